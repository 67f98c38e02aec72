"""The policy: model + optimizer + RNG, and the operations the TS client calls."""
import contextlib
import os
import shutil
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from rstar2_worker.train import dist as ranks
from rstar2_worker.models import hf_model
from rstar2_worker.train.checkpoint import read_config, read_state_dict, write_json, write_state_dict
from rstar2_worker.engine.engine import Engine
from rstar2_worker.models import model as M
from rstar2_worker.models.layers import to_device
from rstar2_worker.models.model import CausalLM, Config, count_params
from rstar2_worker.settings import MODEL_BACKENDS, Settings
# how a train step's per-token losses become one: the mean over every trained token of the batch; or each
# micro-batch's token-mean times its sequences over the batch's ('micro-mean-batch') or over a nominal count
# ('micro-mean-nominal': verl's dynamic-bsz scaling, response_mask.shape[0] / ppo_mini_batch_size)
LOSS_AGGS = ("token-mean", "micro-mean-batch", "micro-mean-nominal")
# the options train_step reads, every one required: their defaults are written once, in TrainOptionsSchema
# (src/worker/types.ts), which test/worker/train-keys.test.ts holds to this set
TRAIN_KEYS = (
    "lr", "weightDecay", "betas", "eps", "gradClip", "clipLow", "clipHigh", "dualClip", "microBatchTokens",
    "maxTokensPerMicroBatch", "gradientCheckpointing", "logitsChunkTokens", "lossAgg", "nominalSeqs", "klCoef",
    "klEstimator", "refLogprobs", "entropyCoef",
)

# ---- the loss math: per-token GRPO loss, KL, entropy bonus, aggregation (Policy.train_step composes them) ----


def grpo_token_loss(logp, old, adv, clip_low, clip_high, dual_clip):
    """Per-token PPO loss with clip-higher and dual clip (verl compute_policy_loss). Returns (loss, clipped)."""
    ratio = torch.exp(torch.clamp(logp - old, -20.0, 20.0))
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    c1 = torch.maximum(l1, l2)
    clipped = (l2 > l1).float()
    c2 = torch.minimum(-adv * dual_clip, c1)
    return torch.where(adv < 0, c2, c1), clipped


def kl_penalty(logp, ref, estimator):
    """Per-token estimate of KL(π ‖ π_ref) from the sampled tokens (Schulman's estimators; verl's kl_penalty 'kl'
    and 'low_var_kl'): k1 = log π - log π_ref; k3 = r - log r - 1 with r = π_ref / π, ≥ 0, clamped to 10 as verl."""
    if estimator == "k1":
        return logp - ref
    d = torch.clamp(ref - logp, -20.0, 20.0)
    return torch.clamp(torch.exp(d) - d - 1, max=10.0)


def entropy_bonus(logp, ent):
    """The policy's entropy at each position, with the gradient of a sampled estimate: ∇H = -E_a[(log π(a) + H)
    ∇log π(a)], from the token taken. The worker's entropy comes out of its chunked log-softmax without a gradient,
    so its exact gradient would need the logits kept; the value returned is H itself."""
    g = (logp.detach() + ent) * logp
    return ent - (g - g.detach())


def aggregate(tok_loss, mask, loss_agg, trained_global, n_seqs, n_global, nominal):
    """A micro-batch's share of the step's loss (LOSS_AGGS): its mask=1 token losses over every trained token of
    the batch, or its token-mean weighted by its sequences over the batch's or a nominal count."""
    msum = (tok_loss * mask).sum()
    if loss_agg == "token-mean":
        return msum / trained_global
    return msum / mask.sum().clamp(min=1) * (n_seqs / (nominal if loss_agg == "micro-mean-nominal" else n_global))


# ---- the policy ----------------------------------------------------------------------------------------

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "generation_config.json",
    "special_tokens_map.json",
)


