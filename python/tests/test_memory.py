"""The worker's memory paths against the plain ones: chunked log-probs, packed micro-batches, activation
checkpointing, the SDPA call, bf16 on CPU. Run by test/worker/memory.test.ts (python -m unittest)."""
import contextlib
import io
import math
import os
import subprocess
import sys
import tempfile
import types
import unittest

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from rstar2_worker.engine import engine as E
from rstar2_worker.engine import kv_pool as KV
from rstar2_worker.models import layers as L
from rstar2_worker.models import model as M
from rstar2_worker.engine import model_runner as MR
from rstar2_worker.train import policy as P
from rstar2_worker.engine import sampler as SA
from rstar2_worker.engine import batch_scheduler as SC
from rstar2_worker.settings import Settings
from rstar2_worker.train.checkpoint import read_config, read_state_dict
from tests.train_opts import full_train_opts

CFG = {
    "vocab_size": 97,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}
ROWS = [[5, 9, 2, 44, 7, 1, 3], [8, 8, 1], [60], [12, 3, 90, 4, 4], [2, 2]]


def new_model(seed=0, **over):
    torch.manual_seed(seed)
    m = M.CausalLM(M.Config({**CFG, **over}))
    m.init_weights(seed)
    # larger weights than the init's 0.02 so softmaxes are far from uniform and differences would show
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3)
    return m


def loss_and_grads(m, rows, packed, chunk=None, temperature=1.0):
    m.zero_grad(set_to_none=True)
    h, _ = M.predicting_hidden(m, rows, packed, torch.device("cpu"))
    lp, ent, top = m.token_logprobs(h, M.next_tokens(rows, "cpu"), temperature, chunk)
    # weights vary per token so a gradient routed to the wrong position would show
    w = torch.linspace(0.5, 1.5, lp.shape[0])
    (-(lp * w).sum()).backward()
    return lp.detach(), ent, top, {n: p.grad.clone() for n, p in m.named_parameters()}


def max_diff(a, b):
    """Largest difference between same-named gradients, relative to the larger of 1 and the gradient's size
    (embedding gradients reach ~50 here, where fp32 summation order alone moves them by ~1e-5)."""
    return max(float((a[k] - b[k]).abs().max()) / max(1.0, float(b[k].abs().max())) for k in a)


class ChunkedLogprobs(unittest.TestCase):
    def test_equal_to_full_logits_values_and_grads(self):
        for tied in (False, True):
            m = new_model(1, tie_word_embeddings=tied)
            for temperature in (1.0, 0.7):
                h = torch.randn(23, 32, requires_grad=True)
                t = torch.randint(0, 97, (23,))
                logits = F.linear(h, m.lm_head.weight) / temperature
                ref = torch.log_softmax(logits, -1)
                ref_lp = ref.gather(-1, t.unsqueeze(-1)).squeeze(-1)
                g = torch.randn(23)
                rh, rw = torch.autograd.grad((ref_lp * g).sum(), [h, m.lm_head.weight])
                for chunk in (1, 5, 23, 1000):
                    lp, ent, top = m.token_logprobs(h, t, temperature, chunk)
                    gh, gw = torch.autograd.grad((lp * g).sum(), [h, m.lm_head.weight])
                    self.assertLess(float((lp - ref_lp).abs().max()), 1e-5)
                    self.assertLess(float((ent + (ref.exp() * ref).sum(-1)).abs().max()), 1e-5)
                    self.assertTrue(torch.equal(top, logits.argmax(-1) == t))
                    self.assertLess(float((gh - rh).abs().max()), 1e-5, f"chunk {chunk} T {temperature}")
                    self.assertLess(float((gw - rw).abs().max()), 1e-5, f"chunk {chunk} T {temperature}")

    def test_model_grads_do_not_depend_on_chunking(self):
        m = new_model(2)
        full = loss_and_grads(m, ROWS, False, chunk=10**6)
        for chunk in (1, 4):
            small = loss_and_grads(m, ROWS, False, chunk=chunk)
            self.assertLess(float((small[0] - full[0]).abs().max()), 1e-5)
            self.assertLess(max_diff(small[3], full[3]), 1e-5)

    def test_default_chunk_keeps_the_logits_slice_under_budget(self):
        m = M.CausalLM(M.Config({**CFG, "vocab_size": 151_936, "num_hidden_layers": 1}))
        seen = []
        real = F.linear

        def spy(x, w, b=None):
            seen.append(x.shape[0])
            return real(x, w, b)

        h, t = torch.randn(2000, 32), torch.randint(0, 151_936, (2000,))
        M.F.linear = spy
        try:
            with torch.no_grad():
                m.token_logprobs(h, t)
        finally:
            M.F.linear = real
        self.assertGreater(len(seen), 1)
        self.assertLessEqual(max(seen) * 151_936 * 4, L.CPU_BLOCK_BYTES)


