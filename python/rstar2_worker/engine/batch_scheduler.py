"""Which sequences run next: admission against the KV pool with prefix reuse, chunked prefill, preemption.

Sequences wait, are admitted when the pool holds their tokens (blocks already computed for the same prefix
are taken, not computed again), prefill in chunks of at most `prefill_tokens` new tokens a step beside the
running decodes, then decode one token a step. When a decode finds no free block, the most recently admitted
sequence is retracted (its blocks freed, its full blocks left cached) and waits at the front of the queue, as
SGLang retracts; it is prefilled again, from its cached prefix, when it is readmitted.
"""
import collections

from rstar2_worker.engine.kv_pool import block_hash


class Sequence:
    def __init__(self, key, prompt, max_new, temperature, top_k, top_p, seed, stop_ids, stop_strs):
        self.key = key  # (request id, row)
        self.tokens = list(prompt)
        self.prompt_len = len(prompt)
        self.logprobs = []
        self.max_new, self.temperature, self.top_k, self.top_p, self.seed = max_new, temperature, top_k, top_p, seed
        self.stop_ids, self.stop_strs, self.tail = stop_ids, stop_strs, b""
        self.blocks, self.hashes = [], []  # hashes[j]: block j's prefix hash, once it is full and computed
        self.pending = []  # hashes of full blocks being computed for this admission, not registered yet
        self.computed = 0  # tokens whose keys and values are in the pool
        self.cached = None  # prompt tokens served from the prefix cache at the first admission
        self.retractions = 0
        self.finish = None

    @property
    def output(self):
        return self.tokens[self.prompt_len :]


class BatchScheduler:
    def __init__(self, blocks, max_batch, prefill_tokens, prefix_cache=True):
        self.pool = blocks  # kv_pool.BlockPool
        self.bs = blocks.block_size
        self.max_batch, self.prefill_tokens, self.prefix_cache = max_batch, prefill_tokens, prefix_cache
        self.waiting = collections.deque()
        self.prefilling = []  # admitted, some tokens still to compute
        self.running = []  # decoding: all tokens but the last computed
        self.inflight = set()  # hashes of full blocks some admitted sequence is computing now

    def __len__(self):
        return len(self.waiting) + len(self.prefilling) + len(self.running)

    def add(self, seq):
        self.waiting.append(seq)

    def drop(self, seq):
        """Takes seq out wherever it is (finished or aborted), freeing its blocks."""
        for q in (self.prefilling, self.running):
            if seq in q:
                q.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)

    def _free(self, seq):
        self.pool.release(seq.blocks)
        self.inflight.difference_update(seq.pending)
        seq.blocks, seq.hashes, seq.pending, seq.computed = [], [], [], 0

    # ---- admission ---------------------------------------------------------------------------

    def admit(self):
        """Moves waiting sequences into prefill while the batch and the pool allow, in arrival order. A sequence
        whose next prefix block another is computing right now waits a step and then takes it from the cache
        (the G samples of one prompt compute it once); others pass it meanwhile."""
        for seq in list(self.waiting):
            if len(self.prefilling) + len(self.running) >= self.max_batch:
                return
            got = self._place(seq)
            if got is None:
                return  # the pool is full: the queue's head waits for blocks, the rest behind it
            if got:
                self.waiting.remove(seq)
                self.prefilling.append(seq)

    def _place(self, seq):
        """Blocks for all of seq's tokens: True when placed, False to wait a step (prefix in flight), None when
        the pool cannot hold it now."""
        n, bs, pool = len(seq.tokens), self.bs, self.pool
        matched, hashes, h = [], [], None
        # whole blocks from the cache, leaving at least the last token to compute (its logits give the next one)
        while self.prefix_cache and (len(matched) + 1) * bs <= n - 1:
            j = len(matched)
            h = block_hash(h, seq.tokens[j * bs : (j + 1) * bs])
            b = pool.cached(h)
            if b is None:
                if h in self.inflight:
                    return False
                break
            matched.append(b)
            hashes.append(h)
        need = -(-n // bs) - len(matched)
        if need > len(pool.free) - sum(1 for b in matched if pool.ref[b] == 0):
            return None
        for b in matched:
            pool.take(b)
        seq.blocks = matched + [pool.allocate() for _ in range(need)]
        seq.hashes = hashes
        seq.computed = len(matched) * bs
        if seq.cached is None:
            seq.cached = seq.computed
        # the full blocks this admission computes: a sequence with the same prefix waits for them
        prev, seq.pending = (hashes[-1] if hashes else None), []
        for j in range(len(matched), n // bs if self.prefix_cache else 0):
            prev = block_hash(prev, seq.tokens[j * bs : (j + 1) * bs])
            seq.pending.append(prev)
        self.inflight.update(seq.pending)
        return True

    # ---- what runs this step --------------------------------------------------------------------

    def prefill_batch(self):
        """(seq, new tokens) chunks of at most prefill_tokens tokens in all, oldest admitted first."""
        out, left = [], self.prefill_tokens
        for seq in self.prefilling:
            if left <= 0:
                break
            k = min(len(seq.tokens) - seq.computed, left)
            out.append((seq, k))
            left -= k
        return out

    def computed(self, seq, k):
        """seq's next k tokens are in the pool now: full blocks are registered for reuse; a sequence whose
        tokens are all computed moves to decoding."""
        seq.computed += k
        self._register(seq)
        if seq.computed == len(seq.tokens) and seq in self.prefilling:
            self.prefilling.remove(seq)
            self.running.append(seq)

    def _register(self, seq):
        bs = self.bs
        while self.prefix_cache and len(seq.hashes) < seq.computed // bs:
            j = len(seq.hashes)
            h = block_hash(seq.hashes[-1] if seq.hashes else None, seq.tokens[j * bs : (j + 1) * bs])
            self.pool.register(seq.blocks[j], h)
            seq.hashes.append(h)
            if h in seq.pending:
                seq.pending.remove(h)
                self.inflight.discard(h)

    def decode_batch(self):
        """The running sequences, each with a block for the token it feeds; when the pool has none left, the
        most recently admitted sequence is retracted (possibly the one asking)."""
        for seq in list(self.running):
            if seq not in self.running:
                continue  # retracted while an earlier one asked
            while len(seq.tokens) > len(seq.blocks) * self.bs:
                b = self.pool.allocate()
                if b is not None:
                    seq.blocks.append(b)
                    continue
                victim = self.running[-1]
                self.retract(victim)
                if victim is seq:
                    break
        return list(self.running)

    def retract(self, seq):
        self.running.remove(seq)
        self._free(seq)
        seq.retractions += 1
        self.waiting.appendleft(seq)
