"""Which fp4kv op errors reach Python as exceptions (each probe in its own process, so a
crash names its probe): a bad argument to ops registered for CUDA with and without a mutated
argument, and to the catch-all create_cache. Usage: python3 bench/py_error_probe.py"""
import subprocess
import sys

SETUP = """
import torch, fp4kv
cache = fp4kv.KVCache(1, 2, 128, 8, "nvfp4", max_batch=1, max_pages=8)
tables = torch.arange(8, dtype=torch.int32, device="cuda").view(1, 8)
lens = torch.tensor([1], dtype=torch.int32, device="cuda")
"""
PROBES = {
    "create_cache (catch-all)": 'fp4kv.KVCache(1, 2, 128, 4, "nvfp5")',
    "begin_step: wrong table width (CUDA, mutates pool)": "cache.begin_step(tables[:, :2].contiguous(), lens)",
    "begin_step: int64 tables (CUDA, mutates pool)": "cache.begin_step(tables.long(), lens)",
    "end_step before begin_step (CUDA, mutates pool)": "cache.end_step()",
    "append: wrong kv heads (CUDA, mutates pool, prints sizes)": ("cache.begin_step(tables, lens); "
                                                                 "cache.append(0, torch.zeros(1, 3, 128, device='cuda'), torch.zeros(1, 3, 128, device='cuda'))"),
    "decode: wrong q heads (CUDA, no mutation)": ("w = fp4kv.DecodeWrapper(8).plan(cache); "
                                                 "w.run(torch.zeros(1, 4, 128, device='cuda', dtype=torch.bfloat16), cache, 0)"),
    "quantize_page: 200 tokens (CPU)": "fp4kv.quantize_page(torch.zeros(200, 64), torch.zeros(200, 64), 'nvfp4')",
}

for name, call in PROBES.items():
    code = SETUP + f"try:\n    {call}\n    print('no error')\nexcept Exception as e:\n    print(type(e).__name__, str(e).splitlines()[0][:120])\n"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    result = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else f"exit {r.returncode}"
    print(f"{name:55} {result}")
