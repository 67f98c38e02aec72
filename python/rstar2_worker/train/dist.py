"""Ranks, process groups and the training wrapper (DDP or FSDP).

Ranks follow torchrun's environment contract (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so
the TS launcher, torchrun and Slurm start the worker the same way. Only rank 0 talks to the client; it
forwards each request that needs every rank over a gloo "control" group, so ranks on other nodes need no
connection to the client.
"""
import contextlib
import datetime
import fcntl
import os
import re
import socket
import struct
import sys
import threading

import torch
import torch.distributed as dist


class Rank:
    def __init__(self, rank=0, world=1, local_rank=0, sharding="ddp", offload=False):
        self.rank, self.world, self.local_rank = rank, world, local_rank
        self.sharding, self.offload = sharding, offload
        self.fsdp = None  # "fsdp2" | "fsdp1" when sharding == "fsdp"
        self.control = None  # gloo group that carries requests from rank 0
        self.address = None  # the address gloo binds (dist.pick_gloo_interface)
        self.peers = None  # every rank's (node, host, address) once joined, to name a lost peer


def env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not an integer") from None


def from_env(settings):
    """The rank as torchrun describes it, with the settings' sharding and optimizer offload."""
    world = env_int("WORLD_SIZE", 1)
    rank = env_int("RANK", 0)
    local = env_int("LOCAL_RANK", rank)
    engine = settings.engine
    if engine and world == 1 and "LOCAL_RANK" not in os.environ and torch.cuda.is_available():
        local = engine[0] % torch.cuda.device_count()  # several built-in engines: one per GPU, round the GPUs
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world})")
    env = os.environ
    if world > 1 and not (env.get("MASTER_ADDR") and env.get("MASTER_PORT")):
        raise ValueError(f"WORLD_SIZE={world} needs MASTER_ADDR and MASTER_PORT (torchrun sets them)")
    r = Rank(rank, world, local, settings.sharding, settings.offload_optimizer)
    if r.sharding == "fsdp":
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


# How long ranks wait for each other to join (the store, gloo's connections, the agreement below). A wrong --master,
# a port nobody listens on or a node never started then fails within a minute of the start, naming the fix; nodes
# started by hand further apart raise RSTAR2_DIST_JOIN_TIMEOUT_S (settings.dist_join_timeout_s, 45 s). Collectives
# afterwards get RSTAR2_DIST_TIMEOUT_S (settings.dist_timeout_s).


