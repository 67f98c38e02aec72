"""The optional RL loss terms of Policy.train_step (issue 44): KL against a reference policy (k1, k3) and the
entropy bonus. Run by test/worker/loss-options.test.ts (python -m unittest tests.test_policy_loss from python/)."""
import unittest

import torch

from rstar2_worker import policy as P
from tests.test_memory import CFG  # the memory tests' tiny GQA model
SEQS = [[3, 9, 2, 44, 7, 1, 3, 30], [8, 8, 1, 5, 6], [12, 3, 50, 4, 4, 9]]
MASKS = [[0] + [1] * (len(s) - 1) for s in SEQS]


def policy(seed):
    p = P.Policy()
    p.init(dict(CFG), seed)
    return p


def token_logprobs(p):
    lps, _, _ = p.logprobs(SEQS)
    return [[float(x) for x in lp] for lp in lps]


class KlTest(unittest.TestCase):
    def test_estimators(self):
        logp = torch.tensor([-1.0, -2.0, -0.5])
        ref = torch.tensor([-1.5, -2.0, -0.1])
        self.assertTrue(torch.allclose(P.kl_penalty(logp, ref, "k1"), logp - ref))
        r = torch.exp(ref - logp)
        k3 = P.kl_penalty(logp, ref, "k3")
        self.assertTrue(torch.allclose(k3, r - torch.log(r) - 1))
        self.assertTrue(bool((k3 >= 0).all()) and float(k3[1]) == 0.0)
        # k3 is an unbiased KL estimate: over samples of π, its mean approaches KL(π ‖ π_ref)
        g = torch.Generator().manual_seed(0)
        pi, pref = torch.softmax(torch.tensor([1.0, 0.2, -0.5, 0.0]), 0), torch.softmax(torch.tensor([0.3, 0.9, -0.2, 0.1]), 0)
        a = torch.multinomial(pi, 200_000, replacement=True, generator=g)
        est = P.kl_penalty(pi.log()[a], pref.log()[a], "k3").mean()
        exact = (pi * (pi.log() - pref.log())).sum()
        self.assertAlmostEqual(float(est), float(exact), delta=0.005)

    def test_a_step_with_k3_only_moves_the_policy_toward_the_reference(self):
        p, ref = policy(1), token_logprobs(policy(2))
        gap = lambda: sum(abs(a - b) for lp, rf in zip(token_logprobs(p), ref) for a, b in zip(lp[1:], rf[1:]))
        before = gap()
        opts = {"lr": 0.01, "klCoef": 1.0, "klEstimator": "k3", "refLogprobs": ref}
        for _ in range(5):
            st = p.train_step("grpo", SEQS, MASKS, [None] * 3, [0.0] * 3, opts)  # advantage 0: only the KL term
        self.assertLess(gap(), 0.8 * before)
        self.assertGreater(st["kl"], 0.0)

    def test_kl_against_itself_changes_nothing_and_bad_input_is_named(self):
        a, b = policy(3), policy(3)
        adv = [1.0, -0.5, 0.3]
        plain = a.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0})
        same = b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0, "klCoef": 0.5, "refLogprobs": token_logprobs(b)})
        self.assertAlmostEqual(same["loss"], plain["loss"], places=5)
        self.assertAlmostEqual(same["gradNorm"], plain["gradNorm"], places=4)
        self.assertAlmostEqual(same["kl"], 0.0, places=5)
        self.assertNotIn("kl", plain)
        with self.assertRaisesRegex(ValueError, "klCoef needs refLogprobs"):
            b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0, "klCoef": 0.5})
        with self.assertRaisesRegex(ValueError, "klEstimator must be 'k1' or 'k3'"):
            b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0, "klEstimator": "k2"})


class EntropyTest(unittest.TestCase):
    def test_the_sampled_gradient_is_the_entropy_gradient_on_average(self):
        z = torch.tensor([0.5, -1.0, 2.0, 0.1, -0.3], requires_grad=True)
        H = -(torch.softmax(z, 0) * torch.log_softmax(z, 0)).sum()
        (exact,) = torch.autograd.grad(H, z)
        g = torch.Generator().manual_seed(1)
        a = torch.multinomial(torch.softmax(z.detach(), 0), 100_000, replacement=True, generator=g)
        lp = torch.log_softmax(z, 0)[a]
        bonus = P.entropy_bonus(lp, H.detach().expand(len(a)))
        self.assertAlmostEqual(float(bonus.mean()), float(H), places=5)  # its value is H
        (est,) = torch.autograd.grad(bonus.mean(), z)
        self.assertLess(float((est - exact).abs().max()), 0.02, f"{est} vs {exact}")

    def test_a_bonus_changes_the_step_not_the_reported_entropy(self):
        a, b = policy(4), policy(4)
        adv = [1.0, -0.5, 0.3]
        plain = a.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0})
        bonus = b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, {"lr": 0.0, "entropyCoef": 0.1})
        self.assertAlmostEqual(bonus["entropy"], plain["entropy"], places=5)
        self.assertNotAlmostEqual(bonus["gradNorm"], plain["gradNorm"], places=4)


if __name__ == "__main__":
    unittest.main()
