"""The built-in engine against transformers' generate, and a multi-turn rollout with and without prefix reuse.

    python3 python/bench/engine_bench.py [--out F.json]      # one GPU (bench/gpu-check.sh)
    python3 python/bench/engine_bench.py --tiny              # smoke test, CPU

decode: a random-init model of Qwen2.5-0.5B's shape in bf16 (gpu_check.HALF_B), prompts of --prompt random
  tokens, every row running to its length (no stop token). The engine is driven as the worker's request loop
  drives it (loop.Generating: the request taken from a frame, stdin polled between steps, the reply written as a
  frame); one full-length warm-up call (it captures the CUDA graphs), then one timed call. transformers: the same
  weights in Qwen2ForCausalLM (sdpa), generate(do_sample, temperature 1, top_k 0, min_new_tokens = max_new_tokens),
  dynamic cache and static cache (compile off), --hf-new tokens (its per-token rate at a shorter length flatters
  it, if anything). tokens/s = generated tokens / wall time of the call, prefill included.
multiturn: --trajectories trajectories, --turns turns each: a turn generates --turn-new tokens, then a tool's
  output of --tool-tokens random tokens is appended and the next turn is requested at once, while the others
  decode. Run with prefix reuse and without (RSTAR2_PREFIX_CACHE=0); re-prefilled tokens = prefill tokens
  computed beyond those never seen before (first prompts, tool outputs, each turn's last sampled token).
"""
import argparse
import collections
import dataclasses
import io
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # rstar2_worker, run from anywhere

import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpu_check  # noqa: E402  (python/bench, beside this file)
from rstar2_worker import loop  # noqa: E402
from rstar2_worker.train import policy as P  # noqa: E402

