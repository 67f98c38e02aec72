"""model.backend: transformers — any decoder transformers' AutoModelForCausalLM builds, for the architectures
model.py does not implement. Thin on purpose: it trains and scores (the loss path is model.py's own chunked
log-softmax over the model's lm_head); it does not generate (roll out on SGLang/vLLM engines) and does not
pack micro-batches. Validated by bench/gpu-check.sh (transformers is not installed on the CPU machines).
"""
import sys

import torch
import torch.nn as nn

from rstar2_worker.train.checkpoint import check_weights, read_config
from rstar2_worker.models.model import CausalLM, next_tokens, predicting_hidden


def import_transformers():
    try:
        import transformers
    except ImportError as e:
        raise RuntimeError(
            f"model.backend 'transformers' needs the transformers package, which {sys.executable} cannot import ({e}); "
            "pip install transformers, or use model.backend 'native' (Qwen2/Qwen3)"
        ) from None
    return transformers


UNSUPPORTED = (
    "model.backend 'transformers' trains and scores only: no generation (roll out on SGLang/vLLM engines) "
    "and no packed micro-batches (leave maxTokensPerMicroBatch unset)"
)


class HFConfig:
    """What the policy reads of a config, for any architecture."""

    def __init__(self, raw):
        self.raw = dict(raw)
        self.model_type = raw.get("model_type")
        self.vocab_size = int(raw["vocab_size"])
        self.tie_word_embeddings = bool(raw.get("tie_word_embeddings", False))


class HFCausalLM(nn.Module):
    """The loaded model's decoder (`model`) and `lm_head` as our own submodules, so state-dict names stay the
    checkpoint's (model.layers.…, lm_head.weight) and FSDP finds `model.layers` as it does in model.py."""

    def __init__(self, hf, cfg):
        super().__init__()
        if not (isinstance(getattr(hf, "model", None), nn.Module) and isinstance(getattr(hf, "lm_head", None), nn.Linear)):
            raise ValueError(
                f"{type(hf).__name__}: model.backend 'transformers' expects a decoder under `model` and an `lm_head` "
                "(the Llama/Mistral/Qwen/Gemma layout)"
            )
        self.cfg = cfg
        self.model = hf.model
        self.lm_head = hf.lm_head
        self._hf = [hf]  # in a list: a plain attribute would register every weight a second time
        self._checkpointing = False

    @property
    def gradient_checkpointing(self):
        return self._checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, on):
        if on != self._checkpointing:
            hf = self._hf[0]
            hf.gradient_checkpointing_enable() if on else hf.gradient_checkpointing_disable()
            self._checkpointing = on

    def hidden(self, ids, pos, bias=None, caches=None, cache_at=0, seqlens=None, max_pos=None):  # max_pos: no tables here
        if caches is not None or seqlens is not None or bias is not None:
            raise ValueError(UNSUPPORTED)
        return self.model(input_ids=ids, position_ids=pos, use_cache=False).last_hidden_state

    token_logprobs = CausalLM.token_logprobs

    def forward(self, ids=None, pad_left=None, drop_last=False, rows=None, packed=False, temperature=1.0, chunk=None, device=None):
        if rows is None:  # logits of whole rows (gpu_check's parity), causal, no padding
            h = self.hidden(ids, torch.arange(ids.shape[1], device=ids.device).expand_as(ids))
            return self.lm_head(h[:, :-1] if drop_last else h)
        if packed:
            raise ValueError(UNSUPPORTED)
        # right padding: a causal model never looks right, so the pads change no real position
        h, computed = predicting_hidden(self, rows, False, device)
        return (*self.token_logprobs(h, next_tokens(rows, device), temperature, chunk), computed)


def load(directory):
    """(config, model) for a Hugging Face model directory, in fp32 on the CPU (the policy places it). The directory is
    checked first (its config and every weight file's header), and only local files are read: a missing or damaged
    checkpoint is an error naming the file, never a download of a hub model of that name or a model from the cache."""
    read_config(directory)
    check_weights(directory)
    transformers = import_transformers()
    # `dtype` since transformers 4.56, where `torch_dtype` became its deprecated spelling
    new = tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (4, 56)
    kw = {"dtype" if new else "torch_dtype": torch.float32, "local_files_only": True}
    try:
        hf = transformers.AutoModelForCausalLM.from_pretrained(directory, **kw)
    except (OSError, ValueError) as e:
        raise ValueError(f"{directory}: transformers cannot load it: {e}") from None
    cfg = HFConfig(hf.config.to_dict())
    return cfg, HFCausalLM(hf, cfg)
