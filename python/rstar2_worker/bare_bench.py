"""Bare PyTorch baseline for bench/worker.ts: the same model, no worker, no protocol, no bookkeeping.

usage: python -m rstar2_worker.bare_bench '<json: {config, seed, threads, batch, prompt, new, train_batch, train_len, reps}>'
Prints one JSON line: {gen_tok_s: [...], train_tok_s: [...]} (one entry per timed repetition).
"""
import json
import sys
import time

import torch

from .model import CausalLM, Config, attn_bias


def main():
    a = json.loads(sys.argv[1])
    torch.set_num_threads(int(a["threads"]))
    cfg = Config(a["config"])
    model = CausalLM(cfg)
    model.init_weights(int(a["seed"]))
    g = torch.Generator().manual_seed(0)
    B, P, N = a["batch"], a["prompt"], a["new"]
    prompt = torch.randint(0, cfg.vocab_size, (B, P), generator=g)
    pad = torch.zeros(B, dtype=torch.long)

    def generate():
        model.eval()
        with torch.no_grad():
            caches = model.new_cache(B, P + N)
            idx = torch.arange(P)
            h = model.hidden(prompt, idx.unsqueeze(0).expand(B, P), attn_bias(pad, idx, idx), caches, 0)
            logits = model.lm_head(h[:, -1])
            for t in range(N):
                tok = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)
                if t == N - 1:
                    break
                cur = P + t
                bias = attn_bias(pad, torch.tensor([cur]), torch.arange(cur + 1))
                h = model.hidden(tok, torch.full((B, 1), cur), bias, caches, cur)
                logits = model.lm_head(h[:, -1])

    TB, TL = a["train_batch"], a["train_len"]
    ids = torch.randint(0, cfg.vocab_size, (TB, TL), generator=g)
    adv = torch.randn(TB, 1, generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def train():
        model.train()
        logp = torch.log_softmax(model(ids)[:, :-1].float(), -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.28)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    out = {"gen_tok_s": [], "train_tok_s": []}
    for i in range(a["reps"] + 1):  # first repetition is warm-up
        t0 = time.perf_counter()
        generate()
        dt = time.perf_counter() - t0
        if i:
            out["gen_tok_s"].append(B * N / dt)
    for i in range(a["reps"] + 1):
        t0 = time.perf_counter()
        train()
        dt = time.perf_counter() - t0
        if i:
            out["train_tok_s"].append(TB * TL / dt)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