class Packing(unittest.TestCase):
    def test_packed_equals_padded(self):
        m = new_model(3)
        pad = loss_and_grads(m, ROWS, False)
        packed = loss_and_grads(m, ROWS, True)
        self.assertEqual(pad[0].shape, packed[0].shape)
        self.assertLess(float((pad[0] - packed[0]).abs().max()), 1e-5)
        self.assertLess(float((pad[1] - packed[1]).abs().max()), 1e-5)
        self.assertLess(max_diff(pad[3], packed[3]), 1e-5)

    def test_packed_attention_does_not_cross_sequences(self):
        # changing the first sequence must leave the second one's log-probs untouched, and vice versa
        m = new_model(4)
        a = loss_and_grads(m, [[1, 2, 3, 4], [5, 6, 7]], True)[0]
        b = loss_and_grads(m, [[9, 9, 9, 9], [5, 6, 7]], True)[0]
        self.assertLess(float((a[3:] - b[3:]).abs().max()), 1e-6)
        self.assertGreater(float((a[:3] - b[:3]).abs().max()), 1e-2)
        alone = loss_and_grads(m, [[5, 6, 7]], True)[0]
        self.assertLess(float((alone - a[3:]).abs().max()), 1e-5)  # positions restart at 0

    def test_varlen_flash_call_equals_one_call_per_sequence(self):
        # torch's varlen_attn runs only on a GPU; here a stand-in with its published contract ([T, H, D]
        # inputs, int32 cumulative starts, causal as a (-1, 0) window, [T, H, D] out) checks what the model
        # hands it and does with the answer, against the per-sequence path
        calls = []

        def varlen(q, k, v, cu_q, cu_k, max_q, max_k, window_size):
            calls.append((cu_q.tolist(), max_q, window_size, cu_q.dtype))
            out = []
            for a, b in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
                qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
                att = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
                att = att.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
                out.append((torch.softmax(att, -1) @ vs).transpose(0, 1))
            return torch.cat(out)

        m = new_model(6)
        loop = loss_and_grads(m, ROWS, True)
        saved = L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok, L.VARLEN_RAN[0]
        L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok = varlen, {"window_size": (-1, 0)}, False, lambda q: True
        try:
            flash = loss_and_grads(m, ROWS, True)
        finally:
            L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok, L.VARLEN_RAN[0] = saved
        self.assertEqual(calls[0], ([0, 7, 10, 11, 16, 18], 7, (-1, 0), torch.int32))
        self.assertEqual(len(calls), CFG["num_hidden_layers"])
        self.assertLess(float((loop[0] - flash[0]).abs().max()), 1e-5)
        self.assertLess(max_diff(loop[3], flash[3]), 1e-5)

    def test_a_varlen_kernel_that_refuses_its_first_call_leaves_the_per_sequence_path(self):
        # flash attention refuses GPUs older than Ampere; packed training must still run there
        def refuses(*a, **kw):
            raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

        m = new_model(6)
        loop = loss_and_grads(m, ROWS, True)
        saved = L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok, L.VARLEN_RAN[0]
        L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok = refuses, {"window_size": (-1, 0)}, False, lambda q: True
        L.VARLEN_RAN[0] = False
        try:
            with contextlib.redirect_stderr(io.StringIO()) as err:
                got = loss_and_grads(m, ROWS, True)
            self.assertIsNone(L.VARLEN)
        finally:
            L.VARLEN, L.VARLEN_CAUSAL, L.VARLEN_GQA, L.varlen_ok, L.VARLEN_RAN[0] = saved
        self.assertIn("varlen flash attention refused (FlashAttention only supports Ampere", err.getvalue())
        self.assertLess(float((loop[0] - got[0]).abs().max()), 1e-6)
        self.assertLess(max_diff(loop[3], got[3]), 1e-6)

    def test_pack_fills_to_the_budget_first_fit_decreasing(self):
        seqs = [[0] * n for n in (3, 7, 2, 5, 9, 1)]
        mbs = P.pack(seqs, 10)
        self.assertEqual(mbs, [[4, 5], [1, 0], [3, 2]])
        self.assertEqual(sorted(i for mb in mbs for i in mb), list(range(6)))
        self.assertEqual(P.pack([[0] * 12, [0] * 3], 10), [[0], [1]])  # over the budget: alone


