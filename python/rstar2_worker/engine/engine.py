"""The policy worker's serving engine: requests join and leave between decode steps over one KV pool.

`add` queues a request (one or more prompts), `step` runs one engine step (admission, a prefill chunk, a
decode step) and returns the requests that finished, `abort` stops rows. The parts: batch_scheduler.py (what runs),
kv_pool.py (where keys and values live, prefix reuse), model_runner.py (the forward, CUDA graphs),
sampler.py (tokens on the device). The model is the policy's own, so a train step updates what it serves;
every weight change drops the cached prefixes (`invalidate`).

Its sizes and switches are the policy's settings (settings.py: RSTAR2_KV_TOKENS, RSTAR2_KV_FRACTION, RSTAR2_KV_MIB,
RSTAR2_KV_BLOCK, RSTAR2_MAX_BATCH, RSTAR2_PREFILL_TOKENS, RSTAR2_CUDA_GRAPHS, RSTAR2_KV_RELEASE, RSTAR2_PREFIX_CACHE,
RSTAR2_COMPILE; docs/ENGINES.md "The built-in engine"), read as the pool is built, so a policy given new settings
gets them at its next pool. What prefix reuse saves is measured by python/bench/engine_bench.py.
"""
import os
import sys
import time

import torch

from rstar2_worker.models import layers as L

from rstar2_worker.engine import sampler
from rstar2_worker.engine.kv_pool import KVPool, bytes_per_token
from rstar2_worker.engine.model_runner import ModelRunner
from rstar2_worker.engine.batch_scheduler import BatchScheduler, Sequence


def gpu_budget(free, total, fraction, engines):
    """KV pool bytes on a GPU: `fraction` of its memory split between the built-in engines that share it, and
    never more than 90 % of what is free (the CUDA context, activations and the other engines' pools)."""
    return min(fraction * total / engines, 0.9 * free)


def slot_name(slot):
    """settings.engine as RSTAR2_ENGINE wrote it ("i/n"), or None."""
    return f"{slot[0]}/{slot[1]}" if slot else None


def sharing(device, slot):
    """How many built-in engines started side by side (slot: (i, n), settings.engine) run on this GPU."""
    if slot is None:
        return 1
    n, gpus = slot[1], torch.cuda.device_count()
    return len(range(device.index or 0, n, gpus))


