"""The worker loop: frames in on stdin, replies out on stdout, in order; rank 0 forwards what every rank runs.
(Not a server: the client owns the process and speaks to it over its pipes.)"""
import collections
import os
import select
import sys
import traceback

import numpy as np
import torch.distributed

from rstar2_worker.train import dist
from rstar2_worker.train import weight_sync
from rstar2_worker.train.policy import Policy
from rstar2_worker.protocol import ragged, read_frame, write_frame


# ops every rank runs (rank 0 forwards them); the others run on rank 0 alone unless the model is sharded
ALL_RANKS = {"init", "load", "reset_optimizer", "save", "train_step", "logprobs"}  # logprobs: each rank its share
# ops with collectives part-way through, where one rank's failure can leave the others waiting in one
MIDWAY = {"train_step", "logprobs", "save", "weights_join", "weights_broadcast"}


def run(inp, out, r, settings):
    # unbuffered, so that select() sees every byte not yet read: the engine polls it between steps
    inp = getattr(inp, "raw", inp)
    early = collections.deque()  # frames read while the engine ran that wait for it to finish, in order
    policy = Policy(r, settings)
    gen = Generating(policy.engine, out)
    # under FSDP every rank holds a shard, so reading the full weights (for a broadcast too) takes them all
    sharded = {"weights_join", "weights_broadcast"}
    everywhere = ALL_RANKS | (sharded if r.sharding == "fsdp" else set())
    while True:
        if r.rank == 0:
            if policy.engine.has_work():
                gen.poll(inp, early)
                if early and early[-1] is None:
                    return  # the client closed us: no one is left to read what the engine would answer
                gen.step()
                continue
            frame = early.popleft() if early else read_frame(inp)
            if frame is not None and gen.take(frame):
                continue
            shared = r.world > 1 and (frame is None or frame[0].get("op") in everywhere)
            if shared:
                dist.forward_request(r, frame)
        else:
            frame, shared = dist.forward_request(r, None), True
        if frame is None:
            return  # EOF: the client closed us (rank 0 passes it on)
        header, arrays = frame
        rid = header.get("id", 0)
        err = None
        try:
            reply, reply_arrays = handle(policy, header, arrays)
        except Exception as e:  # report, go on
            traceback.print_exc(file=sys.stderr)
            err = f"{header.get('op')}: {type(e).__name__}: {e}"
            if shared and r.world > 1 and header.get("op") in MIDWAY and not isinstance(e, (ValueError, OSError)):
                # raised part-way (out of memory): the other ranks may be inside a collective this rank will never
                # join, and the shards may be out of step. A bad request (ValueError, found before any collective,
                # alike on every rank) and a file error (after them) are answered; here the process ends, and
                # the client, seeing a rank die, fails the call and restarts every rank
                gone = dist.peer_gone(r, e)
                print(f"rstar2_worker: rank {r.rank}: {gone or err}; exiting so that every rank restarts", file=sys.stderr)
                sys.stderr.flush()
                os._exit(3)
        if shared:  # a rank that failed where rank 0 did not (a file missing on one node) must not pass silently
            errs = [None] * r.world
            torch.distributed.all_gather_object(errs, err, group=r.control)
            bad = next((i for i, e in enumerate(errs) if e), None)
            err = None if bad is None else errs[bad] if bad == 0 else f"rank {bad}: {errs[bad]}"
        if r.rank == 0:
            if err:
                write_frame(out, {"id": rid, "error": err})
            else:
                write_frame(out, {"id": rid, "result": reply}, reply_arrays)


