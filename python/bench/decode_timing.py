"""Decode-step and prefill timings of a model's shape on this GPU, as `bench/scheduler-sim.ts --calibrate` reads them.

    python python/bench/decode_timing.py [--config config.json] [--tp 4] [--kv-tokens 300000] --out samples.jsonl

Builds random bf16 weights of one tensor-parallel rank (heads, kv heads, MLP columns and the vocabulary split
--tp ways; hidden size whole), a KV cache per layer, and times whole decode steps (every layer, final norm,
lm_head) captured as CUDA graphs, over batches × context lengths, and prefills of one sequence. Writes one JSON
line per point: {batch, kv, ms} for a decode step (kv: the batch's KV tokens), {tokens, ms} for a prefill.

What it is not: an engine. Attention is torch's flash attention (varlen_attn), a kv head's query heads as rows of
one query as decode kernels arrange them, but without their split over the context: few sequences with long
contexts leave most of the GPU idle (on an H100, per KV token of a TP4 rank: 138 ns at batch 8, 35 at 32, 19 at
64, 15.3 at 128), so the default batches start at 64.
No paged cache, no sampling, no tensor-parallel all-reduce (one GPU cannot measure it),
and fewer fused kernels than an engine. These are an engine's time model from standard kernels, to be replaced
by an engine's own measurements where one runs.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # rstar2_worker, run from anywhere

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from rstar2_worker.models.layers import varlen_impl  # noqa: E402

# Qwen3-14B's config.json (the paper's base model)
QWEN3_14B = dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                 num_key_value_heads=8, head_dim=128, vocab_size=151936)


def shard(cfg, tp):
    """One tensor-parallel rank's sizes. Heads and kv heads must split evenly (as engines require)."""
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    if h % tp or kv % tp:
        raise SystemExit(f"decode_timing: --tp {tp} does not divide {h} heads and {kv} kv heads")
    return dict(hidden=cfg["hidden_size"], heads=h // tp, kv_heads=kv // tp, head_dim=cfg.get("head_dim") or cfg["hidden_size"] // h,
                inter=math.ceil(cfg["intermediate_size"] / tp), vocab=math.ceil(cfg["vocab_size"] / tp),
                layers=cfg["num_hidden_layers"])


def cumulative(lens, nq, device):
    """varlen's offsets for a decode batch: nq query rows and lens[i] keys per sequence. Made before a CUDA graph
    is captured (a copy from host memory cannot be captured)."""
    cu_k = torch.tensor([0] + list(lens), dtype=torch.int64).cumsum(0).to(torch.int32)
    return torch.arange(0, (len(lens) + 1) * nq, nq, dtype=torch.int32).to(device), cu_k.to(device)


def attend(q, k, v, lens, cu=None):
    """Decode attention. q [B, rep, KV, D]: each sequence's new token, its query heads in (rep, kv head) order, so
    the rep heads that share a kv head are rep query rows of one non-causal query over that head's cache (read
    once for all of them, as decode kernels do) without a copy. k/v [sum(lens), KV, D] packed by sequence. cu:
    cumulative()'s offsets for flash attention; without them the same arithmetic runs eagerly (CPU)."""
    B, rep, KV, D = q.shape
    # the weights are random, so ordering the query heads this way costs nothing; the copy out of the fused qkv
    # product stands for an engine's rotary kernel, which writes q anew
    q = q.reshape(B * rep, KV, D)
    if cu is not None:
        return VARLEN(q, k, v, cu[0], cu[1], rep, max(lens)).view(B, -1)
    outs, s = [], 0
    for b, n in enumerate(lens):
        qb = q[b * rep:(b + 1) * rep].transpose(0, 1).float()  # [KV, rep, D]
        kb, vb = (x[s:s + n].transpose(0, 1).float() for x in (k, v))  # [KV, n, D]
        att = torch.softmax(qb @ kb.transpose(1, 2) / math.sqrt(D), -1)
        outs.append((att @ vb).transpose(0, 1).to(q.dtype))
        s += n
    return torch.cat(outs).view(B, -1)


# torch's varlen flash attention, how it asks for a causal mask, and whether it takes grouped kv heads
VARLEN, VARLEN_CAUSAL, VARLEN_GQA = varlen_impl() if torch.cuda.is_available() else (None, {}, False)