def train_options(opts, seqs, vocab):
    """train_step's options checked and typed, the KL reference's log-probs and nominalSeqs: (o, refs, nominal)."""
    missing = [k for k in TRAIN_KEYS if k not in opts]
    if missing:  # the client sends every key, its defaults from the TS schema: this worker has none of its own
        raise ValueError(f"train_step: options missing: {', '.join(missing)}")
    unknown = sorted(set(opts) - set(TRAIN_KEYS))
    if unknown:
        raise ValueError(f"train_step: unknown options: {', '.join(unknown)}")
    o = {
        "lr": float(opts["lr"]),
        "weightDecay": float(opts["weightDecay"]),
        "betas": list(opts["betas"]),
        "eps": float(opts["eps"]),
        "gradClip": float(opts["gradClip"]),
        "clipLow": float(opts["clipLow"]),
        "clipHigh": float(opts["clipHigh"]),
        "dualClip": float(opts["dualClip"]),
        "microBatchTokens": int(opts["microBatchTokens"]),
        "maxTokensPerMicroBatch": opts["maxTokensPerMicroBatch"],
        "gradientCheckpointing": bool(opts["gradientCheckpointing"]),
        "logitsChunkTokens": opts["logitsChunkTokens"],
        "lossAgg": opts["lossAgg"],
        "klCoef": float(opts["klCoef"]),
        "klEstimator": opts["klEstimator"],
        "entropyCoef": float(opts["entropyCoef"]),
    }
    # per sequence, aligned with its ids as olds are: the reference policy's log-probs (KL loss)
    refs = opts["refLogprobs"] if o["klCoef"] else None
    if o["klCoef"] and (refs is None or len(refs) != len(seqs) or any(len(r) != len(s) for r, s in zip(refs, seqs))):
        raise ValueError("klCoef needs refLogprobs: one list per sequence, as long as its ids")
    if o["klEstimator"] not in ("k1", "k3"):
        raise ValueError(f"klEstimator must be 'k1' or 'k3', got {o['klEstimator']!r}")
    for k in ("maxTokensPerMicroBatch", "logitsChunkTokens"):
        if o[k] is not None and not (isinstance(o[k], int) and o[k] >= 1):
            raise ValueError(f"{k} must be a positive integer, got {o[k]!r}")
    if o["lossAgg"] == "verl":  # the old name of micro-mean-batch, which is not verl's scaling
        raise ValueError("lossAgg 'verl' was renamed: 'micro-mean-batch' is what it computed; verl's own scaling is 'micro-mean-nominal'")
    if o["lossAgg"] not in LOSS_AGGS:
        raise ValueError(f"lossAgg must be one of {', '.join(LOSS_AGGS)}, got {o['lossAgg']!r}")
    nominal = opts["nominalSeqs"]
    if o["lossAgg"] == "micro-mean-nominal" and not (isinstance(nominal, int) and nominal >= 1):
        raise ValueError(f"lossAgg 'micro-mean-nominal' needs nominalSeqs, a positive integer, got {nominal!r}")
    if o["dualClip"] <= 1.0:
        raise ValueError("dualClip must be > 1")
    V = vocab
    for i, s in enumerate(seqs):
        if s and (min(s) < 0 or max(s) >= V):
            raise ValueError(f"sequences[{i}] has a token id outside the vocabulary [0, {V})")
    return o, refs, nominal