class Generating:
    """Rank 0's side of the engine: generate requests join it as they arrive and are answered as each ends.
    Between engine steps the frames waiting on stdin are read: a cancel stops rows now, engine_load is answered
    now, a generate joins the running batch; any other op (a train step, a save) waits, with every frame after
    it, until the engine has finished what it holds, so the client's order of calls is kept."""

    def __init__(self, engine, out):
        self.engine, self.out = engine, out
        self.cancels = {}  # rows cancelled for a generate not added yet (it waits in `early`)
        self.last = -1  # the newest generate id added: a cancel aimed at an older one that is gone came late

    def take(self, frame):
        """Handles frame if it is the engine's (generate, cancel, engine_load); False for any other op."""
        h, a = frame
        op, rid = h.get("op"), h.get("id", 0)
        if op == "cancel":
            t = h.get("target")
            if t in self.engine.requests:
                self.engine.abort(t, h.get("rows") or [])
            elif isinstance(t, int) and t > self.last:
                self.cancels.setdefault(t, set()).update(h.get("rows") or [])
            return True
        if op == "engine_load":
            write_frame(self.out, {"id": rid, "result": self.engine.load()})
            return True
        if op == "flush_cache":  # as SGLang's /flush_cache: refused while requests run, whose KV it would drop
            if self.engine.has_work():
                write_frame(self.out, {"id": rid, "error": "flush_cache: requests are running or waiting; the cache was not flushed"})
            else:
                self.engine.invalidate()
                write_frame(self.out, {"id": rid, "result": {}})
            return True
        if op != "generate":
            return False
        self.last = max(self.last, rid)
        try:
            fail = self.engine.policy.settings.worker_fail
            if fail == "generate:0":
                raise RuntimeError(f"RSTAR2_WORKER_FAIL={fail}")
            self.engine.add(rid, ragged(a["ids"], a["lens"]), h.get("sampling") or {})
        except Exception as e:  # a bad request is answered at once; the others go on
            if not isinstance(e, ValueError):
                traceback.print_exc(file=sys.stderr)
            write_frame(self.out, {"id": rid, "error": f"generate: {type(e).__name__}: {e}"})
            return True
        gone = self.cancels.pop(rid, None)
        if gone:
            self.engine.abort(rid, gone)
        return True

    def poll(self, inp, early):
        """Reads the frames waiting on inp without blocking."""
        while not (early and early[-1] is None) and select.select([inp], [], [], 0)[0]:
            frame = read_frame(inp)
            if frame is None:
                early.append(frame)  # EOF: the main loop meets it once the engine is done
                return
            # a cancel or a load question is answered now; a generate joins unless some other call waits before it
            if (frame[0].get("op") in ("cancel", "engine_load") or not early) and self.take(frame):
                continue
            early.append(frame)

    def step(self):
        """One engine step; each request it finished is answered. Returns them as engine.step does."""
        try:
            done = self.engine.step()
        except Exception as e:  # out of memory, a bug: every request in flight is answered, none is lost
            traceback.print_exc(file=sys.stderr)
            err = f"generate: {type(e).__name__}: {e}"
            for rid in list(self.engine.requests):
                write_frame(self.out, {"id": rid, "error": err})
            self.engine.reset()
            return []
        for rid, res in done:
            ids = res["ids"]
            write_frame(
                self.out,
                {"id": rid, "result": {"finish": res["finish"], "cached": res["cached"], "retractions": res["retractions"]}},
                {"out_ids": ("i32", [t for x in ids for t in x]), "out_lens": ("i32", [len(x) for x in ids]),
                 "out_logprobs": ("f32", [t for x in res["logprobs"] for t in x])},
            )
        return done


