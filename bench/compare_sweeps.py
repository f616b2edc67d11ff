#!/usr/bin/env python3
"""A/B of two decode sweeps (`fp4kv bench decode --json`) measured in the same device call.

  python3 bench/compare_sweeps.py BASE.json NEW.json [BASE2.json NEW2.json ...]

Pairs the points (shape, preset, context, batch) of each BASE/NEW pair, takes the median of
the NEW/BASE time ratios over the repeated pairs (runs alternated, so clock and thermal drift
hit both), and prints one row per point, then the largest slowdown. Exit 1 when a point is
more than --limit (default 2 %) slower."""
import json
import statistics
import sys


def points(path):
    with open(path) as f:
        j = json.load(f)
    out = {}
    for e in j["points"]:
        if e.get("us") is None:
            continue
        out[(e["shape"], e["preset"], e["context"], e["batch"])] = e["us"]
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--limit=")]
    limit = next((float(a.split("=")[1]) for a in sys.argv[1:] if a.startswith("--limit=")), 0.02)
    if len(args) < 2 or len(args) % 2:
        sys.exit(__doc__)
    pairs = [(points(args[i]), points(args[i + 1])) for i in range(0, len(args), 2)]
    keys = sorted(set.intersection(*(set(b) & set(n) for b, n in pairs)))
    worst = (0.0, None)
    print("| shape | preset | context | batch | base us | new us | new/base |")
    print("|---|---|---|---|---|---|---|")
    for k in keys:
        ratios = [n[k] / b[k] for b, n in pairs]
        r = statistics.median(ratios)
        base = statistics.median(b[k] for b, _ in pairs)
        new = statistics.median(n[k] for _, n in pairs)
        print(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {base:.1f} | {new:.1f} | {r:.3f} |")
        if r - 1 > worst[0]:
            worst = (r - 1, k)
    print(f"\n{len(keys)} points; largest slowdown {worst[0] * 100:.1f} % at {worst[1]}")
    sys.exit(1 if worst[0] > limit else 0)


if __name__ == "__main__":
    main()
