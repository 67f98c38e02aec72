"""The policy worker's train step against the plain loop a user would write with transformers, in one process on
one GPU (bench/gpu-check.sh runs it; docs/RESULTS.md "On GPUs" reports it).

    python python/bench/train_bench.py [--cases 0.5b-bf16,0.5b-bf16-mixed,0.5b-packed,3b-bf16] [--variants]
                                       [--profile] [--out FILE.json]

Each case: random weights of the shape (transformers initialises them, the worker loads the same ones), one
sequence of 8,192 tokens; the worker's `Policy.train_step` as gpu_check's throughput step calls it (SFT loss,
log-probs in slices, fused AdamW), against `loss = model(ids, labels=ids).loss`, backward, clip, AdamW(fused) with
AutoModelForCausalLM on SDPA. Warm-up steps first (the worker's include compiling model.compile's pieces), then
the median. 0.5b-packed: a GRPO batch of 32 sequences of 256-2,048 tokens packed to 16K with checkpointing,
against the worker's own one-sequence rate. MFU counts weights (PaLM: 6 × non-embedding parameters a token) and
causal attention's scores, as gpu_check does, against the GPU's dense bf16 peak. --variants: the 0.5B bf16 step
with model.compile off and with other log-prob slice sizes. --profile: one
step's kernels of each 0.5B case under torch.profiler.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # rstar2_worker, run from anywhere

import torch  # noqa: E402

import gpu_check  # noqa: E402  (python/bench, beside this file)
from rstar2_worker.models import layers as L  # noqa: E402
from rstar2_worker.models import model as M  # noqa: E402
from tests.train_opts import full_train_opts  # noqa: E402

THREE_B = dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
               num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
               tie_word_embeddings=True)  # Qwen2.5-3B's config.json
SHAPES = {"0.5b": gpu_check.HALF_B, "3b": THREE_B}
CASES = ("0.5b-bf16", "0.5b-bf16-mixed", "0.5b-packed", "3b-bf16")
T = 8192
TARGETS = {"ratio": 1.1, "memory": 0.6, "mfu": {"0.5b": 30.0, "3b": 45.0}, "packed": 0.9}


def median_step(step, warmup, steps):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def flops(cfg, lens):
    with torch.device("meta"):  # counted, not allocated
        n = M.count_params(M.CausalLM(M.Config(cfg))) - cfg["vocab_size"] * cfg["hidden_size"]  # a lookup is no matmul
    L, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    return 6 * n * sum(lens) + 12 * L * h * sum(x * x for x in lens)


def hf_model(cfg, precision):
    import transformers

    c = transformers.Qwen2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    torch.manual_seed(0)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return transformers.AutoModelForCausalLM.from_config(c, attn_implementation="sdpa", dtype=dtype).cuda()


def hf_loop(model, precision, ids):
    """The loop a user writes: loss from labels, backward, clip, fused AdamW."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    model.train()

    def step():
        with autocast:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def worker(cfg, precision, state):
    """The policy worker with the transformers model's weights."""
    from rstar2_worker.train.policy import Policy

    p = Policy(settings=gpu_check.settings(precision=precision))
    init = M.CausalLM.init_weights
    M.CausalLM.init_weights = lambda self, seed: None  # drawn on the CPU (15 s at 3B) only to be overwritten next
    try:
        p.init(cfg, 0)
    finally:
        M.CausalLM.init_weights = init
    with torch.no_grad():
        missing, unexpected = p.model.load_state_dict(state, strict=False)
    left = [k for k in missing if k != "lm_head.weight"] + [k for k in unexpected if "rotary" not in k]
    assert not left, f"the worker and transformers name different weights: {left}"
    return p


