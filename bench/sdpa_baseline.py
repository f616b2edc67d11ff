#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention decode baseline (BF16, enable_gqa, contiguous KV,
one decode query per head) at the shapes of `fp4kv bench decode`.

Median of CUDA-event-timed runs; the K/V tensors are rotated over copies so every run reads
at least --rotate-gb GB (cold L2). Writes JSON that `fp4kv bench decode --sdpa` reads.

  python3 bench/sdpa_baseline.py --json sdpa.json [--contexts 4096,131072] [--batches 1,64]
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

SHAPES = {"qwen3-4b": (32, 8, 128), "qwen3-30b-a3b": (32, 4, 128)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="4096,16384,32768,65536,131072,262144")
    ap.add_argument("--batches", default="1,8,16,32,64")
    ap.add_argument("--shapes", default="qwen3-4b,qwen3-30b-a3b")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--rotate-gb", type=float, default=1.0)
    ap.add_argument("--json", default="sdpa.json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    out = {"device": props.name, "torch": torch.__version__, "runs": a.runs, "points": []}
    print(f"device {props.name}, torch {torch.__version__}")
    print(f"{'shape':14s} {'ctx':>7s} {'batch':>5s} {'median_us':>10s} {'KV_MB':>9s} {'TB/s':>6s}  backend")
    for sname in a.shapes.split(","):
        qh, kvh, d = SHAPES[sname]
        for ctx in [int(x) for x in a.contexts.split(",")]:
            for b in [int(x) for x in a.batches.split(",")]:
                kv_bytes = 2 * b * kvh * ctx * d * 2
                pt = {"shape": sname, "context": ctx, "batch": b, "kv_bytes": kv_bytes}
                try:
                    free, _ = torch.cuda.mem_get_info()
                    copies = max(1, math.ceil(a.rotate_gb * 1e9 / kv_bytes))
                    while copies > 1 and copies * kv_bytes > free - 4e9:
                        copies -= 1
                    if kv_bytes > free - 4e9:
                        raise torch.cuda.OutOfMemoryError(f"needs {kv_bytes / 1e9:.1f} GB")
                    q = torch.randn(b, qh, 1, d, device=dev, dtype=torch.bfloat16)
                    ks = [torch.randn(b, kvh, ctx, d, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
                    vs = [torch.randn(b, kvh, ctx, d, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
                    f = lambda i: F.scaled_dot_product_attention(q, ks[i % copies], vs[i % copies], enable_gqa=True)
                    for i in range(3):
                        f(i)
                    torch.cuda.synchronize()
                    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.runs)]
                    for i, (s, e) in enumerate(ev):
                        s.record()
                        f(i + 1)
                        e.record()
                    torch.cuda.synchronize()
                    t = sorted(s.elapsed_time(e) * 1e3 for s, e in ev)
                    us = t[len(t) // 2]
                    pt["us"] = us
                    pt["tbs"] = kv_bytes / (us * 1e-6) / 1e12
                    print(f"{sname:14s} {ctx:7d} {b:5d} {us:10.1f} {kv_bytes / 1e6:9.1f} {pt['tbs']:6.2f}")
                    del q, ks, vs
                except torch.cuda.OutOfMemoryError as e:
                    pt["us"] = None
                    pt["skipped"] = f"out of memory: {e}"[:200]
                    print(f"{sname:14s} {ctx:7d} {b:5d} skipped (out of memory)")
                torch.cuda.empty_cache()
                sys.stdout.flush()
                out["points"].append(pt)
    with open(a.json, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
