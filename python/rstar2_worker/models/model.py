"""A Qwen2/Qwen3-family causal LM in plain torch (runs on torch 1.13 without transformers): the config, the stack of
models/layers.py's decoder layers, the log-prob and entropy heads, and torch.compile's pieces.

Module and parameter names follow Hugging Face's Qwen2ForCausalLM / Qwen3ForCausalLM, so a state dict
from a real checkpoint loads directly. Config keys are HF `config.json` keys.
"""
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from rstar2_worker.models import layers as L
from rstar2_worker.models.layers import (DecoderLayer, PIECES, RMSNorm, ROPE_TYPES, Rotary, attn_in, attn_out_mlp,
                                         to_device)

# A [chunk, vocab] slice of fp32 logits is at most this big on a GPU (uncompiled, log-softmax and its exp add two
# more of the same; compiled, no fp32 slice exists: the logits in the matmul's dtype and their gradient). 1 GiB is
# 1,766 tokens of Qwen's vocabulary: at 128 MiB an 8K step of a 0.5B model on an H200 ran 38 slices, 48 ms
# slower, and above 1 GiB it was slower again (bench: python python/bench/train_bench.py --variants).
LOGITS_CHUNK_BYTES = 1 << 30


class Config:
    def __init__(self, d):
        self.raw = dict(d)
        self.model_type = d.get("model_type", "qwen2")
        self.vocab_size = int(d["vocab_size"])
        self.hidden_size = int(d["hidden_size"])
        self.intermediate_size = int(d["intermediate_size"])
        self.num_hidden_layers = int(d["num_hidden_layers"])
        self.num_attention_heads = int(d["num_attention_heads"])
        self.num_key_value_heads = int(d.get("num_key_value_heads") or self.num_attention_heads)
        self.head_dim = int(d.get("head_dim") or self.hidden_size // self.num_attention_heads)
        # transformers >= 5 writes rope_theta and the scaling into one `rope_parameters` dict; older configs
        # (every Qwen checkpoint published so far) keep them apart as `rope_theta` and `rope_scaling`
        rp = d.get("rope_parameters") or {}
        if any(isinstance(v, dict) for v in rp.values()):
            raise ValueError(f"per-layer-type rope_parameters are not supported: {rp!r}")
        if float(rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))) != 1.0:
            raise ValueError("partial_rotary_factor other than 1 is not supported")
        self.rope_theta = float(rp.get("rope_theta", d.get("rope_theta", 10000.0)))
        self.rms_norm_eps = float(d.get("rms_norm_eps", 1e-6))
        self.max_position_embeddings = int(d.get("max_position_embeddings", 4096))
        self.tie_word_embeddings = bool(d.get("tie_word_embeddings", False))
        # Qwen2 always has q/k/v biases; Qwen3 has none by default and adds per-head RMSNorm on q and k.
        qwen3 = self.model_type == "qwen3"
        self.attention_bias = bool(d.get("attention_bias", not qwen3))
        self.qk_norm = bool(d.get("qk_norm", qwen3))
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {d.get('hidden_act')!r} (only silu)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        self.rope_scaling = dict(d.get("rope_scaling") or {k: v for k, v in rp.items() if k != "rope_theta"})
        # "type" is the older spelling (Qwen2.5's published YaRN config uses it, Qwen3's "rope_type")
        self.rope_type = self.rope_scaling.get("rope_type", self.rope_scaling.get("type")) or "default"
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_scaling type {self.rope_type!r} in {self.rope_scaling!r} (supported: {', '.join(ROPE_TYPES)})"
            )
        if self.rope_type != "default" and not isinstance(self.rope_scaling.get("factor"), (int, float)):
            raise ValueError(f"rope_scaling {self.rope_scaling!r} needs a numeric factor")