SAMPLING = {"temperature": 1.0, "topP": 1.0, "topK": -1, "stopTokenIds": [], "stopStrings": []}
TINY = dict(gpu_check.HALF_B, vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON file for every number (written after each measurement)")
    ap.add_argument("--tiny", action="store_true", help="every size shrunk (a CPU smoke test)")
    ap.add_argument("--jobs", default="decode,breakdown,hf,multiturn")
    ap.add_argument("--batches", default=None, help="default 1,32,128 (tiny 1,8)")
    ap.add_argument("--prompt", type=int, default=None, help="default 256 (tiny 32)")
    ap.add_argument("--new", type=int, default=None, help="default 512 (tiny 32)")
    ap.add_argument("--hf-new", type=int, default=None, help="transformers' new tokens (default 128; tiny 16)")
    ap.add_argument("--trajectories", type=int, default=None, help="default 256 (tiny 16)")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--turn-new", type=int, default=None, help="default 128 (tiny 16)")
    ap.add_argument("--tool-tokens", type=int, default=32)
    ap.add_argument("--precision", default="bf16")
    return ap.parse_args()


A = args()
CFG = TINY if A.tiny else gpu_check.HALF_B
BATCHES = [int(x) for x in (A.batches or ("1,8" if A.tiny else "1,32,128")).split(",")]
PROMPT, NEW = A.prompt or (32 if A.tiny else 256), A.new or (32 if A.tiny else 512)
HF_NEW = A.hf_new or (16 if A.tiny else 128)
TRAJ, TURN_NEW = A.trajectories or (16 if A.tiny else 256), A.turn_new or (16 if A.tiny else 128)
CUDA = torch.cuda.is_available()
DEV = torch.device("cuda", 0) if CUDA else torch.device("cpu")
R = {"meta": {"device": torch.cuda.get_device_name() if CUDA else "cpu", "torch": torch.__version__, "config": CFG,
              "precision": A.precision, "prompt": PROMPT, "new": NEW, "hf_new": HF_NEW},
     "decode": [], "hf": [], "multiturn": [], "errors": []}


def log(msg):
    print(f"engine_bench: {msg}", flush=True)


def save():
    if A.out:
        with open(A.out, "w") as f:
            json.dump(R, f, indent=1)


def sync():
    if CUDA:
        torch.cuda.synchronize()


def as_worker():
    """What a CUDA rank of the worker sets (dist.init): tensors made without a device land on the GPU."""
    if CUDA and hasattr(torch, "set_default_device"):
        torch.cuda.set_device(0)
        torch.set_default_device(DEV)


def new_policy():
    p = P.Policy(settings=gpu_check.settings(precision=A.precision))
    p.init(CFG, 0)
    return p


class Driver:
    """Requests into the engine the way the worker's loop takes them; replies decoded from the frames it writes."""

    def __init__(self, p):
        self.p, self.out = p, io.BytesIO()
        self.gen = loop.Generating(p.engine, self.out)
        rfd, self.wfd = os.pipe()  # stdin with nothing waiting, as in a rollout between requests
        self.inp = os.fdopen(rfd, "rb", buffering=0)
        self.early = collections.deque()
        self.next_id = 1

    def submit(self, prompts, sampling):
        rid = self.next_id
        self.next_id += 1
        flat = np.asarray([t for r in prompts for t in r], dtype=np.int32)
        lens = np.asarray([len(r) for r in prompts], dtype=np.int32)
        self.gen.take(({"op": "generate", "id": rid, "sampling": sampling}, {"ids": flat, "lens": lens}))
        return rid

    def step(self):
        """One step of the worker's loop: stdin polled, an engine step, each finished request's reply written."""
        self.gen.poll(self.inp, self.early)
        done = self.gen.step()
        self.out.seek(0)
        self.out.truncate()
        return done

    def drain(self):
        got = {}
        while self.p.engine.has_work():
            got.update(self.step())
        return got


def rand_prompts(n, length, seed):
    g = np.random.default_rng(seed)
    return g.integers(0, CFG["vocab_size"], size=(n, length)).tolist()


def decode_job(p):
    d = Driver(p)
    for B in BATCHES:
        prompts = rand_prompts(B, PROMPT, B)
        sp = dict(SAMPLING, maxNewTokens=NEW, seed=1)
        try:
            d.submit(prompts, sp)
            d.drain()  # warm-up: the same shape, so every graph this shape needs is captured
            st0 = dict(p.engine.stats)
            sync()
            t0 = time.perf_counter()
            d.submit(prompts, sp)
            got = d.drain()
            sync()
            dt = time.perf_counter() - t0
            n = sum(len(x) for res in got.values() for x in res["ids"])
            steps = p.engine.stats["decode_steps"] - st0["decode_steps"]
            rec = {"batch": B, "new": NEW, "tokens": n, "time_s": round(dt, 3), "tok_s": round(n / dt, 1),
                   "decode_steps": steps, "ms_per_step": round(dt / max(steps, 1) * 1e3, 3),
                   "graphs": p.engine.runner.mode, "captures": p.engine.runner.captures,
                   "capture_s": round(p.engine.runner.capture_s, 2)}
            R["decode"].append(rec)
            log(f"engine batch {B}: {rec['tok_s']} tok/s ({rec['ms_per_step']} ms a step, graphs {rec['graphs']})")
        except Exception as e:  # noqa: BLE001 - the next measurement still runs
            failed(f"engine batch {B}", e)
        save()


def breakdown_job(p):
    """Where a decode step's time goes at the largest batch: the forward (graph replay), sampling, and the rest
    (scheduling, inputs, bookkeeping), each timed with the GPU synchronised around it (slower than the timed run)."""
    from rstar2_worker.engine import engine as E

    B = BATCHES[-1]
    runner, sample = p.engine.runner, E.sampler.sample
    spent = collections.Counter()

    def timed(name, fn):
        def run(*a, **k):
            sync()
            t = time.perf_counter()
            out = fn(*a, **k)
            sync()
            spent[name] += time.perf_counter() - t
            return out
        return run

    runner.decode = timed("forward", runner.decode)
    E.sampler.sample = timed("sample", sample)
    try:
        d = Driver(p)
        d.submit(rand_prompts(B, PROMPT, B), dict(SAMPLING, maxNewTokens=NEW, seed=2))
        steps0 = p.engine.stats["decode_steps"]
        sync()
        t0 = time.perf_counter()
        d.drain()
        sync()
        total = time.perf_counter() - t0
        steps = p.engine.stats["decode_steps"] - steps0
        rec = {"batch": B, "steps": steps, "ms_per_step": round(total / steps * 1e3, 3)}
        rec.update({f"{k}_ms": round(v / steps * 1e3, 3) for k, v in spent.items()})
        rec["rest_ms"] = round(rec["ms_per_step"] - sum(v / steps * 1e3 for v in spent.values()), 3)
        R["breakdown"] = rec
        log(f"breakdown at batch {B}: {rec}")
    finally:
        del runner.decode
        E.sampler.sample = sample
    save()


def hf_job(p):
    import transformers as TF

    conf = TF.Qwen2Config(**{k: v for k, v in CFG.items() if k != "model_type"})
    dtype = torch.bfloat16 if A.precision == "bf16" else torch.float32
    m = TF.AutoModelForCausalLM.from_config(conf, attn_implementation="sdpa", dtype=dtype).to(DEV).eval()
    with torch.no_grad():
        m.load_state_dict(p.model.state_dict(), strict=False)
    m.generation_config.eos_token_id = None
    m.config.eos_token_id = None
    for B in BATCHES:
        for cache in ("dynamic", "static"):
            try:
                ids = torch.tensor(rand_prompts(B, PROMPT, B), device=DEV)
                kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=HF_NEW, min_new_tokens=HF_NEW,
                          attention_mask=torch.ones_like(ids))
                if cache == "static":
                    kw.update(cache_implementation="static", disable_compile=True)
                with torch.no_grad():
                    m.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
                    sync()
                    t0 = time.perf_counter()
                    out = m.generate(ids, **kw)
                    sync()
                dt = time.perf_counter() - t0
                n = (out.shape[1] - ids.shape[1]) * B
                rec = {"batch": B, "cache": cache, "new": HF_NEW, "tok_s": round(n / dt, 1), "ms_per_step": round(dt / HF_NEW * 1e3, 2)}
                R["hf"].append(rec)
                log(f"transformers {cache} batch {B}: {rec['tok_s']} tok/s ({rec['ms_per_step']} ms a step)")
            except Exception as e:  # noqa: BLE001
                failed(f"transformers {cache} batch {B}", e)
            save()
    del m
    for rec in R["decode"]:
        for hf in R["hf"]:
            if hf["batch"] == rec["batch"]:
                rec[f"x_{hf['cache']}"] = round(rec["tok_s"] / hf["tok_s"], 2)
    save()