class Policy:
    def __init__(self, r=None, settings=None):
        """settings: the worker's (Settings.from_env at start-up); None: every default, whatever the environment."""
        self.r = r or ranks.Rank()
        self.settings = settings or Settings()
        self.rank, self.world = self.r.rank, self.r.world
        self.model = None
        self.wrapped = None  # the model as train steps run it: DDP, FSDP, or the model itself
        self.cfg = None
        self.src_dir = None
        self.detok = None
        self.opt = None
        self.pending_opt_state = None
        self.step = 0
        self.weight_group = None  # weight_sync.Group once the rollout engines joined one
        self.gen = torch.Generator()  # draws the sampling seed of each generate row that comes without one
        self.device, self.precision = pick_device(self.r.local_rank), self.settings.precision
        self.backend = pick_backend(self.settings.model_backend)
        self.engine = Engine(self)
        self.compiled = None  # what model.compile decided (model.compile_pieces)
        self.direct = 0  # ids of generate calls made in-process (Policy.generate), apart from the client's

    # ---- model lifecycle -------------------------------------------------------------------------

    def _place(self):
        """This rank's device; precision bf16 also stores the weights (and so AdamW's state) in bf16."""
        self.model.to(self.device, torch.bfloat16 if self.precision == "bf16" else torch.float32)
        if self.compiled is None:  # once a process: compiled pieces serve every model it loads
            mode = self.settings.compile
            if mode == "auto" and self.r.sharding == "fsdp" and self.device.type == "cuda":
                # FSDP with the compiled pieces has not run on a GPU yet (bench/gpu-check.sh's FSDP step); 'on' asks
                # for it anyway
                print("rstar2 worker: model.compile auto: off under FSDP (not yet checked on a GPU; 'on' compiles)",
                      file=sys.stderr)
                mode = "off"
            self.compiled = M.compile_pieces(mode, self.device)

    def _info(self, restored=False):
        # step: the optimizer steps taken (optimizer.pt's after a load), on which the client's warmup counts
        out = {"config": self.cfg.raw, "params": self.n_params, "restoredOptimizer": restored, "step": self.step}
        out.update(device=str(self.device), precision=self.precision, compiled=self.compiled)
        if self.src_dir:
            out["dir"] = self.src_dir
        return out

    def init(self, config, seed):
        self.engine.reset()
        self.cfg = Config(config)
        torch.manual_seed(seed)
        self.model = CausalLM(self.cfg)
        self.model.init_weights(seed)
        self._place()
        self.gen.manual_seed(seed)
        self.src_dir, self.detok, self.opt, self.pending_opt_state, self.step = None, None, None, None, 0
        self._wrap()
        return self._info()

    def _wrap(self):
        self.n_params = count_params(self.model)  # counted whole: FSDP1's parameters become views of shards
        # FSDP shards at once so no rank holds a full replica longer than the load; DDP waits for a train step
        self.wrapped = ranks.wrap(self.r, self.model) if self.r.sharding == "fsdp" else None

    @property
    def forward_module(self):
        """What runs a forward outside training: the FSDP wrapper when sharded (it gathers the weights), else
        the plain model (DDP's wrapper adds nothing there)."""
        return self.wrapped if self.r.sharding == "fsdp" else self.model

    def load(self, directory):
        self.engine.reset()
        raw = read_config(directory)
        mt = raw.get("model_type", "qwen2")
        if self.backend == "transformers":
            cfg, model = hf_model.load(directory)
        elif mt not in ("qwen2", "qwen3"):
            raise ValueError(
                f"{os.path.join(directory, 'config.json')}: model_type {mt!r} is not supported by the built-in model (qwen2, qwen3); "
                "model.backend 'transformers' loads it with transformers' AutoModelForCausalLM"
            )
        else:
            cfg = Config(raw)
            model = CausalLM(cfg)
            load_weights(model, read_state_dict(directory), cfg, directory)
        opt_path = os.path.join(directory, "optimizer.pt")
        # read before anything is replaced: a damaged file leaves the loaded model in place, as damaged weights do
        st = read_optimizer_state(opt_path) if os.path.exists(opt_path) else None
        if st is not None and st.get("shards"):
            if self.r.sharding != "fsdp":
                raise ValueError(f"{directory}: its optimizer state is sharded (saved under sharding: fsdp); "
                                 "resume it with sharding: fsdp, on any number of ranks")
            if not os.path.isdir(os.path.join(directory, ranks.OPTIMIZER_DIR)):
                raise ValueError(f"{directory}: optimizer.pt says its optimizer state is sharded, but "
                                 f"{ranks.OPTIMIZER_DIR}/ is missing (optimizer-rank*.pt files are the format before "
                                 "it: load the weights alone, without optimizer.pt, or use the checkout that wrote them)")
        self.cfg, self.model, self.src_dir = cfg, model, directory
        self._place()
        self.detok = None  # built on the first stop-string request: parsing a 150K-entry tokenizer.json takes ~0.6 s
        self.opt, self.pending_opt_state, self.step = None, None, 0
        self._wrap()
        restored = False
        if st is not None:
            self.pending_opt_state = st.get("optimizer")
            if st.get("shards"):  # FSDP: read at the first step, into the shards this rank then holds
                self.pending_opt_state = {"sharded": directory}
            self.step = int(st.get("step", 0))
            torch.set_rng_state(st["torch_rng"])
            self.gen.set_state(st["gen_rng"])
            restored = True
        if self.world > 1:  # a node reading a stale or partial copy of the directory would train apart, or hang
            mine = (restored, self.step)
            every = [None] * self.world
            dist.all_gather_object(every, mine, group=self.r.control)
            odd = next((i for i, x in enumerate(every) if tuple(x) != tuple(every[0])), None)
            if odd is not None:
                raise ValueError(
                    f"{directory}: rank {odd} read (optimizer restored, step) {tuple(every[odd])} but rank 0 "
                    f"{tuple(every[0])}: every node must see the same checkpoint"
                )
        return self._info(restored)

    def save(self, directory, with_optimizer, shards=None, max_shard_bytes=None):
        """Consolidated HF weights and optimizer.pt from rank 0; under FSDP each rank also writes its
        optimizer shard (the directory must be on storage every node sees)."""
        self._need_model()
        os.makedirs(directory, exist_ok=True)
        sd = ranks.full_state_dict(self.r, self.forward_module)
        sharded_opt = with_optimizer and self.r.sharding == "fsdp"
        if sharded_opt and self.opt is not None:
            ranks.save_optimizer_state(self.wrapped, self.opt, directory)
        elif sharded_opt and "sharded" in (self.pending_opt_state or {}) and self.rank == 0:
            # loaded, not yet stepped: the shards as they were saved, whatever number of ranks saved them
            src = os.path.join(self.pending_opt_state["sharded"], ranks.OPTIMIZER_DIR)
            if os.path.abspath(src) != os.path.abspath(os.path.join(directory, ranks.OPTIMIZER_DIR)):
                shutil.copytree(src, os.path.join(directory, ranks.OPTIMIZER_DIR), dirs_exist_ok=True)
        if self.rank != 0:
            return {"dir": directory}
        if self.cfg.tie_word_embeddings:
            sd.pop("lm_head.weight", None)
        raw = dict(self.cfg.raw)
        raw["torch_dtype"] = "bfloat16" if self.precision == "bf16" else "float32"
        write_json(os.path.join(directory, "config.json"), raw)
        files = write_state_dict(directory, sd, shards, max_shard_bytes)
        if self.src_dir and os.path.abspath(self.src_dir) != os.path.abspath(directory):
            for name in TOKENIZER_FILES:
                src = os.path.join(self.src_dir, name)
                if os.path.exists(src):
                    shutil.copyfile(src, os.path.join(directory, name))
        if with_optimizer:
            st = {
                "optimizer": None if sharded_opt else self.opt.state_dict() if self.opt is not None else self.pending_opt_state,
                "shards": self.world if sharded_opt else 0,
                "step": self.step,
                "torch_rng": torch.get_rng_state(),
                "gen_rng": self.gen.get_state(),
            }
            tmp = os.path.join(directory, "optimizer.pt.tmp")
            torch.save(st, tmp)
            os.replace(tmp, os.path.join(directory, "optimizer.pt"))
        return {"dir": directory, "files": files}

    def _need_model(self):
        if self.model is None:
            raise RuntimeError("no model: call init or load first")

    def _autocast(self):
        """bf16-mixed: bf16 matmuls over fp32 weights; the other precisions run in the weights' own dtype."""
        if self.precision != "bf16-mixed":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # ---- generation ------------------------------------------------------------------------------

    def generate(self, prompts, sp, cancelled=None):
        """One request through the engine, alone: (ids, logprobs, finish) per prompt. `cancelled()`, polled
        between steps, returns the rows the client stopped: each ends there, finish "abort", with what it has."""
        self.direct += 1
        res = self.engine.run(("direct", self.direct), prompts, sp, cancelled)
        return res["ids"], res["logprobs"], res["finish"]

    # ---- scoring ---------------------------------------------------------------------------------

    def logprobs(self, seqs, temperature=1.0, budget=8192, chunk=None):
        """(log p, entropy, target is the argmax) per token of each sequence, 0 at its first token, as numpy
        arrays. Every rank scores its share of `seqs`; rank 0 returns them all, the other ranks Nones."""
        self._need_model()
        self.model.eval()
        lo, hi = self.share(len(seqs))
        mine = seqs[lo:hi]
        zero = (np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.int32))
        out = [tuple(z[: len(r)] for z in zero) for r in mine]  # a sequence of 0 or 1 tokens predicts nothing
        mbs = [mb for mb in micro_batches(mine, budget) if any(len(mine[i]) > 1 for i in mb)]
        with torch.no_grad(), self._autocast():
            for k in range(self.most_passes(len(mbs))):
                if k >= len(mbs):  # FSDP: a forward for each of the busiest rank's
                    self.forward_module(rows=[[0, 0]], device=self.device)
                    continue
                rows = [mine[i] for i in mbs[k]]
                lp, ent, top, _ = self.forward_module(rows=rows, temperature=temperature, chunk=chunk, device=self.device)
                got = lp.cpu().numpy(), ent.cpu().numpy(), top.int().cpu().numpy()
                at = 0
                for i, r in zip(mbs[k], rows):
                    n = len(r) - 1
                    if n > 0:
                        out[i] = tuple(np.concatenate((z, x[at : at + n])) for z, x in zip(zero, got))
                        at += n
        if self.wrapped is not None:
            ranks.reshard(self.r, self.wrapped)
        if self.world > 1:
            every = [None] * self.world if self.rank == 0 else None
            dist.gather_object(out, every, dst=0, group=self.r.control)
            if self.rank != 0:
                return None, None, None
            out = [x for part in every for x in part]
        return [x[0] for x in out], [x[1] for x in out], [x[2] for x in out]

    def share(self, n):
        """This rank's slice [lo, hi) of a batch of n sequences."""
        return self.rank * n // self.world, (self.rank + 1) * n // self.world

    def most_passes(self, n):
        """The most forward passes any rank has to run, n this rank's: every rank runs as many, since FSDP's
        forward and backward gather each layer's weights from all ranks (a rank that stopped early would leave
        the others waiting until the collective timed out). Counted on the CPU group: no wait on a GPU."""
        if self.world == 1:
            return n
        t = torch.tensor([n], device="cpu")
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.r.control)
        return int(t)

    # ---- training --------------------------------------------------------------------------------

    def reset_optimizer(self):
        """A fresh optimizer and step count: a new stage's warmup starts from zero, as a new run would."""
        self.opt, self.pending_opt_state, self.step = None, None, 0
        return {"step": 0}

    def _optimizer(self, o):
        if self.opt is None and self.wrapped is not None:
            ranks.reshard(self.r, self.wrapped)  # the shards, not gathered weights, go to the optimizer
        params = unique_params(self.forward_module)
        if self.opt is None:
            # fused on a GPU: the default (foreach) keeps each parameter's step count in a tensor, made on the
            # GPU under this worker's default device, and read back twice per parameter per step (582 waits
            # on the GPU per step of a 0.5B model on an H200). Not under offload, which keeps the parameters and
            # their optimizer on the CPU
            fused = {"fused": True} if self.device.type == "cuda" and not self.r.offload else {}
            self.opt = torch.optim.AdamW(params, lr=o["lr"], betas=o["betas"], eps=o["eps"], weight_decay=o["weightDecay"], **fused)
            if self.pending_opt_state is not None:
                if "sharded" in self.pending_opt_state:
                    ranks.load_optimizer_state(self.wrapped, self.opt, self.pending_opt_state["sharded"])
                elif self.r.sharding == "fsdp":  # saved unsharded (DDP), resumed sharded
                    ranks.set_optimizer_state(self.wrapped, self.opt, self.pending_opt_state)
                else:
                    self.opt.load_state_dict(self.pending_opt_state)
                self.pending_opt_state = None
        for g in self.opt.param_groups:
            g["betas"], g["eps"], g["weight_decay"] = tuple(o["betas"]), o["eps"], o["weightDecay"]
        return self.opt

    def _token_loss(self, kind, idx, seqs, olds, advs, refs, o, logp, ent, mask, stats):
        """One micro-batch's per-token loss and clipped flags: GRPO's clipped ratio (+ KL, - entropy), or SFT's
        negative log-likelihood. The KL estimate is summed into stats[6]."""
        dev = self.device
        if kind == "grpo":
            n_pred = [max(len(seqs[i]) - 1, 0) for i in idx]
            old = torch.tensor(
                [x for i, n in zip(idx, n_pred) for x in (olds[i][1:] if olds[i] is not None else [0.0] * n)],
                dtype=torch.float32, device="cpu",
            )
            has_old = torch.tensor([olds[i] is not None for i, n in zip(idx, n_pred) for _ in range(n)], device="cpu")
            old = torch.where(to_device(has_old, dev), to_device(old, dev), logp.detach())
            adv = to_device(torch.tensor([advs[i] for i, n in zip(idx, n_pred) for _ in range(n)], dtype=torch.float32, device="cpu"), dev)
            tok_loss, clipped = grpo_token_loss(logp, old, adv, o["clipLow"], o["clipHigh"], o["dualClip"])
            if refs is not None:
                ref = to_device(torch.tensor([x for i in idx for x in refs[i][1:]], dtype=torch.float32, device="cpu"), dev)
                kl = kl_penalty(logp, ref, o["klEstimator"])
                tok_loss = tok_loss + o["klCoef"] * kl
                with torch.no_grad():
                    stats[6] += (kl * mask).sum().double()
            if o["entropyCoef"]:
                tok_loss = tok_loss - o["entropyCoef"] * entropy_bonus(logp, ent)
        else:
            tok_loss, clipped = -logp, torch.zeros_like(logp)
        return tok_loss, clipped

    def _optimizer_step(self, opt, o, stats, passes, with_kl, t0):
        """The summed gradients clipped and applied at the lr the client sent; the step's stats read once."""
        params = unique_params(self.model)
        if self.world > 1:
            dist.all_reduce(stats)
        max_norm = o["gradClip"] if o["gradClip"] > 0 else float("inf")
        grad_norm = ranks.clip_grad_norm(self.r, self.wrapped, [p for p in params if p.grad is not None], max_norm)
        lr = o["lr"]  # the whole schedule, warmup on this worker's step count included, is the client's (src/rl/schedule.ts)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.step += 1
        dt = time.time() - t0
        loss_v, clip_n, ent_s, trained, tokens, padded, kl_s = stats.tolist()
        return {
            "loss": loss_v,
            "gradNorm": grad_norm,
            "clipFrac": clip_n / max(trained, 1),
            "entropy": ent_s / max(trained, 1),
            **({"kl": kl_s / max(trained, 1)} if with_kl else {}),
            "tokens": int(tokens),
            "trainedTokens": int(trained),
            "paddedTokens": int(padded),
            "tokensPerS": tokens / dt if dt > 0 else 0.0,
            "lr": lr,
            "step": self.step,
            "microBatches": passes,
            "timeS": dt,
        }

    def train_step(self, kind, seqs, masks, olds, advs, opts):
        self._need_model()
        o, refs, nominal = train_options(opts, seqs, self.cfg.vocab_size)
        t0 = time.time()
        if self.engine.release_for_training and self.engine.kv is not None:
            # only when there is a pool: emptying the allocator's cache made every step of a train-only loop
            # allocate its activations afresh, ~80 ms of a 235 ms 8K step of a 0.5B model on an H200
            self.engine.release()
        self.engine.invalidate()  # the prefixes it cached were computed with the weights this step changes
        model = self.model
        model.train()
        if self.wrapped is None:
            self.wrapped = ranks.wrap(self.r, model)
        opt = self._optimizer(o)
        n_global = len(seqs)
        trained_global = sum(sum(m[1:]) for m in masks)
        if trained_global == 0:
            raise ValueError("train batch has no mask=1 tokens")
        lo, hi = self.share(n_global)
        mine = list(range(lo, hi))
        # stats: loss, clipped tokens, entropy sum, trained tokens, all tokens, computed tokens (padding included);
        # summed on the device and read once a step (reading them per micro-batch waited on the GPU each time)
        stats = torch.zeros(7, dtype=torch.float64, device=self.device)  # [6]: KL estimate summed
        packed = o["maxTokensPerMicroBatch"] is not None
        model.gradient_checkpointing = o["gradientCheckpointing"]
        mine_seqs = [seqs[i] for i in mine]
        mbs = pack(mine_seqs, o["maxTokensPerMicroBatch"]) if packed else micro_batches(mine_seqs, o["microBatchTokens"])
        dev = self.device
        idle = [mb for mb in mbs if all(len(mine_seqs[j]) < 2 for j in mb)]  # nothing to predict
        stats[4] += sum(len(mine_seqs[j]) for mb in idle for j in mb)
        mbs = [mb for mb in mbs if mb not in idle]
        # zero-weight passes where this rank has fewer micro-batches than another (most_passes); DDP needs only the
        # last one, where gradients are reduced, which a rank with nothing to train also joins
        passes = max(self.most_passes(len(mbs)), 1)
        for k in range(passes):
            last = k == passes - 1  # DDP reads no_sync at the forward, FSDP at the backward
            if k >= len(mbs):  # nothing left to train on this rank: a zero-weight pass
                with ranks.no_sync(self.r, self.wrapped, last), self._autocast():
                    idle_loss = self.wrapped(rows=[[0, 0]], device=dev)[0].sum() * 0.0
                with ranks.no_sync(self.r, self.wrapped, last):
                    idle_loss.backward()
                continue
            mb = mbs[k]
            idx = [mine[j] for j in mb]
            rows = [seqs[i] for i in idx]
            tokens = sum(len(r) for r in rows)
            # per predicted token (ids[1:] of each sequence, sequence after sequence)
            mask = to_device(torch.tensor([m for i in idx for m in masks[i][1:]], dtype=torch.float32, device="cpu"), dev)
            with ranks.no_sync(self.r, self.wrapped, last), self._autocast():
                logp, ent, _, computed = self.wrapped(rows=rows, packed=packed, chunk=o["logitsChunkTokens"], device=dev)
            tok_loss, clipped = self._token_loss(kind, idx, seqs, olds, advs, refs, o, logp, ent, mask, stats)
            loss = aggregate(tok_loss, mask, o["lossAgg"], trained_global, len(idx), n_global, nominal)
            with ranks.no_sync(self.r, self.wrapped, last):
                (loss * ranks.sum_scale(self.r)).backward()
            with torch.no_grad():
                stats[:4] += torch.stack([loss, (clipped * mask).sum(), (ent * mask).sum(), mask.sum()]).double()
            stats[4] += tokens
            stats[5] += computed
        return self._optimizer_step(opt, o, stats, passes, refs is not None, t0)


