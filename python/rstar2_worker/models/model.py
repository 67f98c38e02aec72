"""A Qwen2/Qwen3-family decoder in plain torch (runs on torch 1.13 without transformers).

Module and parameter names follow Hugging Face's Qwen2ForCausalLM / Qwen3ForCausalLM, so a state dict
from a real checkpoint loads directly. Config keys are HF `config.json` keys.
"""
import functools
import inspect
import itertools
import math
import os
import sys
import time
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# A [chunk, vocab] slice of fp32 logits is at most this big on a GPU (uncompiled, log-softmax and its exp add two
# more of the same; compiled, no fp32 slice exists: the logits in the matmul's dtype and their gradient). 1 GiB is
# 1,766 tokens of Qwen's vocabulary: at 128 MiB an 8K step of a 0.5B model on an H200 ran 38 slices, 48 ms
# slower, and above 1 GiB it was slower again (bench: python python/bench/train_bench.py --variants).
LOGITS_CHUNK_BYTES = 1 << 30
# On a CPU, fp32 logit slices and eager attention scores stay under glibc's highest mmap threshold (32 MiB,
# which the worker sets): a bigger block is mapped fresh and unmapped on free, so every step would fault all its
# pages in again. On the software-MMU host that made such a step 3-5x slower (docs/DECISIONS.md, worker).
CPU_BLOCK_BYTES = 30 << 20


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
ROPE_TYPES = ("default", "linear", "yarn")


def rope_parameters(cfg):
    """(inv_freq, attention scaling applied to cos/sin) for cfg.rope_scaling, as transformers'
    modeling_rope_utils computes them; SGLang's and vLLM's YaRN agree (correction range over the original
    context, factor as given), so trainer and engines score the same tokens alike."""
    dim, base = cfg.head_dim, cfg.rope_theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    rs = cfg.rope_scaling
    if cfg.rope_type == "default":
        return inv_freq, 1.0
    factor = float(rs["factor"])
    if cfg.rope_type == "linear":  # positions divided by factor, i.e. the frequencies
        return inv_freq / factor, 1.0
    original = int(rs.get("original_max_position_embeddings") or cfg.max_position_embeddings)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rs.get("attention_factor")
    if attention is None:
        m, m_all = rs.get("mscale"), rs.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

    def correction_dim(rotations):  # the dimension whose wavelength fits `rotations` times in `original`
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a one-dimension ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: high frequencies left as trained (extrapolated); 0: low ones interpolated (/ factor)
    return inv_freq / factor * (1 - keep) + inv_freq * keep, float(attention)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        f = FUSED.get("norm")
        if f is not None and x.is_cuda and not torch.is_grad_enabled():
            return f(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x, weight, eps):
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def rotate(x, cos, sin):
    return x * cos + rotate_half(x) * sin


def silu_mul(g, u):
    return F.silu(g) * u


