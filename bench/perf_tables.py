#!/usr/bin/env python3
"""The per-shape tables of docs/PERF.md from one `fp4kv bench decode --json` file.

  python3 bench/perf_tables.py bench.json [--contexts 131072,4096]

For each shape and context: one row per preset (plus PyTorch SDPA when the JSON carries
its times), one column per batch: time, TB/s of the preset's own KV bytes, % of the
streaming-read bandwidth measured in the same run, speedup over our bf16 kernel / SDPA."""
import argparse
import json


def ctx_label(c):
    return f"{c // 1024}K" if c % 1024 == 0 else str(c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--contexts", default="131072,4096")
    args = ap.parse_args()
    d = json.load(open(args.json))
    pts = [p for p in d["points"] if not p.get("skipped")]
    read = d["read_tbs"]
    shapes = list(dict.fromkeys(p["shape"] for p in pts))
    presets = list(dict.fromkeys(p["preset"] for p in pts))
    for shape in shapes:
        for ctx in [int(c) for c in args.contexts.split(",")]:
            sel = [p for p in pts if p["shape"] == shape and p["context"] == ctx]
            if not sel:
                continue
            batches = sorted({p["batch"] for p in sel})
            print(f"**{shape}, context {ctx_label(ctx)}** (time in us; TB/s of its own KV bytes; "
                  "% of the streaming-read bandwidth; speedup over our bf16 / over SDPA)\n")
            print("| preset | " + " | ".join(f"batch {b}" for b in batches) + " |")
            print("|---|" + "---:|" * len(batches))
            sdpa = {p["batch"]: p for p in sel if p.get("sdpa_us", 0) > 0}
            if sdpa:
                cells = []
                for b in batches:
                    p = sdpa.get(b)
                    if not p:
                        cells.append("")
                        continue
                    bf = next(q for q in sel if q["batch"] == b and q["preset"] == "bf16")
                    tbs = bf["kv_bytes"] / (p["sdpa_us"] * 1e-6) / 1e12
                    cells.append(f"{p['sdpa_us']:.1f} us, {tbs:.2f} TB/s ({100 * tbs / read:.0f}%)")
                print("| **PyTorch SDPA bf16** | " + " | ".join(cells) + " |")
            for pr in presets:
                cells = []
                for b in batches:
                    p = next((q for q in sel if q["batch"] == b and q["preset"] == pr), None)
                    if not p:
                        cells.append("")
                        continue
                    xs = f" / {p['x_sdpa']:.2f}x" if p.get("x_sdpa", 0) > 0 else ""
                    cells.append(f"{p['us']:.1f} us, {p['tbs']:.2f} TB/s ({100 * p['read_fraction']:.0f}%), "
                                 f"{p['x_bf16']:.2f}x{xs}")
                print(f"| {pr} | " + " | ".join(cells) + " |")
            print()


if __name__ == "__main__":
    main()