class Checkpointing(unittest.TestCase):
    def test_loss_and_grads_equal_without(self):
        m = new_model(5)
        m.train()
        for packed in (False, True):
            off = loss_and_grads(m, ROWS, packed)
            m.gradient_checkpointing = True
            on = loss_and_grads(m, ROWS, packed)
            m.gradient_checkpointing = False
            self.assertLess(float((on[0] - off[0]).abs().max()), 1e-6)
            self.assertLess(max_diff(on[3], off[3]), 1e-6)

    def test_layers_are_recomputed(self):
        m = new_model(6)
        m.train()
        calls = []
        # a pre-hook: torch >= 2.1 stops a recomputation once it has what backward needs, before the mlp returns
        m.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        loss_and_grads(m, ROWS, True)
        self.assertEqual(len(calls), 1)
        m.gradient_checkpointing = True
        calls.clear()
        loss_and_grads(m, ROWS, True)
        self.assertEqual(len(calls), 2)  # once forward, once again in backward


def reference_sdpa(q, k, v, attn_mask=None, is_causal=False):
    """torch ≥ 2.0's documented semantics, written out, to check what the sdpa branch passes it."""
    T, S = q.shape[-2], k.shape[-2]
    bias = torch.zeros(T, S)
    if is_causal:
        bias.masked_fill_(torch.ones(T, S, dtype=torch.bool).tril().logical_not(), float("-inf"))
    if attn_mask is not None:
        bias = bias.masked_fill(attn_mask.logical_not(), float("-inf"))
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias, -1)
    return att @ v


class AttentionSelection(unittest.TestCase):
    def test_picks_sdpa_only_where_torch_has_it(self):
        self.assertEqual(L.attention_impl(types.SimpleNamespace()), "eager")
        self.assertEqual(L.attention_impl(types.SimpleNamespace(scaled_dot_product_attention=reference_sdpa)), "sdpa")
        expected = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "eager"
        self.assertEqual(L.ATTENTION, expected)

    def test_sdpa_branch_matches_eager(self):
        m = new_model(7)
        prompts = [[3, 4, 5, 6], [7, 8]]
        eager_train = loss_and_grads(m, ROWS, True)
        eager_gen = generate(m, prompts)
        real = getattr(F, "scaled_dot_product_attention", None)
        F.scaled_dot_product_attention, L.ATTENTION = reference_sdpa, "sdpa"
        try:
            sdpa_train = loss_and_grads(m, ROWS, True)
            sdpa_gen = generate(m, prompts)
            sdpa_pad = loss_and_grads(m, ROWS, False)
        finally:
            if real is None:
                del F.scaled_dot_product_attention
            else:
                F.scaled_dot_product_attention = real
            L.ATTENTION = L.attention_impl()
        self.assertLess(float((sdpa_train[0] - eager_train[0]).abs().max()), 1e-5)
        self.assertLess(float((sdpa_pad[0] - eager_train[0]).abs().max()), 1e-5)
        self.assertLess(max_diff(sdpa_train[3], eager_train[3]), 1e-5)
        self.assertEqual(sdpa_gen[0], eager_gen[0])
        self.assertLess(max(abs(a - b) for x, y in zip(sdpa_gen[1], eager_gen[1]) for a, b in zip(x, y)), 1e-5)

    def test_eager_scores_in_row_blocks_equal_one_block(self):
        m = new_model(5)
        rows = ROWS + [[i % 97 for i in range(40)]]
        old = L.CPU_BLOCK_BYTES
        L.ATTENTION = "eager"  # the blocked path, also where torch has SDPA
        try:
            whole = [loss_and_grads(m, rows, packed) for packed in (False, True)]
            L.CPU_BLOCK_BYTES = 1  # one query row per block
            blocks = [loss_and_grads(m, rows, packed) for packed in (False, True)]
        finally:
            L.CPU_BLOCK_BYTES, L.ATTENTION = old, L.attention_impl()
        for a, b in zip(blocks, whole):
            self.assertLess(float((a[0] - b[0]).abs().max()), 1e-5)
            self.assertLess(max_diff(a[3], b[3]), 1e-5)

    @unittest.skipUnless(L.ATTENTION == "eager", "torch has fused attention here")
    def test_eager_scores_stay_under_the_mmap_threshold(self):
        # B * heads * T * T fp32 scores of 2 x 1200 tokens: 46 MB in one block, over the budget
        m, seen, real = new_model(5), [], torch.softmax

        def spy(x, *a, **k):
            seen.append(x.numel() * 4)
            return real(x, *a, **k)

        rows = [[i % 97 for i in range(1200)], [i % 89 for i in range(1199)]]
        torch.softmax = spy
        try:
            with torch.no_grad():
                M.predicting_hidden(m, rows, False, torch.device("cpu"))
        finally:
            torch.softmax = real
        self.assertGreater(len(seen), CFG["num_hidden_layers"])
        self.assertLessEqual(max(seen), L.CPU_BLOCK_BYTES)