# The same functions compiled into fused kernels (engine.py sets them under RSTAR2_COMPILE=1): a decode step of a
# small model is a chain of tiny kernels, each costing the GPU a few microseconds whatever its size. Used only on
# CUDA without autograd (generation, scoring), so training runs the plain functions above.
FUSED = {}


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Rotary:
    """Cos/sin tables indexed by absolute position (HF's non-interleaved rotate_half layout)."""

    def __init__(self, cfg):
        self.inv_freq, self.scale = rope_parameters(cfg)
        self.cos = self.sin = None

    def tables(self, n, device):
        if self.cos is None or self.cos.shape[0] < n or self.cos.device != device:
            t = torch.arange(max(n, 256), dtype=torch.float32, device=device)
            freqs = torch.outer(t, self.inv_freq.to(device))
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cos, self.sin = emb.cos(), emb.sin()
            if self.scale != 1.0:  # YaRN's attention scaling, folded into both rotations as transformers does
                self.cos, self.sin = self.cos * self.scale, self.sin * self.scale
        return self.cos, self.sin

    def at(self, pos, dtype):
        """cos, sin at positions pos [B, T], shaped [B, 1, T, D] for q and k."""
        return self.cos[pos].unsqueeze(1).to(dtype), self.sin[pos].unsqueeze(1).to(dtype)

    def apply(self, q, k, pos):
        # q,k: [B, H, T, D]; pos: [B, T] absolute positions, inside the tables (CausalLM.hidden builds them
        # once per forward: reading pos.max() here waited on the GPU once per layer)
        cos, sin = self.at(pos, q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, nh, nkv, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(h, nh * hd, bias=cfg.attention_bias)
        self.k_proj = nn.Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.v_proj = nn.Linear(h, nkv * hd, bias=cfg.attention_bias)
        self.o_proj = nn.Linear(nh * hd, h, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x, pos, rope, bias, cache=None, cache_at=0, seqlens=None, paged=None):
        B, T, _ = x.shape
        c = self.cfg
        if torch.is_grad_enabled() or x.is_cuda:  # CUDA: a captured graph must read the live weights, not a cache
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:  # CPU: one matmul instead of three; at decode's few rows each linear runs far below the matmul rate
            q, k, v = fused_linear(x, (self.q_proj, self.k_proj, self.v_proj))
        q = q.view(B, T, c.num_attention_heads, c.head_dim)
        k = k.view(B, T, c.num_key_value_heads, c.head_dim)
        v = v.view(B, T, c.num_key_value_heads, c.head_dim)
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if paged is not None:  # the engine's KV pool (model_runner.Paged): heads stay in [B, T, heads, D] throughout
            cos, sin = paged.rope
            qk = (FUSED.get("rotate") or rotate)(torch.cat((q, k), 2), cos, sin)  # rotated together: one set of kernels
            q, k = qk[:, :, : c.num_attention_heads], qk[:, :, c.num_attention_heads :]
            return self.o_proj(paged.attention(self, q, k, v, cache))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = rope.apply(q, k, pos)
        if cache is not None:
            # preallocated [B, nkv, S, D] buffers; positions [cache_at, cache_at+T) are written in place
            kc, vc = cache
            kc[:, :, cache_at : cache_at + T] = k
            vc[:, :, cache_at : cache_at + T] = v
            k, v = kc[:, :, : cache_at + T], vc[:, :, : cache_at + T]
        if seqlens is None:
            out = self.attend(q, k, v, bias)
        else:
            out = self.attend_packed(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), seqlens).transpose(1, 2)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))

    def attend_packed(self, q, k, v, seqlens):
        """A packed row [1, T, heads, D] → [1, T, H, D]: each sequence attends causally to itself only."""
        if VARLEN is not None and varlen_ok(q):
            out = self.attend_varlen(q[0], k[0], v[0], seqlens)
            if out is not None:
                return out.unsqueeze(0)
        # block-diagonal, one block at a time, so attention costs Σ len² instead of (Σ len)². split, not
        # slicing: a slice's backward writes into a zeroed copy of the whole tensor, once per sequence
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        parts = zip(q.split(seqlens, 2), k.split(seqlens, 2), v.split(seqlens, 2))
        return torch.cat([self.attend(qs, ks, vs, None) for qs, ks, vs in parts], 2).transpose(1, 2)

    def attend_varlen(self, q, k, v, seqlens):
        """A packed row's q [T, H, D], k/v [T, nkv, D] in one flash-attention call over its sequences (torch's
        varlen_attn), instead of one call per sequence. None if the kernel refuses its first call (flash
        attention needs an Ampere or newer GPU): the process then attends one sequence at a time."""
        rep = self.cfg.num_attention_heads // self.cfg.num_key_value_heads
        if not VARLEN_GQA:
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        cu = cumulative(tuple(seqlens), q.device)
        kw = {"enable_gqa": True} if VARLEN_GQA else {}
        try:
            out = VARLEN(q, k, v, cu, cu, max(seqlens), max(seqlens), **VARLEN_CAUSAL, **kw)
        except RuntimeError as e:
            if VARLEN_RAN[0] or isinstance(e, torch.cuda.OutOfMemoryError):  # a real failure, not a refusal
                raise
            refuse_varlen(e)
            return None
        VARLEN_RAN[0] = True
        return out

    def attend(self, q, k, v, bias, gqa=False):
        """q [B, H, T, D], k/v [B, nkv, S, D] → [B, H, T, D]. `bias`: additive [B, 1, T, S] mask, or None for
        plain causal attention (T == S). `gqa`: SDPA groups the heads itself where this torch can (the engine's
        prefill)."""
        c = self.cfg
        B, _, T, _ = q.shape
        rep = c.num_attention_heads // c.num_key_value_heads
        if ATTENTION == "sdpa":
            mask = None if bias is None else bias == 0
            if gqa and SDPA_GQA and rep > 1:
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bias is None)
        # GQA without repeat_interleave: the rep query heads that share a kv head become extra query rows.
        # On a CPU, query rows go in blocks whose fp32 scores fit CPU_BLOCK_BYTES
        S = k.shape[2]
        step = T if q.is_cuda else max(1, CPU_BLOCK_BYTES // (4 * B * c.num_attention_heads * S))
        kt = k.transpose(-1, -2)
        outs = []
        for s in range(0, T, step):
            e = min(T, s + step)
            qg = q[:, :, s:e].reshape(B, c.num_key_value_heads, rep * (e - s), c.head_dim)
            att = torch.matmul(qg, kt) * (1.0 / math.sqrt(c.head_dim))
            att = att.view(B, c.num_key_value_heads, rep, e - s, S)
            if bias is None:
                att = att.masked_fill(torch.ones(e - s, S, dtype=torch.bool, device=q.device).triu(1 + s), float("-inf"))
            else:
                att = att + bias[:, :, s:e].unsqueeze(2)
            att = torch.softmax(att.float(), dim=-1).to(v.dtype).view(B, c.num_key_value_heads, rep * (e - s), S)
            outs.append(torch.matmul(att, v).view(B, c.num_attention_heads, e - s, c.head_dim))
        return outs[0] if len(outs) == 1 else torch.cat(outs, 2)


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


def attention_impl(functional=F):
    """'sdpa' where torch has F.scaled_dot_product_attention (≥ 2.0: fused kernels), else 'eager' (torch 1.13)."""
    return "sdpa" if hasattr(functional, "scaled_dot_product_attention") else "eager"


ATTENTION = attention_impl()


def sdpa_gqa(functional=F):
    """Whether this torch's SDPA takes grouped kv heads itself (enable_gqa, torch >= 2.5)."""
    try:
        return "enable_gqa" in inspect.signature(functional.scaled_dot_product_attention).parameters
    except (AttributeError, ValueError, TypeError):
        return False


SDPA_GQA = ATTENTION == "sdpa" and sdpa_gqa()


def varlen_impl():
    """torch's varlen flash attention (torch.nn.attention.varlen, from 2.10) and how this version asks for a
    causal mask (`is_causal` in 2.10, a (-1, 0) window later) and for grouped kv heads; None where it is absent."""
    try:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
    except (ImportError, ValueError, TypeError):
        return None, {}, False
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)} if "window_size" in params else None
    return (varlen_attn, causal, "enable_gqa" in params) if causal is not None else (None, {}, False)


