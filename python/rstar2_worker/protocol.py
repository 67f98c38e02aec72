"""Frames: u32 LE length | u32 LE header length | header JSON | raw little-endian i32/f32 arrays.
Mirrors src/worker/protocol.ts."""
import json
import struct

import numpy as np

NP = {"i32": np.dtype("<i4"), "f32": np.dtype("<f4")}


def read_exact(stream, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = stream.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def read_frame(stream):
    head = read_exact(stream, 4)
    if head is None:
        return None
    (n,) = struct.unpack("<I", head)
    body = read_exact(stream, n)
    if body is None:
        return None
    (hl,) = struct.unpack("<I", body[:4])
    header = json.loads(body[4 : 4 + hl].decode("utf-8"))
    arrays, off = {}, 4 + hl
    for spec in header.get("arrays", []):
        dt = NP[spec["dtype"]]
        nbytes = spec["length"] * 4
        arrays[spec["name"]] = np.frombuffer(body, dtype=dt, count=spec["length"], offset=off)
        off += nbytes
    return header, arrays


def write_frame(stream, header, arrays=None):
    specs, blobs = [], []
    for name, (dtype, values) in (arrays or {}).items():
        a = np.ascontiguousarray(np.asarray(values, dtype=NP[dtype]))
        specs.append({"name": name, "dtype": dtype, "length": int(a.size)})
        blobs.append(a.tobytes())
    hb = json.dumps({**header, "arrays": specs}).encode("utf-8")
    body_len = 4 + len(hb) + sum(len(b) for b in blobs)
    stream.write(struct.pack("<II", body_len, len(hb)) + hb + b"".join(blobs))
    stream.flush()


def ragged(flat, lens):
    out, off = [], 0
    for n in lens.tolist():
        out.append(flat[off : off + n].tolist())
        off += n
    return out