def measure(label, step, lens, cfg, peak_tflops, warmup, steps):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        dt = median_step(step, warmup, steps)
    except torch.cuda.OutOfMemoryError as e:
        print(f"train-bench: {label}: out of memory ({str(e).splitlines()[0]})", flush=True)
        return None
    r = {"tokensPerS": sum(lens) / dt, "stepMs": dt * 1e3, "peakGiB": torch.cuda.max_memory_allocated() / 2**30,
         "mfu": 100 * flops(cfg, lens) / dt / (peak_tflops * 1e12) if peak_tflops else None}
    mfu = f", MFU {r['mfu']:.1f} %" if r["mfu"] is not None else ""
    print(f"train-bench: {label}: {r['tokensPerS']:,.0f} tokens/s ({r['stepMs']:.1f} ms a step, median of {steps}){mfu}, "
          f"peak {r['peakGiB']:.1f} GiB", flush=True)
    return r


def sft_args(seq):
    return ("sft", [seq], [[0] + [1] * (len(seq) - 1)], [None], [0.0], full_train_opts(1e-5, microBatchTokens=len(seq)))


def grpo_args(g, V):
    lens = torch.randint(256, 2049, (32,), generator=g, device="cpu").tolist()
    rl = [torch.randint(0, V, (n,), generator=g, device="cpu").tolist() for n in lens]
    return lens, ("grpo", rl, [[0] * 128 + [1] * (n - 128) for n in lens], [None] * len(rl),
                  [(-1.0) ** i for i in range(len(rl))],
                  full_train_opts(1e-5, maxTokensPerMicroBatch=16384, gradientCheckpointing=True))


