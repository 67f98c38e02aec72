"""model.compile's path (a decoder layer as two pieces around its attention, the log-prob slices' arithmetic as
functions) against the modules' own forward. The pieces run uncompiled here, as compile_pieces falls back to
them where torch.compile does not work, and compiled by inductor on this CPU where it has a C++ compiler; on a
GPU bench/gpu-check.sh runs them compiled. Run by test/worker/memory.test.ts (python -m unittest)."""
import contextlib
import io
import os
import shutil
import unittest

import torch

from rstar2_worker.models import layers as L

from rstar2_worker.models import model as M
from rstar2_worker.train import policy as P
from tests.test_memory import CFG  # the memory tests' tiny GQA model

ROWS = [[5, 9, 2, 44, 7, 1, 3], [8, 8, 1], [12, 3, 90, 4, 4], [2, 2]]


@contextlib.contextmanager
def plain_pieces():
    """PIECES as compile_pieces fills them, the functions themselves instead of their compiled forms."""
    saved = dict(L.PIECES)
    L.PIECES.clear()
    L.PIECES.update({f.__name__: f for f in (L.attn_in, L.attn_out_mlp, M.slice_stats, M.slice_grad)}, cpu=True)
    try:
        yield
    finally:
        L.PIECES.clear()
        L.PIECES.update(saved)


def model(seed, **over):
    torch.manual_seed(seed)
    m = M.CausalLM(M.Config({**CFG, **over}))
    m.init_weights(seed)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a weight the pieces mix up shows
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                p.add_(torch.randn(p.shape) * 0.3)
    return m


def run(m, packed, checkpointing, temperature=1.0):
    """(log-probs, entropy, is-argmax) of ROWS and every parameter's gradient of a loss over them."""
    m.zero_grad(set_to_none=True)
    m.train()
    m.gradient_checkpointing = checkpointing
    lp, ent, top, _ = m(rows=ROWS, packed=packed, temperature=temperature, chunk=5, device="cpu")
    w = torch.linspace(-1, 1, lp.shape[0])
    (lp * w).sum().backward()
    return (lp.detach(), ent, top), {n: p.grad.clone() for n, p in m.named_parameters()}