# dynamic NTK is left out on purpose: transformers rescales it by each batch's length, vLLM by a fixed one,
# so the trainer's and the engines' logprobs would disagree past max_position_embeddings
class Piece:
    """fn compiled; if compiling fails at a first call, fn itself from then on, said once."""

    def __init__(self, fn, compiled):
        self.fn, self.compiled, self.ran = fn, compiled, False

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                out = self.compiled(*args)
                self.ran = True
                return out
            except Exception as e:  # noqa: BLE001 - a compiler failure; after a first success, a real one
                if self.ran or isinstance(e, torch.cuda.OutOfMemoryError):
                    raise
                print(f"rstar2 worker: model.compile: compiling {self.fn.__name__} failed ({first_line(e)}); it runs "
                      "uncompiled", file=sys.stderr)
                self.compiled = None
        return self.fn(*args)


def first_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__


def compile_pieces(mode, device):
    """Fills PIECES for model.compile `mode` ('auto': on CUDA, 'on': on any device, 'off'), each piece tried
    forward and backward once on small inputs here, so that a torch without a working compiler (torch 1.13 has
    no torch.compile; inductor needs Triton on a GPU, a C++ compiler on a CPU) runs the modules' own forward
    instead, said once. Returns what was decided, for the worker's info."""
    PIECES.clear()
    dev = torch.device(device)
    if mode == "off" or (mode == "auto" and dev.type != "cuda"):
        return "off"
    if not hasattr(torch, "compile"):
        print(f"rstar2 worker: model.compile: torch {torch.__version__} has no torch.compile; the model runs uncompiled",
              file=sys.stderr)
        return "unavailable"
    t0 = time.time()
    # A slice's rows are few against the vocabulary: inductor then splits each row's reduction and gives up the
    # online softmax, which made the slices of an 8K step of a 0.5B model take 49 ms on an H200 instead of ~10
    whole = {"split_reductions": False}
    pieces = {f.__name__: Piece(f, torch.compile(f, dynamic=True, options=opts))
              for f, opts in ((attn_in, None), (attn_out_mlp, None), (slice_stats, whole), (slice_grad, whole))}
    from torch import _dynamo

    limit = "recompile_limit" if hasattr(_dynamo.config, "recompile_limit") else "cache_size_limit"
    # a variant per dtype, grad mode, batch of one or more and parameter kind (FSDP's unsharded tensors)
    setattr(_dynamo.config, limit, max(getattr(_dynamo.config, limit), 32))
    try:
        probe(pieces, dev)
    except Exception as e:  # noqa: BLE001 - no working compiler here: the plain modules serve
        print(f"rstar2 worker: model.compile: torch.compile does not work here ({first_line(e)}); the model runs "
              "uncompiled", file=sys.stderr)
        return "unavailable"
    PIECES.update(pieces, cpu=dev.type != "cuda")
    print(f"rstar2 worker: model.compile: compiled the decoder layer's pieces and the log-prob slices in "
          f"{time.time() - t0:.1f} s", file=sys.stderr)
    return "on"


def probe(pieces, dev):
    """Each piece forward and backward on tiny inputs (compile errors surface at the first call of each pass)."""
    x = torch.randn(1, 4, 8, device=dev, requires_grad=True)
    w = lambda *shape: torch.randn(*shape, device=dev, requires_grad=True)  # noqa: E731
    cos = torch.ones(1, 4, 1, 4, device=dev)
    q, k, v = pieces["attn_in"].compiled(x, w(8), w(8, 8), w(8), w(4, 8), w(4), w(4, 8), w(4), None, None, cos, cos, 1e-6, 2, 1)
    out = pieces["attn_out_mlp"].compiled(x, q, w(8, 8), w(8), w(16, 8), w(16, 8), w(8, 16), 1e-6)
    (out.sum() + k.sum() + v.sum()).backward()
    t = torch.zeros(4, dtype=torch.long, device=dev)
    pieces["slice_stats"].compiled(x[0].detach(), t, 1.0)
    pieces["slice_grad"].compiled(x[0].detach(), t, torch.ones(4, device=dev), 1.0)




class DecoderModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class CausalLM(nn.Module):
    """forward(ids, pad_left=None) → logits. `pad_left[b]` leading positions of row b are padding.
    forward(rows=[[ids…], …], packed=…) → (log p, entropy, is-argmax) of every next token, sequence after sequence
    (token_logprobs), and the positions computed: training and scoring go through forward so that DDP and FSDP,
    which only act on the wrapped module's forward, see them.
    `drop_last`: no logits for the last position (nothing to score there); with a 150K vocabulary, slicing the
    hidden states instead of the logits saves a vocab-sized buffer and its zero-filled gradient.
    `gradient_checkpointing`: in training, each decoder layer keeps only its input and recomputes the rest in
    backward."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.gradient_checkpointing = False
        self.model = DecoderModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rope = Rotary(cfg)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        std = float(self.cfg.raw.get("initializer_range", 0.02))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                    p.fill_(1.0)
                elif name.endswith(".bias"):
                    p.zero_()
                else:
                    # drawn on the CPU whatever the default device (CUDA ranks set it): the generator is a CPU
                    # one, and the same seed then gives the same weights on every device
                    p.copy_(torch.randn(p.shape, generator=g, device="cpu") * std)

    def hidden(self, ids, pos, bias, caches=None, cache_at=0, seqlens=None, max_pos=None, paged=None):
        """Final hidden states [B, T, H]. `bias` None: causal; `seqlens`: ids is one packed row of sequences
        of these lengths (pos restarting at 0 for each). `max_pos`: pos.max() where the caller knows it
        (reading it from a GPU tensor waits on the GPU). `paged`: caches are the engine's KV pool layers and
        `paged` says where (model_runner.Paged)."""
        x = self.model.embed_tokens(ids)
        self.rope.tables((int(pos.max()) if max_pos is None else max_pos) + 1, x.device)
        if paged is not None:  # once for every layer, shaped for [B, T, heads, D]
            paged.rope = tuple(t.transpose(1, 2) for t in self.rope.at(pos, x.dtype))
        rot = None
        if PIECES and caches is None and paged is None and (x.is_cuda or PIECES.get("cpu")):
            rot = self.rope.cos[pos].unsqueeze(2), self.rope.sin[pos].unsqueeze(2)  # once, not per layer
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled() and caches is None
        for i, layer in enumerate(self.model.layers):
            if recompute:
                # no RNG state kept for the recompute: a layer draws nothing (no dropout)
                x = checkpoint(layer, x, pos, self.rope, bias, None, 0, seqlens, None, rot, use_reentrant=False,
                               preserve_rng_state=False)
            else:
                x = layer(x, pos, self.rope, bias, None if caches is None else caches[i], cache_at, seqlens, paged, rot)
        return self.model.norm(x)

    def token_logprobs(self, h, targets, temperature=1.0, chunk=None):
        """(log p(target), entropy, target is the argmax) per row of h [N, H], computed `chunk` tokens at a
        time (default: LOGITS_CHUNK_BYTES of fp32 logits, L.CPU_BLOCK_BYTES on a CPU); differentiable in log p."""
        chunk = chunk or max(1, (LOGITS_CHUNK_BYTES if h.is_cuda else L.CPU_BLOCK_BYTES) // (4 * self.cfg.vocab_size))
        return ChunkedLogprobs.apply(h, self.lm_head.weight, targets, float(temperature), int(chunk))

    def forward(self, ids=None, pad_left=None, drop_last=False, rows=None, packed=False, temperature=1.0, chunk=None, device=None):
        if rows is not None:
            h, computed = predicting_hidden(self, rows, packed, device)
            return (*self.token_logprobs(h, next_tokens(rows, device), temperature, chunk), computed)
        B, T = ids.shape
        pad_left = torch.zeros(B, dtype=torch.long, device=ids.device) if pad_left is None else pad_left
        idx = torch.arange(T, device=ids.device)
        pos = (idx.unsqueeze(0) - pad_left.unsqueeze(1)).clamp(min=0)
        bias = attn_bias(pad_left, idx, idx, ids.dtype)
        h = self.hidden(ids, pos, bias)
        return self.lm_head(h[:, :-1] if drop_last else h)

    def new_cache(self, B, S, dtype=torch.float32, device=None):
        c = self.cfg
        shape = (B, c.num_key_value_heads, S, c.head_dim)
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)) for _ in range(c.num_hidden_layers)]

def predicting_hidden(model, rows, packed, device):
    """Final hidden states at every position that predicts a next token of its own sequence, sequence after
    sequence ([Σ (len - 1), H]), and how many positions the forward computed. Packed: one row, no padding,
    positions restarting at 0 per sequence, attention inside each sequence only. Else: right-padded rows.
    Everything is indexed on the CPU and copied over, so nothing here waits on the GPU."""
    if packed:
        lens = [len(r) for r in rows if r]
        ids = to_device(torch.tensor([t for r in rows for t in r], dtype=torch.long, device="cpu"), device).unsqueeze(0)
        pos = to_device(torch.cat([torch.arange(n, device="cpu") for n in lens]), device).unsqueeze(0)
        h = model.hidden(ids, pos, None, seqlens=lens, max_pos=max(lens) - 1)[0]
        keep = torch.ones(ids.shape[1], dtype=torch.bool, device="cpu")
        keep[torch.tensor(lens, device="cpu").cumsum(0) - 1] = False  # a sequence's last token predicts nothing
        return h.index_select(0, to_device(keep.nonzero().squeeze(1), device)), ids.shape[1]
    ids, valid = pad_right(rows)
    B, T = ids.shape
    h = model.hidden(to_device(ids, device), to_device(torch.arange(T, device="cpu"), device).expand(B, T), None, max_pos=T - 1)
    return predicting_rows(h, valid, device), ids.numel()


def predicting_rows(h, valid, device):
    """The rows of right-padded hidden states h [B, T, H] that predict a real next token ([Σ (len - 1), H])."""
    at = torch.zeros_like(valid)
    at[:, :-1] = valid[:, 1:]  # position t predicts t + 1
    return h.reshape(-1, h.shape[-1]).index_select(0, to_device(at.reshape(-1).nonzero().squeeze(1), device))


def next_tokens(rows, device):
    """The targets predicting_hidden's rows are scored against: ids[1:] of each sequence, concatenated."""
    return to_device(torch.tensor([t for r in rows for t in r[1:]], dtype=torch.long, device="cpu"), device)


