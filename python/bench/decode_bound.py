"""The built-in engine's CPU decode against the matmul-rate bound, measured alternately in one process.

  .venv/bin/python python/bench/decode_bound.py MODEL_DIR [--batch 32] [--prompt 46] [--new 128] [--reps 7]

bound: torch's fp32 matmul rate on this CPU (1024^3, --threads threads) / (2 x parameters) tokens/s, the rate a
decode step would reach if it were nothing but its weight matmuls at full speed. Each repetition measures the
matmul rate, then one engine request of --batch random prompts to --new tokens each (no stop token, temperature
1, as a rollout samples), driven as Policy.generate drives it; decode tokens/s leaves the prefill out (its time
measured apart). Also where a decode step's time goes: the forward, the sampling, the rest (scheduling, inputs,
bookkeeping). Prints medians and the per-repetition ratios as one JSON line. On a shared machine the ratio of
each repetition is the number to read, the bound measured beside it.
"""
import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
if not (os.environ.get("GOMP_SPINCOUNT") or os.environ.get("OMP_WAIT_POLICY")):
    os.environ["GOMP_SPINCOUNT"] = "1000"  # as src/worker/client.ts starts the worker (libgomp's wait)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rstar2_worker.engine import engine as E  # noqa: E402
from rstar2_worker.settings import Settings  # noqa: E402
from rstar2_worker.train import policy as P  # noqa: E402


def matmul_gflops(n=1024, reps=10):
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / sorted(ts)[reps // 2] / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=46)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    p = P.Policy(settings=Settings.from_env())  # RSTAR2_* as the worker reads them
    p.load(a.model)
    params = sum(x.numel() for x in p.model.parameters())
    prompts = np.random.default_rng(0).integers(0, p.cfg.vocab_size, size=(a.batch, a.prompt)).tolist()
    sp = {"temperature": 1.0, "topP": 1.0, "topK": -1, "maxNewTokens": a.new, "seed": 1}
    runner = p.engine
    p.engine.run(0, prompts, sp)  # warm-up: the pool, the runner
    spent = collections.Counter()

    def timed(obj, name, key):
        fn = getattr(obj, name)

        def run(*args, **kw):
            t = time.perf_counter()
            out = fn(*args, **kw)
            spent[key] += time.perf_counter() - t
            return out

        setattr(obj, name, run)

    timed(runner.runner, "decode", "forward")
    timed(runner.runner, "prefill", "prefill")
    timed(E.sampler, "sample", "sample")
    reps = []
    for r in range(a.reps):
        gf = matmul_gflops()
        spent.clear()
        t0 = time.perf_counter()
        res = p.engine.run(r + 1, prompts, sp)
        dt = time.perf_counter() - t0
        n = sum(len(x) for x in res["ids"])
        steps = a.new - 1  # the first token comes from the prefill
        decode_s = dt - spent["prefill"]
        tok_s = a.batch * steps / decode_s
        bound = gf * 1e9 / (2 * params)
        reps.append({"gflops": round(gf, 1), "bound_tok_s": round(bound), "decode_tok_s": round(tok_s),
                     "ratio": round(tok_s / bound, 3), "ms_step": round(decode_s / steps * 1e3, 3),
                     "forward_ms": round(spent["forward"] / steps * 1e3, 3),
                     "sample_ms": round(spent["sample"] / a.new * 1e3, 3),
                     "rest_ms": round((decode_s - spent["forward"] - spent["sample"]) / steps * 1e3, 3),
                     "prefill_s": round(spent["prefill"], 3), "tokens": n, "load1": os.getloadavg()[0]})
        print(json.dumps(reps[-1]), file=sys.stderr)
    med = {k: float(np.median([x[k] for x in reps])) for k in reps[0]}
    print(json.dumps({"params": params, "batch": a.batch, "prompt": a.prompt, "new": a.new, "threads": a.threads,
                      "torch": torch.__version__, "median": med, "reps": reps}))


if __name__ == "__main__":
    main()