def init(r, settings, report=None):
    """Joins the process group (NCCL when this rank has a GPU, else gloo) and the gloo control group. A rank
    that has not joined within the join timeout passes why to report(message) (default: stderr) and exits."""
    cuda = torch.cuda.is_available()
    if cuda:
        if not hasattr(torch, "set_default_device"):
            raise RuntimeError(f"the GPU path needs torch >= 2.0; this torch is {torch.__version__}")
        torch.cuda.set_device(r.local_rank)
        # every tensor the policy builds lands on this rank's GPU without device arguments in its code
        torch.set_default_device(f"cuda:{r.local_rank}")
    if r.world == 1 and r.sharding == "ddp":
        return
    work = datetime.timedelta(seconds=settings.dist_timeout_s)
    idle = datetime.timedelta(days=7)  # followers wait on the control group between requests, maybe hours apart
    settable = hasattr(dist.distributed_c10d, "_set_pg_timeout")
    join = datetime.timedelta(seconds=settings.dist_join_timeout_s) if settable else work
    # CPU tensors get gloo beside NCCL: under optimizer offload the gradient norm is reduced from the CPU
    backend = "cuda:nccl,cpu:gloo" if cuda else "gloo"
    if r.world == 1 and not os.environ.get("MASTER_ADDR"):  # FSDP on one rank started by hand
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=work)
        return
    iface = pick_gloo_interface(r)
    # gloo does not always keep to the timeout: a rank listening for a peer that never connects waited 25 s
    # past a 5 s one (torch 2.13). Past it, the rank says why (rank 0 to its client, through report) and ends.
    late = threading.Timer(join.total_seconds() + 2, joined_late, (r, join, iface, report))
    late.daemon = True
    late.start()
    try:
        dist.init_process_group(backend, rank=r.rank, world_size=r.world, timeout=join)
        every = [(alike(r, cuda), here(r))]
        if r.world > 1:
            r.control = dist.new_group(backend="gloo", timeout=join)
            every = [None] * r.world
            dist.all_gather_object(every, (alike(r, cuda), here(r)), group=r.control)
    except Exception as e:  # noqa: BLE001 - whatever torch raised, the rank could not join: say what to check
        raise RuntimeError(join_failure(r, e, join, iface)) from e
    finally:
        late.cancel()
    r.peers = [p for _, p in every]
    if settable:
        dist.distributed_c10d._set_pg_timeout(work)
        if r.control is not None:
            dist.distributed_c10d._set_pg_timeout(idle, r.control)
    # nodes launched by hand can disagree; find out now, not in the first step
    mine = alike(r, cuda)
    odd = next((i for i, (x, _) in enumerate(every) if tuple(x) != mine), None)
    if odd is not None:
        names = ("sharding", "offload", "fsdp", "torch", "cuda")
        diff = ", ".join(f"{n} {a!r} vs {b!r}" for n, a, b in zip(names, mine, every[odd][0]) if a != b)
        raise ValueError(
            f"rank {r.rank} ({where(r, r.rank)}) and rank {odd} ({where(r, odd)}) differ: {diff}. Start every node "
            "alike: the same torch (bash scripts/setup.sh on each, or the same RSTAR2_PYTHON), the same recipe and "
            "flags, GPUs on all or none"
        )


def alike(r, cuda):
    """What every rank must agree on: a node on torch 2.3 would run FSDP1 beside FSDP2 elsewhere, a node without a
    GPU gloo beside NCCL: other collectives."""
    return (r.sharding, r.offload, r.fsdp, torch.__version__.split("+")[0], cuda)


def here(r):
    """This rank's node and address, to name a peer in errors: (node, host, address gloo uses)."""
    return (env_int("GROUP_RANK", 0), socket.gethostname(), r.address)


def where(r, rank):
    node, host, addr = r.peers[rank]
    return f"node {node}, {host}" + (f" at {addr}" if addr else "")


def peer_gone(r, e):
    """For an error in a collective: what gloo lost, naming the peer's node from the address gloo gives, or None
    when the error is not a lost connection."""
    text = str(e)
    if not re.search(r"connection (closed|reset) by peer|remote process exited|broken pipe|connection refused", text, re.I):
        return None
    m = re.search(r"\[([0-9a-fA-F:.]+)\]:\d+", text)
    addr = m.group(1) if m else None
    ranks = [i for i, p in enumerate(r.peers or []) if addr and p[2] == addr and i != r.rank]
    if not ranks or addr == r.address:  # unknown, or a rank of this very node (it shares this address)
        return f"a peer rank is gone ({first_line(e)})"
    node, host, _ = r.peers[ranks[0]]
    return (f"node {node} ({host} at {addr}, rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}) is gone: "
            "it died or lost the network")


def first_line(e):
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def joined_late(r, join, iface, report):
    why = f"RuntimeError: {join_failure(r, TimeoutError('the join did not end'), join, iface)}"
    if report:
        report(why)
    else:
        print(f"rstar2_worker rank {r.rank}: {why}", file=sys.stderr)
    sys.stderr.flush()
    os._exit(1)


