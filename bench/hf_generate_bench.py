"""Decode speed and memory of Hugging Face transformers `generate` at a long context:
transformers' own DynamicCache (BF16 keys and values, PyTorch SDPA) against fp4kv.hf.FP4Cache
(fp4kv's paged cache and decode kernel), on a Qwen3 shape with random weights.

Usage: python3 bench/hf_generate_bench.py [--model qwen3-4b] [--context 32768] [--new-tokens 128]
                                          [--presets nvfp4,bf16] [--json OUT]
(needs torch with CUDA, transformers and the fp4kv package on PYTHONPATH)

Method, per cache: one untimed warm-up generate, then generate from the same random prompt with
max_new_tokens 1 (prefill only) and 1 + N (prefill + N decode steps), each timed with CUDA
synchronization; decode tokens/s = N / (t(1 + N) - t(1)), so the prompt's cost cancels. EOS
is disabled (min_new_tokens) so every run decodes exactly N tokens. Memory: the peak allocated
during the long run above the memory held before it (weights and the prompt), and the cache's
own bytes (DynamicCache: its key and value tensors at the end; FP4Cache: its pool, sized for
max_length up front like transformers' StaticCache).
"""
import argparse
import json
import time

import torch
from transformers import DynamicCache, Qwen3Config, Qwen3ForCausalLM

import fp4kv.hf

SHAPES = {  # Qwen3 model configs (the Hub's config.json fields the forward pass reads)
    "qwen3-4b": dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}


def random_model(shape: str, max_positions: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(**SHAPES[shape], max_position_embeddings=max_positions, rope_theta=1e6,
                         rms_norm_eps=1e-6, attn_implementation="fp4kv")
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = Qwen3ForCausalLM(config).eval()
        torch.set_default_dtype(torch.float32)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def timed_generate(model, ids, make_cache, new_tokens: int):
    """Seconds for one generate call and the cache it filled."""
    cache = make_cache()
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, past_key_values=cache, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - start, cache


def cache_bytes(cache) -> int:
    if isinstance(cache, fp4kv.hf.FP4Cache):
        return cache.kv.pool.numel() * cache.kv.pool.element_size()
    total = 0
    for layer in cache.layers:
        for t in (layer.keys, layer.values):
            total += t.numel() * t.element_size()
    return total


def measure(model, ids, name: str, make_cache, new_tokens: int) -> dict:
    timed_generate(model, ids, make_cache, 2)  # warm-up: kernels loaded, allocator pools grown
    prefill_s, _ = timed_generate(model, ids, make_cache, 1)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    total_s, cache = timed_generate(model, ids, make_cache, 1 + new_tokens)
    peak = torch.cuda.max_memory_allocated() - before
    row = dict(cache=name, context=ids.shape[1], new_tokens=new_tokens, prefill_s=prefill_s,
               decode_tokens_per_s=new_tokens / (total_s - prefill_s),
               ms_per_token=1e3 * (total_s - prefill_s) / new_tokens,
               cache_gb=cache_bytes(cache) / 1e9, peak_above_weights_gb=peak / 1e9)
    print(f"{name:>22}: prefill {prefill_s:6.2f} s, decode {row['decode_tokens_per_s']:7.1f} tokens/s "
          f"({row['ms_per_token']:.2f} ms/token), cache {row['cache_gb']:.2f} GB, "
          f"peak above weights {row['peak_above_weights_gb']:.2f} GB", flush=True)
    del cache
    torch.cuda.empty_cache()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3-4b", choices=sorted(SHAPES))
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--presets", default="nvfp4,bf16")
    ap.add_argument("--json")
    a = ap.parse_args()
    max_length = a.context + a.new_tokens + 8
    model = random_model(a.model, max_length)
    ids = torch.randint(0, model.config.vocab_size, (1, a.context), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    print(f"{a.model} (random weights, bf16) on {torch.cuda.get_device_name()}: context {a.context}, "
          f"{a.new_tokens} decoded tokens, torch {torch.__version__}", flush=True)
    rows = [measure(model, ids, "DynamicCache (sdpa)", DynamicCache, a.new_tokens)]
    for preset in a.presets.split(","):
        rows.append(measure(model, ids, f"FP4Cache {preset}",
                            lambda p=preset: fp4kv.hf.FP4Cache(model.config, preset=p, max_length=max_length),
                            a.new_tokens))
    base = rows[0]
    for r in rows:
        r["speedup_vs_dynamic"] = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
        r["cache_ratio_vs_dynamic"] = base["cache_gb"] / r["cache_gb"]
    print("| cache | decode tokens/s | x DynamicCache | cache GB | x smaller | peak above weights GB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['cache']} | {r['decode_tokens_per_s']:.1f} | {r['speedup_vs_dynamic']:.2f} | "
              f"{r['cache_gb']:.2f} | {r['cache_ratio_vs_dynamic']:.2f} | {r['peak_above_weights_gb']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(model=a.model, device=torch.cuda.get_device_name(), torch=torch.__version__,
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
