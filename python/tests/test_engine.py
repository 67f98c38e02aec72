"""The serving engine (engine.py and its parts) against itself run the plain way: a request alone, fresh, in a
pool that never fills, one step at a time. Run by test/worker/engine.test.ts (python -m unittest)."""
import contextlib
import dataclasses
import io
import unittest

import torch

from rstar2_worker.settings import Settings
from rstar2_worker.train import policy as P
from rstar2_worker.engine import sampler as SA
from rstar2_worker.engine.kv_pool import BlockPool
from tests.test_memory import CFG  # the same tiny GQA model the memory tests use
from tests.train_opts import full_train_opts

GREEDY = {"temperature": 0.0, "maxNewTokens": 24}


def policy(seed=3, **envs):
    """A policy on the CPU with a model whose logits are far from uniform, its engine built with the settings the
    environment variables `envs` give."""
    p = P.Policy(settings=Settings.from_env({k: str(v) for k, v in envs.items()}))
    p.device = torch.device("cpu")
    p.init(CFG, seed)
    with torch.no_grad():
        for prm in p.model.parameters():
            prm.mul_(4)
    with contextlib.redirect_stderr(io.StringIO()):
        p.engine._ensure()
    return p


def prompt(i, n):
    return [(7 * i + 3 * t) % 90 + 1 for t in range(n)]


def run_all(p, requests):
    """requests: [(id, prompts, sampling, join_at_step)]; the engine steps until all end. Returns {id: result}."""
    out, step, todo = {}, 0, sorted(requests, key=lambda r: r[3])
    while todo or p.engine.has_work():
        while todo and todo[0][3] <= step:
            rid, prompts, sp, _ = todo.pop(0)
            p.engine.add(rid, prompts, sp)
        out.update(p.engine.step())
        step += 1
    return out