class PiecesTest(unittest.TestCase):
    def same(self, want, got):
        for a, b in zip(want[0], got[0]):
            self.assertTrue(torch.allclose(a.float(), b.float(), atol=1e-5), (a, b))
        self.assertEqual(set(want[1]), set(got[1]))
        for n in want[1]:
            self.assertTrue(torch.allclose(want[1][n], got[1][n], atol=1e-5), n)

    def test_pieces_give_the_modules_outputs_and_gradients(self):
        cases = [
            ("qwen2, padded", {}, False, False, 1.0),
            ("qwen2, packed, checkpointing", {}, True, True, 1.0),
            ("qwen2 with biases, padded, temperature", {"attention_bias": True}, False, False, 0.7),
            ("qwen3 (q/k norms), packed", {"model_type": "qwen3", "head_dim": 16}, True, False, 1.0),
        ]
        for label, over, packed, ckpt, temp in cases:
            with self.subTest(label):
                m = model(3, **over)
                if over.get("attention_bias"):
                    self.assertIsNotNone(m.model.layers[0].self_attn.q_proj.bias)
                if over.get("model_type") == "qwen3":
                    self.assertTrue(m.cfg.qk_norm)
                want = run(m, packed, ckpt, temp)
                with plain_pieces():
                    calls = []
                    real = L.DecoderLayer.in_pieces
                    L.DecoderLayer.in_pieces = lambda *a: calls.append(1) or real(*a)
                    try:
                        got = run(m, packed, ckpt, temp)
                    finally:
                        L.DecoderLayer.in_pieces = real
                self.assertGreaterEqual(len(calls), m.cfg.num_hidden_layers)  # the pieces ran, in every layer
                self.same(want, got)

    def test_generation_caches_keep_the_modules_path(self):
        m = model(4)
        m.eval()
        ids = torch.tensor([[3, 7, 11, 2]])
        with torch.no_grad():
            want = m(ids)
            with plain_pieces():
                got = m(ids)  # a plain forward takes the pieces: same logits
                cache = m.new_cache(1, 8)
                idx = torch.arange(4)
                cached = m.lm_head(m.hidden(ids, idx.unsqueeze(0), M.attn_bias(torch.zeros(1, dtype=torch.long), idx, idx), cache, 0))
        self.assertTrue(torch.allclose(want, got, atol=1e-5))
        self.assertTrue(torch.allclose(want, cached, atol=1e-5))
        self.assertTrue(cache[0][0][:, :, :4].abs().sum() > 0)  # the cached path wrote its keys

    def test_compile_modes(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(M.compile_pieces("off", "cpu"), "off")
            self.assertEqual(M.compile_pieces("auto", "cpu"), "off")  # auto compiles on CUDA only
        self.assertEqual(L.PIECES, {})
        self.assertEqual(err.getvalue(), "")
        # RSTAR2_COMPILE's parsing: test_settings.py

    def test_compile_on_falls_back_where_torch_cannot_compile(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            got = M.compile_pieces("on", "cpu")
        try:
            if not hasattr(torch, "compile"):  # torch 1.13: said once, nothing compiled
                self.assertEqual(got, "unavailable")
                self.assertEqual(L.PIECES, {})
                self.assertRegex(err.getvalue(), r"model\.compile: torch 1\.\d+\S* has no torch\.compile")
            elif not shutil.which(os.environ.get("CXX") or "g++") and not shutil.which("c++"):
                # inductor's CPU code needs a C++ compiler: without one it says why not
                self.assertIn(got, ("on", "unavailable"))
                self.assertEqual(bool(L.PIECES), got == "on")
            else:  # CI's case (issue 51 item 7): compiled for real, and the compiled pieces give the modules' numbers
                self.assertEqual(got, "on", err.getvalue())
                # on the shapes compile_pieces tried (a real model's would compile each piece again: ~50 s more here)
                torch.manual_seed(0)
                x = torch.randn(1, 4, 8, requires_grad=True)
                w = lambda *shape: torch.randn(*shape, requires_grad=True)  # noqa: E731
                cos = torch.ones(1, 4, 1, 4)
                t = torch.zeros(4, dtype=torch.long)
                calls = {
                    "attn_in": (x, w(8), w(8, 8), w(8), w(4, 8), w(4), w(4, 8), w(4), None, None, cos, cos, 1e-6, 2, 1),
                    "attn_out_mlp": (x, w(1, 4, 8), w(8, 8), w(8), w(16, 8), w(16, 8), w(8, 16), 1e-6),
                    "slice_stats": (x[0].detach(), t, 1.0),
                    "slice_grad": (x[0].detach(), t, torch.ones(4), 1.0),
                }
                for name, args in calls.items():
                    p = L.PIECES[name]
                    got_out, want_out = p(*args), p.fn(*args)
                    self.assertTrue(p.ran and p.compiled is not None, (name, err.getvalue()))  # compiled, no fallback
                    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (got_out, want_out))):
                        self.assertTrue(torch.allclose(a, b, atol=1e-5), name)
            # said at most once; torch's own warnings (a deprecation inside its compiler on 2.13) are not ours
            ours = [ln for ln in err.getvalue().splitlines() if ln.startswith("rstar2 worker:")]
            self.assertLessEqual(len(ours), 1, err.getvalue())
        finally:
            L.PIECES.clear()

    def test_a_piece_falls_back_once_then_raises_after_a_success(self):
        state = {"fail": True}

        def broken(x):
            if state["fail"]:
                raise RuntimeError("inductor: no working C++ compiler")
            return x * 3

        def plain(x):
            return x * 2

        p = M.Piece(plain, broken)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(p(torch.tensor(1.0)).item(), 2.0)  # the plain function, said once
            self.assertEqual(p(torch.tensor(1.0)).item(), 2.0)
        self.assertEqual(err.getvalue().count("compiling plain failed (RuntimeError: inductor: no working C++ compiler)"), 1)
        state["fail"] = False
        q = M.Piece(plain, broken)
        self.assertEqual(q(torch.tensor(1.0)).item(), 3.0)
        state["fail"] = True
        with self.assertRaises(RuntimeError):  # after a success, a failure is a real one
            q(torch.tensor(1.0))

    def test_the_worker_reports_what_compile_decided(self):
        p = P.Policy()
        with contextlib.redirect_stderr(io.StringIO()):
            info = p.init(CFG, 0)
        self.assertEqual(info["compiled"], "off")  # auto, on a CPU


if __name__ == "__main__":
    unittest.main()


def test_fused_linear_follows_in_place_weight_writes():
    # the cached concatenation must not outlive a weight sync or optimizer step (both write the parameters in place)
    torch.manual_seed(0)
    ls = (torch.nn.Linear(8, 6), torch.nn.Linear(8, 4), torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(2):
            got = L.fused_linear(x, ls)
            for g, m in zip(got, ls):
                torch.testing.assert_close(g, m(x))
            ls[1].weight.add_(1.0)
            ls[2].bias.copy_(torch.randn(4))
