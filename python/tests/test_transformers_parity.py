"""The worker against transformers itself on CPU, random-init tiny models (skipped where transformers is not
importable): Qwen2, Qwen2 with YaRN and Qwen3 on the built-in model, Llama on model.backend 'transformers'. Each
model is built and saved by transformers; the worker loads it, and its logits, log-probs and one SFT step's loss
are transformers' own; the worker's save (in shards) is loaded back by from_pretrained to the same logits; greedy
generation is transformers' generate.
bench/gpu-check.sh runs the same comparison on a GPU (gpu_check.py parity). Run: python -m unittest
tests.test_transformers_parity (from python/)."""
import importlib.util
import json
import os
import tempfile
import unittest

import torch

from rstar2_worker.train.policy import Policy
from tests.train_opts import full_train_opts

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, rope_theta=1e6, tie_word_embeddings=False)
# fp32 on one CPU: the built-in model gives transformers' logits to the bit here; a kernel that sums in another
# order (a GPU, SDPA) would differ in the last bits
TOL = 1e-5


@unittest.skipUnless(importlib.util.find_spec("transformers"), "transformers is not installed (bash scripts/setup.sh)")
class TransformersParity(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        import transformers

        cls.tf = transformers

    def check(self, kind, backend="native"):
        tf = self.tf
        arch = {"qwen2": "Qwen2", "qwen2-yarn": "Qwen2", "qwen3": "Qwen3", "llama": "Llama"}[kind]
        extra = {"qwen3": {"head_dim": 16}, "qwen2-yarn": {"rope_scaling": {"type": "yarn", "factor": 4.0}}}
        cls = getattr(tf, f"{arch}ForCausalLM")
        torch.manual_seed(0)
        hf = cls(getattr(tf, f"{arch}Config")(**SMALL, **extra.get(kind, {}))).float().eval()
        ids = torch.randint(0, SMALL["vocab_size"], (2, 160))  # long enough that YaRN visibly moves the logits
        seq = ids[0].tolist()
        with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as d2:
            hf.save_pretrained(d)
            p = Policy()
            p.backend = backend
            p.load(d)
            with torch.no_grad():
                ref = hf(ids).logits[:, :-1]
                ours = p.model(ids, drop_last=True)
                self.assertLess((ref - ours).abs().max().item(), TOL, f"{kind}: logits")
                ref_lp = torch.log_softmax(ref[0], -1).gather(-1, ids[0, 1:, None])[:, 0]
            lp = torch.tensor(p.logprobs([seq])[0][0][1:])
            self.assertLess((ref_lp - lp).abs().max().item(), TOL, f"{kind}: log-probs")
            hf.train()
            ref_loss = hf(ids[:1], labels=ids[:1]).loss.item()
            st = p.train_step("sft", [seq], [[0] + [1] * (len(seq) - 1)], [None], [0.0], full_train_opts(0.0))
            self.assertAlmostEqual(st["loss"], ref_loss, delta=TOL, msg=f"{kind}: SFT loss")
            p.save(d2, False, 2)  # HF shards with an index, as a checkpoint is written
            with open(os.path.join(d2, "model.safetensors.index.json")) as f:
                self.assertEqual(len(set(json.load(f)["weight_map"].values())), 2)
            back = cls.from_pretrained(d2).float().eval()
            with torch.no_grad():
                self.assertLess((back(ids).logits[:, :-1] - ours).abs().max().item(), TOL, f"{kind}: from_pretrained")

    def test_qwen2(self):
        self.check("qwen2")

    def test_qwen2_yarn(self):
        self.check("qwen2-yarn")

    def test_qwen3(self):
        self.check("qwen3")

    def test_llama_on_the_transformers_backend(self):
        self.check("llama", backend="transformers")

    def test_greedy_generation_is_transformers_generate(self):
        # the engine's paged KV cache and batched decode (two prompt lengths) against transformers' generate
        tf = self.tf
        torch.manual_seed(0)
        hf = tf.Qwen3ForCausalLM(tf.Qwen3Config(**SMALL, head_dim=16)).float().eval()
        prompts = [torch.randint(0, SMALL["vocab_size"], (n,)).tolist() for n in (17, 40)]
        with tempfile.TemporaryDirectory() as d:
            hf.save_pretrained(d)
            p = Policy()
            p.load(d)
        ours, _, _ = p.generate(prompts, {"temperature": 0.0, "maxNewTokens": 24})
        for prompt, got in zip(prompts, ours):
            with torch.no_grad():
                ref = hf.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24, do_sample=False)
            self.assertEqual(got, ref[0, len(prompt):].tolist())


if __name__ == "__main__":
    unittest.main()
