"""TRL's side of bench/trl-compare.ts: builds the model directory both sides load, the tool-calling SFT
checkpoint, and runs TRL's GRPOTrainer on the settings the bench gives, printing one JSON line of timings.

  model --tokenizer-json F --out DIR [--shape tiny] [--seed 0]   a random-init Qwen2 saved by transformers
  sft --model DIR --data F --out DIR [--steps 300]               tool-calling demos (user → tool call → result → \\boxed{})
  grpo --model DIR --data F --steps N [--tools] ...              TRL GRPOTrainer; prints {"steps": [...], ...}

On a machine with CUDA, sft and grpo run on the GPU (CUDA_VISIBLE_DEVICES= keeps them on the CPU), as the
worker does.

Not part of the shipped worker: it needs trl (python/bench/requirements.txt), which the worker does not.
"""
import argparse
import json
import re
import resource
import subprocess
import sys
import time

import torch

TOOL_NAME = "python_code_with_standard_io"
# Qwen2 shapes (hidden, intermediate, layers, heads, kv heads): tiny for a CPU; 0.5b is Qwen2.5-0.5B's body (with the
# bench's own small vocabulary), for a GPU, where a 3M model measures launch overhead rather than either system
SHAPES = {"tiny": (256, 688, 4, 4, 2), "0.5b": (896, 4864, 24, 14, 2)}
BOXED = re.compile(r"\\boxed\{\s*(-?\d+)\s*\}")


def python_code_with_standard_io(code: str) -> str:
    """Runs Python code and returns its standard output (or the error).

    Args:
        code: the Python program to run; print what you want to see.
    """
    # the same interpreter and time limit as rstar2's sandbox (Debian's python3, 4 s); a fresh process per call,
    # which is what a TRL user without a sandbox service writes
    try:
        r = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True, timeout=4)
    except subprocess.TimeoutExpired:
        return "Tool call failure\nreason: timeout"
    return r.stdout if r.returncode == 0 else f"Tool call failure\nstderr: {r.stderr[-500:]}"


def tool_schema():
    """The schema TRL renders for the tool (transformers' get_json_schema of the function), which rstar2's recipe
    gets as tool.schema, so both sides' prompts are the same tokens."""
    from transformers.utils import get_json_schema

    return get_json_schema(python_code_with_standard_io)


def read_rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- the model directory ----------------------------------------------------------------------------------


