"""Token id → bytes from a tokenizer.json, just enough to detect stop strings during generation.

Handles byte-level BPE (GPT-2 byte↔unicode map, as Qwen uses), SentencePiece-style pieces ("▁" for a space,
<0xNN> byte fallback) and plain character/word vocabularies. Added/special tokens decode to their content.
"""
import json


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _types(node):
    if not node:
        return set()
    out = {node.get("type")}
    for child in node.get("decoders", []) or []:
        out |= _types(child)
    return out


class Detok:
    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj.get("model") or {}
        vocab = model.get("vocab") or {}
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {piece: i for i, (piece, _s) in enumerate(vocab)}
        decoders = _types(tj.get("decoder"))
        byte_level = "ByteLevel" in decoders
        u2b = _bytes_to_unicode() if byte_level else None
        self.pieces = {}
        for tok, i in vocab.items():
            self.pieces[int(i)] = self._piece(tok, u2b)
        for t in tj.get("added_tokens") or []:
            self.pieces[int(t["id"])] = t["content"].encode("utf-8")

    @staticmethod
    def _piece(tok, u2b):
        if u2b is not None:
            try:
                return bytes(u2b[ch] for ch in tok)
            except KeyError:
                return tok.encode("utf-8")
        if len(tok) == 6 and tok.startswith("<0x") and tok.endswith(">"):
            try:
                return bytes([int(tok[3:5], 16)])
            except ValueError:
                pass
        return tok.replace("▁", " ").encode("utf-8")

    def piece(self, token_id):
        return self.pieces.get(int(token_id), b"")