def multiturn_job(p, prefix_cache):
    p.settings = dataclasses.replace(p.settings, prefix_cache=prefix_cache)
    p.engine.release()  # the next pool is built with the new setting
    d = Driver(p)
    g = np.random.default_rng(7)
    first = rand_prompts(TRAJ, PROMPT, 3)
    ctx = {}  # request id → (trajectory, turn, its prompt)
    sp = lambda t: dict(SAMPLING, maxNewTokens=TURN_NEW, seeds=[t])  # noqa: E731
    st0 = dict(p.engine.stats)
    fresh = 0  # tokens no earlier turn has seen: first prompts, tool outputs, each turn's last sampled token
    sync()
    t0 = time.perf_counter()
    for t, q in enumerate(first):
        ctx[d.submit([q], sp(t))] = (t, 0, q)
        fresh += len(q)
    generated = 0
    while p.engine.has_work():
        for rid, res in d.step():
            t, turn, q = ctx.pop(rid)
            out = res["ids"][0]
            generated += len(out)
            if turn + 1 < A.turns:
                tool = g.integers(0, CFG["vocab_size"], size=A.tool_tokens).tolist()
                nxt = q + out + tool
                fresh += len(tool) + 1
                ctx[d.submit([nxt], sp(t))] = (t, turn + 1, nxt)
    sync()
    dt = time.perf_counter() - t0
    computed = p.engine.stats["prefill_tokens"] - st0["prefill_tokens"]
    rec = {"prefix_cache": prefix_cache, "trajectories": TRAJ, "turns": A.turns, "generated": generated,
           "time_s": round(dt, 2), "tok_s": round(generated / dt, 1), "prefill_computed": computed,
           "re_prefilled": computed - fresh, "cached_tokens": p.engine.stats["cached_tokens"] - st0["cached_tokens"],
           "retractions": p.engine.stats["retractions"] - st0["retractions"], "kv_capacity": p.engine.kv.blocks.capacity}
    R["multiturn"].append(rec)
    log(f"multi-turn, prefix cache {'on' if prefix_cache else 'off'}: {rec['tok_s']} tok/s, "
        f"re-prefilled {rec['re_prefilled']} tokens, {rec['retractions']} retractions")
    save()


def failed(what, e):
    R["errors"].append({"what": what, "error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
    log(f"{what}: FAILED {type(e).__name__}: {e}")
    save()


def main():
    as_worker()
    p = new_policy()
    jobs = A.jobs.split(",")
    if "decode" in jobs:
        decode_job(p)
    if "breakdown" in jobs:
        try:
            breakdown_job(p)
        except Exception as e:  # noqa: BLE001
            failed("breakdown", e)
    if "hf" in jobs:
        try:
            hf_job(p)
        except Exception as e:  # noqa: BLE001
            failed("transformers", e)
    if "multiturn" in jobs:
        for on in (True, False):
            try:
                multiturn_job(p, on)
            except Exception as e:  # noqa: BLE001
                failed(f"multiturn prefix_cache={on}", e)
        on, off = R["multiturn"][0:2] if len(R["multiturn"]) == 2 else (None, None)
        if on and off:
            R["multiturn_fewer_re_prefilled"] = round(1 - on["re_prefilled"] / max(off["re_prefilled"], 1), 4)
            log(f"prefix reuse: {R['multiturn_fewer_re_prefilled'] * 100:.1f} % fewer re-prefilled tokens")
    from rstar2_worker.models import layers as L

    R["meta"]["compiled"] = bool(L.FUSED)
    save()
    print(json.dumps({k: R[k] for k in ("decode", "hf", "multiturn", "errors")}, indent=1))
    sys.exit(1 if R["errors"] else 0)


if __name__ == "__main__":
    main()
