"""Hugging Face checkpoint directories: config.json + model.safetensors, or shards + model.safetensors.index.json.

The safetensors format is parsed directly (the package may be absent): u64 LE header length, a JSON
header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then raw bytes.
"""
import json
import math
import os
import re
import struct

import numpy as np
import torch

DTYPES = {
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F64": torch.float64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}


def safetensors_header(path):
    """(tensor specs by name, where the data section starts, the file's size), every spec checked against the file:
    a damaged or cut file is refused here, naming it and what is wrong, before any tensor is mapped."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"{path}: not a safetensors file (too short: {size} bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise ValueError(f"{path}: corrupt safetensors header length {n} in a file of {size} bytes (truncated file?)")
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: unreadable safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: unreadable safetensors header (a JSON object of tensors expected)")
    base = 8 + n
    specs = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = DTYPES.get(spec["dtype"]), [int(d) for d in spec["shape"]], spec["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name} has a damaged header entry {spec!r}") from None
        if dtype is None:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {spec['dtype']}")
        if not (isinstance(b, int) and isinstance(e, int)) or b > e or b < 0:
            raise ValueError(f"{path}: tensor {name} has damaged data offsets {spec['data_offsets']!r}")
        if e > size - base:
            raise ValueError(f"{path}: tensor {name} ends at byte {e} of a {size - base}-byte data section (truncated file?)")
        need = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if e - b != need:
            raise ValueError(f"{path}: tensor {name} holds {e - b} bytes, but its shape {shape} of {spec['dtype']} needs {need} "
                             "(damaged header)")
        specs[name] = (dtype, shape, b, e)
    return specs, base, size


def read_safetensors(path):
    """The file's tensors, each backed by its own private (copy-on-write) mapping of the file: pages come in
    as a tensor is read, nothing is copied unless it is written, and dropping a tensor unmaps it."""
    specs, base, _ = safetensors_header(path)
    out = {}
    for name, (dtype, shape, b, e) in specs.items():
        if e == b:
            t = torch.empty(0, dtype=dtype)
        else:
            raw = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c", offset=base + b, shape=(e - b,)))
            t = raw.view(dtype)
        out[name] = t.reshape(shape)
    return out


def write_safetensors(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt", **(metadata or {})}
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hb += b" " * (-len(hb) % 8)  # align the data section to 8 bytes, as the reference writer does
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for raw in blobs:
            f.write(raw)
    os.replace(tmp, path)


SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def require_dir(directory):
    """A checkpoint directory that is not there is an error naming it, never a cue to load something else (a hub
    id of that name, another backend's weights, a fresh model)."""
    if not os.path.exists(directory):
        raise FileNotFoundError(f"{directory}: no such checkpoint directory")
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory}: not a directory (a checkpoint is a directory: config.json and safetensors)")


def weight_files(directory):
    """The safetensors files of a checkpoint and, for shards, the index's weight_map {tensor: file}, or None."""
    require_dir(directory)
    single = os.path.join(directory, SINGLE)
    index = os.path.join(directory, INDEX)
    if os.path.exists(single):
        return [single], None
    if os.path.exists(index):
        try:
            with open(index) as f:
                doc = json.load(f)
        except ValueError as e:
            raise ValueError(f"{index}: not valid JSON ({e})") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: no \"weight_map\" object naming each tensor's file")
        if not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: weight_map values must be file names")
        for name in sorted(set(weight_map.values())):
            if os.path.basename(name) != name or name in (".", ".."):
                raise ValueError(f"{index}: weight_map names {name!r}, not a file of {directory}")
            if not os.path.exists(os.path.join(directory, name)):
                raise FileNotFoundError(f"{index}: weight_map names shard {name}, which is missing from {directory}")
        return [os.path.join(directory, n) for n in sorted(set(weight_map.values()))], weight_map
    hint = ""
    if any(os.path.exists(os.path.join(directory, n)) for n in ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        hint = " (it has pytorch_model.bin weights; only safetensors are read: convert them)"
    raise FileNotFoundError(f"{directory}: no weights: neither {SINGLE} nor {INDEX}{hint}")


def check_weights(directory):
    """Every weight file's header against its size, and the index against the files, without mapping a tensor:
    for loaders whose own errors name no file (transformers' from_pretrained)."""
    files, weight_map = weight_files(directory)
    held = {os.path.basename(p): set(safetensors_header(p)[0]) for p in files}
    check_map(directory, weight_map, held)


def check_map(directory, weight_map, held):
    wrong = [k for k, f in (weight_map or {}).items() if k not in held[f]]
    if wrong:
        index = os.path.join(directory, INDEX)
        raise ValueError(f"{index}: weight_map puts tensor {wrong[0]} in {weight_map[wrong[0]]}, which does not hold it")


def read_state_dict(directory):
    files, weight_map = weight_files(directory)
    sd, held = {}, {}
    for path in files:
        part = read_safetensors(path)
        held[os.path.basename(path)] = set(part)
        sd.update(part)
    check_map(directory, weight_map, held)
    return sd


def shard_groups(names, nbytes, shards=None, max_bytes=None):
    """Tensor names (in order) grouped into shard files. `shards`: exactly that many files (fewer only when
    there are fewer tensors), cut where the running byte count first reaches each k/shards of the total.
    `max_bytes`: Hugging Face's `max_shard_size` rule (a new file when the next tensor would overflow the
    current one; a tensor over the limit gets a file of its own). Neither: one file."""
    if shards and shards > 1:
        n, s = len(names), min(shards, len(names))
        cum = [0]
        for name in names:
            cum.append(cum[-1] + nbytes[name])
        cuts, lo = [], 1
        for k in range(1, s):
            i = next((j for j in range(lo, n) if cum[j] * s >= k * cum[-1]), n)
            i = min(i, n - (s - k))  # every later file still gets a tensor
            cuts.append(i)
            lo = i + 1
        return [names[a:b] for a, b in zip([0] + cuts, cuts + [n])]
    if max_bytes:
        groups, size = [[]], 0
        for name in names:
            if groups[-1] and size + nbytes[name] > max_bytes:
                groups.append([])
                size = 0
            groups[-1].append(name)
            size += nbytes[name]
        return groups
    return [list(names)]


def write_state_dict(directory, sd, shards=None, max_bytes=None):
    """Writes model.safetensors, or Hugging Face shards model-0000i-of-0000n.safetensors plus
    model.safetensors.index.json; then removes weight files of the other layout, since a stale
    model.safetensors would be read in preference to a new index."""
    names = list(sd)  # module order: embeddings first, then layer by layer, as HF's writer orders them
    nbytes = {n: sd[n].numel() * sd[n].element_size() for n in names}
    groups = shard_groups(names, nbytes, shards, max_bytes)
    if len(groups) == 1:
        write_safetensors(os.path.join(directory, SINGLE), sd)
        keep = {SINGLE}
    else:
        files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
        for f, g in zip(files, groups):
            write_safetensors(os.path.join(directory, f), {n: sd[n] for n in g})
        weight_map = {n: f for f, g in zip(files, groups) for n in g}
        write_json(os.path.join(directory, INDEX), {"metadata": {"total_size": sum(nbytes.values())}, "weight_map": weight_map})
        keep = set(files) | {INDEX}
    for name in os.listdir(directory):
        if name not in keep and (name in (SINGLE, INDEX) or SHARD_RE.match(name)):
            os.remove(os.path.join(directory, name))
    return sorted(keep)


def read_config(directory):
    require_dir(directory)
    path = os.path.join(directory, "config.json")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{directory}: no config.json (not a Hugging Face model directory)")
    with open(path) as f:
        try:
            cfg = json.load(f)
        except ValueError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: not a model config (a JSON object expected, got {type(cfg).__name__})")
    return cfg


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
