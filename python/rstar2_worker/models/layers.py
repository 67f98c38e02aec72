"""The decoder's layers (Qwen2/Qwen3 family) in plain torch: RMSNorm, the rotary embedding, attention (SDPA, the
blocked eager path, varlen flash attention for packed rows, the engine's paged KV), the MLP and the decoder layer,
with the pieces torch.compile fuses. The causal LM that stacks them is models/model.py.

Parameter names follow Hugging Face's Qwen2/Qwen3 modules, so a real checkpoint's state dict loads directly.
"""
import functools
import inspect
import itertools
import math
import sys
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

# On a CPU, fp32 logit slices and eager attention scores stay under glibc's highest mmap threshold (32 MiB,
# which the worker sets): a bigger block is mapped fresh and unmapped on free, so every step would fault all its
# pages in again. On the software-MMU host that made such a step 3-5x slower (docs/DECISIONS.md, worker).
CPU_BLOCK_BYTES = 30 << 20

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