def profile_step(step):
    """Kernels, their count and the GPU's busy time in one step, against the step's wall time."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
        step()
        torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    ka = pr.key_averages()
    key = "self_device_time_total" if hasattr(ka[0], "self_device_time_total") else "self_cuda_time_total"
    kern = [e for e in ka if getattr(e, key) > 0 and getattr(e, "device_type", None) is not None and e.device_type.name == "CUDA"]
    busy = sum(getattr(e, key) for e in kern) / 1e3
    syncs = sum(e.count for e in ka if e.key == "cudaStreamSynchronize")
    print(f"train-bench: profile: GPU busy {busy:.1f} ms in {sum(e.count for e in kern)} kernels, step {wall:.1f} ms "
          f"under the profiler, {syncs} waits on the GPU", flush=True)
    for e in sorted(kern, key=lambda e: -getattr(e, key))[:25]:
        print(f"  {getattr(e, key) / 1e3:8.2f} ms  n={e.count:5d}  {e.key[:110]}")
    host = [e for e in ka if e not in kern and e.self_cpu_time_total > 0]
    print("train-bench: profile: host time by operation (self)")
    for e in sorted(host, key=lambda e: -e.self_cpu_time_total)[:15]:
        print(f"  {e.self_cpu_time_total / 1e3:8.2f} ms  n={e.count:5d}  {e.key[:110]}")
    return {"busyMs": busy, "kernels": sum(e.count for e in kern), "wallMs": wall, "syncs": syncs}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python python/bench/train_bench.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--variants", action="store_true", help="the 0.5B bf16 step without compile and with other slice sizes")
    ap.add_argument("--profile", action="store_true", help="one step of each 0.5B case under torch.profiler")
    ap.add_argument("--out", help="results as JSON")
    a = ap.parse_args(argv)
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}; cases are {', '.join(CASES)}")
    if not torch.cuda.is_available():
        print("train-bench: needs a CUDA GPU", file=sys.stderr)
        return 2
    import transformers

    torch.set_default_device("cuda")
    name = torch.cuda.get_device_name()
    peak = float(os.environ.get("RSTAR2_PEAK_TFLOPS") or next((v for k, v in gpu_check.PEAK_TFLOPS.items() if k in name), 0))
    R = {"meta": {"gpu": name, "torch": torch.__version__, "transformers": transformers.__version__, "tokens": T,
                  "warmup": a.warmup, "steps": a.steps, "peakTflops": peak, "compile": gpu_check.settings().compile}, "cases": {}}
    print(f"train-bench: {name}, torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    g = torch.Generator().manual_seed(0)
    for case in cases:
        shape, precision = case.split("-", 1)
        cfg = SHAPES[shape]
        precision = "bf16" if precision == "packed" else precision
        seq = torch.randint(0, cfg["vocab_size"], (T,), generator=g, device="cpu").tolist()
        hf = hf_model(cfg, precision)
        state = {k: v for k, v in hf.state_dict().items()}
        out = {}
        p = worker(cfg, precision, state)
        del state
        if case.endswith("packed"):
            lens, args = grpo_args(g, cfg["vocab_size"])
            del hf
            out["worker"] = measure(f"{case}, worker", lambda: p.train_step(*args), lens, cfg, peak, a.warmup, a.steps)
            if a.profile:
                out["profile"] = profile_step(lambda: p.train_step(*args))
            one = measure(f"{case}, worker one sequence", lambda: p.train_step(*sft_args(seq)), [T], cfg, peak, a.warmup, a.steps)
            out["oneSequence"] = one
            if out["worker"] and one:
                out["ratio"] = out["worker"]["tokensPerS"] / one["tokensPerS"]
                print(f"train-bench: {case}: {out['ratio']:.2f}x the one-sequence rate (target >= {TARGETS['packed']})")
        else:
            ids = torch.tensor([seq], device="cuda")
            hf.cpu()  # each side measured with only its own model on the GPU
            torch.cuda.empty_cache()
            out["worker"] = measure(f"{case}, worker", lambda: p.train_step(*sft_args(seq)), [T], cfg, peak, a.warmup, a.steps)
            if a.profile and shape == "0.5b":
                out["profile"] = profile_step(lambda: p.train_step(*sft_args(seq)))
            if a.variants and case == "0.5b-bf16":
                out["variants"] = variants(p, seq, cfg, peak)
            p.model.cpu()
            p.opt = None
            torch.cuda.empty_cache()
            hf.cuda()
            out["transformers"] = measure(f"{case}, transformers", hf_loop(hf, precision, ids), [T], cfg, peak, a.warmup, a.steps)
            del hf
            w, t = out["worker"], out["transformers"]
            if w and t:
                out["ratio"] = w["tokensPerS"] / t["tokensPerS"]
                out["memoryRatio"] = w["peakGiB"] / t["peakGiB"]
                print(f"train-bench: {case}: {out['ratio']:.2f}x transformers' tokens/s (target >= {TARGETS['ratio']}), "
                      f"{100 * out['memoryRatio']:.0f} % of its peak memory (target <= {100 * TARGETS['memory']:.0f} %)"
                      + (f", MFU {w['mfu']:.1f} % (target >= {TARGETS['mfu'][shape]:.0f} %)" if precision == "bf16" and w["mfu"] else ""),
                      flush=True)
        R["cases"][case] = out
        del p
        torch.cuda.empty_cache()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(R, f, indent=2)
    return 0


def variants(p, seq, cfg, peak):
    """The same step with one thing changed at a time, in the same process."""
    out = {}
    saved_pieces, saved_chunk = dict(L.PIECES), M.LOGITS_CHUNK_BYTES
    step = lambda: p.train_step(*sft_args(seq))  # noqa: E731
    try:
        L.PIECES.clear()
        out["compile off"] = measure("0.5b-bf16 variant: model.compile off", step, [T], cfg, peak, 2, 3)
        L.PIECES.update(saved_pieces)
        for mib in (128, 512, 1024, 2048):
            M.LOGITS_CHUNK_BYTES = mib << 20
            out[f"slices of {mib} MiB"] = measure(f"0.5b-bf16 variant: log-prob slices of {mib} MiB", step, [T], cfg, peak, 2, 3)
    finally:
        L.PIECES.clear()
        L.PIECES.update(saved_pieces)
        M.LOGITS_CHUNK_BYTES = saved_chunk
    return out


if __name__ == "__main__":
    sys.exit(main())
