"""Entry point: `python -m rstar2_worker`. Frames on stdin/stdout, logs on stderr."""
import ctypes
import os
import sys
import traceback

from rstar2_worker import PROTOCOL_VERSION


def main():
    die_with_parent()
    # frames go to a copy of fd 1, and fd 1 itself becomes stderr: stray prints, and C libraries writing to
    # stdout (NCCL_DEBUG's log does), must never land in the frame stream
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    inp = sys.stdin.buffer
    from rstar2_worker.protocol import write_frame
    from rstar2_worker.settings import Settings

    try:
        settings = Settings.from_env()  # read once, here; passed down from here
    except ValueError as e:
        hello_error(out, PROTOCOL_VERSION, f"ValueError: {e}")
        return 1
    # tests simulate a stale checkout with RSTAR2_WORKER_FAKE_VERSION
    version = PROTOCOL_VERSION if settings.fake_version is None else settings.fake_version
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as e:
        hello_error(
            out,
            version,
            f"PyTorch is not importable by {sys.executable} ({e}). Run `bash scripts/setup.sh` (it installs "
            "python/requirements.txt into .venv), or set RSTAR2_PYTHON to a Python that has torch.",
        )
        return 1
    torch.set_num_threads(settings.threads)
    if not torch.cuda.is_available():
        keep_freed_memory()
    from rstar2_worker.train import dist
    from rstar2_worker import loop

    try:
        r = dist.from_env(settings)
        dist.init(r, settings, report=lambda why: (hello_error(out, version, why), out.flush()))
        from rstar2_worker.train.policy import pick_backend

        pick_backend(settings.model_backend)  # transformers missing: say so now
    except Exception as e:  # bad env, sharding this torch cannot do, unreachable master: say so, don't hang
        traceback.print_exc()
        hello_error(out, version, f"{type(e).__name__}: {e}")
        return 1
    if r.world > 1 or r.sharding != "ddp":
        print(f"rstar2_worker: rank {r.rank}/{r.world} (local {r.local_rank}) joined, sharding {r.sharding}", file=sys.stderr)
    if r.rank == 0:  # the only rank that writes frames: under torchrun every rank shares one stdout
        n = torch.get_num_threads()
        dev = f"cuda ({torch.cuda.get_device_name(r.local_rank)})" if torch.cuda.is_available() else f"cpu ({n} thread{'s' * (n != 1)})"
        write_frame(out, {"op": "hello", "id": 0, "version": version, "torch": torch.__version__, "world": r.world, "device": dev})
    try:
        loop.run(inp, out, r, settings)
    except Exception as e:
        traceback.print_exc()
        gone = dist.peer_gone(r, e)  # a follower waiting on rank 0 for the next request
        if gone:
            print(f"rstar2_worker: rank {r.rank}: {gone}", file=sys.stderr)
        return 2
    if r.world > 1:
        # the client closed us and rank 0 passed it on: the work is done. Tearing down the process group at exit,
        # after a peer has already gone, can abort the process in gloo's threads ("terminate called without an
        # active exception", exit 134, seen on a loaded host), so a rank leaves without the interpreter's teardown
        out.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def die_with_parent():
    """The kernel kills this rank when the process that started it dies (the launcher, torchrun, slurmstepd), even
    by kill -9: a rank other than 0 reads no stdin and would otherwise wait on its peers, holding its ports, until a
    collective timed out. Linux only; elsewhere rank 0 still ends at its stdin's EOF."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    import signal

    # a launcher that died before this line leaves this rank to end at its stdin's EOF (rank 0) or the join timeout
    libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def keep_freed_memory():
    """A CPU step frees its activations and allocates them again in the next. glibc gives a freed block above its
    mmap threshold, and free heap above its trim threshold, back to the kernel, so each step faulted its
    activations in again, a page at a time: on a host where faults are dear (a software-MMU VM) that was a fifth
    to a third of a training step. Blocks up to 32 MiB (mallopt's ceiling) now come from the heap, and up to 256 MiB of it
    is kept free. Not on GPUs, where the CPU's allocations are few and a kept heap would only hold memory. A
    user's own MALLOC_* or GLIBC_TUNABLES settings are left as they are."""
    if "GLIBC_TUNABLES" in os.environ or any(k.startswith("MALLOC_") for k in os.environ):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: its own allocator's defaults
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 256 << 20)  # M_TRIM_THRESHOLD


def hello_error(out, version, msg):
    """Why this rank cannot start: a frame from rank 0; the others say it on stderr and exit, since under
    torchrun, Slurm or on a second node their stdout is shared with rank 0's frames."""
    from rstar2_worker.protocol import write_frame

    if os.environ.get("RANK", "0") == "0":
        write_frame(out, {"op": "hello", "id": 0, "version": version, "error": msg})
    else:
        print(f"rstar2_worker rank {os.environ['RANK']}: {msg}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
