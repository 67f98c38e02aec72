"""What transformers itself does with a tokenizer directory, for test/tokenizer/transformers.test.ts to compare with.

stdin: {"save": {"dir", "tokenizer"} (optional: a tiny random-init Qwen3 saved by transformers with that
tokenizer, as a user's fine-tune would be), "dirs": [tokenizer directories], "texts": [str],
"chats": [{"dir", "messages", "tools", "add_generation_prompt"}], "models": [model directories]}
stdout: {"transformers": version, "classes": {dir: class name}, "ids": {dir: [ids of each text]},
"decoded": {dir: [decode(ids) of each text]}, "chats": [{"text", "ids"}],
"models": {dir: {"missing_keys", "unexpected_keys", "mismatched_keys": as from_pretrained reports them}}}
"""
import json
import sys

import torch
import transformers


def save_tiny(directory, tokenizer_dir):
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = transformers.Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
                                   bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).save_pretrained(directory)
    tok.save_pretrained(directory)


def main():
    req = json.load(sys.stdin)
    if req.get("save"):
        save_tiny(req["save"]["dir"], req["save"]["tokenizer"])
    out = {"transformers": transformers.__version__, "classes": {}, "ids": {}, "decoded": {}, "chats": []}
    toks = {}
    for d in req.get("dirs", []) + [c["dir"] for c in req.get("chats", [])]:
        if d not in toks:
            toks[d] = transformers.AutoTokenizer.from_pretrained(d)
    for d in req.get("dirs", []):
        tok = toks[d]
        out["classes"][d] = type(tok).__name__
        ids = [tok.encode(t, add_special_tokens=True) for t in req["texts"]]
        out["ids"][d] = ids
        out["decoded"][d] = [tok.decode(i, skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]
    for c in req.get("chats", []):
        tok = toks[c["dir"]]
        kw = dict(tools=c.get("tools"), add_generation_prompt=c.get("add_generation_prompt", False))
        text = tok.apply_chat_template(c["messages"], tokenize=False, **kw)
        ids = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=True, **kw)["input_ids"]
        out["chats"].append({"text": text, "ids": list(ids)})
    out["models"] = {}
    for d in req.get("models", []):
        _, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True)
        out["models"][d] = {k: sorted(map(str, info.get(k, []))) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
