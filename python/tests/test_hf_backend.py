"""model.backend 'transformers': the clear error where transformers is not installed, and the policy's plumbing
through HFCausalLM with a stand-in `transformers` module whose AutoModelForCausalLM builds the Llama-style layout
(`model` + `lm_head`) around the built-in decoder. The real library is checked by tests/test_transformers_parity.py
on CPU and bench/gpu-check.sh (gpu_check.py parity) on a GPU. Run: python -m unittest tests.test_hf_backend (from
python/)."""
import importlib.util
import os
import tempfile
import types
import unittest
from unittest import mock

import torch
import torch.nn as nn

from rstar2_worker.models import hf_model
from rstar2_worker.models import model as M
from rstar2_worker.train.policy import Policy, pick_backend
from tests.train_opts import full_train_opts

CFG = {
    "model_type": "qwen2",
    "vocab_size": 61,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
}
ROWS = [[5, 9, 2, 44, 7, 1, 3], [8, 8, 1], [12, 3, 60, 4]]


class Decoder(nn.Module):  # transformers' decoder call: input_ids, position_ids → .last_hidden_state
    def __init__(self, lm):
        super().__init__()
        self.embed_tokens, self.layers, self.norm = lm.model.embed_tokens, lm.model.layers, lm.model.norm
        self._lm = [lm]

    def forward(self, input_ids, position_ids, use_cache=False):
        return types.SimpleNamespace(last_hidden_state=self._lm[0].hidden(input_ids, position_ids, None))


class FakeAuto:
    loaded = []
    kwargs = []

    @staticmethod
    def from_pretrained(directory, **kw):
        FakeAuto.kwargs.append(kw)
        p = Policy()
        p.backend = "native"
        p.load(directory)
        hf = nn.Module()
        hf.model, hf.lm_head = Decoder(p.model), p.model.lm_head
        hf.config = types.SimpleNamespace(to_dict=lambda: dict(p.cfg.raw))
        hf.gradient_checkpointing_enable = hf.gradient_checkpointing_disable = lambda: None
        FakeAuto.loaded.append(directory)
        return hf


class TransformersBackend(unittest.TestCase):
    @unittest.skipIf(importlib.util.find_spec("transformers"), "transformers is installed here")
    def test_missing_package_is_named(self):
        with self.assertRaisesRegex(RuntimeError, "needs the transformers package.*pip install transformers"):
            pick_backend("transformers")
        with self.assertRaisesRegex(ValueError, "model backend must be one of native, transformers"):
            pick_backend("hf")

    def test_native_refuses_other_architectures_naming_the_option(self):
        with tempfile.TemporaryDirectory() as d:
            p = Policy()
            p.init({**CFG}, 0)
            p.save(d, False)
            cfg_path = os.path.join(d, "config.json")
            with open(cfg_path) as f:
                raw = f.read()
            with open(cfg_path, "w") as f:
                f.write(raw.replace('"qwen2"', '"llama"'))
            with self.assertRaisesRegex(ValueError, "model_type 'llama' is not supported.*model.backend 'transformers'"):
                p.load(d)

    def test_scores_trains_and_saves_like_the_native_model(self):
        stub = types.ModuleType("transformers")
        stub.AutoModelForCausalLM, stub.__version__ = FakeAuto, "5.0.0"
        # not mock.patch.dict(sys.modules): leaving it drops every module imported meanwhile, and torch >= 2
        # refuses to import its op libraries a second time
        stubbed = mock.patch.object(hf_model, "import_transformers", lambda: stub)
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2, stubbed:
            native = Policy()
            native.init({**CFG}, 3)
            native.save(d, False)
            hf = Policy()
            hf.backend = "transformers"
            info = hf.load(d)
            self.assertEqual(FakeAuto.loaded[-1], d)
            # torch_dtype is deprecated from 4.56; only the directory's own files, never the hub or its cache
            self.assertEqual(FakeAuto.kwargs[-1], {"dtype": torch.float32, "local_files_only": True})
            self.assertIsInstance(hf.model, hf_model.HFCausalLM)
            self.assertEqual(info["params"], M.count_params(native.model))
            want, got = native.logprobs(ROWS), hf.logprobs(ROWS)
            for a, b in zip(want[0], got[0]):
                self.assertLess(max(abs(x - y) for x, y in zip(a, b)), 1e-5)
            opts = full_train_opts(1e-2, gradientCheckpointing=True)
            s1 = native.train_step("sft", ROWS, [[0] + [1] * (len(r) - 1) for r in ROWS], [None] * 3, [0.0] * 3, opts)
            s2 = hf.train_step("sft", ROWS, [[0] + [1] * (len(r) - 1) for r in ROWS], [None] * 3, [0.0] * 3, opts)
            self.assertAlmostEqual(s1["loss"], s2["loss"], places=5)
            hf.save(d2, False)  # the checkpoint's own names, loadable by the native model
            back = Policy()
            back.load(d2)
            self.assertEqual(set(back.model.state_dict()), set(native.model.state_dict()))
            with self.assertRaisesRegex(ValueError, "no generation"):
                hf.generate([[1, 2]], {"maxNewTokens": 2})
            with self.assertRaisesRegex(ValueError, "no packed micro-batches"):
                hf.train_step("sft", ROWS, [[0] + [1] * (len(r) - 1) for r in ROWS], [None] * 3, [0.0] * 3, full_train_opts(1e-2, maxTokensPerMicroBatch=64))

    def test_a_missing_or_damaged_directory_is_named_and_nothing_else_is_loaded(self):
        # issue 56 item 6: from_pretrained takes a path that does not exist for a hub id (a download, or a model of
        # that name from the cache), and names no file when a shard is cut short
        stub = types.ModuleType("transformers")
        stub.AutoModelForCausalLM, stub.__version__ = FakeAuto, "5.0.0"
        stubbed = mock.patch.object(hf_model, "import_transformers", lambda: stub)
        with tempfile.TemporaryDirectory() as root, stubbed:
            hf = Policy()
            hf.backend = "transformers"
            before = len(FakeAuto.loaded)
            missing = os.path.join(root, "Qwen", "Qwen3-0.6B")
            with self.assertRaisesRegex(FileNotFoundError, f"^{missing}: no such checkpoint directory$"):
                hf.load(missing)
            d = os.path.join(root, "cut")
            native = Policy()
            native.init({**CFG}, 3)
            native.save(d, False)
            weights = os.path.join(d, "model.safetensors")
            os.truncate(weights, os.path.getsize(weights) - 100)
            with self.assertRaisesRegex(ValueError, f"^{weights}: tensor \\S+ ends at byte \\d+ .*truncated file"):
                hf.load(d)
            self.assertEqual(len(FakeAuto.loaded), before, "from_pretrained was never asked")


if __name__ == "__main__":
    unittest.main()