def pad_right(rows, dtype=torch.long):
    """Rows right-padded with zeros, and where they are real; on the CPU (a GPU rank's default device is its GPU)."""
    T = max(len(r) for r in rows)
    t = torch.zeros(len(rows), T, dtype=dtype, device="cpu")
    valid = torch.zeros(len(rows), T, dtype=torch.bool, device="cpu")
    for i, r in enumerate(rows):
        if len(r):
            t[i, : len(r)] = torch.tensor(r, dtype=dtype, device="cpu")
            valid[i, : len(r)] = True
    return t, valid


class ChunkedLogprobs(torch.autograd.Function):
    """lm_head + log-softmax over `chunk` rows at a time, so neither pass holds more than a [chunk, vocab]
    slice of the logits: forward keeps only h and the weight, backward recomputes each slice's logits (as
    activation checkpointing would) and turns them into gradients at once. Logits are made in the matmul's
    dtype (bf16 under autocast) and normalised in fp32."""

    @staticmethod
    def forward(ctx, h, weight, targets, temperature, chunk):
        N = h.shape[0]
        lp = torch.empty(N, dtype=torch.float32, device=h.device)
        ent = torch.empty(N, dtype=torch.float32, device=h.device)
        top = torch.empty(N, dtype=torch.bool, device=h.device)
        ctx.dtype = weight.dtype
        stats = PIECES.get("slice_stats") if h.is_cuda or PIECES.get("cpu") else None
        for s in range(0, N, chunk):
            raw = F.linear(h[s : s + chunk], weight)
            ctx.dtype = raw.dtype
            lp[s : s + chunk], ent[s : s + chunk], top[s : s + chunk] = (stats or slice_stats)(raw, targets[s : s + chunk], temperature)
        ctx.save_for_backward(h, weight, targets)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent, top)
        return lp, ent, top

    @staticmethod
    def backward(ctx, g, _g_ent, _g_top):
        h, weight, targets = ctx.saved_tensors
        dt, T, chunk = ctx.dtype, ctx.temperature, ctx.chunk
        w = weight.to(dt)
        gh = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        gw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        grad = PIECES.get("slice_grad") if h.is_cuda or PIECES.get("cpu") else None
        for s in range(0, h.shape[0], chunk):
            hc = h[s : s + chunk].to(dt)
            gl = (grad or slice_grad)(F.linear(hc, w), targets[s : s + chunk], g[s : s + chunk], T)
            if gh is not None:
                gh[s : s + chunk] = gl @ w
            if gw is not None:
                add_product(gw, gl.t(), hc)
        return gh, None if gw is None else gw.to(weight.dtype), None, None, None


