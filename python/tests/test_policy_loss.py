"""The optional RL loss terms of Policy.train_step (issue 44): KL against a reference policy (k1, k3) and the
entropy bonus; and how a step's token losses are aggregated, verl's scaling among them (issue 43). Run by test/worker/loss-options.test.ts (python -m unittest tests.test_policy_loss from python/)."""
import unittest

import torch

from rstar2_worker.train import policy as P
from tests.test_memory import CFG  # the memory tests' tiny GQA model
from tests.train_opts import full_train_opts

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
        opts = full_train_opts(0.01, klCoef=1.0, klEstimator="k3", refLogprobs=ref)
        for _ in range(5):
            st = p.train_step("grpo", SEQS, MASKS, [None] * 3, [0.0] * 3, opts)  # advantage 0: only the KL term
        self.assertLess(gap(), 0.8 * before)
        self.assertGreater(st["kl"], 0.0)

    def test_kl_against_itself_changes_nothing_and_bad_input_is_named(self):
        a, b = policy(3), policy(3)
        adv = [1.0, -0.5, 0.3]
        plain = a.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0))
        same = b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0, klCoef=0.5, refLogprobs=token_logprobs(b)))
        self.assertAlmostEqual(same["loss"], plain["loss"], places=5)
        self.assertAlmostEqual(same["gradNorm"], plain["gradNorm"], places=4)
        self.assertAlmostEqual(same["kl"], 0.0, places=5)
        self.assertNotIn("kl", plain)
        with self.assertRaisesRegex(ValueError, "klCoef needs refLogprobs"):
            b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0, klCoef=0.5))
        with self.assertRaisesRegex(ValueError, "klEstimator must be 'k1' or 'k3'"):
            b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0, klEstimator="k2"))


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
        plain = a.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0))
        bonus = b.train_step("grpo", SEQS, MASKS, [None] * 3, adv, full_train_opts(0.0, entropyCoef=0.1))
        self.assertAlmostEqual(bonus["entropy"], plain["entropy"], places=5)
        self.assertNotAlmostEqual(bonus["gradNorm"], plain["gradNorm"], places=4)


# verl's loss scaling, written out here from its source (J-shang/verl at d0dc976, the verl the rStar2 release pins):
# verl/workers/actor/dp_actor.py update_policy, use_dynamic_bsz: each micro-batch's policy loss is
#   pg_loss = agg_loss(pg_losses, response_mask, "token-mean") = masked_mean = sum(x * m) / (sum(m) + 1e-8)
#   loss = pg_loss * (response_mask.shape[0] / ppo_mini_batch_size); loss.backward()   (gradients accumulate)
# with ppo_mini_batch_size normalised in fsdp_workers.py to train_batch_size * rollout.n / world; the ranks'
# gradients are averaged, so over all ranks: sum over micro-batches of token-mean * sequences / (prompts * n).
def verl_weights(micro_batches, trained, nominal):
    """Each sequence's weight on its own token-sum gradient: a sequence in micro-batch mb counts its tokens
    1 / (mb's trained tokens) times len(mb) / nominal."""
    w = {}
    for mb in micro_batches:
        tokens = sum(trained[i] for i in mb)
        for i in mb:
            w[i] = len(mb) / nominal / (tokens + 1e-8)
    return w


