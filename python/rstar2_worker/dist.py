"""Ranks, process groups and the training wrapper (DDP or FSDP).

Ranks follow torchrun's environment contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so
the TS launcher, torchrun and Slurm start the worker the same way. Only rank 0 talks to the client; it
forwards each request that needs every rank over a gloo "control" group, so ranks on other nodes need no
connection to the client.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist

SHARDINGS = ("ddp", "fsdp")


class Rank:
    def __init__(self, rank=0, world=1, local_rank=0, sharding="ddp", offload=False):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.sharding, self.offload = sharding, offload
        self.fsdp = None  # "fsdp2" | "fsdp1" when sharding == "fsdp"
        self.control = None  # gloo group that carries requests from rank 0


def env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def engine_slot():
    """(i, n) from RSTAR2_ENGINE="i/n": this worker is built-in engine i of n started side by side (agent/stack.ts),
    else None."""
    v = os.environ.get("RSTAR2_ENGINE")
    if not v:
        return None
    try:
        i, n = (int(x) for x in v.split("/"))
    except ValueError:
        raise ValueError(f"RSTAR2_ENGINE={v!r} must be i/n") from None
    if not 0 <= i < n:
        raise ValueError(f"RSTAR2_ENGINE={v!r}: i must be in [0, n)")
    return i, n


def from_env():
    """The rank as torchrun describes it, plus RSTAR2_SHARDING / RSTAR2_OFFLOAD_OPTIMIZER."""
    world = env_int("WORLD_SIZE", 1)
    rank = env_int("RANK", 0)
    local = env_int("LOCAL_RANK", rank)
    engine = engine_slot()
    if engine and world == 1 and "LOCAL_RANK" not in os.environ and torch.cuda.is_available():
        local = engine[0] % torch.cuda.device_count()  # several built-in engines: one per GPU, round the GPUs
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    env = os.environ
    if world > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        raise ValueError(f"WORLD_SIZE={world} needs MASTER_ADDR and MASTER_PORT (torchrun sets them)")
    sharding = env.get("RSTAR2_SHARDING") or "ddp"
    if sharding not in SHARDINGS:
        raise ValueError(f"RSTAR2_SHARDING must be one of {', '.join(SHARDINGS)}, got {sharding!r}")
    offload = env.get("RSTAR2_OFFLOAD_OPTIMIZER", "") not in ("", "0")
    if offload and sharding != "fsdp":
        raise ValueError("optimizer offload needs sharding: fsdp (DDP keeps the optimizer on the device)")
    r = Rank(rank, world, local, sharding, offload)
    if sharding == "fsdp":
        r.fsdp = fsdp_flavour(torch.__version__)
    return r


def fsdp_flavour(version):
    """FSDP2 (`fully_shard`) from 2.4, FSDP1 on 2.2–2.3. Older torch cannot shard here: checkpoints go
    through torch.distributed.checkpoint.state_dict, which arrived in 2.2."""
    major, minor = (int(x) for x in version.split("+")[0].split(".")[:2])
    if (major, minor) >= (2, 4):
        return "fsdp2"
    if (major, minor) >= (2, 2):
        return "fsdp1"
    raise RuntimeError(f"sharding: fsdp needs torch >= 2.2 (FSDP2 from 2.4); this torch is {major}.{minor}")


def init(r):
    """Joins the process group (NCCL when this rank has a GPU, else gloo) and the gloo control group."""
    cuda = torch.cuda.is_available()
    if cuda:
        if not hasattr(torch, "set_default_device"):
            raise RuntimeError(f"the GPU path needs torch >= 2.0; this torch is {torch.__version__}")
        torch.cuda.set_device(r.local_rank)
        # every tensor the policy builds lands on this rank's GPU without device arguments in its code
        torch.set_default_device(f"cuda:{r.local_rank}")
    if r.world == 1 and r.sharding == "ddp":
        return
    timeout = datetime.timedelta(seconds=env_int("RSTAR2_DIST_TIMEOUT_S", 600))
    # CPU tensors get gloo beside NCCL: under optimizer offload the gradient norm is reduced from the CPU
    backend = "cuda:nccl,cpu:gloo" if cuda else "gloo"
    if r.world == 1 and not os.environ.get("MASTER_ADDR"):  # FSDP on one rank started by hand
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        dist.init_process_group(backend, rank=r.rank, world_size=r.world, timeout=timeout)
    # followers wait here between requests, which may be hours apart (rollouts only use rank 0)
    r.control = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=7)) if r.world > 1 else None
    if r.control is not None:  # nodes launched by hand can disagree; find out now, not in the first step
        # a node on torch 2.3 would run FSDP1 beside FSDP2 elsewhere, a node without a GPU gloo: other collectives
        mine = (r.sharding, r.offload, r.fsdp, torch.__version__.split("+")[0], cuda)
        every = [None] * r.world
        dist.all_gather_object(every, mine, group=r.control)
        odd = next((i for i, x in enumerate(every) if tuple(x) != mine), None)
        if odd is not None:
            raise ValueError(
                f"rank {r.rank} has (sharding, offload, fsdp, torch, cuda) {mine} but rank {odd} has {tuple(every[odd])}: "
                "start every node alike"
            )


def forward_request(r, frame):
    """Rank 0: sends the frame to every rank. Others: returns the next frame from rank 0."""
    box = [frame]
    dist.broadcast_object_list(box, src=0, group=r.control)
    return box[0]


def wrap(r, model):
    """The module train steps run through: DDP, or FSDP sharding `model` in place."""
    if r.sharding == "fsdp":
        return wrap_fsdp(r, model)
    if r.world == 1:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[r.local_rank] if torch.cuda.is_available() else None,
        # buffers are constants (no batch norm); broadcasting them each forward would also need every
        # rank to run the same number of forwards
        broadcast_buffers=False,
    )
    ddp.register_comm_hook(None, sum_hook)
    return ddp


def sum_hook(_state, bucket):
    # sums instead of DDP's mean: each rank's loss is already divided by the global token count
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def sum_scale(r):
    """What a rank's loss is multiplied by before its backward so that the ranks' gradients are summed: each rank's
    loss is already its share of the global mean. DDP here sums (sum_hook); FSDP, 1 and 2, averages over the ranks."""
    return r.world if r.sharding == "fsdp" else 1


def no_sync(r, wrapped, last):
    """Gradient accumulation: skip the gradient reduction on every micro-batch but the last."""
    if last or r.world == 1 and r.sharding == "ddp":
        return contextlib.nullcontext()
    if r.fsdp == "fsdp2":
        wrapped.set_requires_gradient_sync(False)
        return _resync(wrapped)
    return wrapped.no_sync()


@contextlib.contextmanager
def _resync(wrapped):
    try:
        yield
    finally:
        wrapped.set_requires_gradient_sync(True)


def wrap_fsdp(r, model):  # GPU path: checked by bench/gpu-check.sh, not by the CPU tests
    layers = list(model.model.layers)
    if r.fsdp == "fsdp2":
        try:
            from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
        except ImportError:  # 2.4–2.5 keep it under _composable
            from torch.distributed._composable.fsdp import CPUOffloadPolicy, fully_shard
        kw = {"offload_policy": CPUOffloadPolicy()} if r.offload else {}
        for layer in layers:
            fully_shard(layer, **kw)
        fully_shard(model, **kw)
        return model
    from torch.distributed.fsdp import CPUOffload
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({type(layers[0])}),
        cpu_offload=CPUOffload(offload_params=True) if r.offload else None,
        device_id=torch.cuda.current_device() if torch.cuda.is_available() else None,
        use_orig_params=True,
    )


def reshard(r, wrapped):
    """FSDP2 leaves the root module's own weights (embeddings, final norm, lm_head) gathered after a forward
    until a backward reshards them; after a forward without one (scoring) they would stay whole, and an
    optimizer made then would hold the whole tensors instead of this rank's shards, never updated."""
    if r.fsdp == "fsdp2":
        wrapped.reshard()


def clip_grad_norm(r, wrapped, params, max_norm):
    """The global gradient norm before clipping, as a float, whatever holds the shards."""
    if r.fsdp == "fsdp1":
        return float(wrapped.clip_grad_norm_(max_norm))
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # FSDP2: a DTensor


def full_state_dict(r, model):
    """The whole model's state on rank 0 (None elsewhere); every rank must call it. `model`: the plain
    module under DDP, the FSDP-wrapped one under FSDP."""
    if r.sharding != "fsdp":
        return model.state_dict() if r.rank == 0 else None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd if r.rank == 0 else None


def optimizer_state(wrapped, opt):
    """This rank's shard of the optimizer state (FSDP); keyed by parameter name, so it reloads by name."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(wrapped, opt)


def load_optimizer_state(wrapped, opt, state):
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(wrapped, opt, optim_state_dict=state)