def join_failure(r, e, join, iface):
    env = os.environ
    s = int(join.total_seconds())
    how = f"gloo binds {iface}" if iface else "gloo binds the address this host's name resolves to"
    if r.address and (r.address.startswith("127.") or r.address == "::1"):
        how += f" (loopback: {env['MASTER_ADDR']} is this host; nodes on other machines need node 0's network address)"
    return (
        f"rank {r.rank} of {r.world} could not join the job at {env['MASTER_ADDR']}:{env['MASTER_PORT']} within {s} s "
        f"({first_line(e)}). Check that --master (MASTER_ADDR:MASTER_PORT) is node 0's address and a port free there "
        f"that every node reaches, that every node was started with the same --nnodes and --nproc-per-node, and that "
        f"{how}, an interface the other nodes reach (set GLOO_SOCKET_IFNAME to choose it); nodes started more than "
        f"{s} s apart need a larger RSTAR2_DIST_JOIN_TIMEOUT_S"
    )


def pick_gloo_interface(r):
    """Left to itself gloo binds the address the host's name resolves to, which on many hosts (Debian's
    /etc/hosts, containers) is loopback: a peer on another node then never connects and the job hangs. Unless the
    user set GLOO_SOCKET_IFNAME, gloo binds the interface this host reaches MASTER_ADDR through (the one that holds
    the address a packet to it leaves from; on node 0, the interface holding the master address itself). Returns
    the interface gloo will use (None: gloo's own choice), and keeps the address in r.address."""
    env = os.environ
    addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    try:
        family, _, _, _, sa = socket.getaddrinfo(addr, port, type=socket.SOCK_DGRAM)[0]
    except OSError as e:
        raise ValueError(f"MASTER_ADDR {addr!r} (--master) does not resolve here: {e}") from None
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        try:
            s.connect(sa)  # UDP: no packet is sent, the kernel only picks the route and the source address
            src = s.getsockname()[0]
        except OSError:
            src = None  # no route: the join fails and says so
    spans_nodes = env_int("LOCAL_WORLD_SIZE", r.world) < r.world
    if env.get("GLOO_SOCKET_IFNAME"):
        r.address = src
        return env["GLOO_SOCKET_IFNAME"]
    iface = interface_of(src) if src else None
    if iface:
        os.environ["GLOO_SOCKET_IFNAME"] = iface  # read by ProcessGroupGloo when the group is made
        if spans_nodes and r.local_rank == 0:
            print(f"rstar2_worker: node {env_int('GROUP_RANK', 0)}: gloo uses {iface} ({src}), the route to "
                  f"{addr}; set GLOO_SOCKET_IFNAME to choose another", file=sys.stderr)
    r.address = src
    return iface


def interface_of(addr):
    """The name of the interface holding addr, or None."""
    if ":" in addr:
        want = socket.inet_pton(socket.AF_INET6, addr.split("%")[0]).hex()
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    cols = line.split()
                    if cols and cols[0] == want:
                        return cols[-1]
        except OSError:
            return None
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(got[20:24]) == addr:
                return name
    return None


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


def wrap_fsdp(r, model):  # on CPUs over gloo in the tests (test/worker/distributed.test.ts), on GPUs by bench/gpu-check.sh
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


OPTIMIZER_DIR = "optimizer"  # in a checkpoint: the sharded optimizer state, one file per rank that saved it


def save_optimizer_state(wrapped, opt, directory):
    """FSDP: each rank writes its shard of the optimizer state (torch.distributed.checkpoint, keyed by parameter
    name), so a run can resume on any number of ranks; every rank must call it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(wrapped, opt)}, checkpoint_id=os.path.join(directory, OPTIMIZER_DIR))


def load_optimizer_state(wrapped, opt, directory):
    """Reads what save_optimizer_state wrote, by however many ranks, into this rank's shard; every rank must call
    it. DCP fills the tensors of a state shaped as this rank holds it, so the optimizer's is made first."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(wrapped, opt)}  # AdamW's state made by a zero step (lr 0)
    dcp.load(state, checkpoint_id=os.path.join(directory, OPTIMIZER_DIR))
    set_optimizer_state_dict(wrapped, opt, optim_state_dict=state["optimizer"])


def set_optimizer_state(wrapped, opt, state):
    """A state dict keyed by parameter name, whole or this rank's shard (an older checkpoint's optimizer-rank*.pt)."""
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    set_optimizer_state_dict(wrapped, opt, optim_state_dict=state)
