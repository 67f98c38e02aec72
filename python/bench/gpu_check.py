"""GPU checks run by bench/gpu-check.sh: `python python/bench/gpu_check.py preflight|parity|generate|...`.

parity: random-init Qwen2 and Qwen3 models built by transformers, saved with save_pretrained, loaded by the
worker; logits and one SFT step's loss are compared with transformers' own, and the worker's sharded save is
loaded back by transformers' from_pretrained. generate: the embedded engine's greedy tokens against
transformers' generate, a stop token, and its sampled log-probs against its own scoring. hf-backend: model.backend
'transformers' on an architecture the built-in model lacks (Llama): the worker's log-probs and SFT loss against
transformers' own. logprob-grad: the chunked log-prob gradients in bf16 against full fp32 logits, plain and
compiled. compiled: model.compile's pieces against the modules' forward, log-probs and gradients. throughput:
bf16 and bf16-mixed training steps on a random ~0.5B model (Qwen2.5-0.5B's shape): one sequence of 4K and of 8K
tokens, and a GRPO batch of 32 packed sequences; tokens/s and MFU.
"""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # rstar2_worker, run from anywhere

from tests.train_opts import full_train_opts  # noqa: E402  (python/tests: the train options tests and benches send)


def settings(**over):
    """The worker's settings as the environment gives them (RSTAR2_*), with `over` in place of some."""
    import dataclasses

    from rstar2_worker.settings import Settings

    return dataclasses.replace(Settings.from_env(), **over)


def fail(msg):
    print(f"gpu-check: {msg}", file=sys.stderr)
    sys.exit(2)


def preflight():
    try:
        import torch
    except ImportError as e:
        fail(f"torch is not importable by {sys.executable} ({e})")
    if int(torch.__version__.split(".")[0]) < 2:
        fail(f"needs torch >= 2; {sys.executable} has {torch.__version__}")
    if not torch.cuda.is_available():
        fail(f"no CUDA device is visible to {sys.executable} (torch {torch.__version__})")
    try:
        import transformers
    except ImportError as e:
        fail(f"transformers is not importable by {sys.executable} ({e}); pip install transformers")
    print(f"gpu-check: {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}")


def on_gpu():
    import torch

    torch.set_default_device("cuda")
    from rstar2_worker.train.policy import Policy

    return torch, Policy


SMALL = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=2048, rope_theta=1e6, tie_word_embeddings=False)


def parity():
    torch, Policy = on_gpu()
    import transformers

    bad = []
    # qwen2-yarn: rope_scaling as Qwen2.5 publishes it (original_max_position_embeddings left to default, which
    # transformers versions agree on)
    for kind in ("qwen2", "qwen3", "qwen2-yarn"):
        cls = getattr(transformers, "Qwen3ForCausalLM" if kind == "qwen3" else "Qwen2ForCausalLM")
        conf_cls = getattr(transformers, "Qwen3Config" if kind == "qwen3" else "Qwen2Config")
        extra = {"head_dim": 64} if kind == "qwen3" else {}
        if kind == "qwen2-yarn":
            extra = {"rope_scaling": {"type": "yarn", "factor": 4.0}}
        torch.manual_seed(0)
        hf = cls(conf_cls(**SMALL, **extra)).float().eval()
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)  # safetensors: the default since transformers 4.35
            with open(os.path.join(d, "config.json")) as f:
                saved = json.load(f)
            p = Policy(settings=settings())
            p.load(d)
        rope_keys = "rope_parameters" if "rope_parameters" in saved else "rope_theta/rope_scaling"
        ids = torch.randint(0, SMALL["vocab_size"], (2, 64))
        with torch.no_grad(), tempfile.TemporaryDirectory() as d:
            ref = hf(ids).logits.float()[:, :-1]
            ours = p.forward_module(ids, drop_last=True).float()
            p.save(d, False, 2)  # our HF shards, read back by transformers
            back = cls.from_pretrained(d).float().eval()(ids).logits.float()[:, :-1]
        diff = max((ref - ours).abs().max().item(), (back - ours).abs().max().item())
        seq = ids[0].tolist()
        hf.train()
        ref_loss = hf(ids[:1], labels=ids[:1]).loss.item()
        st = p.train_step("sft", [seq], [[0] + [1] * (len(seq) - 1)], [None], [0.0], full_train_opts(0.0))
        dloss = abs(st["loss"] - ref_loss)
        ok = diff < 2e-2 and dloss < 1e-3  # bf16-level tolerance on fp32 models: kernels differ, not the math
        print(f"parity {kind} (config.json with {rope_keys}): max |logits diff| {diff:.2e}, loss {st['loss']:.5f} vs transformers {ref_loss:.5f} {'ok' if ok else 'FAIL'}")
        if not ok:
            bad.append(kind)
    if bad:
        sys.exit(1)


