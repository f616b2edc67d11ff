#!/usr/bin/env python3
"""The chat-template fixture through transformers' own template compiler (where transformers is
installed: the device machine has it, CI has not): every case of
tests/model/data/chat_template_cases.json rendered by the environment apply_chat_template uses
must give the fixture's text (which fp4kv's tests compare against), or fail where it fails.
Exit 1 on any difference.

    python3 tests/model/check_chat_template_with_hf.py   (from the repository root)
"""
import json
import sys

import transformers
from transformers.utils import chat_template_utils as ctu


def main():
    fixture = json.load(open("tests/model/data/chat_template_cases.json", encoding="utf-8"))
    compile_template = getattr(ctu, "_compile_jinja_template")
    differ = 0
    for c in fixture["cases"]:
        variables = dict(c["specials"], **c["variables"])
        variables.update(messages=c["messages"], tools=c["tools"], documents=None,
                         add_generation_prompt=c["add_generation_prompt"])
        try:
            got = {"expected": compile_template(fixture["templates"][c["template"]]).render(**variables)}
        except Exception as e:  # raise_exception raises jinja2's TemplateError with the message
            got = {"failed": str(e)}
        if "expected" in c:
            ok = got.get("expected") == c["expected"]
        elif "raised" in c:
            ok = got.get("failed") == c["raised"]
        else:
            ok = "failed" in got
        if not ok:
            differ += 1
            if differ <= 5:
                print("differs:", c["name"], json.dumps(got)[:300])
    print(f"transformers {transformers.__version__}: {len(fixture['cases'])} cases, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