def pack(seqs, budget):
    """Packed micro-batches of at most `budget` tokens (no padding): longest first, each sequence into the
    first micro-batch with room for it (first-fit decreasing); a sequence over the budget gets its own."""
    out, sizes = [], []
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        n = len(seqs[i])
        j = next((j for j, size in enumerate(sizes) if size + n <= budget), None)
        if j is None:
            out.append([i])
            sizes.append(n)
        else:
            out[j].append(i)
            sizes[j] += n
    return out


def pick_device(rank, cuda=torch.cuda):
    """This rank's local GPU (LOCAL_RANK, else the rank) when CUDA is present, else the CPU."""
    if not cuda.is_available():
        return torch.device("cpu")
    local, n = int(os.environ.get("LOCAL_RANK", rank)), cuda.device_count()
    if local >= n:
        raise RuntimeError(f"rank {rank} wants GPU {local} (LOCAL_RANK), but only {n} are visible")
    return torch.device("cuda", local)


def pick_backend(name):
    if name not in MODEL_BACKENDS:
        raise ValueError(f"model backend must be one of {', '.join(MODEL_BACKENDS)}, got {name!r}")
    if name == "transformers":
        hf_model.import_transformers()  # fail at start, naming the package, not at the first load
    return name


def micro_batches(seqs, budget):
    """Length-grouped packing: longest first, a micro-batch holds sequences while count × longest ≤ budget
    (≥ 1 each) and none is under half the longest, so padding stays below half of every micro-batch.
    Results are per index and the loss is a sum over tokens, so the grouping changes only speed."""
    out, cur, longest = [], [], 0
    for i in sorted(range(len(seqs)), key=lambda i: -len(seqs[i])):
        n = max(len(seqs[i]), 1)
        if cur and ((len(cur) + 1) * longest > budget or 2 * n < longest):
            out.append(cur)
            cur = []
        if not cur:
            longest = n
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def read_optimizer_state(path):
    """optimizer.pt onto the CPU: rank 0 wrote it from its GPU, and every rank reading it would otherwise put a whole
    copy of the optimizer state on that GPU first (or fail on a host without one); load_state_dict moves each tensor
    to its parameter's device. A damaged or cut file is an error naming it."""
    try:
        st = torch.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - a cut zip, a bad pickle: either way the file cannot be used
        raise ValueError(f"{path}: damaged optimizer state, cannot be read ({type(e).__name__}: {e})") from None
    missing = [k for k in ("torch_rng", "gen_rng") if not isinstance(st, dict) or k not in st]
    if missing:
        raise ValueError(f"{path}: not an optimizer state this worker wrote (no {missing[0]})")
    return st


def load_weights(model, sd, cfg, directory):
    """Copies tensors into the model one at a time; each source (a file mapping) is dropped after its copy,
    so a load never holds more than the model plus one tensor in memory."""
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # HF omits it for tied models; some writers keep a copy
    own = model.state_dict()
    missing = [m for m in own if m not in sd and not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    unexpected = [k for k in sd if k not in own]
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}")
    with torch.no_grad():
        for name in list(sd):
            src = sd.pop(name)
            if tuple(src.shape) != tuple(own[name].shape):
                raise ValueError(f"{directory}: {name} has shape {list(src.shape)}, the config makes {list(own[name].shape)}")
            own[name].copy_(src)
            del src


def unique_params(model):
    seen, out = set(), []
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