def hf_backend():
    torch, Policy = on_gpu()
    import transformers

    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMALL)).float().eval()
    ids = torch.randint(0, SMALL["vocab_size"], (1, 64))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)  # safetensors: the default since transformers 4.35
        p = Policy(settings=settings())
        p.backend = "transformers"
        p.load(d)
    seq = ids[0].tolist()
    with torch.no_grad():
        ref = torch.log_softmax(hf(ids).logits.float()[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    ours = torch.tensor(p.logprobs([seq])[0][0][1:], device=ref.device)
    diff = (ref - ours).abs().max().item()
    hf.train()
    ref_loss = hf(ids, labels=ids).loss.item()
    st = p.train_step("sft", [seq], [[0] + [1] * (len(seq) - 1)], [None], [0.0], full_train_opts(0.0))
    ok = diff < 2e-2 and abs(st["loss"] - ref_loss) < 1e-3
    print(f"hf-backend llama: max |logprob diff| {diff:.2e}, loss {st['loss']:.5f} vs transformers {ref_loss:.5f} {'ok' if ok else 'FAIL'}")
    if not ok:
        sys.exit(1)


def generate():
    """The embedded engine on the GPU: greedy tokens as transformers' generate picks them (prompts of two lengths,
    so the batch is left-padded), and sampled log-probs as the worker's own scoring gives them (the RL ratio)."""
    torch, Policy = on_gpu()
    import transformers

    torch.manual_seed(0)
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**SMALL, head_dim=64)).float().eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        p = Policy(settings=settings())
        p.load(d)
    prompts = [torch.randint(0, SMALL["vocab_size"], (n,)).tolist() for n in (17, 40)]
    ours, _, _ = p.generate(prompts, {"temperature": 0.0, "maxNewTokens": 32})
    same = 0
    for prompt, got in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), max_new_tokens=32, min_new_tokens=32, do_sample=False)
        want = ref[0, len(prompt) :].tolist()
        same += got == want
    # a stop token that ends the first row early, so the batch drops a finished row and goes on with the other
    stop = ours[0][5]
    cut, _, finish = p.generate(prompts, {"temperature": 0.0, "maxNewTokens": 32, "stopTokenIds": [stop]})
    want = [o[: o.index(stop) + 1] if stop in o else o for o in ours]
    stops = cut == want and finish[0] == "stop"
    ids, lps, _ = p.generate(prompts, {"temperature": 1.0, "topK": 50, "topP": 0.9, "maxNewTokens": 64, "seed": 1})
    scored = p.logprobs([q + o for q, o in zip(prompts, ids)])[0]
    diff = max(abs(a - b) for q, o, lp, sc in zip(prompts, ids, lps, scored) for a, b in zip(lp, sc[len(q) :]))
    ok = same == len(prompts) and stops and diff < 1e-3
    print(f"generate: greedy equal to transformers' for {same}/{len(prompts)} prompts; a stop token ends its row "
          f"{'as it should' if stops else 'WRONG'}; top-k/top-p sampled vs scored log-probs max diff {diff:.2e} "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        sys.exit(1)


def logprob_grad():
    """The log-prob slices' gradients in bf16 (bf16 weights, and fp32 weights under autocast as bf16-mixed
    trains) against full fp32 logits: the lm_head's gradient is accumulated inside each slice's product."""
    torch, _ = on_gpu()
    import torch.nn.functional as F

    from rstar2_worker.models import model as M

    torch.manual_seed(0)
    V, H, N = 151936, 896, 4000  # Qwen's vocabulary; 4,000 tokens are 3 of the default slices
    w32 = torch.randn(V, H) * 0.02
    h32, t, g = torch.randn(N, H), torch.randint(0, V, (N,)), torch.randn(N)
    h_ref, w_ref = h32.clone().requires_grad_(), w32.clone().requires_grad_()
    ref = torch.log_softmax(F.linear(h_ref, w_ref), -1).gather(-1, t[:, None])[:, 0]
    (ref * g).sum().backward()
    bad = []
    for pieces in ("off", "on"):  # the slices' arithmetic as plain operations, then compiled (model.compile)
        M.compile_pieces(pieces, "cuda")
        for mode in ("bf16", "bf16-mixed"):
            dt = torch.bfloat16 if mode == "bf16" else torch.float32
            h, w = h32.to(dt).detach().requires_grad_(), w32.to(dt).detach().requires_grad_()  # fp32: not h32 itself
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16-mixed"):
                lp, _, _ = M.ChunkedLogprobs.apply(h, w, t, 1.0, M.LOGITS_CHUNK_BYTES // (4 * V))
            (lp * g).sum().backward()
            rel = [((a.grad.float() - b.grad).abs().max() / b.grad.abs().max()).item() for a, b in ((h, h_ref), (w, w_ref))]
            ok = max(rel) < 2e-2  # bf16 products against fp32 ones
            print(f"logprob-grad {mode}, model.compile {pieces}: relative max diff vs fp32 full logits, hidden {rel[0]:.1e}, "
                  f"lm_head {rel[1]:.1e}; lm_head gradient accumulated "
                  f"{'inside the product' if M.MM_OUT_DTYPE[0] else 'by cast and add (no addmm out_dtype in this torch)'} "
                  f"{'ok' if ok else 'FAIL'}")
            if not ok:
                bad.append(f"{mode} {pieces}")
    if bad:
        sys.exit(1)


def compiled():
    """model.compile's pieces against the modules' own forward on the GPU: log-probs, entropy and every
    gradient of a train-like loss, padded and packed (varlen attention) rows, checkpointing, fp32, bf16 and
    bf16 autocast, Qwen2 (q/k/v biases) and Qwen3 (q/k norms)."""
    torch, _ = on_gpu()
    from rstar2_worker.models import model as M

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, SMALL["vocab_size"], (n,), generator=g, device="cpu").tolist() for n in (300, 17, 129, 64)]
    bad = []
    cases = [("qwen2", "fp32", False), ("qwen2", "bf16-mixed", True), ("qwen3", "bf16", False), ("qwen3", "bf16", True)]
    for kind, mode, packed in cases:
        extra = {"attention_bias": True} if kind == "qwen2" else {"model_type": "qwen3", "head_dim": 64}
        if True:
            if True:
                torch.manual_seed(0)
                m = M.CausalLM(M.Config({**SMALL, **extra}))
                m.init_weights(0)
                m = m.to(torch.bfloat16 if mode == "bf16" else torch.float32).train()
                m.gradient_checkpointing = packed
                got = []
                for pieces in ("off", "on"):
                    M.compile_pieces(pieces, "cuda")
                    m.zero_grad(set_to_none=True)
                    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "bf16-mixed"):
                        lp, ent, _, _ = m(rows=rows, packed=packed, device="cuda")
                    (lp * torch.linspace(-1, 1, lp.shape[0])).sum().backward()
                    got.append((lp.detach().float(), ent.float(), {n: p.grad.float() for n, p in m.named_parameters()}))
                (lp0, e0, g0), (lp1, e1, g1) = got
                tol = 1e-4 if mode == "fp32" else 3e-2  # fp32: kernels sum in other orders; bf16: rounding points move
                d_lp = ((lp1 - lp0).abs().max() / lp0.abs().max()).item()
                d_g = max(((g1[n] - g0[n]).abs().max() / g0[n].abs().max().clamp(min=1e-12)).item() for n in g0)
                ok = d_lp < tol and d_g < tol * 10 and (e1 - e0).abs().max().item() < tol * 10
                print(f"compiled {kind} {mode} {'packed, checkpointing' if packed else 'padded'}: relative max diff, log-probs "
                      f"{d_lp:.1e}, gradients {d_g:.1e} {'ok' if ok else 'FAIL'}")
                if not ok:
                    bad.append(f"{kind} {mode} {packed}")
    M.compile_pieces("off", "cuda")
    if bad:
        sys.exit(1)


