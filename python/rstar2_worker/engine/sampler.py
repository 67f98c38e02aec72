"""Sampling on the model's device, a row's draw independent of the rest of the batch.

Each row draws token i of its output with one uniform number u = hash(row seed, i), by inverse CDF over its
(truncated) distribution, so a seeded row draws the same tokens alone or in any batch, on any device, and only
the chosen token comes back to the host. The returned log-prob is the token's under softmax(logits / T) before
top-k/top-p truncation (under softmax(logits) for T = 0, greedy), as the trainer scores it.
"""
import numpy as np
import torch

MASK64 = (1 << 64) - 1


def splitmix64(x):
    """splitmix64's output function over numpy uint64 arrays (wrapping arithmetic)."""
    x = (x + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK64)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seeds, steps):
    """u in (0, 1) for each (row seed, output index): 53 random bits, never 0 or 1."""
    with np.errstate(over="ignore"):
        s = np.asarray(seeds, dtype=np.uint64)
        i = np.asarray(steps, dtype=np.uint64)
        z = splitmix64(splitmix64(s) ^ i)
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def row_seed(seed, row):
    """A batch's seed and a row's index as one row seed (the old batch-wide `seed` of a generate call)."""
    with np.errstate(over="ignore"):
        return int(splitmix64(np.asarray([int(seed) & MASK64], dtype=np.uint64) ^ np.uint64(row))[0])


class Params:
    """Per-row sampling settings as device tensors, built once per batch composition. A greedy row divides by
    1: its log-prob is then the plain softmax's, from the one log-softmax every row shares."""

    def __init__(self, temps, top_ks, top_ps, device):
        t = torch.tensor(temps, dtype=torch.float32, device="cpu")
        self.greedy = bool((t == 0).all())
        self.any_greedy = bool((t == 0).any())
        self.ones = bool((t == 1).all())
        self.temps = torch.where(t == 0, torch.ones_like(t), t).unsqueeze(1).to(device)
        self.is_greedy = (t == 0).to(device)
        k = [x if 0 < x else 0 for x in top_ks]
        p = list(top_ps)
        self.filtered = any(k) or any(x < 1.0 for x in p)
        if self.filtered:
            self.top_k = torch.tensor(k, dtype=torch.long, device="cpu").to(device)
            self.top_p = torch.tensor(p, dtype=torch.float32, device="cpu").to(device)


def sample(logits, params, u):
    """(tokens, logprobs) for logits [B, V] (any float dtype), `params` a Params, u [B] float64 on the device."""
    logits = logits.float()
    scaled = logits if params.ones else logits / params.temps
    logp = torch.log_softmax(scaled, -1)
    if params.greedy:
        tok = logits.argmax(-1)
    elif params.filtered:
        # in descending order: top-k keeps the first k, top-p the smallest prefix whose mass reaches p
        sorted_l, order = torch.sort(scaled, dim=-1, descending=True)
        rank = torch.arange(scaled.shape[-1], device=scaled.device).unsqueeze(0)
        keep_k = (params.top_k == 0).unsqueeze(1) | (rank < params.top_k.unsqueeze(1))
        sorted_l = sorted_l.masked_fill(~keep_k, float("-inf"))
        probs = torch.softmax(sorted_l, -1)
        drop = probs.cumsum(-1) - probs > params.top_p.unsqueeze(1)
        probs = probs.masked_fill(drop, 0.0)
        tok = order.gather(-1, inverse_cdf(probs, u).unsqueeze(1)).squeeze(1)
    else:
        tok = inverse_cdf(logp.exp(), u)
    if params.any_greedy and not params.greedy:
        tok = torch.where(params.is_greedy, logits.argmax(-1), tok)
    return tok, logp.gather(-1, tok.unsqueeze(1)).squeeze(1)


def inverse_cdf(probs, u, chunk=1024):
    """The first index whose cumulative mass passes u × the row's total; a zero-probability entry is never
    chosen. In fp64 (a 150K vocabulary's fp32 running sum drifts by ~1e-5) and in two levels, so that only
    [B, V / chunk] chunk sums and the one chosen chunk are summed in fp64, not all of [B, V]."""
    B, V = probs.shape
    full = V // chunk * chunk
    sums = [probs[:, :full].view(B, -1, chunk).sum(-1, dtype=torch.float64)] if full else []
    if full < V:
        sums.append(probs[:, full:].sum(-1, keepdim=True, dtype=torch.float64))
    cdf = torch.cat(sums, 1).cumsum(-1) if len(sums) > 1 else sums[0].cumsum(-1)
    target = u * cdf[:, -1]
    c = torch.searchsorted(cdf, target.unsqueeze(1), right=True).clamp(max=cdf.shape[1] - 1)
    before = torch.where(c > 0, cdf.gather(1, (c - 1).clamp(min=0)), torch.zeros_like(target.unsqueeze(1)))
    cols = c * chunk + torch.arange(chunk, device=probs.device).unsqueeze(0)
    inside = probs.gather(1, cols.clamp(max=V - 1)).double().masked_fill(cols >= V, 0.0).cumsum(-1)
    i = torch.searchsorted(inside, target.unsqueeze(1) - before, right=True).clamp(max=chunk - 1)
    return (c * chunk + i).squeeze(1).clamp(max=V - 1)