def compile_pieces():
    """model.FUSED: RMSNorm, the rotation and SiLU-times-up compiled (torch.compile, shapes dynamic), each tried
    once here so that a torch without a working compiler leaves them out, said once. On an H200 a decode step of
    a 0.5B model went 3.9 → 3.1 ms at batch 1 and 6.3 → 4.8 ms at batch 128 (bench/samples/h200-engine-bench*)."""
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    t0 = time.time()
    try:
        fused = {"norm": torch.compile(L.rms_norm, dynamic=True), "rotate": torch.compile(L.rotate, dynamic=True),
                 "silu_mul": torch.compile(L.silu_mul, dynamic=True)}
        with torch.no_grad():
            fused["norm"](x, w, 1e-6)
            fused["rotate"](x, x, x)
            fused["silu_mul"](x, x)
    except Exception as e:  # noqa: BLE001 - no compiler (no triton, an old torch): the plain functions serve
        print(f"rstar2 worker: compiling the engine's fused pieces failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              "the engine runs uncompiled", file=sys.stderr)
        return
    L.FUSED.update(fused)
    print(f"rstar2 worker: compiled the engine's fused pieces in {time.time() - t0:.1f} s", file=sys.stderr)


class Engine:
    def __init__(self, policy):
        self.policy = policy
        self.kv = self.runner = self.sched = None
        self.requests = {}  # id → its sequences, in row order
        self.params = (None, None)  # (batch's sequences, sampler.Params) of the last decode
        self.stats = {"prefill_tokens": 0, "cached_tokens": 0, "decode_steps": 0, "generated": 0, "retractions": 0}

    # ---- the pool's life -------------------------------------------------------------------------

    @property
    def gpu(self):
        return self.policy.device.type == "cuda"

    @property
    def settings(self):
        """The policy's settings, each by-device default filled in for this engine's device."""
        return self.policy.settings.on_device(self.gpu)

    @property
    def release_for_training(self):
        return self.settings.kv_release

    def dtype(self):
        return torch.float32 if self.policy.precision == "fp32" else torch.bfloat16

    def _ensure(self):
        if self.kv is not None:
            return
        p, cfg, s = self.policy, self.policy.cfg, self.settings
        dt = self.dtype()
        per = bytes_per_token(cfg, dt)
        bs = s.kv_block
        tokens = s.kv_tokens
        if not tokens:
            if self.gpu:
                torch.cuda.empty_cache()
                free, total = torch.cuda.mem_get_info(p.device)
                budget = gpu_budget(free, total, s.kv_fraction, sharing(p.device, s.engine))
            else:
                budget = s.kv_mib << 20
            tokens = int(budget // per)
        num_blocks = max(tokens // bs, 2) + 1  # + block 0, which padding uses
        self.kv = KVPool(cfg, num_blocks, bs, dt, p.device)
        scale = float(cfg.rope_scaling.get("factor", 1.0)) if cfg.rope_type != "default" else 1.0
        self.max_len = min(self.kv.blocks.capacity, max(int(cfg.max_position_embeddings * scale), 32768))
        max_batch = s.max_batch
        graphs = "eager" if s.cuda_graphs == "eager" else s.cuda_graphs == "1" and self.gpu
        autocast = torch.bfloat16 if p.precision == "bf16-mixed" else None
        if self.gpu and s.compile != "off" and hasattr(torch, "compile") and not L.FUSED:
            compile_pieces()
        self.runner = ModelRunner(p.model, self.kv, p.device, self.max_len, autocast, graphs, max_batch)
        self.sched = BatchScheduler(self.kv.blocks, max_batch, s.prefill_tokens, s.prefix_cache)
        print(f"rstar2 worker: engine KV pool {self.kv.blocks.capacity} tokens ({num_blocks * bs * per / 2**20:.0f} MiB, "
              f"blocks of {bs}), up to {max_batch} rows, CUDA graphs {'on' if graphs is True else graphs or 'off'}", file=sys.stderr)

    def invalidate(self):
        """The weights changed: no cached prefix may be reused. A new model (init, load) also gets a new pool."""
        if self.kv is not None:
            self.kv.blocks.forget()

    def release(self):
        """Frees the pool and the captured graphs (a train step on the same GPU needs the memory); the next
        request builds them again. Only between requests."""
        if self.requests:
            raise RuntimeError("the engine still has requests: it cannot release its KV pool now")
        self.kv = self.runner = self.sched = None
        self.params = (None, None)
        if self.gpu:
            torch.cuda.empty_cache()

    def reset(self):
        """A new model: everything built for the old one goes."""
        self.requests.clear()
        self.release()

    # ---- requests --------------------------------------------------------------------------------

    def add(self, rid, prompts, sp):
        """Queues request `rid`: prompts (lists of token ids) under one sampling dict (the protocol's `sampling`;
        `seeds` optionally one per prompt). Raises ValueError for a bad request before queueing any of it."""
        p = self.policy
        p._need_model()
        if p.r.sharding == "fsdp":
            raise ValueError("generate under sharding: fsdp is not supported: roll out on SGLang/vLLM engines (--engines)")
        if p.backend == "transformers":
            from rstar2_worker.models import hf_model

            raise ValueError(hf_model.UNSUPPORTED)
        temperature = float(sp.get("temperature", 1.0))
        top_p = float(sp.get("topP", 1.0))
        top_k = int(sp.get("topK", -1))
        max_new = int(sp.get("maxNewTokens", 0))
        stop_ids = frozenset(int(x) for x in sp.get("stopTokenIds", []) or [])
        stop_strs = [s.encode("utf-8") for s in sp.get("stopStrings", []) or [] if s]
        if max_new < 0 or temperature < 0 or not (0 < top_p <= 1):
            raise ValueError(f"bad sampling params: maxNewTokens={max_new} temperature={temperature} topP={top_p}")
        if stop_strs and p.detok is None:
            from rstar2_worker.engine.detok import Detok

            tok = os.path.join(p.src_dir or "", "tokenizer.json")
            if not (p.src_dir and os.path.exists(tok)):
                raise ValueError("stopStrings need a tokenizer.json next to the loaded model; map stop strings to stopTokenIds instead")
            p.detok = Detok(tok)
        V = p.cfg.vocab_size
        for i, pr in enumerate(prompts):
            if not pr:
                raise ValueError(f"prompts[{i}] is empty")
            if min(pr) < 0 or max(pr) >= V:
                raise ValueError(f"prompts[{i}] has a token id outside the vocabulary [0, {V})")
        seed, seeds = sp.get("seed"), sp.get("seeds")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
        if rid in self.requests:
            raise ValueError(f"request {rid} is already running")
        self._ensure()
        longest = max(len(pr) for pr in prompts) + max_new
        if longest > self.max_len:
            raise ValueError(f"prompt + maxNewTokens = {longest} tokens: over the engine's limit of {self.max_len} "
                             f"(the KV pool's {self.kv.blocks.capacity} tokens or the model's positions)")
        seqs = []
        for i, pr in enumerate(prompts):
            s = seeds[i] if seeds is not None else None
            if s is None and seed is not None:
                s = sampler.row_seed(seed, i)
            if s is None:  # the worker's own generator (saved with the optimizer): unseeded runs resume exactly
                s = int(torch.randint(0, 2**62, (1,), generator=p.gen, device="cpu"))
            seqs.append(Sequence((rid, i), pr, max_new, temperature, top_k, top_p, int(s), stop_ids, stop_strs))
        self.requests[rid] = seqs
        for s in seqs:
            if max_new == 0:
                s.finish = "length"
            else:
                self.sched.add(s)

    def abort(self, rid, rows):
        for r in rows:
            seqs = self.requests.get(rid)
            if seqs and 0 <= r < len(seqs) and seqs[r].finish is None:
                self._finish(seqs[r], "abort")

    def has_work(self):
        return bool(self.requests)

    def load(self):
        """What SGLang's /get_load reports: rows running and queued, KV tokens held and in all (the pool is built
        for the question once a model is there: a scheduler asks before the first request)."""
        if self.sched is None and self.policy.model is not None and self.policy.r.sharding != "fsdp":
            self._ensure()
        if self.sched is None:
            return {"running": 0, "queued": 0, "usedTokens": 0, "capacityTokens": 0, "blockTokens": self.policy.settings.kv_block}
        b, st = self.kv.blocks, self.stats
        return {"running": len(self.sched.running) + len(self.sched.prefilling), "queued": len(self.sched.waiting),
                "usedTokens": b.used, "capacityTokens": b.capacity, "blockTokens": b.block_size,
                "decodeSteps": st["decode_steps"], "generatedTokens": st["generated"],
                "prefillTokens": st["prefill_tokens"], "cachedTokens": st["cached_tokens"], "retractions": st["retractions"],
                "slot": slot_name(self.policy.settings.engine), "device": str(self.policy.device),
                "maxLen": self.max_len}

    # ---- one step --------------------------------------------------------------------------------

    def step(self):
        """One admission, prefill chunk and decode step; returns [(id, result)] of the requests now finished."""
        finished = [rid for rid in list(self.requests) if self._done(rid)]
        sched = self.sched
        if sched is None or not len(sched):
            return self._collect(finished)
        sched.admit()
        chunks = sched.prefill_batch()
        if chunks:
            rows = [(s.tokens[s.computed : s.computed + k], s.computed, s.blocks) for s, k in chunks]
            logits = self.runner.prefill(rows)
            self.stats["prefill_tokens"] += sum(k for _, k in chunks)
            done = []
            for i, (s, k) in enumerate(chunks):
                sched.computed(s, k)
                if s.computed == len(s.tokens):
                    done.append(i)
            if done:
                seqs = [chunks[i][0] for i in done]
                self._sample(seqs, logits[torch.tensor(done, device=logits.device)])
        running = [s for s in sched.decode_batch() if s.finish is None]
        if running:
            logits = self.runner.decode([(s.tokens[-1], len(s.tokens) - 1, s.blocks) for s in running])
            self.stats["decode_steps"] += 1
            for s in running:
                sched.computed(s, 1)
            self._sample(running, logits)
        return self._collect([rid for rid in list(self.requests) if self._done(rid)])

    def _sample(self, seqs, logits):
        key = [(s.key, s.temperature, s.top_k, s.top_p) for s in seqs]
        if self.params[0] != key:
            self.params = (key, sampler.Params([s.temperature for s in seqs], [s.top_k for s in seqs], [s.top_p for s in seqs], logits.device))
        u = sampler.uniforms([s.seed for s in seqs], [len(s.tokens) - s.prompt_len for s in seqs])
        tok, lp = sampler.sample(logits, self.params[1], torch.from_numpy(u).to(logits.device))
        tl, ll = tok.tolist(), lp.tolist()
        detok = self.policy.detok
        for s, t, l in zip(seqs, tl, ll):
            s.tokens.append(t)
            s.logprobs.append(l)
            self.stats["generated"] += 1
            n = len(s.tokens) - s.prompt_len
            if t in s.stop_ids:
                self._finish(s, "stop")
            elif s.stop_strs and self._stop_string(s, detok.piece(t)):
                self._finish(s, "stop")
            elif n >= s.max_new:
                self._finish(s, "length")

    @staticmethod
    def _stop_string(s, piece):
        longest = max(len(x) for x in s.stop_strs)
        tail = s.tail + piece
        s.tail = tail[-(longest + 64) :]
        look = tail[-(longest + len(piece)) :]
        return any(x in look for x in s.stop_strs)

    def _finish(self, s, why):
        s.finish = why
        self.sched.drop(s)
        self.stats["cached_tokens"] += s.cached or 0
        self.stats["retractions"] += s.retractions

    def _done(self, rid):
        return all(s.finish is not None for s in self.requests[rid])

    def _collect(self, rids):
        out = []
        for rid in rids:
            seqs = self.requests.pop(rid)
            out.append((rid, {
                "ids": [s.output for s in seqs],
                "logprobs": [s.logprobs for s in seqs],
                "finish": [s.finish for s in seqs],
                "cached": [s.cached or 0 for s in seqs],
                "retractions": [s.retractions for s in seqs],
            }))
        return out

    def run(self, rid, prompts, sp, cancelled=None):
        """A request to its end (no other requests meanwhile): Policy.generate's path. `cancelled()`, polled
        between steps, returns the rows to stop."""
        self.add(rid, prompts, sp)
        while True:
            if cancelled:
                self.abort(rid, cancelled())
            for got, res in self.step():
                if got == rid:
                    return res