# Qwen2.5-0.5B's shape, random weights
HALF_B = dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
              num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6,
              tie_word_embeddings=True)
PEAK_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}  # dense bf16


def timed(torch, p, args):
    """Median seconds of 3 train steps after a warm-up (allocator, kernels); None when out of memory."""
    try:
        p.train_step(*args)
        torch.cuda.synchronize()
        times = []
        for _ in range(3):
            t0 = time.time()
            p.train_step(*args)
            torch.cuda.synchronize()
            times.append(time.time() - t0)
    except torch.cuda.OutOfMemoryError as e:
        print(f"  out of memory ({str(e).splitlines()[0]})")
        torch.cuda.empty_cache()
        return None
    return sorted(times)[1]


def waits(torch, p, args):
    """How often one train step waits on the GPU (cudaStreamSynchronize): each wait lets the GPU run dry
    while Python catches up. 582 a step from the foreach AdamW's step counts cost an H200 ~4k of 47k tokens/s."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as pr:
        p.train_step(*args)
        torch.cuda.synchronize()
    return sum(e.count for e in pr.key_averages() if e.key == "cudaStreamSynchronize")


def throughput():
    torch, Policy = on_gpu()
    name = torch.cuda.get_device_name()
    peak = float(os.environ.get("RSTAR2_PEAK_TFLOPS") or next((v for k, v in PEAK_TFLOPS.items() if k in name), 0))
    L, h, V = HALF_B["num_hidden_layers"], HALF_B["hidden_size"], HALF_B["vocab_size"]
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(256, 2049, (32,), generator=g, device="cpu").tolist()
    rl = [torch.randint(0, V, (n,), generator=g, device="cpu").tolist() for n in lens]  # an RL batch: 128-token prompts
    cases = [(f"{T} tokens, one sequence", ("sft", [seq], [[0] + [1] * (T - 1)], [None], [0.0], {"microBatchTokens": T}))
             for T in (4096, 8192) for seq in [torch.randint(0, V, (T,), generator=g, device="cpu").tolist()]]
    cases.append((
        f"GRPO, {len(rl)} sequences of 256-2048 tokens ({sum(lens):,}) packed to 16K, checkpointing",
        ("grpo", rl, [[0] * 128 + [1] * (n - 128) for n in lens], [None] * len(rl), [(-1.0) ** i for i in range(len(rl))],
         {"maxTokensPerMicroBatch": 16384, "gradientCheckpointing": True}),
    ))
    from rstar2_worker.models import layers as L
    from rstar2_worker.train.policy import pack

    for precision in ("bf16", "bf16-mixed"):  # bf16 weights and AdamW state; fp32 weights, bf16 matmuls
        p = Policy(settings=settings(precision=precision))
        info = p.init(HALF_B, 0)
        n = info["params"] - V * h  # the embedding lookup is no matmul
        for label, (kind, seqs, masks, olds, advs, opts) in cases:
            torch.cuda.reset_peak_memory_stats()
            args = (kind, seqs, masks, olds, advs, full_train_opts(1e-5, **opts))
            dt = timed(torch, p, args)
            if dt is None:
                continue
            tokens = sum(len(x) for x in seqs)
            # PaLM's count: weights, plus causal attention's scores within each sequence (no recomputation)
            flops = (6 * n * tokens + 12 * L * h * sum(len(x) ** 2 for x in seqs)) / dt
            mfu = f", MFU {100 * flops / (peak * 1e12):.1f}% of {peak:.0f} TFLOP/s" if peak else ""
            mem = torch.cuda.max_memory_allocated() / 2**30
            print(f"throughput {precision}, {label}: {tokens / dt:,.0f} tokens/s (median of 3){mfu}; peak memory {mem:.1f} GiB; "
                  f"{waits(torch, p, args)} waits on the GPU a step")
            if os.environ.get("RSTAR2_GPU_PEAKS"):  # for bench/gpu-plan.ts: rstar2 plan against these peaks
                budget = opts.get("maxTokensPerMicroBatch")
                mbs = pack(seqs, budget) if budget else [range(len(seqs))]
                with open(os.environ["RSTAR2_GPU_PEAKS"], "a") as f:
                    f.write(json.dumps({"config": HALF_B, "precision": precision, "peakGiB": mem,
                                        "checkpointing": bool(opts.get("gradientCheckpointing")),
                                        "tokens": max(sum(len(seqs[i]) for i in mb) for mb in mbs)}) + "\n")
        del p
        torch.cuda.empty_cache()
    print(f"throughput: packed micro-batches attended {'in one varlen flash call per layer' if L.VARLEN else 'one sequence at a time'}")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    fns = {"preflight": preflight, "parity": parity, "generate": generate, "hf-backend": hf_backend,
           "logprob-grad": logprob_grad, "compiled": compiled, "throughput": throughput}
    if what not in fns:
        fail(f"usage: python python/bench/gpu_check.py {'|'.join(fns)}")
    fns[what]()
