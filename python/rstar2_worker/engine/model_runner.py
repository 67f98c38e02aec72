"""Runs the model over the engine's KV pool: prefill chunks eagerly, decode steps in CUDA graphs where it can.

One forward for both: rows of new tokens [B, T] at positions [B, T], written to pool slots, attending to the
slots each row's block table lists. A decode step (T = 1) on a GPU replays a graph captured for its batch size
and block count rounded up to a bucket; padding rows write to and read from block 0, which no sequence holds.
"""
import contextlib
import math
import sys
import time

import numpy as np
import torch


class Paged:
    """One forward over the pool: where its keys and values go (`slots` [B*T]), which blocks each row reads
    (`table` [B, nb]), the additive mask over them (`bias` [B, 1, T, nb * block]), and the rotary tables at
    the positions (`rope`, set by CausalLM.hidden)."""

    def __init__(self, slots, table, bias, block_size, cfg):
        self.slots, self.table, self.bias, self.bs = slots, table, bias, block_size
        self.rope = None
        H, nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        # query head h reads kv head h // rep: a decode step multiplies every query head against all kv heads'
        # keys at once, the others zeroed by this mask (scaled by 1/sqrt(D) on the way), and keeps its own
        rep = H // nkv
        own = torch.arange(H, device=table.device) // rep
        self.qmask = (own.unsqueeze(1) == torch.arange(nkv, device=table.device)).unsqueeze(-1) / math.sqrt(D)
        self.pick = torch.arange(H, device=table.device) * nkv + own

    def attention(self, attn, q, k, v, pool):
        """q [B, T, H, D], k/v [B, T, nkv, D] of this pass, pool [slots, 2, nkv, D] one layer's keys and values
        → attention output [B, T, H * D]. The pass's keys and values are written first, then each row's blocks
        are read whole (one index_select of contiguous blocks, no per-token gather)."""
        B, T, H, D = q.shape
        nkv = k.shape[2]
        # in the pool's dtype: under bf16-mixed autocast the rotation leaves q and k in fp32
        q = q.to(pool.dtype)
        pool.index_copy_(0, self.slots, torch.stack((k, v), 2).to(pool.dtype).view(B * T, 2, nkv, D))
        nb = self.table.shape[1]
        kv = pool.view(-1, self.bs * 2 * nkv * D).index_select(0, self.table.reshape(-1)).view(B, nb * self.bs, 2, nkv, D)
        if T > 1:  # prefill: SDPA (or the explicit path) over [B, heads, S, D] views
            keys, vals = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
            return attn.attend(q.transpose(1, 2), keys, vals, self.bias, gqa=True).transpose(1, 2).reshape(B, T, H * D)
        # decode: [B, S, nkv * D] rows are strided views of the gathered blocks, which bmm reads as they are
        keys, vals = kv[:, :, 0].flatten(2), kv[:, :, 1].flatten(2)
        if self.qmask.dtype != q.dtype:  # once a forward, not once a layer
            self.qmask = self.qmask.to(q.dtype)
        qf = (q.view(B, H, 1, D) * self.qmask).view(B, H, nkv * D)
        scores = torch.bmm(qf, keys.transpose(1, 2)) + self.bias.view(B, 1, -1)
        att = torch.softmax(scores, -1, dtype=torch.float32).to(vals.dtype)
        out = torch.bmm(att, vals).view(B, H * nkv, D).index_select(1, self.pick)
        return out.view(B, 1, H * D)


def bucket(n, sizes):
    return next(s for s in sizes if s >= n)