def slice_stats(raw, t, temperature):
    """A slice's (log p(t), entropy, t is the argmax) from its logits [n, vocab] in the matmul's dtype."""
    logits = raw.float()
    top = logits.argmax(-1) == t
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, t.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1), top


def slice_grad(raw, t, g, temperature):
    """d loss / d logits of a slice, in raw's dtype: (onehot(t) - softmax) times the incoming grad g [n], and 1/T
    through the scaling."""
    logits = raw.float()
    if temperature != 1.0:
        logits = logits / temperature
    gc = g.unsqueeze(-1)
    gl = torch.softmax(logits, -1).mul_(-gc).scatter_add_(-1, t.unsqueeze(-1), gc)
    if temperature != 1.0:
        gl = gl / temperature
    return gl.to(raw.dtype)


MM_OUT_DTYPE = [None]  # whether this torch's addmm takes out_dtype here (recent torch, CUDA); None: not tried


def add_product(acc, a, b):
    """acc += a @ b, acc fp32. A bf16 product is accumulated into fp32 by the GEMM itself where torch can
    (CUDA): casting each slice's [vocab, hidden] product to fp32 and adding it cost an H200 more than the
    products did (56 → 38 ms for 8K tokens at 0.5B, 243 → 140 ms at 14B's hidden size)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
        return
    if a.is_cuda and MM_OUT_DTYPE[0] is not False:
        try:
            torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
            MM_OUT_DTYPE[0] = True
            return
        except (TypeError, RuntimeError) as e:
            if MM_OUT_DTYPE[0] or isinstance(e, torch.cuda.OutOfMemoryError):  # a real failure, not a refusal
                raise
            MM_OUT_DTYPE[0] = False
    acc += (a @ b).float()


def attn_bias(pad_left, q_idx, k_idx, _dtype=None):
    """[B, 1, Tq, Tk] additive mask: causal, and keys inside a row's left padding are hidden."""
    causal = k_idx.unsqueeze(0) <= q_idx.unsqueeze(1)  # [Tq, Tk]
    valid = k_idx.unsqueeze(0) >= pad_left.unsqueeze(1)  # [B, Tk]
    ok = causal.unsqueeze(0) & valid.unsqueeze(1)
    # a padding query row would see no key at all; let it see itself so softmax stays finite
    ok = ok | (q_idx.unsqueeze(1) == k_idx.unsqueeze(0)).unsqueeze(0)
    bias = torch.zeros(ok.shape, dtype=torch.float32, device=ok.device)
    bias.masked_fill_(~ok, float("-inf"))
    return bias.unsqueeze(1)


def count_params(model):
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n