VARLEN, VARLEN_CAUSAL, VARLEN_GQA = varlen_impl()
VARLEN_RAN = [False]  # once it has run in this process, a failure is a real one, not a refusal


def refuse_varlen(e):
    global VARLEN
    VARLEN = None
    print(f"rstar2 worker: varlen flash attention refused ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
          "packed rows attend one sequence at a time", file=sys.stderr)


def varlen_ok(q):
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)  # flash kernels only


@functools.lru_cache(maxsize=8)
def cumulative(seqlens, device):
    """[0, l0, l0 + l1, ...] as int32 on `device`: made once per packed micro-batch, not once per layer."""
    return to_device(torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32, device="cpu"), device)


def to_device(t, device):
    """A CPU tensor onto `device` without waiting on the GPU: torch copies from ordinary memory only after
    the GPU has finished all its queued work (a wait per copy: ~12 per micro-batch on an H200 before this);
    from pinned memory the copy is queued like a kernel."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        f = FUSED.get("silu_mul") if x.is_cuda and not torch.is_grad_enabled() else None
        plain = torch.is_grad_enabled() or x.is_cuda  # as in Attention.forward
        gu = (self.gate_proj(x), self.up_proj(x)) if plain else fused_linear(x, (self.gate_proj, self.up_proj))
        return self.down_proj((f or silu_mul)(*gu))


_FUSED_W = weakref.WeakKeyDictionary()


def fused_linear(x, linears):
    """The outputs of `linears` (same input) from one matmul over their concatenated weights, kept per first
    linear and rebuilt when any weight is replaced or written in place (weight sync, load, an optimizer step bump
    the tensors' version counters), so the checkpoint, export and training keep HF's separate parameters."""
    ps = [t for m in linears for t in (m.weight, m.bias) if t is not None]
    key = tuple((t.data_ptr(), t._version) for t in ps)
    hit = _FUSED_W.get(linears[0])
    if hit is None or hit[0] != key:
        w = torch.cat([m.weight for m in linears])
        b = None if linears[0].bias is None else torch.cat([m.bias for m in linears])
        hit = (key, w, b)
        _FUSED_W[linears[0]] = hit
    y = F.linear(x, hit[1], hit[2])
    return y.split([m.out_features for m in linears], -1)


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, pos, rope, bias, cache=None, cache_at=0, seqlens=None, paged=None, rot=None):
        if rot is not None:
            return self.in_pieces(x, rot, bias, seqlens)
        x = x + self.self_attn(self.input_layernorm(x), pos, rope, bias, cache, cache_at, seqlens, paged)
        return x + self.mlp(self.post_attention_layernorm(x))

    def in_pieces(self, x, rot, bias, seqlens):
        """The same layer as PIECES' two functions around the attention (compiled on a GPU). rot: cos and sin at
        each position, [B, T, 1, D] fp32."""
        a, m, c = self.self_attn, self.mlp, self.self_attn.cfg
        qk = (a.q_norm.weight, a.k_norm.weight) if c.qk_norm else (None, None)
        q, k, v = PIECES["attn_in"](
            x, self.input_layernorm.weight, a.q_proj.weight, a.q_proj.bias, a.k_proj.weight, a.k_proj.bias,
            a.v_proj.weight, a.v_proj.bias, *qk, *rot, c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads,
        )
        if seqlens is not None:
            out = a.attend_packed(q, k, v, seqlens)
        else:
            # kv heads repeated, as the modules do: SDPA's enable_gqa made an 8K step of a 0.5B model on an H200
            # slower (250.7 against 234.7 ms)
            out = a.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), bias).transpose(1, 2)
        return PIECES["attn_out_mlp"](
            x, out, a.o_proj.weight, self.post_attention_layernorm.weight, m.gate_proj.weight, m.up_proj.weight,
            m.down_proj.weight, c.rms_norm_eps,
        )


def attn_in(x, norm_w, wq, bq, wk, bk, wv, bv, qn_w, kn_w, cos, sin, eps, heads, kv_heads):
    """input_layernorm, the q/k/v projections, Qwen3's q/k norms and the rotation: q, k, v as [B, T, heads, D]."""
    h = rms_norm(x, norm_w, eps)
    q = F.linear(h, wq, bq).unflatten(-1, (heads, -1))
    k = F.linear(h, wk, bk).unflatten(-1, (kv_heads, -1))
    v = F.linear(h, wv, bv).unflatten(-1, (kv_heads, -1))
    if qn_w is not None:
        q, k = rms_norm(q, qn_w, eps), rms_norm(k, kn_w, eps)
    cos, sin = cos.to(q.dtype), sin.to(q.dtype)
    return rotate(q, cos, sin), rotate(k, cos, sin), v


def attn_out_mlp(x, attn, wo, norm_w, wg, wu, wd, eps):
    """o_proj and its residual, post_attention_layernorm, the MLP and its residual. attn: [B, T, H, D]."""
    x = x + F.linear(attn.flatten(2), wo)
    h = rms_norm(x, norm_w, eps)
    return x + F.linear(silu_mul(F.linear(h, wg), F.linear(h, wu)), wd)


# model.compile: a decoder layer as two pieces around its attention, and the log-prob slices' arithmetic, compiled
# (torch.compile, shapes dynamic) so that each is a few fused kernels instead of one kernel per operation. In eager
# mode a train step of a 0.5B model on an H200 launched 4,620 kernels, ~80 ms of its 235 spent between them, and
# RMSNorm's, the rotation's and SwiGLU's casts and products took 33 ms. Set by compile_pieces; empty: the modules'
# own forward (CPU, torch 1.13, model.compile off).
PIECES = {}


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
        time (default: LOGITS_CHUNK_BYTES of fp32 logits, CPU_BLOCK_BYTES on a CPU); differentiable in log p."""
        chunk = chunk or max(1, (LOGITS_CHUNK_BYTES if h.is_cuda else CPU_BLOCK_BYTES) // (4 * self.cfg.vocab_size))
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