def conversation(q, a, expr):
    """A tool-calling demo: the question, a call that prints the expression, the tool's answer, the answer boxed."""
    call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": f"print({expr})"}}}
    return [{"role": "user", "content": q}, {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": TOOL_NAME, "content": f"{a}\n"}, {"role": "assistant", "content": f"\\boxed{{{a}}}"}]


def corpus(args):
    """The tokenizer's training text: every row's demo rendered by the template, with and without the tool."""
    from transformers.utils.chat_template_utils import render_jinja_template
    from trl.chat_template_utils import qwen2_5_chat_template

    with open(args.out, "w") as f:
        for r in read_rows(args.data):
            conv = conversation(r["question"], r["answer"], r["expr"])
            for tools in ([tool_schema()], None):
                text = render_jinja_template([conv], tools=tools, chat_template=qwen2_5_chat_template)[0][0]
                f.write(json.dumps({"text": text}) + "\n")


def build_model(args):
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen2_5_chat_template

    # TRL's copy of Qwen2.5's template: the one its add_response_schema recognises, so `tools=` can parse calls
    tok = PreTrainedTokenizerFast(tokenizer_file=args.tokenizer_json, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = qwen2_5_chat_template
    torch.manual_seed(args.seed)
    hidden, inter, layers, heads, kv = SHAPES[args.shape]
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=2048,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    print(json.dumps({"params": sum(p.numel() for p in model.parameters()), "vocab": len(tok)}))


# ---- tool-calling SFT ---------------------------------------------------------------------------------------


def demo(tok, tools, q, a, expr):
    """(ids, loss mask) of one demo: the prompt as GRPO renders it, then a call that prints the expression, the
    tool's answer, and the answer boxed; the loss on the two assistant turns only."""
    conv = conversation(q, a, expr)
    user, turn1, turn2, full = conv[:1], conv[:2], conv[:3], conv

    def ids(msgs, gen=False):
        return tok.apply_chat_template(msgs, tools=tools, tokenize=True, add_generation_prompt=gen, return_dict=False)

    p1, t1, p2, t2 = ids(user, True), ids(turn1), ids(turn2, True), ids(full)
    mask = [0] * len(t2)
    for lo, hi in ((len(p1), len(t1)), (len(p2), len(t2))):
        for i in range(lo, hi):
            mask[i] = 1
    return t2, mask


def sft(args):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(device)
    tools = [tool_schema()]
    rows = read_rows(args.data)
    demos = [demo(tok, tools, r["question"], r["answer"], r["expr"]) for r in rows]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model.train()
    g = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        pick = torch.randint(0, len(demos), (args.batch,), generator=g).tolist()
        L = max(len(demos[i][0]) for i in pick)
        ids = torch.full((args.batch, L), tok.pad_token_id)
        labels = torch.full((args.batch, L), -100)
        for b, i in enumerate(pick):
            t, m = demos[i]
            ids[b, : len(t)] = torch.tensor(t)
            labels[b, : len(t)] = torch.where(torch.tensor(m) == 1, torch.tensor(t), torch.tensor(-100))
        loss = model(input_ids=ids.to(device), labels=labels.to(device)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"sft step {step} loss {loss.item():.4f}", file=sys.stderr)
    model.save_pretrained(args.out)
    tok.save_pretrained(args.out)
    # how often the checkpoint now calls the tool: greedy first turns of a few prompts
    model.eval()
    calls = 0
    for r in rows[:8]:
        p = tok.apply_chat_template([{"role": "user", "content": r["question"]}], tools=tools, tokenize=True,
                                    add_generation_prompt=True, return_dict=False)
        out = model.generate(torch.tensor([p], device=device), max_new_tokens=64, do_sample=False)
        calls += "<tool_call>" in tok.decode(out[0, len(p):])
    print(json.dumps({"loss": loss.item(), "greedy_calls_of_8": calls}))


# ---- GRPO ---------------------------------------------------------------------------------------------------


def boxed_reward(completions, answer, **_):
    """1 for the exact integer in the last \\boxed{} (of the last assistant message), else 0: rstar2's integer
    profile."""
    out = []
    for c, gold in zip(completions, answer):
        text = c[-1]["content"] if isinstance(c, list) else c
        m = BOXED.findall(text or "")
        out.append(1.0 if m and int(m[-1]) == int(gold) else 0.0)
    return out


def grpo(args):
    import datasets
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    rows = read_rows(args.data)
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
                                     for r in rows])
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    cfg = GRPOConfig(
        output_dir=args.out_dir, max_steps=args.steps, per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, gradient_accumulation_steps=1, max_completion_length=args.max_tokens,
        learning_rate=args.lr, lr_scheduler_type="constant", warmup_steps=0, temperature=1.0, beta=0.0,
        num_iterations=1, use_cpu=not torch.cuda.is_available(), bf16=False, gradient_checkpointing=False,
        save_strategy="no", report_to="none", logging_steps=1, seed=args.seed, dataloader_num_workers=0,
        disable_tqdm=True,
        max_tool_calling_iterations=args.max_turns - 1 if args.tools else None,
    )
    timing = {"gen": [], "gen_tokens": [], "train_tokens": [], "tool_calls": []}

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0, self.steps = None, []

        def on_step_begin(self, *_, **__):
            self.t0 = time.time()

        def on_step_end(self, *_, **__):
            self.steps.append({"start": self.t0, "end": time.time()})  # epoch seconds: the bench subtracts its spawn

    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=boxed_reward, args=cfg, train_dataset=ds, processing_class=tok,
                          tools=[python_code_with_standard_io] if args.tools else None, callbacks=[clock])
    generate, score = trainer._generate, trainer._generate_and_score_completions

    def timed_generate(prompts):
        t0 = time.time()
        out = generate(prompts)
        timing["gen"].append(time.time() - t0)
        return out

    def timed_score(inputs):
        out = score(inputs)
        # every sequence the update trains: prompt and completion tokens (padding left out)
        timing["gen_tokens"].append(int(out["completion_mask"].sum()))
        timing["train_tokens"].append(int(out["completion_mask"].sum() + out["prompt_mask"].sum()))
        return out

    trainer._generate, trainer._generate_and_score_completions = timed_generate, timed_score
    trainer.train()
    calls = [h.get("tools/call_frequency") for h in trainer.state.log_history if "tools/call_frequency" in h]
    steps = []
    for i, s in enumerate(clock.steps):
        steps.append({**s, "step_s": s["end"] - s["start"], "gen_s": timing["gen"][i],
                      "gen_tokens": timing["gen_tokens"][i], "train_tokens": timing["train_tokens"][i],
                      **({"tool_calls_per_sample": calls[i]} if i < len(calls) else {})})
    rewards = [h.get("reward") for h in trainer.state.log_history if "reward" in h]
    print(json.dumps({"side": "trl", "steps": steps, "reward_mean": rewards, "peak_rss_mib": peak_rss_mib(),
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                                   "trl": trl.__version__}}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("model")
    m.add_argument("--tokenizer-json", required=True)
    m.add_argument("--out", required=True)
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    c = sub.add_parser("corpus")
    c.add_argument("--data", required=True)
    c.add_argument("--out", required=True)
    s = sub.add_parser("sft")
    s.add_argument("--model", required=True)
    s.add_argument("--data", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--steps", type=int, default=300)
    s.add_argument("--batch", type=int, default=8)
    s.add_argument("--lr", type=float, default=2e-3)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("grpo")
    g.add_argument("--model", required=True)
    g.add_argument("--data", required=True)
    g.add_argument("--out-dir", required=True)
    g.add_argument("--steps", type=int, default=6)
    g.add_argument("--prompts", type=int, default=4)
    g.add_argument("--group", type=int, default=8)
    g.add_argument("--max-tokens", type=int, default=128)
    g.add_argument("--max-turns", type=int, default=2)
    g.add_argument("--lr", type=float, default=1e-5)
    g.add_argument("--threads", type=int, default=2)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--tools", action="store_true")
    g.add_argument("--schema", action="store_true", help="print the tool's schema as TRL renders it, and exit")
    args = ap.parse_args()
    if args.cmd == "grpo" and args.schema:
        print(json.dumps(tool_schema()))
        return
    {"corpus": corpus, "model": build_model, "sft": sft, "grpo": grpo}[args.cmd](args)


if __name__ == "__main__":
    main()
