"""rope_scaling against the published formulas, computed here in plain floats (python -m unittest tests.test_rope
from python/). YaRN (arXiv 2309.00071, as transformers' _compute_yarn_parameters implements it): dimension
pair i has frequency base^(-2i/d); pairs that turn more than beta_fast = 32 times over the original context
keep it, pairs that turn fewer than beta_slow = 1 times get it divided by the factor, and the pairs between
ramp linearly over the (floored/ceiled) correction dimensions; cos and sin are scaled by 0.1 ln(factor) + 1."""
import math
import unittest

import torch

from rstar2_worker.models import layers as L

from rstar2_worker.models import model as M

QWEN = {  # Qwen2.5-7B's shape with its published YaRN block
    "vocab_size": 64,
    "hidden_size": 3584,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "rope_theta": 1000000.0,
    "max_position_embeddings": 32768,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
}


def yarn_reference(d, base, factor, original):
    """inv_freq per pair and the attention factor, from the formula (not from the worker's code)."""

    def pair_at(rotations):  # solve original / (2π base^(2i/d)) = rotations for the pair index i
        return d * math.log(original / (2 * math.pi * rotations)) / (2 * math.log(base))

    low, high = max(math.floor(pair_at(32)), 0), min(math.ceil(pair_at(1)), d - 1)
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        interpolated = min(max((i - low) / (high - low), 0.0), 1.0)  # 0 below low, 1 above high
        out.append(theta * (1 - interpolated) + theta / factor * interpolated)
    return out, 0.1 * math.log(factor) + 1


class RopeScaling(unittest.TestCase):
    def test_yarn_matches_the_formula_for_factor_4(self):
        cfg = M.Config(QWEN)
        inv, scale = L.rope_parameters(cfg)
        want, want_scale = yarn_reference(128, 1e6, 4.0, 32768)
        self.assertEqual(len(inv), 64)
        for i in range(64):
            self.assertAlmostEqual(inv[i].item() / want[i], 1.0, places=5, msg=f"pair {i}")
        self.assertAlmostEqual(scale, 1.1386294361, places=9)
        self.assertAlmostEqual(scale, want_scale, places=12)
        # the known ends: the fastest pair untouched, the slowest divided by the factor
        self.assertEqual(inv[0].item(), 1.0)
        self.assertAlmostEqual(inv[63].item() / (1e6 ** (-126 / 128) / 4), 1.0, places=5)
        # and the ramp really is in between somewhere
        mid = [i for i in range(64) if want[i] not in (1e6 ** (-2 * i / 128), 1e6 ** (-2 * i / 128) / 4)]
        self.assertTrue(mid)

    def test_rotary_tables_carry_the_scaled_frequencies(self):
        cfg = M.Config({**QWEN, "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
        rope = L.Rotary(cfg)
        cos, sin = rope.tables(40000, torch.device("cpu"))
        want, s = yarn_reference(128, 1e6, 4.0, 32768)
        for p in (1, 1000, 39999):
            for i in (0, 20, 30, 63):
                angle = p * want[i]
                tol = 2e-7 * angle + 1e-5  # fp32 frequencies: the angle's error grows with it
                self.assertAlmostEqual(cos[p, i].item(), math.cos(angle) * s, delta=tol)
                self.assertAlmostEqual(sin[p, 64 + i].item(), math.sin(angle) * s, delta=tol)

    def test_linear_divides_every_frequency(self):
        inv, scale = L.rope_parameters(M.Config({**QWEN, "rope_scaling": {"type": "linear", "factor": 2.0}}))
        for i in (0, 7, 63):
            self.assertAlmostEqual(inv[i].item() / (1e6 ** (-2 * i / 128) / 2), 1.0, places=5)
        self.assertEqual(scale, 1.0)

    def test_default_and_missing_are_plain_rope(self):
        plain, _ = L.rope_parameters(M.Config({**QWEN, "rope_scaling": None}))
        dflt, s = L.rope_parameters(M.Config({**QWEN, "rope_scaling": {"rope_type": "default"}}))
        self.assertTrue(torch.equal(plain, dflt))
        self.assertEqual(s, 1.0)

    def test_unknown_types_are_refused_by_name(self):
        for t in ("dynamic", "longrope", "llama3", "su"):
            with self.assertRaisesRegex(ValueError, f"unsupported rope_scaling type '{t}'.*supported: default, linear, yarn"):
                M.Config({**QWEN, "rope_scaling": {"type": t, "factor": 2.0}})
        with self.assertRaisesRegex(ValueError, "needs a numeric factor"):
            M.Config({**QWEN, "rope_scaling": {"type": "yarn"}})

    def test_transformers_5_rope_parameters_read_as_the_older_keys(self):
        # transformers >= 5 saves {"rope_parameters": {"rope_type", "rope_theta", factor...}} and no rope_theta
        legacy = {k: v for k, v in QWEN.items() if k not in ("rope_theta", "rope_scaling")}
        v5 = M.Config({**legacy, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0,
                                                     "original_max_position_embeddings": 32768}})
        old = M.Config(QWEN)
        self.assertEqual((v5.rope_theta, v5.rope_type), (1e6, "yarn"))
        for a, b in zip(L.rope_parameters(v5), L.rope_parameters(old)):
            self.assertTrue(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))
        plain = M.Config({**legacy, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}})
        self.assertEqual((plain.rope_theta, plain.rope_type), (5e5, "default"))
        with self.assertRaisesRegex(ValueError, "per-layer-type rope_parameters"):
            M.Config({**legacy, "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6}}})
        with self.assertRaisesRegex(ValueError, "partial_rotary_factor"):
            M.Config({**legacy, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}})

    def test_a_yarn_model_runs(self):
        cfg = M.Config({**QWEN, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2})
        m = M.CausalLM(cfg)
        m.init_weights(0)
        out = m(torch.tensor([[1, 2, 3, 4]]))
        self.assertEqual(tuple(out.shape), (1, 4, 64))
        self.assertTrue(torch.isfinite(out).all())


if __name__ == "__main__":
    unittest.main()
