"""PyTorch SDPA causal BF16 attention with GQA, the speed anchor of `fp4kv bench prefill`
(run both in the same device call). Median of CUDA-event-timed runs; TFLOP/s counts the
causal half of 4 T^2 d H_q, as `fp4kv bench prefill` does.
Usage: python3 bench/sdpa_prefill_baseline.py [--contexts 4096,32768] [--q-heads 32] [--kv-heads 8] [--head-dim 128]"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def time_ms(fn, runs):
    fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="4096,32768")
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    print(f"PyTorch {torch.__version__} SDPA causal BF16 on {torch.cuda.get_device_name()}: "
          f"{a.q_heads} query heads, {a.kv_heads} KV heads, head_dim {a.head_dim}")
    for T in (int(x) for x in a.contexts.split(",")):
        q = torch.randn(1, a.q_heads, T, a.head_dim, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, a.kv_heads, T, a.head_dim, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), a.runs)
        tflops = 2.0 * T * T * a.head_dim * a.q_heads / (ms * 1e-3) / 1e12
        print(f"sdpa {T:7d} tokens: {ms:8.3f} ms ({tflops:6.1f} TFLOP/s)")


if __name__ == "__main__":
    main()
