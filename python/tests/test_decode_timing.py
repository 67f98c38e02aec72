import json
import math
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))  # the bench, not in the package
import decode_timing as D  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=100)


class DecodeTimingTest(unittest.TestCase):
    def test_decode_attention_is_grouped_query_attention(self):
        g = torch.Generator().manual_seed(1)
        B, rep, KV, Dh, lens = 3, 4, 2, 16, [5, 1, 9]
        q = torch.randn(B, rep, KV, Dh, generator=g)  # query head r * KV + j reads kv head j
        k, v = torch.randn(sum(lens), KV, Dh, generator=g), torch.randn(sum(lens), KV, Dh, generator=g)
        want, s = [], 0
        for b, n in enumerate(lens):  # each query head against its kv head's keys, written out
            heads = []
            for h in range(rep * KV):
                kh, vh = k[s:s + n, h % KV], v[s:s + n, h % KV]
                heads.append(torch.softmax(kh @ q[b, h // KV, h % KV] / math.sqrt(Dh), 0) @ vh)
            want.append(torch.cat(heads))
            s += n
        self.assertTrue(torch.allclose(D.attend(q, k, v, lens), torch.stack(want), atol=1e-5))

    def test_writes_the_samples_calibrate_reads(self):
        with tempfile.TemporaryDirectory() as d:
            cfg, out = os.path.join(d, "config.json"), os.path.join(d, "s.jsonl")
            with open(cfg, "w") as f:
                json.dump(TINY, f)
            rows = D.main(["--config", cfg, "--tp", "2", "--kv-tokens", "64", "--batches", "2,4", "--contexts", "8,32",
                           "--prefills", "16,128", "--reps", "1", "--out", out])
            with open(out) as f:
                lines = [json.loads(x) for x in f]
        self.assertEqual(lines, rows)
        steps = [(r["batch"], r["kv"]) for r in rows if "batch" in r]
        self.assertEqual(steps, [(2, 16), (2, 64), (4, 32)])  # 4 × 32 is over the 64-token cache
        self.assertEqual([r["tokens"] for r in rows if "tokens" in r], [16])
        self.assertTrue(all(r["ms"] > 0 and r["tp"] == 2 for r in rows))

    def test_refuses_a_split_the_heads_do_not_allow(self):
        with self.assertRaisesRegex(SystemExit, "--tp 3 does not divide 8 heads and 2 kv heads"):
            D.shard(TINY, 3)


if __name__ == "__main__":
    unittest.main()