class Rank:
    """One tensor-parallel rank's weights and KV cache, bf16 on the GPU (float32 on a CPU, for tests)."""

    def __init__(self, s, kv_tokens, device, dtype):
        g = torch.Generator(device=device).manual_seed(0)

        def w(*shape):
            return torch.empty(*shape, device=device, dtype=dtype).normal_(0, 0.02, generator=g)

        self.s, self.dtype = s, dtype
        H, KV, D, E = s["heads"], s["kv_heads"], s["head_dim"], s["hidden"]
        self.layers = [dict(qkv=w((H + 2 * KV) * D, E), o=w(E, H * D), gate_up=w(2 * s["inter"], E), down=w(E, s["inter"]),
                            k=w(kv_tokens, KV, D), v=w(kv_tokens, KV, D)) for _ in range(s["layers"])]
        self.head = w(s["vocab"], E)

    def step(self, x, lens, cu=None):
        """One decode step for len(lens) sequences (x: their new tokens' hidden states [B, E]) → logits."""
        H, KV, D = self.s["heads"], self.s["kv_heads"], self.s["head_dim"]
        n = sum(lens)
        for L in self.layers:
            q, k, v = (norm(x) @ L["qkv"].t()).split([H * D, KV * D, KV * D], -1)
            # the new token's k/v go into the cache (here: over its last slots, as an engine writes its own)
            L["k"][n - len(lens):n] = k.view(-1, KV, D)
            L["v"][n - len(lens):n] = v.view(-1, KV, D)
            x = x + attend(q.view(-1, H // KV, KV, D), L["k"][:n], L["v"][:n], lens, cu) @ L["o"].t()
            gate, up = (norm(x) @ L["gate_up"].t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ L["down"].t()
        return norm(x) @ self.head.t()

    def prefill(self, x, cu=None):
        """One sequence's prompt of x.shape[0] tokens, causal, into an empty cache → last token's logits."""
        H, KV, D = self.s["heads"], self.s["kv_heads"], self.s["head_dim"]
        T = x.shape[0]
        for L in self.layers:
            q, k, v = (norm(x) @ L["qkv"].t()).split([H * D, KV * D, KV * D], -1)
            L["k"][:T], L["v"][:T] = k.view(T, KV, D), v.view(T, KV, D)
            q, k, v = q.view(T, H, D), k.view(T, KV, D), v.view(T, KV, D)
            if cu is not None and VARLEN_GQA:
                o = VARLEN(q, k, v, cu, cu, T, T, **VARLEN_CAUSAL, enable_gqa=True)
            elif cu is not None:  # each kv head copied per query head: T × H × D, small beside a prefill's products
                k, v = (y.repeat_interleave(H // KV, 1) for y in (k, v))
                o = VARLEN(q, k, v, cu, cu, T, T, **VARLEN_CAUSAL)
            else:
                k, v = (y.repeat_interleave(H // KV, 1).transpose(0, 1) for y in (k, v))
                att = (q.transpose(0, 1) @ k.transpose(1, 2) / math.sqrt(D)).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
                o = (torch.softmax(att, -1) @ v).transpose(0, 1)
            x = x + o.reshape(T, H * D) @ L["o"].t()
            gate, up = (norm(x) @ L["gate_up"].t()).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ L["down"].t()
        return norm(x[-1:]) @ self.head.t()


def norm(x):
    """RMSNorm without its weight: torch's own (one fused kernel on GPUs, as engines fuse theirs) where it has it."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), eps=1e-6)
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)


def timed(fn, reps):
    """(median ms of `reps` runs of fn, whether they were CUDA graph replays). A GPU replays one captured graph,
    as engines replay theirs, so the CPU's kernel launches are not timed; where capture fails, plain calls."""
    if not torch.cuda.is_available():
        return wall(fn, reps), False
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError as e:
        print(f"decode_timing: CUDA graph capture failed ({str(e).splitlines()[0]}); timing plain calls", file=sys.stderr)
        torch.cuda.synchronize()
        return wall(fn, reps), False
    graph.replay()
    torch.cuda.synchronize()
    return wall(graph.replay, reps), True


def wall(fn, reps):
    ms = []
    for _ in range(reps):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ms.append((time.perf_counter() - t) * 1000)
    return statistics.median(ms)


def points(kv_tokens, batches, contexts):
    return [(b, c) for b in batches for c in contexts if b * c <= kv_tokens]


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python python/bench/decode_timing.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", help="a Hugging Face config.json (default: Qwen3-14B's shape)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks the model is split over (time one rank)")
    ap.add_argument("--kv-tokens", type=int, default=131072, help="KV cache tokens to allocate (the largest batch × context)")
    ap.add_argument("--batches", default="64,128,256,384,512", help="decode batch sizes (default from 64: see above)")
    ap.add_argument("--contexts", default="256,512,1024,2048,4096,8192,32768", help="context tokens per sequence")
    ap.add_argument("--prefills", default="256,1024,4096,8192")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", required=True, help="JSONL to write")
    a = ap.parse_args(argv)
    cfg = QWEN3_14B
    if a.config:
        with open(a.config) as f:
            cfg = json.load(f)
    s = shard(cfg, a.tp)
    cuda = torch.cuda.is_available()
    dev, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    if cuda and not VARLEN:
        raise SystemExit(f"decode_timing: needs torch's varlen flash attention (torch >= 2.10); torch {torch.__version__} lacks it")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"decode_timing: {name}, torch {torch.__version__}, one of {a.tp} ranks: {s}, "
          f"attention {'varlen flash' if cuda else 'eager'}", file=sys.stderr, flush=True)
    rank = Rank(s, a.kv_tokens, dev, dtype)
    batches = [int(x) for x in a.batches.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    rows = []
    with open(a.out, "w") as out, torch.no_grad():
        def emit(row):
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), file=sys.stderr, flush=True)

        for b, c in points(a.kv_tokens, batches, contexts):
            x = torch.randn(b, s["hidden"], device=dev, dtype=dtype)
            lens = [c] * b
            cu = cumulative(lens, s["heads"] // s["kv_heads"], dev) if cuda else None
            ms, graph = timed(lambda: rank.step(x, lens, cu), a.reps)
            emit({"batch": b, "kv": b * c, "ms": round(ms, 4), "graph": graph, "tp": a.tp, "device": name})
        for t in (int(x) for x in a.prefills.split(",")):
            if t > a.kv_tokens:
                continue
            x = torch.randn(t, s["hidden"], device=dev, dtype=dtype)
            cu = torch.tensor([0, t], dtype=torch.int32).to(dev) if cuda else None
            ms, graph = timed(lambda: rank.prefill(x, cu), a.reps)
            emit({"tokens": t, "ms": round(ms, 4), "graph": graph, "tp": a.tp, "device": name})
    return rows


if __name__ == "__main__":
    main()