def generate(m, prompts, stop=()):
    pol = P.Policy()
    pol.cfg, pol.model, pol.device = m.cfg, m, torch.device("cpu")  # m stays on the CPU on a GPU host too
    ids, lps, _ = pol.generate(prompts, {"temperature": 0, "maxNewTokens": 5, "stopTokenIds": list(stop)})
    return ids, lps


class DeviceAndPrecision(unittest.TestCase):
    def test_device_follows_local_rank_when_cuda_is_present(self):
        none = types.SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)
        two = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2)
        self.assertEqual(P.pick_device(1, none), torch.device("cpu"))
        old = os.environ.pop("LOCAL_RANK", None)
        try:
            self.assertEqual(P.pick_device(1, two), torch.device("cuda", 1))
            os.environ["LOCAL_RANK"] = "0"
            self.assertEqual(P.pick_device(3, two), torch.device("cuda", 0))
            os.environ["LOCAL_RANK"] = "2"
            with self.assertRaisesRegex(RuntimeError, "GPU 2 .* only 2 are visible"):
                P.pick_device(2, two)
        finally:
            os.environ.pop("LOCAL_RANK", None)
            if old is not None:
                os.environ["LOCAL_RANK"] = old

    def test_generate_names_the_device_of_every_tensor_it_makes(self):
        # A CUDA rank makes CUDA the default device, so a tensor made without one lands there: generate's
        # bookkeeping (rows, stop ids) then met sample()'s CPU tokens and the first stop token failed on a GPU.
        # Here every factory call made by the engine's own files must name its device.
        engine_files = {m.__file__ for m in (E, KV, MR, SA, SC)}
        factories = {torch.tensor, torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.rand,
                     torch.randn, torch.randint, torch.randperm}
        unnamed = []

        class Watch(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if func in factories and "device" not in kwargs:
                    f = sys._getframe(1)
                    while f and (f.f_code.co_filename.startswith(os.path.dirname(torch.__file__)) or f.f_code is
                                 Watch.__torch_function__.__code__):
                        f = f.f_back
                    if f and f.f_code.co_filename in engine_files:
                        unnamed.append(f"torch.{func.__name__} at {os.path.basename(f.f_code.co_filename)}:{f.f_lineno}")
                return func(*args, **kwargs)

        m = new_model(8)
        with Watch():
            ids, _ = generate(m, [[3, 4, 5, 6], [7, 8]], stop=[5])
        self.assertEqual(unnamed, [])
        self.assertTrue(ids[0] and ids[1])

    def test_unknown_precision_is_named(self):
        with self.assertRaisesRegex(ValueError, "RSTAR2_PRECISION must be one of fp32, bf16-mixed, bf16, got 'fp16'"):
            Settings.from_env({"RSTAR2_PRECISION": "fp16"})

    def test_adamw_is_fused_on_a_gpu_unless_offloaded(self):
        # the default (foreach) AdamW read each parameter's GPU-held step count back twice a step: 582 waits
        # on the GPU per step of a 0.5B model on an H200
        seen = []
        real = torch.optim.AdamW
        o = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weightDecay": 0.0}
        torch.optim.AdamW = lambda params, **kw: seen.append(kw.pop("fused", None)) or real(params, **kw)
        try:
            for device, offload in (("cpu", False), ("cuda", False), ("cuda", True)):
                pol = self.policy("fp32")
                pol.device, pol.r.offload = torch.device(device), offload
                pol._optimizer(o)
        finally:
            torch.optim.AdamW = real
        self.assertEqual(seen, [None, True, None])

    def policy(self, precision):
        pol = P.Policy(settings=Settings(precision=precision))
        pol.init(CFG, 8)
        return pol

    def step(self, pol):
        masks = [[0] + [1] * (len(r) - 1) for r in ROWS]
        olds = [None] * len(ROWS)
        advs = [1.0, -0.5, 0.3, 0.8, -1.0]
        return pol.train_step("grpo", ROWS, masks, olds, advs, full_train_opts(1e-3, maxTokensPerMicroBatch=12))

    def test_bf16_runs_on_cpu_close_to_fp32(self):
        ref = self.step(self.policy("fp32"))
        ref_lp = self.policy("fp32").logprobs(ROWS)[0]
        for precision in ("bf16-mixed", "bf16"):
            pol = self.policy(precision)
            want = torch.bfloat16 if precision == "bf16" else torch.float32
            self.assertTrue(all(p.dtype == want for p in pol.model.parameters()))
            lp = pol.logprobs(ROWS)[0]
            diff = max(abs(a - b) for x, y in zip(lp, ref_lp) for a, b in zip(x, y))
            self.assertLess(diff, 0.05, precision)
            self.assertGreater(diff, 0, precision)  # it really ran in bf16
            st = self.step(pol)
            self.assertLess(abs(st["loss"] - ref["loss"]), 0.05, precision)
            self.assertLess(abs(st["gradNorm"] - ref["gradNorm"]) / ref["gradNorm"], 0.05, precision)
            self.assertTrue(all(s.dtype == want for s in pol.opt.state[next(iter(pol.model.parameters()))].values() if s.dim()))
            ids, lps, _ = pol.generate([[1, 2, 3]], {"temperature": 0, "maxNewTokens": 4})
            self.assertEqual(len(ids[0]), 4)
            with tempfile.TemporaryDirectory() as d:
                pol.save(d, False)
                self.assertEqual(read_config(d)["torch_dtype"], "bfloat16" if precision == "bf16" else "float32")
                self.assertTrue(all(t.dtype == want for t in read_state_dict(d).values()))


# A step's activations in a fresh process (mallopt cannot be undone): 40 buffers of 1 MiB, all freed at its end,
# ten times after a first step; prints the page faults of the ten
STEPS = """
import resource, sys, torch
from rstar2_worker.__main__ import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
def step():
    xs = [torch.ones(1 << 18) for _ in range(40)]
    return float(sum(x[0] for x in xs))
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


class FreedMemory(unittest.TestCase):
    def faults(self, mode, **env):
        e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
        e.update(env, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        r = subprocess.run([sys.executable, "-c", STEPS, mode], env=e, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return int(r.stdout)

    def test_steps_reuse_their_freed_activations_instead_of_faulting_them_in_again(self):
        plain, kept = self.faults("plain"), self.faults("keep")
        # plain glibc gives the freed 40 MiB back and faults it in again: ~10,000 faults a step
        self.assertLess(kept * 10, plain, f"page faults over 10 steps: {kept} kept, {plain} plain")

    def test_a_users_own_malloc_settings_are_left_alone(self):
        plain = self.faults("plain")
        mine = self.faults("keep", GLIBC_TUNABLES="glibc.malloc.check=0")
        self.assertGreater(mine * 2, plain, f"page faults: {mine} with the user's tunables, {plain} plain")


if __name__ == "__main__":
    unittest.main()