class VerlScalingTest(unittest.TestCase):
    # four sequences of unequal lengths, packed into micro-batches of at most 13 tokens
    SEQS = [[3, 9, 2, 44, 7, 1, 3, 30], [8, 8, 1, 5, 6], [12, 3, 50, 4, 4, 9], [5, 6, 7, 8]]
    MASKS = [[0, 0] + [1] * (len(s) - 2) for s in SEQS]
    ADV = [1.0, -0.5, 0.3, -1.2]
    BUDGET = 13

    def grads(self, p, seqs, masks, advs, opts):
        """The gradient train_step hands the optimizer (no clipping), flattened."""
        got = []
        real = torch.optim.AdamW.step

        def capture(opt, *a, **k):
            got.append(torch.cat([q.grad.flatten() for g in opt.param_groups for q in g["params"] if q.grad is not None]))

        torch.optim.AdamW.step = capture
        try:
            st = p.train_step("grpo", seqs, masks, [None] * len(seqs), advs, full_train_opts(0.0, **{"gradClip": 0, **opts}))
        finally:
            torch.optim.AdamW.step = real
        return got[0], st

    def test_micro_mean_nominal_is_verls_gradient_and_loss(self):
        p = policy(5)
        trained = [sum(m[1:]) for m in self.MASKS]
        # each sequence's token-sum gradient, from a step on it alone (token-mean of one sequence = sum / its tokens)
        per_seq = []
        for i in range(len(self.SEQS)):
            g, _ = self.grads(p, [self.SEQS[i]], [self.MASKS[i]], [self.ADV[i]], {})
            per_seq.append(g * trained[i])
        mbs = P.pack(self.SEQS, self.BUDGET)
        self.assertGreater(len(mbs), 1)  # several micro-batches, or the weighting would not show
        nominal = 8  # e.g. 2 prompts × 4 rollouts, of which RoC kept these 4
        w = verl_weights(mbs, trained, nominal)
        want = sum(w[i] * per_seq[i] for i in range(len(self.SEQS)))
        opts = {"lossAgg": "micro-mean-nominal", "nominalSeqs": nominal, "maxTokensPerMicroBatch": self.BUDGET}
        got, st = self.grads(p, self.SEQS, self.MASKS, self.ADV, opts)
        self.assertLess(float((got - want).abs().max()), 1e-6 * float(want.abs().max()) + 1e-9)
        # the loss verl reports: sum over micro-batches of pg_loss * loss_scale_factor; at ratio 1 a token's pg
        # loss is -advantage
        loss = sum(sum(-self.ADV[i] * trained[i] for i in mb) / sum(trained[i] for i in mb) * len(mb) / nominal for mb in mbs)
        self.assertAlmostEqual(st["loss"], loss, places=5)
        # a nominal batch twice as large halves the step: the scale is not renormalised by what was kept
        half, st2 = self.grads(p, self.SEQS, self.MASKS, self.ADV, {**opts, "nominalSeqs": 2 * nominal})
        self.assertTrue(torch.allclose(half * 2, got, rtol=1e-5, atol=1e-9))
        self.assertAlmostEqual(st2["loss"] * 2, st["loss"], places=5)

    def test_micro_mean_batch_divides_by_the_sequences_given_and_verl_is_refused(self):
        p = policy(6)
        opts = {"maxTokensPerMicroBatch": self.BUDGET}
        nominal, st_n = self.grads(p, self.SEQS, self.MASKS, self.ADV, {**opts, "lossAgg": "micro-mean-nominal", "nominalSeqs": 8})
        batch, st_b = self.grads(p, self.SEQS, self.MASKS, self.ADV, {**opts, "lossAgg": "micro-mean-batch"})
        # the same weighting over the 4 sequences given instead of the nominal 8
        self.assertTrue(torch.allclose(batch, nominal * 2, rtol=1e-5, atol=1e-9))
        self.assertAlmostEqual(st_b["loss"], st_n["loss"] * 2, places=5)
        mean, _ = self.grads(p, self.SEQS, self.MASKS, self.ADV, {**opts, "lossAgg": "token-mean"})
        self.assertGreater(float((mean - batch).abs().max()), 1e-4 * float(mean.abs().max()))  # a different weighting
        for bad, msg in (
            ({"lossAgg": "verl"}, "'verl' was renamed: 'micro-mean-batch' is what it computed"),
            ({"lossAgg": "micro-mean-nominal"}, "needs nominalSeqs, a positive integer"),
            ({"lossAgg": "micro-mean-nominal", "nominalSeqs": 0}, "needs nominalSeqs"),
            ({"lossAgg": "seq-mean"}, "lossAgg must be one of token-mean, micro-mean-batch, micro-mean-nominal"),
        ):
            with self.assertRaisesRegex(ValueError, msg):
                p.train_step("grpo", self.SEQS, self.MASKS, [None] * 4, self.ADV, full_train_opts(0.0, **bad))


class OptionsTest(unittest.TestCase):
    """train_step has no defaults of its own (they are TrainOptionsSchema's) and no lr schedule: it uses the lr sent."""

    def test_every_key_is_required_and_an_unknown_one_is_named(self):
        p = policy(7)
        with self.assertRaisesRegex(ValueError, r"^train_step: options missing: weightDecay, betas, .*, entropyCoef$"):
            p.train_step("sft", SEQS, MASKS, [None] * 3, [0.0] * 3, {"lr": 0.0})
        partial = full_train_opts(0.0)
        del partial["clipHigh"], partial["nominalSeqs"]
        with self.assertRaisesRegex(ValueError, r"^train_step: options missing: clipHigh, nominalSeqs$"):
            p.train_step("sft", SEQS, MASKS, [None] * 3, [0.0] * 3, partial)
        with self.assertRaisesRegex(ValueError, r"^train_step: unknown options: warmupSteps$"):
            p.train_step("sft", SEQS, MASKS, [None] * 3, [0.0] * 3, {**full_train_opts(0.0), "warmupSteps": 3})
        self.assertEqual(p.step, 0)  # refused before any change

    def test_the_lr_sent_is_the_lr_used_at_every_step(self):
        p = policy(8)
        for k, lr in enumerate((1e-3, 2e-3, 2e-3, 5e-4), 1):
            st = p.train_step("sft", SEQS, MASKS, [None] * 3, [0.0] * 3, full_train_opts(lr))
            self.assertEqual((st["lr"], st["step"]), (lr, k))
            self.assertEqual(p.opt.param_groups[0]["lr"], lr)


if __name__ == "__main__":
    unittest.main()


class RankScaleTest(unittest.TestCase):
    def test_fsdp_ranks_scale_their_loss_by_the_world_so_its_averaging_sums(self):
        from rstar2_worker.train import dist as D

        # each rank's loss is its share of the global token mean: the gradients must be summed over ranks. FSDP
        # averages them (divides by the world), so its ranks multiply first; DDP's sum_hook sums already
        self.assertEqual(D.sum_scale(D.Rank(world=4, sharding="fsdp")), 4)
        self.assertEqual(D.sum_scale(D.Rank(world=4, sharding="ddp")), 1)
        self.assertEqual(D.sum_scale(D.Rank(world=1, sharding="fsdp")), 1)
        shares = [torch.tensor(0.75), torch.tensor(0.25)]  # two ranks' d(share of the mean)/dw
        averaged = sum(s * D.sum_scale(D.Rank(world=2, sharding="fsdp")) for s in shares) / 2
        self.assertEqual(averaged.item(), 1.0)  # the whole batch's gradient