class ModelRunner:
    def __init__(self, model, pool, device, max_len, autocast_dtype=None, graphs=False, max_batch=256):
        self.model, self.pool, self.device = model, pool, device
        self.bs = pool.blocks.block_size
        self.max_len = max_len
        self.max_blocks = -(-max_len // self.bs)
        self.autocast_dtype = autocast_dtype
        model.rope.tables(max_len, device)  # once: a graph holds the tables' addresses
        # graphs: True (CUDA graphs), "eager" (the same bucketed static-buffer path run without capture: what tests
        # on a CPU check), or False (each step at its exact size)
        self.mode = graphs
        self.batch_sizes = [1, 2, 4, 8] + list(range(16, max_batch + 16, 16))
        self.block_counts = [1 << i for i in range(max(self.max_blocks - 1, 1).bit_length() + 1)]
        self.graphs = {}
        self.mempool = None
        self.captures = 0
        self.capture_s = 0.0
        if graphs:
            nb, b = self.block_counts[-1], self.batch_sizes[-1]
            self.rope_at_capture = model.rope.cos
            self.static = {
                "head": torch.zeros(3, b, dtype=torch.long, device=device),  # ids, positions, slots
                "table": torch.zeros(b, nb, dtype=torch.long, device=device),
                "logits": torch.zeros(b, model.cfg.vocab_size, dtype=self.logits_dtype(), device=device),
            }

    def logits_dtype(self):
        return self.autocast_dtype or next(self.model.parameters()).dtype

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # no weight-cast cache: a captured graph must cast from the live weights, not a cache of old ones
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=False)

    def forward(self, ids, pos, slots, table, last):
        """Logits [B, V] at row b's position last[b] of ids [B, T]; table [B, nb] holds each row's blocks."""
        B, T = ids.shape
        S = table.shape[1] * self.bs
        keys = torch.arange(S, device=ids.device)
        bias = torch.zeros(B, T, S, dtype=torch.float32, device=ids.device)
        bias = bias.masked_fill(keys.view(1, 1, S) > pos.unsqueeze(-1), float("-inf")).unsqueeze(1)
        with torch.no_grad(), self._autocast():
            paged = Paged(slots, table, bias, self.bs, self.model.cfg)
            h = self.model.hidden(ids, pos, None, self.pool.layers, paged=paged, max_pos=self.max_len - 1)
            h = h[torch.arange(B, device=ids.device), last] if T > 1 else h[:, 0]
            return self.model.lm_head(h)

    def inputs(self, rows, T):
        """Host arrays for rows of (new tokens, first position, blocks), right-padded to T new tokens."""
        B = len(rows)
        nb = max(-(-(start + len(toks)) // self.bs) for toks, start, _ in rows)
        ids = np.zeros((B, T), np.int64)
        pos = np.zeros((B, T), np.int64)
        slots = np.zeros((B, T), np.int64)
        table = np.zeros((B, nb), np.int64)
        last = np.zeros(B, np.int64)
        for i, (toks, start, blocks) in enumerate(rows):
            n = len(toks)
            bl = np.asarray(blocks[:nb], np.int64)
            table[i, : len(bl)] = bl
            p = np.arange(start, start + n)
            ids[i, :n] = toks
            pos[i, :n] = p
            slots[i, :n] = bl[p // self.bs] * self.bs + p % self.bs
            last[i] = n - 1
        return ids, pos, slots, table, last

    def _dev(self, a):
        return torch.from_numpy(a).to(self.device)

    def prefill(self, rows):
        """rows: (new tokens, first position, blocks) each; logits at each row's last new token."""
        T = max(len(r[0]) for r in rows)
        ids, pos, slots, table, last = self.inputs(rows, T)
        return self.forward(self._dev(ids), self._dev(pos), self._dev(slots.reshape(-1)), self._dev(table), self._dev(last))

    def decode(self, rows):
        """rows: (token, position, blocks) each, a sequence's blocks covering its position; logits [B, V] for the
        next token of each."""
        B, bs = len(rows), self.bs
        nb = max(len(bl) for _, _, bl in rows)
        static = self.mode and B <= self.batch_sizes[-1]
        bb, nbb = (bucket(B, self.batch_sizes), bucket(nb, self.block_counts)) if static else (B, nb)
        # built as Python ints: a decode step's host work is per row, and numpy per small row costs more
        head = np.zeros((3, bb), np.int64)  # ids, positions, slots; padding rows write slot 0 (block 0)
        head[0, :B] = [t for t, _, _ in rows]
        head[1, :B] = [p for _, p, _ in rows]
        head[2, :B] = [bl[p // bs] * bs + p % bs for _, p, bl in rows]
        table = np.zeros((bb, nbb), np.int64)
        for i, (_, _, bl) in enumerate(rows):
            table[i, : len(bl)] = bl
        if not static:
            d = self._dev(head)
            return self.forward(d[0].unsqueeze(1), d[1].unsqueeze(1), d[2], self._dev(table), None)
        if self.model.rope.cos is not self.rope_at_capture:  # the tables were rebuilt: graphs hold the old ones
            self.graphs.clear()
            self.rope_at_capture = self.model.rope.cos
        st = self.static
        st["head"][:, :bb].copy_(torch.from_numpy(head))
        st["table"][:bb, :nbb].copy_(torch.from_numpy(table))
        run = self._graph(bb, nbb) if self.mode is True else None
        if run is None:
            self._static_step(bb, nbb)
        else:
            run.replay()
        return st["logits"][:B]

    def _static_step(self, bb, nbb):
        st = self.static
        head = st["head"][:, :bb]
        st["logits"][:bb].copy_(self.forward(head[0].unsqueeze(1), head[1].unsqueeze(1), head[2], st["table"][:bb, :nbb], None))

    def _graph(self, bb, nbb):
        """The graph for (batch bucket, block bucket), captured on first use; None where capture fails (then
        every later step runs eagerly, said once)."""
        key = (bb, nbb)
        if key in self.graphs:
            return self.graphs[key]
        t0 = time.time()
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm up outside capture: lazy inits (cuBLAS handles) must not be captured
                self._static_step(bb, nbb)
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.mempool):
                self._static_step(bb, nbb)
            if self.mempool is None:
                self.mempool = g.pool()
        except Exception as e:  # noqa: BLE001 - any capture failure leaves decode correct, only slower
            print(f"rstar2 worker: CUDA graph capture failed at batch {bb}, {nbb} blocks "
                  f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); decode runs without graphs", file=sys.stderr)
            self.mode = "eager"
            self.graphs.clear()
            return None
        self.captures += 1
        self.capture_s += time.time() - t0
        self.graphs[key] = g
        return g
