"""The worker's settings: every RSTAR2_* variable it reads, read once at start-up (`Settings.from_env`, in
__main__) and passed down: dist.from_env and dist.init, Policy(r, settings), its engine, weight sync.

src/worker/client.ts sets the process's (threads, precision, backend, compile, sharding, offload) and the weight
sync's dtype; the engine's sizes are the user's to export (docs/ENGINES.md "The built-in engine"). Each default is
written here once. A malformed value fails the start, naming its variable. Torchrun's own variables (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...) are not settings: dist.py reads them as torchrun defines them.
"""
from __future__ import annotations

import dataclasses
import os

PRECISIONS = ("fp32", "bf16-mixed", "bf16")
MODEL_BACKENDS = ("native", "transformers")
SHARDINGS = ("ddp", "fsdp")
COMPILE_MODES = ("auto", "on", "off")
WEIGHT_SYNC_DTYPES = ("bfloat16", "float16", "float32")


def integer(minimum):
    def parse(name, v):
        try:
            n = int(v)
        except ValueError:
            raise ValueError(f"{name}={v!r} is not an integer") from None
        if n < minimum:
            raise ValueError(f"{name}={v!r} must be at least {minimum}")
        return n

    return parse


def fraction(name, v):
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{name}={v!r} is not a number") from None
    if not 0 < x <= 1:
        raise ValueError(f"{name}={v!r} must be in (0, 1]")
    return x


def flag(name, v):
    if v not in ("0", "1"):
        raise ValueError(f"{name}={v!r} must be 0 or 1")
    return v == "1"


def one_of(choices, aliases=None):
    def parse(name, v):
        v = (aliases or {}).get(v, v)
        if v not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {v!r}")
        return v

    return parse


def engine_slot(name, v):
    """(i, n) from "i/n": built-in engine i of n started side by side (agent/stack.ts)."""
    try:
        i, n = (int(x) for x in v.split("/"))
    except ValueError:
        raise ValueError(f"{name}={v!r} must be i/n") from None
    if not 0 <= i < n:
        raise ValueError(f"{name}={v!r}: i must be in [0, n)")
    return i, n


def text(name, v):
    return v


def var(name, default, parse, why):
    """A field read from the environment variable `name` (unset or empty: `default`)."""
    return dataclasses.field(default=default, metadata={"env": name, "parse": parse, "why": why})


# the defaults of the fields left None, on a GPU and on a CPU (Settings.on_device)
BY_DEVICE = {"max_batch": (256, 64), "prefill_tokens": (8192, 2048), "cuda_graphs": ("1", "0"), "kv_release": (True, False)}


@dataclasses.dataclass(frozen=True)
class Settings:
    # the process
    threads: int = var("RSTAR2_THREADS", 2, integer(1), "torch's CPU threads")
    precision: str = var("RSTAR2_PRECISION", "fp32", one_of(PRECISIONS), "weights and compute")
    model_backend: str = var("RSTAR2_MODEL_BACKEND", "native", one_of(MODEL_BACKENDS), "the model's implementation")
    compile: str = var("RSTAR2_COMPILE", "auto", one_of(COMPILE_MODES, {"1": "auto", "0": "off"}),
                       "model.compile: auto (on CUDA), on (any device), off; 1 reads as auto, 0 as off")
    sharding: str = var("RSTAR2_SHARDING", "ddp", one_of(SHARDINGS), "how ranks hold the model")
    offload_optimizer: bool = var("RSTAR2_OFFLOAD_OPTIMIZER", False, flag, "AdamW's state on the CPU (fsdp only)")
    dist_timeout_s: int = var("RSTAR2_DIST_TIMEOUT_S", 600, integer(1), "collectives after the join")
    dist_join_timeout_s: int = var("RSTAR2_DIST_JOIN_TIMEOUT_S", 45, integer(1),
                                   "how long ranks wait for each other to join (nodes started by hand further apart raise it)")
    engine: tuple | None = var("RSTAR2_ENGINE", None, engine_slot, "i/n: built-in engine i of n started side by side")
    weight_sync_dtype: str | None = var("RSTAR2_WEIGHT_SYNC_DTYPE", None, one_of(WEIGHT_SYNC_DTYPES),
                                        "the dtype engines receive weights in; unset: each weight's own")
    # the built-in engine (engine/engine.py); None: by device (BY_DEVICE)
    kv_tokens: int = var("RSTAR2_KV_TOKENS", 0, integer(0), "KV pool size in tokens; 0: from the memory budget below")
    kv_fraction: float = var("RSTAR2_KV_FRACTION", 0.5, fraction,
                             "of a GPU's memory, split between the built-in engines on it, at most 90 % of what is free")
    kv_mib: int = var("RSTAR2_KV_MIB", 128, integer(1), "the KV pool on a CPU")
    kv_block: int = var("RSTAR2_KV_BLOCK", 16, integer(1), "tokens a KV block")
    max_batch: int | None = var("RSTAR2_MAX_BATCH", None, integer(1), "rows a step (256 on a GPU, 64 on a CPU)")
    prefill_tokens: int | None = var("RSTAR2_PREFILL_TOKENS", None, integer(1),
                                     "new prompt tokens a step (8192 on a GPU, 2048 on a CPU)")
    cuda_graphs: str | None = var("RSTAR2_CUDA_GRAPHS", None, one_of(("1", "0", "eager")),
                                  "decode as CUDA graphs (1 on a GPU); eager: their bucketed path without capture (tests)")
    kv_release: bool | None = var("RSTAR2_KV_RELEASE", None, flag,
                                  "free the pool for every train step (1 on a GPU, where training needs that memory)")
    prefix_cache: bool = var("RSTAR2_PREFIX_CACHE", True, flag, "0: compute every prompt in full (what reuse saves)")
    # tests
    worker_fail: str | None = var("RSTAR2_WORKER_FAIL", None, text, "OP:RANK: that rank fails OP as out of memory would")
    fake_version: int | None = var("RSTAR2_WORKER_FAKE_VERSION", None, integer(0), "the hello's version (a stale checkout)")

    @classmethod
    def from_env(cls, env=os.environ):
        """The settings `env` gives; raises ValueError naming the first variable whose value is malformed."""
        got = {}
        for f in dataclasses.fields(cls):
            v = env.get(f.metadata["env"])
            if v not in (None, ""):
                got[f.name] = f.metadata["parse"](f.metadata["env"], v)
        s = cls(**got)
        if s.offload_optimizer and s.sharding != "fsdp":
            raise ValueError("optimizer offload needs sharding: fsdp (DDP keeps the optimizer on the device)")
        return s

    def on_device(self, gpu):
        """These settings with each by-device default (None) filled in, for a GPU or a CPU."""
        return dataclasses.replace(self, **{k: v[0 if gpu else 1] for k, v in BY_DEVICE.items() if getattr(self, k) is None})
