"""Entry point: `python -m rstar2_worker`. Frames on stdin/stdout, logs on stderr."""
import os
import sys
import traceback

from . import PROTOCOL_VERSION


def main():
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # stray prints must never corrupt the frame stream
    inp = sys.stdin.buffer
    from .protocol import write_frame

    # tests simulate a stale checkout with RSTAR2_WORKER_FAKE_VERSION
    version = int(os.environ.get("RSTAR2_WORKER_FAKE_VERSION", PROTOCOL_VERSION))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    try:
        import numpy  # noqa: F401
        import torch
    except ImportError as e:
        write_frame(
            out,
            {
                "op": "hello",
                "id": 0,
                "version": version,
                "error": f"PyTorch is not importable by {sys.executable} ({e}). Install it with "
                "`apt-get install python3-torch python3-numpy`, or set RSTAR2_PYTHON to a Python that has torch.",
            },
        )
        return 1
    torch.set_num_threads(int(os.environ.get("RSTAR2_THREADS", "2")))
    if world > 1:
        import datetime

        import torch.distributed as dist

        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    from .server import serve

    write_frame(out, {"op": "hello", "id": 0, "version": version, "torch": torch.__version__, "rank": rank, "world": world})
    try:
        serve(inp, out, rank, world)
    except Exception:
        traceback.print_exc()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
