"""Weight sync by broadcast: the trainer's rank 0 joins a process group with the rollout engines' ranks
(SGLang's /init_weights_update_group, vLLM's vllm_ext.WeightSyncExtension) as rank 0 and broadcasts every
weight, by Hugging Face name, in the order it announced them, cast to the engines' dtype
(`cast`: settings.weight_sync_dtype, RSTAR2_WEIGHT_SYNC_DTYPE, which the client sets; None: the trainer's own). The engines receive them in
buckets, one update call each (src/recipe/weight-sync.ts); rank 0 sends one tensor at a time and waits for
it, so the sender holds one cast copy at most whatever the buckets.

The group is separate from the trainer's own ranks: torch cannot make a group (new_group) that spans
processes outside the default group, so rank 0 builds a second "default-like" group from its own TCP store,
the recipe SGLang's engines follow (init_custom_process_group; OpenRLHF and verl too). Both sides must build
it the same way, store keys included, so even a single-rank trainer does it this way rather than making the
group its default one (whose keys are prefixed differently). It leans on torch's private
_new_process_group_helper, whose signature moved across versions; we follow both.
"""
import datetime
import inspect
import time

import torch
import torch.distributed as dist

from rstar2_worker.settings import WEIGHT_SYNC_DTYPES
from rstar2_worker.train import dist as ranks

DTYPE_NAMES = {getattr(torch, n): n for n in WEIGHT_SYNC_DTYPES}


class Group:
    def __init__(self, pg, name, world):
        self.pg, self.name, self.world = pg, name, world


def join(addr, port, world_size, group_name, backend, timeout_s, op_timeout_s=None):
    """Rank 0 of `world_size` ranks; returns once every engine rank has joined (or raises at timeout_s). Each
    broadcast of a tensor then waits at most op_timeout_s (default timeout_s) for the engines."""
    if world_size < 2:
        raise ValueError(f"a weight-update group needs the engines too: world_size {world_size} < 2")
    timeout = datetime.timedelta(seconds=timeout_s)
    op = datetime.timedelta(seconds=op_timeout_s) if op_timeout_s else None
    pg = custom_group(backend, f"tcp://{addr}:{port}", 0, world_size, group_name, timeout, op)
    return Group(pg, group_name, world_size)


def custom_group(backend, url, rank, world_size, group_name, timeout, op_timeout=None):
    """A group of `world_size` ranks meeting at `url` (rank 0 hosts the store), beside the default group. The
    join waits `timeout`; each collective `op_timeout` (default the same): an engine that stops receiving part-way
    through an update fails the sender's broadcast that soon, not after the join's long wait."""
    from torch.distributed import distributed_c10d as c10d

    # a group of this name left from an earlier run (a trainer restarted against a served engine) goes first:
    # torch refuses a second group under one name, and the new trainer's keys use the same name
    for old, name in list(c10d._world.pg_names.items()) if hasattr(c10d, "_world") else []:
        if name == group_name:
            try:
                dist.destroy_process_group(old)
            except Exception:  # noqa: BLE001 - a broken old group may not tear down; its name is what matters
                c10d._world.pg_names.pop(old, None)
    store, rank, world = next(c10d.rendezvous(url, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = c10d.PrefixStore(group_name, store)
    params = inspect.signature(c10d._new_process_group_helper).parameters
    kw = {"backend_options" if "backend_options" in params else "pg_options": None}
    pg = c10d._new_process_group_helper(world, rank, [], c10d.Backend(backend), store, group_name=group_name,
                                        timeout=op_timeout or timeout, **kw)
    if isinstance(pg, tuple):  # torch >= 2.1 returns (group, store)
        pg = pg[0]
    ranks = {i: i for i in range(world)}  # the group's ranks are its global ranks (collectives map through this)
    if hasattr(c10d, "_world"):
        c10d._world.pg_group_ranks[pg] = ranks
    else:  # torch < 2.0
        c10d._pg_group_ranks[pg] = ranks
    return pg


def weights(r, policy):
    """(name, tensor) in Hugging Face names, as save() writes them (a tied lm_head is left out); every rank
    must call it under FSDP (the full state is gathered), only rank 0 gets the list."""
    sd = ranks.full_state_dict(r, policy.forward_module)
    if sd is None:
        return None
    if policy.cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return list(sd.items())


def meta(named, cast):
    """What the engines receive: names, dtypes (`cast`, or each weight's own when None) and shapes."""
    return {
        "names": [n for n, _ in named],
        "dtypes": [cast or DTYPE_NAMES[t.dtype] for _, t in named],
        "shapes": [list(t.shape) for _, t in named],
    }


def broadcast(group, named, device, cast):
    """Sends every tensor from rank 0, cast to `cast` (None: its own dtype); the engines receive in the same order
    (names announced beforehand)."""
    t0, nbytes = time.time(), 0
    dtype = getattr(torch, cast) if cast else None
    with torch.no_grad():
        for _, t in named:
            # FSDP's full state comes back on the CPU; the cast is the engines' dtype, as announced
            t = t.detach().to(device=device, dtype=dtype or t.dtype).contiguous()
            dist.broadcast(t, src=0, group=group.pg)
            if t.is_cuda:
                # NCCL returns once the send is queued: without the wait every cast copy would stay allocated
                # until the engines had asked for the bucket that holds it
                torch.cuda.current_stream(t.device).synchronize()
            nbytes += t.numel() * t.element_size()
            del t
    return {"tensors": len(named), "bytes": nbytes, "timeS": time.time() - t0}


# ---- the engine's side: `rstar2 serve` receives what a trainer's rank 0 broadcasts ----------------------


def join_as_engine(addr, port, rank, world_size, group_name, backend, timeout_s):
    """Joins a trainer's weight-update group as rank `rank` (SGLang's /init_weights_update_group); the join and
    each receive wait at most timeout_s."""
    if not (1 <= rank < world_size):
        raise ValueError(f"rank_offset {rank} is outside the group's engine ranks 1..{world_size - 1}")
    timeout = datetime.timedelta(seconds=timeout_s)
    return Group(custom_group(backend, f"tcp://{addr}:{port}", rank, world_size, group_name, timeout), group_name, world_size)


class Staged:
    """The buckets of one update as they arrive, applied together once the last is in: until then the model
    serves its old weights, and an update that fails part-way leaves them untouched (SGLang loads each bucket
    as it comes). On a GPU the received tensors wait on the host, so staging never holds a second model there."""

    def __init__(self):
        self.tensors = {}

    def receive(self, group, model, names, dtypes, shapes, device):
        own = model.state_dict()
        # every announced tensor is checked before any is received: a bad bucket fails whole
        for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
            if name not in own:
                raise ValueError(f"the served model has no weight {name!r}")
            if list(own[name].shape) != list(shape):
                raise ValueError(f"{name}: shape {list(shape)} sent, the served model's is {list(own[name].shape)}")
            if dtype not in DTYPE_NAMES.values():
                raise ValueError(f"{name}: dtype {dtype!r} is not one of {sorted(DTYPE_NAMES.values())}")
        with torch.no_grad():
            for name, dtype, shape in zip(names, dtypes, shapes):
                t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                dist.broadcast(t, src=0, group=group.pg)
                self.tensors[name] = t.cpu() if t.is_cuda else t

    def apply(self, model):
        """Copies every staged tensor into the model (cast to its dtype); returns how many."""
        own = model.state_dict()
        with torch.no_grad():
            for name, t in self.tensors.items():
                own[name].copy_(t)
        n = len(self.tensors)
        self.tensors = {}
        return n
