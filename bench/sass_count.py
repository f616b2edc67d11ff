#!/usr/bin/env python3
"""Instruction counts of a decode kernel's main loop from `cuobjdump --dump-sass` output.

  python3 bench/sass_count.py SASS_TXT KERNEL_SUBSTRING [LABEL]

Finds the function whose mangled name contains KERNEL_SUBSTRING, takes the backward branch
whose body holds the most page MMAs (the page loop; in FP4 and FP8 kernels the FP16 HMMAs,
their BF16 ones being the sink/recent CTA's), and prints the opcode
histogram of that body, the smallest loop with as many MMAs and the innermost MMA loop, the HMMA count (= 16 x 16 tiles x column tiles), and instructions
per tile and per element (warp instructions x 32 lanes / elements)."""
import re
import sys
from collections import Counter


def page_mmas_are_bf16(hmma_is_bf16):
    """Whether a kernel's page-loop MMAs are its BF16 ones, from each HMMA's BF16 flag. Kernels
    over FP4 and FP8 pages multiply pages in FP16, their BF16 MMAs being the sink/recent CTA's
    (sink_recent_part.cuh); kernels over BF16 pages have BF16 MMAs only."""
    return all(hmma_is_bf16)


def functions(text):
    cur, lines = None, []
    for ln in text.splitlines():
        m = re.search(r"Function : (\S+)", ln)
        if m:
            if cur:
                yield cur, lines
            cur, lines = m.group(1), []
        elif cur:
            lines.append(ln)
    if cur:
        yield cur, lines


def parse(lines):
    ins = []
    for ln in lines:
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", ln)
        if not m:
            continue
        addr = int(m.group(1), 16)
        body = m.group(2).strip()
        body = re.sub(r"^@!?U?P\w+\s+", "", body)
        op = body.split()[0] if body else ""
        ins.append((addr, op, body))
    return ins


def pick_page_loops(loops):
    """From the backward branches whose body holds MMAs, as (MMA count, first, last) index
    spans, the three loops reported: the page loop (the first span with the most MMAs; code
    the compiler lays out inside it counts too), the smallest span with as many MMAs (the page
    loop proper) and the smallest with any MMA (the innermost key-step loop)."""
    hmax = max(h for h, _, _ in loops)
    region = next(l for l in loops if l[0] == hmax)
    tight = min((l for l in loops if l[0] == hmax), key=lambda l: l[2] - l[1])
    inner = min(loops, key=lambda l: l[2] - l[1])
    return region, tight, inner


def span_len(span):
    return span[2] - span[1] + 1


def main():
    text = open(sys.argv[1]).read()
    key = sys.argv[2]
    label = sys.argv[3] if len(sys.argv) > 3 else key
    nt = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    for name, lines in functions(text):
        if key not in name:
            continue
        ins = parse(lines)
        index_of = {addr: i for i, (addr, _, _) in enumerate(ins)}
        want_bf16 = page_mmas_are_bf16(".BF16" in x[1] for x in ins if x[1].startswith("HMMA"))
        is_page_mma = lambda op: op.startswith("HMMA") and (".BF16" in op) == want_bf16
        loops = []  # (HMMA count, first, last) of every backward branch with page MMAs
        for i, (addr, op, body) in enumerate(ins):
            if op.startswith("BRA"):
                m = re.search(r"0x([0-9a-f]+)", body)
                if not m:
                    continue
                tgt = int(m.group(1), 16)
                if tgt < addr and tgt in index_of:
                    first = index_of[tgt]
                    h = sum(1 for x in ins[first : i + 1] if is_page_mma(x[1]))
                    if h:
                        loops.append((h, first, i))
        total = Counter(x[1].split(".")[0] for x in ins)
        print(f"== {label}: {name}")
        print(f"whole kernel: {len(ins)} instructions, HMMA {total.get('HMMA', 0)}, LDL/STL {total.get('LDL', 0) + total.get('STL', 0)}")
        if loops:
            best, tight, inner = pick_page_loops(loops)
            h, region = best[0], ins[best[1] : best[2] + 1]
            c = Counter(x[1].split(".")[0] for x in region)
            tiles = h // nt
            print(f"page loop: {len(region)} warp instructions, HMMA {h} -> {tiles} tiles of 16x16 per warp per page")
            if tiles:
                print(f"  {len(region) / tiles:.1f} warp instructions per tile, {len(region) * 32 / (tiles * 256):.2f} per element")
            print("  " + ", ".join(f"{k} {v}" for k, v in c.most_common(30)))
            print(f"tight page loop: {span_len(tight)} warp instructions; innermost MMA loop: {span_len(inner)}")
        return
    print(f"== {label}: no function matching {key}")


if __name__ == "__main__":
    main()
