"""Bare PyTorch baseline for bench/worker.ts: the same model, with no protocol and no bookkeeping.

Runs inside the worker process (op `bare_bench`) so bench/worker.ts can interleave worker and bare
repetitions under the same machine load. Training uses a copy of the model, so the policy is untouched.
Not part of the worker package: the worker's loop imports this module only for that op, found on the
PYTHONPATH that bench/worker.ts starts the worker with (python/bench).
"""
import copy
import time

import torch

from rstar2_worker.models.model import attn_bias


class BareBench:
    def __init__(self, model, seed=0):
        self.model = model
        self.train_model = copy.deepcopy(model)
        self.opt = torch.optim.AdamW(self.train_model.parameters(), lr=1e-4, weight_decay=0.01)
        self.g = torch.Generator().manual_seed(seed)

    def generate(self, B, P, N):
        m, g = self.model, self.g
        m.eval()
        prompt = torch.randint(0, m.cfg.vocab_size, (B, P), generator=g)
        pad = torch.zeros(B, dtype=torch.long)
        t0 = time.perf_counter()
        with torch.no_grad():
            caches = m.new_cache(B, P + N)
            idx = torch.arange(P)
            h = m.hidden(prompt, idx.unsqueeze(0).expand(B, P), attn_bias(pad, idx, idx), caches, 0)
            logits = m.lm_head(h[:, -1])
            for t in range(N):
                tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
                if t == N - 1:
                    break
                cur = P + t
                bias = attn_bias(pad, torch.tensor([cur]), torch.arange(cur + 1))
                h = m.hidden(tok, torch.full((B, 1), cur), bias, caches, cur)
                logits = m.lm_head(h[:, -1])
        return B * N / (time.perf_counter() - t0)

    def train(self, B, T):
        m = self.train_model
        m.train()
        ids = torch.randint(0, m.cfg.vocab_size, (B, T), generator=self.g)
        adv = torch.randn(B, 1, generator=self.g)
        t0 = time.perf_counter()
        logp = torch.log_softmax(m(ids, drop_last=True).float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return B * T / (time.perf_counter() - t0)


def handle(policy, h):
    """The op's reply for header h: tokens/s of one bare generate or train repetition."""
    policy._need_model()
    if policy.r.sharding == "fsdp":  # rank 0 alone on sharded weights would wait for the others forever
        raise ValueError("bare_bench needs the whole model on rank 0: not under sharding fsdp")
    if getattr(policy, "bare", None) is None or policy.bare.model is not policy.model:
        policy.bare = BareBench(policy.model)
    if h["kind"] == "generate":
        return {"tokS": policy.bare.generate(int(h["batch"]), int(h["prompt"]), int(h["new"]))}
    return {"tokS": policy.bare.train(int(h["batch"]), int(h["len"]))}
