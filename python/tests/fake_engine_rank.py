"""A stand-in for one rollout engine rank in a weight-update group (test/engines/fake-servers.ts runs it; kept under python/ with the rest of the Python).

JSON lines in, JSON lines out: {"op": "init", <SGLang's /init_weights_update_group fields>} joins the group
as rank `rank_offset`, the way SGLang's engines do (init_custom_process_group: rendezvous at the master's
store, keys under the group's name); {"op": "update", <SGLang's /update_weights_from_distributed fields>,
"out": PATH} receives each tensor from rank 0 in the announced order and writes them to PATH (safetensors).

As SGLang's model runner does (update_weights_from_distributed: torch.empty and an async broadcast for each
announced tensor, then wait for all, then load_weights), the whole update is held at once: with "free_bytes"
(the memory beside the KV pool) an update whose tensors do not fit fails at the tensor that does not, after the
ones before it were received, with the answer SGLang gives; rank 0 is then left sending that tensor.
"""
import datetime
import json
import sys

import torch
import torch.distributed as dist

from rstar2_worker.train.checkpoint import write_safetensors
from rstar2_worker.train.weight_sync import custom_group

groups = {}
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "init":
            url = f"tcp://{req['master_address']}:{req['master_port']}"
            timeout = datetime.timedelta(seconds=float(req.get("timeout_s", 30)))
            op = datetime.timedelta(seconds=float(req["op_timeout_s"])) if req.get("op_timeout_s") else None
            groups[req["group_name"]] = custom_group(req["backend"], url, req["rank_offset"], req["world_size"], req["group_name"], timeout, op)
        else:
            got, held, free = {}, 0, req.get("free_bytes")
            for name, dtype, shape in zip(req["names"], req["dtypes"], req["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                held += t.numel() * t.element_size()
                if free is not None and held > free:
                    raise RuntimeError(
                        f"Failed to update parameter online: CUDA out of memory. Tried to allocate "
                        f"{t.numel() * t.element_size() / 2**20:.2f} MiB ({name}) with {free / 2**20:.2f} MiB free. "
                        "The full weights of the ModelRunner are partially updated. Please discard the whole weights."
                    )
                dist.broadcast(t, src=0, group=groups[req["group_name"]])
                got[name] = t
            write_safetensors(req["out"], got)
        reply = {"success": True, "message": "ok"}
    except Exception as e:  # the server answers what SGLang would: success false and why
        reply = {"success": False, "message": str(e) if isinstance(e, RuntimeError) else f"{type(e).__name__}: {e}"}
    print(json.dumps(reply), flush=True)
