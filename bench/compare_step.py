#!/usr/bin/env python3
"""Median new/base ratios of bench/device_step_ab.sh's alternated runs: per GEMM (tuned plan and
GEMV alone) and per step point (graph time and its parts). Usage: compare_step.py LOGDIR REPS"""
import json
import statistics
import sys


def load(d, kind, side, rep):
    with open(f"{d}/{kind}_{side}_{rep}.json") as f:
        return json.load(f)


def main():
    d, reps = sys.argv[1], int(sys.argv[2])
    print("## GEMMs (median over pairs; us)\n")
    print("| batch | gemm | base tuned | new tuned | ratio | base gemv | new gemv | ratio | new choice |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = {}
    for rep in range(1, reps + 1):
        for side in ("base", "new"):
            try:
                j = load(d, "gemm", side, rep)
            except (OSError, ValueError):
                continue
            for p in j["points"]:
                r = rows.setdefault((p["batch"], p["gemm"]), {"base": [], "new": [], "choice": ""})
                r[side].append((p["tuned_us"], p["gemv_us"]))
                if side == "new":
                    r["choice"] = p["tuned_choice"]
    for (b, g), r in sorted(rows.items()):
        if not r["base"] or not r["new"]:
            continue
        med = lambda xs, i: statistics.median(x[i] for x in xs)
        bt, nt, bg, ng = med(r["base"], 0), med(r["new"], 0), med(r["base"], 1), med(r["new"], 1)
        gr = f"{ng / bg:.3f}" if bg > 0 and ng > 0 else "-"
        print(f"| {b} | {g} | {bt:.2f} | {nt:.2f} | {nt / bt:.3f} | {bg:.2f} | {ng:.2f} | {gr} | {r['choice']} |")
    print("\n## Decode step (graph us, median over pairs; ratio = median of per-pair new/base)\n")
    print("| preset | context | batch | base | new | ratio | base attention | new attention | base gemm | new gemm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    pts = {}
    for rep in range(1, reps + 1):
        try:
            pair = [load(d, "step", s, rep) for s in ("base", "new")]
        except (OSError, ValueError):
            continue
        for pb, pn in zip(pair[0]["points"], pair[1]["points"]):
            if "graph_us" not in pb or "graph_us" not in pn:
                continue
            k = (pb["preset"], pb["context"], pb["batch"])
            pts.setdefault(k, []).append((pb, pn))
    for k, prs in pts.items():
        m = lambda f: statistics.median(f(pb, pn) for pb, pn in prs)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {m(lambda b, n: b['graph_us']):.1f} | {m(lambda b, n: n['graph_us']):.1f} | "
              f"{m(lambda b, n: n['graph_us'] / b['graph_us']):.3f} | {m(lambda b, n: b['attention_us']):.1f} | "
              f"{m(lambda b, n: n['attention_us']):.1f} | {m(lambda b, n: b['gemm_us']):.1f} | {m(lambda b, n: n['gemm_us']):.1f} |")


if __name__ == "__main__":
    main()