def weights_op(policy, op, h):
    """The weight-sync ops: the trainer's side (join, broadcast) and a served engine's (join, receive)."""
    if op == "weights_join":  # once: rank 0 joins the engines' weight-update group, as its rank 0
        policy._need_model()
        named = weight_sync.weights(policy.r, policy)
        if named is None:
            return {}
        policy.weight_group = weight_sync.join(
            h["addr"], int(h["port"]), int(h["worldSize"]), h.get("groupName") or "weight_update_group",
            h.get("backend") or "nccl", float(h.get("timeoutS") or 600), float(h.get("opTimeoutS") or 0) or None,
        )
        return weight_sync.meta(named, policy.settings.weight_sync_dtype)
    if op == "weights_broadcast":  # per update, while each engine receives (the names weights_join returned)
        policy._need_model()
        named = weight_sync.weights(policy.r, policy)
        if named is None:
            return {}
        if policy.weight_group is None:
            raise RuntimeError("no weight-update group: call weights_join first")
        return weight_sync.broadcast(policy.weight_group, named, policy.device, policy.settings.weight_sync_dtype)
    if op == "weights_engine_join":  # `rstar2 serve`: joins a trainer's weight-update group as an engine rank
        policy._need_model()
        policy.recv_group = None
        policy.recv_group = weight_sync.join_as_engine(
            h["addr"], int(h["port"]), int(h["rank"]), int(h["worldSize"]), h["groupName"],
            h.get("backend") or "nccl", float(h.get("timeoutS") or 600),
        )
        policy.staged = weight_sync.Staged()
        return {"rank": int(h["rank"])}
    if op == "weights_receive":  # one bucket; `commit` (the last) swaps them all in and drops cached prefixes
        policy._need_model()
        g = getattr(policy, "recv_group", None)
        if g is None or g.name != h.get("groupName"):
            raise ValueError(f"no weight-update group {h.get('groupName')!r} joined (or its last receive failed): "
                             "join one with /init_weights_update_group")
        try:
            policy.staged.receive(g, policy.model, h["names"], h["dtypes"], h["shapes"], policy.device)
        except Exception:
            # the old weights serve on; the group's stream is out of step, so it is left
            policy.staged, policy.recv_group = weight_sync.Staged(), None
            raise
        if not h.get("commit"):
            return {"staged": len(policy.staged.tensors), "applied": 0}
        n = policy.staged.apply(policy.model)
        policy.engine.invalidate()
        return {"staged": 0, "applied": n}
    raise ValueError(f"unknown op {op!r}")


def handle(policy, h, a):
    op = h.get("op")
    fail = policy.settings.worker_fail  # tests: "OP:RANK" makes that rank fail OP as out of memory would
    if fail == f"{op}:{policy.rank}":
        raise RuntimeError(f"RSTAR2_WORKER_FAIL={fail}")
    if op == "init":
        return policy.init(h["config"], int(h.get("seed", 0))), None
    if op == "load":
        return policy.load(h["dir"]), None
    if op == "reset_optimizer":
        return policy.reset_optimizer(), None
    if op == "save":
        return policy.save(h["dir"], bool(h.get("optimizer")), h.get("shards"), h.get("maxShardBytes")), None
    if op == "logprobs":
        seqs = ragged(a["ids"], a["lens"])
        chunk = h.get("logitsChunkTokens")
        if chunk is not None and not (isinstance(chunk, int) and chunk >= 1):
            raise ValueError(f"logitsChunkTokens must be a positive integer, got {chunk!r}")
        lps, ents, tops = policy.logprobs(seqs, float(h.get("temperature", 1.0)), int(h.get("microBatchTokens", 8192)), chunk)
        if lps is None:  # a rank other than 0: its share went to rank 0
            return {}, None
        return {}, {
            "logprobs": ("f32", np.concatenate([np.asarray(x, dtype=np.float32) for x in lps])),
            "entropy": ("f32", np.concatenate([np.asarray(x, dtype=np.float32) for x in ents])),
            "argmax": ("i32", np.concatenate([np.asarray(x, dtype=np.int32) for x in tops])),
        }
    if op == "train_step":
        lens = a["lens"]
        seqs = ragged(a["ids"], lens)
        masks = ragged(a["mask"], lens)
        olds_all = ragged(a["old_logprobs"], lens)
        has_old = a["has_old"].tolist()
        olds = [o if has_old[i] else None for i, o in enumerate(olds_all)]
        advs = a["advantages"].tolist()
        kind = h.get("loss")
        if kind not in ("grpo", "sft"):
            raise ValueError(f"loss must be 'grpo' or 'sft', got {kind!r}")
        return policy.train_step(kind, seqs, masks, olds, advs, h.get("opts") or {}), None
    if op.startswith("weights_"):
        return weights_op(policy, op, h), None
    if op == "bare_bench":  # bench/worker.ts's baseline, not part of the client API; the bench is not shipped
        try:
            import bare_bench  # python/bench/bare_bench.py
        except ImportError:
            raise ValueError("bare_bench: python/bench is not on the worker's PYTHONPATH (bench/worker.ts puts it there)") from None
        return bare_bench.handle(policy, h), None
    raise ValueError(f"unknown op {op!r}")
