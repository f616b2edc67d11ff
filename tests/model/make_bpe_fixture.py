#!/usr/bin/env python3
"""Writes the BPE tokenizer test fixture: a small byte-level BPE trained on data/calib.txt in
the Qwen2 tokenizer.json format (tiny_bpe_tokenizer.json) and the cases the C++ tokenizer must
reproduce (tiny_bpe_cases.json: texts with their token ids, and NFC pairs), computed by an
independent reference: the `regex` module running Qwen2's pattern itself, unicodedata's NFC
and GPT-2's BPE loop.

    python3 tests/model/make_bpe_fixture.py   (from the repository root)
"""
import json
import random
import unicodedata

import regex

PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE = regex.compile(PATTERN)
MERGES = 600
ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def words(text):
    return ["".join(B2U[b] for b in w.encode()) for w in PRE.findall(unicodedata.normalize("NFC", text))]


def train(text):
    counts = {}
    for w in words(text):
        counts[w] = counts.get(w, 0) + 1
    split = {w: list(w) for w in counts}
    merges = []
    for _ in range(MERGES):
        pairs = {}
        for w, c in counts.items():
            s = split[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + c
        if not pairs:
            break
        best = max(sorted(pairs), key=lambda p: pairs[p])
        merges.append(best)
        for w in counts:
            split[w] = merge_pair(split[w], best)
    return merges


def merge_pair(sym, pair):
    """Every occurrence of the adjacent pair in sym merged, left to right."""
    out, k = [], 0
    while k < len(sym):
        if k + 1 < len(sym) and (sym[k], sym[k + 1]) == pair:
            out.append(sym[k] + sym[k + 1])
            k += 2
        else:
            out.append(sym[k])
            k += 1
    return out


def bpe(word, ranks):
    sym = list(word)
    while len(sym) > 1:
        pairs = [(ranks.get((a, b), 1 << 30), k) for k, (a, b) in enumerate(zip(sym, sym[1:]))]
        rank, _ = min(pairs)
        if rank == 1 << 30:
            break
        pair = next((a, b) for (a, b) in zip(sym, sym[1:]) if ranks.get((a, b)) == rank)
        sym = merge_pair(sym, pair)
    return sym


def encode(text, vocab, ranks, added):
    ids, seg, i = [], 0, 0
    by_len = sorted(added, key=len, reverse=True)
    while i < len(text):
        hit = next((a for a in by_len if text.startswith(a, i)), None)
        if hit is None:
            i += 1
            continue
        ids += [vocab[p] for w in words(text[seg:i]) for p in bpe(w, ranks)]
        ids.append(added[hit])
        i += len(hit)
        seg = i
    ids += [vocab[p] for w in words(text[seg:]) for p in bpe(w, ranks)]
    return ids


def random_text(rng):
    pool = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") + list(" \t\n\r  ") +
            list(".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`") + ["'s", "'RE", "'ll", "'ſ", "'D", "\r\n", "\u00a0", "\u3000"] +
            list("éüñçßøåæœ") + ["e\u0301", "a\u0308", "\u1100\u1161", "\u1100\u1161\u11a8", "\u0041\u030a\u0323"] +
            list("中文字漢語日本語한국어") + list("٠١٢३४५①Ⅻ½") + ["😀", "👍🏽", "\u200d", "\u0301", "\ufeff"] + ADDED)
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, 40)))


def main():
    text = open("data/calib.txt", encoding="utf-8").read()[:200000]
    merges = train(text)
    vocab = {c: i for i, c in enumerate(sorted(B2U.values()))}
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    added = {a: len(vocab) + k for k, a in enumerate(ADDED)}
    ranks = {m: r for r, m in enumerate(merges)}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": a, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for a, i in added.items()],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [[a, b] for a, b in merges]},
    }
    rng = random.Random(20261207)
    fixed = ["", "Hello, world!", "It's what they'RE doing; we'll see 'bout it.", "12345 + 6.78 = 12351.78",
             "  leading and trailing   ", "a  \n\n  b\t\t c   \r\n", "tabs\tand\u00a0no-break\u3000spaces",
             "caf\u00e9 vs cafe\u0301", "\u1100\u1161\u11a8 \uac01", "中文 and 日本語, 한국어!", "emoji 😀👍🏽 end",
             "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
             "!!!\n\n???   \n", "x'ſ y", "it'ſa test'Sam", "\u0301starts with a mark", "done.\n"]
    long_words = ["the" * 1000, "".join(rng.choice("etaoinshrdlu") for _ in range(4000)), "9" * 500]
    texts = fixed + long_words + [random_text(rng) for _ in range(400)]
    for start in range(0, len(text) - 600, len(text) // 20):
        texts.append(text[start:start + 600])
    cases = [{"text": t, "ids": encode(t, vocab, ranks, added), "pieces": PRE.findall(t)} for t in texts]
    nfc_pool = [chr(c) for c in list(range(0x20, 0x250)) + list(range(0x300, 0x370)) + list(range(0x1100, 0x1176))
                + list(range(0x11A8, 0x11C3)) + [0x0B47, 0x0B3E, 0x0B57, 0x1E0A, 0x1E0C, 0x212B, 0x2126, 0xFB2C,
                0x0F73, 0x1D15E, 0x1D165, 0x1D16E, 0xAC00, 0xAC01, 0xD7A3, 0x0344, 0x0F81, 0x2ADC, 0x05B7, 0x05BC]]
    nfc = []
    for _ in range(2000):
        s = "".join(rng.choice(nfc_pool) for _ in range(rng.randint(1, 12)))
        nfc.append({"in": s, "nfc": unicodedata.normalize("NFC", s)})
    with open("tests/model/data/tiny_bpe_tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False)
    with open("tests/model/data/tiny_bpe_cases.json", "w", encoding="utf-8") as f:
        json.dump({"unicode_version": unicodedata.unidata_version, "encode": cases, "nfc": nfc}, f,
                  ensure_ascii=False)


if __name__ == "__main__":
    main()