class Engine(unittest.TestCase):
    def test_greedy_is_the_same_alone_or_joining_a_running_batch(self):
        p = policy()
        alone = {i: p.generate([prompt(i, 5 + 3 * i)], GREEDY)[0][0] for i in range(4)}
        # request i joins at step 4 i, while the earlier ones decode; one runs with another temperature beside
        got = run_all(p, [(i, [prompt(i, 5 + 3 * i)], GREEDY, 4 * i) for i in range(4)]
                      + [(9, [prompt(9, 8)], {"temperature": 1.0, "maxNewTokens": 30, "seed": 1}, 2)])
        for i in range(4):
            self.assertEqual(got[i]["ids"][0], alone[i], f"request {i}")
        self.assertTrue(all(len(x) == 24 for x in alone.values()))

    def test_seeded_rows_draw_the_same_tokens_in_any_batch(self):
        p = policy()
        sp = {"temperature": 1.0, "maxNewTokens": 20, "topP": 0.9, "topK": 40}
        rows = [prompt(i, 4 + i) for i in range(5)]
        seeds = [11, 12, 13, 14, 15]
        together, lps, _ = p.generate(rows, {**sp, "seeds": seeds})
        for i in (0, 3):
            alone, lp, _ = p.generate([rows[i]], {**sp, "seeds": [seeds[i]]})
            self.assertEqual(alone[0], together[i])
            self.assertLess(max(abs(a - b) for a, b in zip(lp[0], lps[i])), 1e-4)
        again = run_all(p, [(1, [rows[4]], {**sp, "seeds": [15]}, 3), (2, rows[:2], {**sp, "seeds": seeds[:2]}, 0)])
        self.assertEqual(again[1]["ids"][0], together[4])
        self.assertEqual(again[2]["ids"], together[:2])
        other, _, _ = p.generate([rows[0]], {**sp, "seeds": [99]})
        self.assertNotEqual(other[0], together[0])

    def test_a_later_turn_reuses_the_earlier_turns_keys_and_gives_what_a_fresh_engine_gives(self):
        p = policy()
        first = prompt(1, 40)
        out1 = p.generate([first], GREEDY)[0][0]
        turn2 = first + out1 + prompt(5, 13)  # the model's answer and a tool's output, then the next turn
        before = p.engine.stats["prefill_tokens"]
        res = p.engine.run(("t", 2), [turn2], GREEDY)
        computed = p.engine.stats["prefill_tokens"] - before
        bs = p.engine.kv.blocks.block_size
        self.assertEqual(res["cached"][0], (len(first) + len(out1) - 1) // bs * bs)
        self.assertEqual(computed, len(turn2) - res["cached"][0])
        fresh = policy()
        self.assertEqual(fresh.generate([turn2], GREEDY)[0][0], res["ids"][0])

    def test_samples_of_one_prompt_compute_its_prefix_once(self):
        p = policy()
        q = prompt(2, 70)
        res = p.engine.run(("g", 1), [q] * 6, {"temperature": 1.0, "maxNewTokens": 8, "seed": 3})
        bs = p.engine.kv.blocks.block_size
        self.assertEqual(p.engine.stats["prefill_tokens"], len(q) + 5 * (len(q) - (len(q) - 1) // bs * bs))
        self.assertEqual(res["cached"], [0] + [(len(q) - 1) // bs * bs] * 5)

    def test_a_train_step_drops_the_cached_prefixes(self):
        p = policy()
        q = prompt(3, 50)
        p.generate([q], GREEDY)
        p.train_step("sft", [q + [5, 6]], [[0] * len(q) + [1, 1]], [None], [0.0], full_train_opts(1e-2))
        res = p.engine.run(("after", 1), [q], GREEDY)
        self.assertEqual(res["cached"], [0])

    def test_the_pool_can_be_freed_for_a_train_step_and_comes_back(self):
        p = policy()
        q = prompt(6, 20)
        before = p.generate([q], GREEDY)[0][0]
        p.settings = dataclasses.replace(p.settings, kv_release=True)  # RSTAR2_KV_RELEASE=1, as on a GPU
        p.train_step("sft", [q + before], [[0] * len(q) + [1] * len(before)], [None], [0.0], full_train_opts(0.0))
        self.assertIsNone(p.engine.kv, "the train step ran without the pool")
        self.assertEqual(p.generate([q], GREEDY)[0][0], before, "lr 0: the same weights, a new pool, the same tokens")
        self.assertIsNotNone(p.engine.kv)

    def test_a_pool_too_small_retracts_and_still_gives_every_greedy_result(self):
        rows = [prompt(i, 6 + 2 * i) for i in range(6)]
        big = policy()
        want = big.generate(rows, {**GREEDY, "maxNewTokens": 40})[0]
        small = policy(RSTAR2_KV_TOKENS=8 * 16, RSTAR2_KV_BLOCK=8)
        got = small.engine.run(("s", 1), rows, {**GREEDY, "maxNewTokens": 40})
        self.assertEqual(got["ids"], want)
        self.assertGreater(sum(got["retractions"]), 0)
        self.assertEqual(small.engine.kv.blocks.used, 0, "every block is back in the pool")
        with self.assertRaisesRegex(ValueError, "over the engine's limit"):
            small.engine.add(("too", 1), [prompt(0, 100)], {**GREEDY, "maxNewTokens": 40})

    def test_chunked_prefill_and_the_bucketed_decode_path_change_nothing(self):
        rows = [prompt(i, 5 + 11 * i) for i in range(4)]
        sp = {"temperature": 0.8, "maxNewTokens": 20, "seeds": [1, 2, 3, 4]}
        want, wlp, _ = policy().generate(rows, sp)
        for envs in ({"RSTAR2_PREFILL_TOKENS": 7}, {"RSTAR2_CUDA_GRAPHS": "eager"}):
            p = policy(**envs)
            got, lp, _ = p.generate(rows, sp)
            self.assertEqual(got, want, envs)
            self.assertLess(max(abs(a - b) for x, y in zip(lp, wlp) for a, b in zip(x, y)), 1e-4, envs)
        self.assertEqual(p.engine.runner.mode, "eager")

    def test_logprobs_are_the_sampled_distributions(self):
        p = policy()
        q = prompt(4, 9)
        for sp in ({"temperature": 0.7, "maxNewTokens": 12, "seed": 5}, GREEDY):
            ids, lps, _ = p.generate([q], sp)
            t = sp["temperature"] or 1.0
            lp, _, _ = p.logprobs([q + ids[0]], temperature=t)
            self.assertLess(max(abs(a - b) for a, b in zip(lp[0][len(q):], lps[0])), 1e-4)

    def test_abort_stop_tokens_and_load(self):
        p = policy()
        p.engine.add("a", [prompt(0, 5), prompt(1, 5)], {**GREEDY, "maxNewTokens": 500})
        stop = p.generate([prompt(2, 5)], GREEDY)[0][0][3]  # a token greedy decoding emits at its fourth step
        for _ in range(3):
            p.engine.step()
        load = p.engine.load()
        self.assertEqual((load["running"], load["queued"]), (2, 0))
        self.assertGreater(load["usedTokens"], 0)
        p.engine.abort("a", [0])
        p.engine.abort("a", [1])
        (rid, res), = p.engine.step()
        self.assertEqual(res["finish"], ["abort", "abort"])
        self.assertEqual(p.engine.load()["usedTokens"], 0)
        ids, _, finish = p.generate([prompt(2, 5)], {**GREEDY, "stopTokenIds": [stop]})
        self.assertEqual(finish, ["stop"])
        self.assertEqual(ids[0][-1], stop)
        self.assertLessEqual(len(ids[0]), 4)


class Parts(unittest.TestCase):
    def test_uniforms_depend_on_the_seed_and_step_only(self):
        a = SA.uniforms([1, 2, 1], [0, 0, 5])
        self.assertEqual(a[0], SA.uniforms([1], [0])[0])
        self.assertTrue(((a > 0) & (a < 1)).all())
        self.assertEqual(len(set(a.tolist())), 3)
        u = SA.uniforms(list(range(20000)), [3] * 20000)
        self.assertLess(abs(u.mean() - 0.5), 0.01)

    def test_inverse_cdf_samples_the_distribution_and_never_a_zero(self):
        probs = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3]]).expand(20000, 5)
        u = torch.from_numpy(SA.uniforms(list(range(20000)), [0] * 20000))
        got = torch.bincount(SA.inverse_cdf(probs, u), minlength=5).double() / 20000
        self.assertEqual(got[0].item() + got[2].item(), 0.0)
        self.assertLess((got - probs[0].double()).abs().max().item(), 0.015)

    def test_the_two_level_cdf_picks_what_one_cumulative_sum_picks(self):
        g = torch.Generator().manual_seed(0)
        for V in (5, 1024, 3000):  # less than a chunk, exactly one, a partial last chunk
            probs = torch.rand(64, V, generator=g) ** 4
            probs[:, ::3] = 0.0
            u = torch.from_numpy(SA.uniforms(list(range(64)), [V] * 64))
            cdf = probs.double().cumsum(-1)
            want = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
            self.assertEqual(SA.inverse_cdf(probs, u, chunk=64).tolist(), want.tolist(), V)

    def test_engines_side_by_side_take_a_gpu_each_or_share_one(self):
        from rstar2_worker.engine import engine as E

        slot = Settings.from_env({"RSTAR2_ENGINE": "2/4"}).engine
        self.assertEqual(slot, (2, 4))
        self.assertEqual(E.slot_name(slot), "2/4")
        real = torch.cuda.device_count
        try:
            torch.cuda.device_count = lambda: 1  # four engines on one GPU: each a quarter of the memory
            self.assertEqual(E.sharing(torch.device("cuda", 0), slot), 4)
            torch.cuda.device_count = lambda: 2  # on two GPUs, engines 0 and 2 on the first
            self.assertEqual(E.sharing(torch.device("cuda", 0), slot), 2)
        finally:
            torch.cuda.device_count = real
        for bad in ("4/4", "x"):
            with self.assertRaisesRegex(ValueError, "RSTAR2_ENGINE"):
                Settings.from_env({"RSTAR2_ENGINE": bad})
        self.assertEqual(E.gpu_budget(free=100, total=140, fraction=0.5, engines=4), 17.5)
        self.assertEqual(E.gpu_budget(free=10, total=140, fraction=0.5, engines=1), 9.0, "never past 90 % of free")

    def test_freed_blocks_stay_cached_until_handed_out_oldest_first(self):
        b = BlockPool(4, 2)
        x, y = b.allocate(), b.allocate()
        b.register(x, 111)
        b.release([x, y])
        self.assertEqual(b.cached(111), x)
        b.take(x)  # reused: leaves the free list
        self.assertEqual(b.ref[x], 1)
        z = b.allocate()
        self.assertNotIn(z, (x,))
        b.release([x])
        got = [b.allocate(), b.allocate()]
        self.assertIsNone(b.allocate())
        self.assertIn(x, got)
        self.assertIsNone(b.cached(111), "a block handed out again forgets its prefix")


if __name__ == "__main__":
    unittest.main()
