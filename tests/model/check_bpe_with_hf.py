#!/usr/bin/env python3
"""The BPE fixture's cases through Hugging Face `tokenizers` itself (where it is installed: the
device machine has it, CI has not): every case's ids, and decode on the cases already in NFC.
Exit 1 on any difference.

    python3 tests/model/check_bpe_with_hf.py   (from the repository root)
"""
import json
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer


def main():
    t = Tokenizer.from_file("tests/model/data/tiny_bpe_tokenizer.json")
    cases = json.load(open("tests/model/data/tiny_bpe_cases.json", encoding="utf-8"))["encode"]
    bad_ids = bad_text = 0
    for c in cases:
        ids = t.encode(c["text"]).ids
        if ids != c["ids"]:
            bad_ids += 1
            if bad_ids <= 3:
                print("ids differ:", json.dumps(c["text"]), ids[:16], c["ids"][:16])
        nfc = unicodedata.normalize("NFC", c["text"]) == c["text"]
        if nfc and t.decode(c["ids"], skip_special_tokens=False) != c["text"]:
            bad_text += 1
    print(f"tokenizers {tokenizers.__version__}: {len(cases)} cases, ids differ in {bad_ids}, "
          f"decode differs in {bad_text}")
    return 1 if bad_ids or bad_text else 0


if __name__ == "__main__":
    sys.exit(main())
