"""vLLM worker extension for broadcast weight sync: start vLLM with python/ on PYTHONPATH,
VLLM_SERVER_DEV_MODE=1 (for /collective_rpc) and `--worker-extension-cls rstar2_worker.vllm_ext.WeightSyncExtension`.

The methods run in every vLLM worker (one per tensor-parallel rank), called through POST /collective_rpc
with one JSON string argument, as vLLM's RLHF example does. Unlike that example, the group is a plain
torch.distributed one (rstar2_worker.train.weight_sync.custom_group), because the trainer's side is plain torch.
"""
import datetime
import json

import torch
import torch.distributed as dist

from rstar2_worker.train.weight_sync import custom_group


class WeightSyncExtension:
    def rstar2_weight_sync_ranks(self):
        return {"rank": int(getattr(self, "rank", 0))}  # one answer per worker: their count is the rank count

    def init_weight_update_group(self, spec):
        s = json.loads(spec)
        url = f"tcp://{s['master_address']}:{s['master_port']}"
        rank = int(s["rank_offset"]) + int(getattr(self, "rank", 0))
        timeout = datetime.timedelta(seconds=float(s.get("timeout_s", 600)))
        # each receive waits as long as the trainer waits for a bucket, not the join's long wait
        op = datetime.timedelta(seconds=float(s["op_timeout_s"])) if s.get("op_timeout_s") else None
        self._rstar2_group = custom_group(s.get("backend", "nccl"), url, rank, int(s["world_size"]), s["group_name"], timeout, op)
        return {"rank": rank}

    def update_weights_from_distributed(self, spec):
        s = json.loads(spec)
        device = getattr(self, "device", None) or ("cuda" if torch.cuda.is_available() else "cpu")
        model = self.model_runner.model
        for name, dtype, shape in zip(s["names"], s["dtypes"], s["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
            dist.broadcast(t, src=0, group=self._rstar2_group)
            model.load_weights(weights=[(name, t)])  # one at a time: no second copy of the model
            del t
        return {"tensors": len(s["names"])}
