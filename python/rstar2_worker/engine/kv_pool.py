"""The engine's KV cache: one preallocated pool of fixed-size blocks per layer, and the block bookkeeping.

A sequence holds a list of blocks; token t of it lives at slot blocks[t // B] * B + t % B of every layer's
pool. A full block whose keys and values have been computed is registered under a hash of every token up to
its end, so a later sequence with the same prefix (the next turn of a trajectory, another sample of the same
prompt) takes the block instead of computing it again, as vLLM's prefix caching and SGLang's radix cache do.
Freed blocks keep their contents and hash until they are handed out again, oldest freed first.
Block 0 is never handed out: padding rows and padding tokens write there.
"""
import collections

import torch


def block_hash(prev, tokens):
    """The hash of a full block: its tokens and everything before them (through the previous block's hash)."""
    return hash((prev, tuple(tokens)))


class BlockPool:
    def __init__(self, num_blocks, block_size):
        if num_blocks < 2:
            raise ValueError(f"the KV pool needs at least 2 blocks, got {num_blocks}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref = [0] * num_blocks
        self.hash_of = [None] * num_blocks
        self.by_hash = {}
        # free blocks, oldest freed first; a cached block taken back leaves from the middle
        self.free = collections.OrderedDict((b, None) for b in range(1, num_blocks))

    @property
    def capacity(self):
        return (self.num_blocks - 1) * self.block_size

    @property
    def used(self):
        return (self.num_blocks - 1 - len(self.free)) * self.block_size

    def cached(self, h):
        """The block registered under hash h, or None."""
        return self.by_hash.get(h)

    def take(self, b):
        """One more holder of cached block b."""
        if self.ref[b] == 0:
            del self.free[b]
        self.ref[b] += 1

    def allocate(self):
        """A fresh block (its old cached contents forgotten), or None when every block is held."""
        if not self.free:
            return None
        b, _ = self.free.popitem(last=False)
        h = self.hash_of[b]
        if h is not None:
            self.hash_of[b] = None
            if self.by_hash.get(h) == b:
                del self.by_hash[h]
        self.ref[b] = 1
        return b

    def release(self, blocks):
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def register(self, b, h):
        """Block b now holds the computed tokens hashed h. A hash already held by another block keeps that one."""
        if h in self.by_hash or self.hash_of[b] is not None:
            return
        self.hash_of[b] = h
        self.by_hash[h] = b

    def forget(self):
        """Drops every cached prefix (the weights changed: their keys and values are stale)."""
        self.by_hash.clear()
        self.hash_of = [None] * self.num_blocks


class KVPool:
    """Per layer, the key and the value of every slot side by side: [num_blocks * block_size, 2, kv_heads,
    head_dim], so a block's keys and values are one contiguous piece, read with one copy."""

    def __init__(self, cfg, num_blocks, block_size, dtype, device):
        self.blocks = BlockPool(num_blocks, block_size)
        shape = (num_blocks * block_size, 2, cfg.num_key_value_heads, cfg.head_dim)
        # zeros, not empty: attention reads slots it then masks out (padding, a block's unwritten tail), and a
        # NaN bit pattern there would survive the mask (0 * NaN)
        self.layers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_hidden_layers)]


def bytes_per_token(cfg, dtype):
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * torch.finfo(dtype).bits // 8
