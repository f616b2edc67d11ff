"""The fp4kv torch ops on the GPU: decode attention and a prefill chunk's attention against
PyTorch SDPA over the keys and values the cache holds (BF16 rows, and dequantized pages for the
FP4 and FP8 formats), CUDA-graph
capture and replay of a decode step, torch.compile without graph breaks, the page codecs,
and errors. Skipped without torch, a CUDA device or the built extension.

Tolerances. The decode kernels read exactly the values the reference reads (the BF16 rows and
the pages' dequantized values), so the only differences are arithmetic: the query as an FP16
or BF16 operand, the probabilities P rounded to FP16 before the P.V product (mixed presets),
FP32 accumulation in another order, and the BF16 output. Each is a relative error of at most
2^-9 to 2^-8 of a value of magnitude <= max|v|, so outputs agree within 2e-2 for the unit-scale
random data below, and a wrong page, row, head or scale gives errors near 1."""
import math

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
fp4kv = pytest.importorskip("fp4kv")

PAGE = 128
ATOL = 2e-2


def make_cache(preset, layers=2, kv_heads=2, head_dim=128, num_blocks=16, max_batch=4, max_pages=4):
    return fp4kv.KVCache(layers, kv_heads, head_dim, num_blocks, preset, "cuda", max_batch=max_batch,
                         max_pages=max_pages)


def block_tables(batch, max_pages):
    """Row r owns blocks r * max_pages .. (r + 1) * max_pages - 1."""
    return torch.arange(batch * max_pages, dtype=torch.int32, device="cuda").view(batch, max_pages)


def reference(q, k, v, length):
    """SDPA of one row: q [q_heads][d] over k, v [length][kv_heads][d] (GQA), float32."""
    group = q.shape[0] // k.shape[1]
    kk = k[:length].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [q_heads][length][d]
    vv = v[:length].float().repeat_interleave(group, dim=1).transpose(0, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.float()[:, None, :], kk, vv)[:, 0, :]


def stored_keys_values(cache, layer, row_blocks, k, v, length):
    """What the cache holds for one row before this step's promotion: the BF16 rows, with every
    page that was full before the step replaced by its dequantized values."""
    kk, vv = k.to(torch.bfloat16).float().clone(), v.to(torch.bfloat16).float().clone()
    full_pages = (length - 1) // PAGE if cache.preset != "bf16" else 0
    for p in range(full_pages):
        for h in range(cache.kv_heads):
            pk, pv = fp4kv.dequantize_page(cache.page(layer, int(row_blocks[p]), h), cache.preset, cache.head_dim)
            kk[p * PAGE:(p + 1) * PAGE, h] = pk.cuda()
            vv[p * PAGE:(p + 1) * PAGE, h] = pv.cuda()
    return kk, vv


@pytest.mark.parametrize("preset", ["bf16", "fp8", "nvfp4-vanilla", "mxfp4-vanilla"])
def test_decode_matches_sdpa_over_the_stored_values(preset):
    torch.manual_seed(0)
    cache = make_cache(preset)
    q_heads, d = 8, cache.head_dim
    wrapper = fp4kv.DecodeWrapper(q_heads).plan(cache)
    lengths = [1, 129, 300]  # one token, a page + 1, several pages and a partial one
    tables = block_tables(len(lengths), cache.max_pages)
    ks = [torch.randn(n, cache.kv_heads, d, device="cuda") for n in lengths]
    vs = [torch.randn(n, cache.kv_heads, d, device="cuda") for n in lengths]
    for layer in range(cache.layers):
        for r, n in enumerate(lengths):
            if n > 1:
                cache.prefill(layer, ks[r][:n - 1], vs[r][:n - 1], tables[r], 0)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    cache.begin_step(tables, seq_lens)
    q = torch.randn(len(lengths), q_heads, d, device="cuda").to(torch.bfloat16)
    for layer in range(cache.layers):
        cache.append(layer, torch.stack([k[-1] for k in ks]), torch.stack([v[-1] for v in vs]))
        out, lse = wrapper.run(q, cache, layer, return_lse=True)
        for r, n in enumerate(lengths):
            kk, vv = stored_keys_values(cache, layer, tables[r].cpu(), ks[r], vs[r], n)
            want = reference(q[r], kk, vv, n)
            torch.testing.assert_close(out[r].float(), want, atol=ATOL, rtol=0, msg=f"{preset} row {r} layer {layer}")
            want_lse = torch.logsumexp(_head_logits(q[r], kk, n) / math.sqrt(d), dim=-1)
            torch.testing.assert_close(lse[r], want_lse, atol=ATOL, rtol=0)
    cache.end_step()
    assert cache.errors() == (0, 0)


@pytest.mark.parametrize("preset", ["bf16", "fp8", "nvfp4-vanilla", "mxfp4-vanilla"])
def test_prefill_attention_matches_sdpa_over_the_stored_prefix(preset):
    """A chunk of 70 tokens after a cached prefix of 300 (two full pages, quantized, and a
    partial one in BF16): each chunk token against SDPA over the stored prefix and the chunk's
    BF16 keys up to itself."""
    torch.manual_seed(1)
    cache = make_cache(preset, layers=1)
    q_heads, d, start, T = 8, cache.head_dim, 300, 70
    table = block_tables(1, cache.max_pages)[0]
    k = torch.randn(start + T, cache.kv_heads, d, device="cuda")
    v = torch.randn(start + T, cache.kv_heads, d, device="cuda")
    cache.prefill(0, k[:start], v[:start], table, 0)
    q = torch.randn(T, q_heads, d, device="cuda").to(torch.bfloat16)
    kc, vc = k[start:].to(torch.bfloat16), v[start:].to(torch.bfloat16)
    out, lse = cache.prefill_attention(0, q, kc, vc, table, start)
    kk, vv = stored_keys_values(cache, 0, table.cpu(), k[:start + 1], v[:start + 1], start + 1)
    keys, values = torch.cat([kk[:start], kc.float()]), torch.cat([vv[:start], vc.float()])
    for t in range(T):
        want = reference(q[t], keys, values, start + t + 1)
        torch.testing.assert_close(out[t].float(), want, atol=ATOL, rtol=0, msg=f"{preset} token {t}")
        want_lse = torch.logsumexp(_head_logits(q[t], keys, start + t + 1) / math.sqrt(d), dim=-1)
        torch.testing.assert_close(lse[t], want_lse, atol=ATOL, rtol=0)
    assert cache.errors() == (0, 0)


def _head_logits(q, k, n):
    """q.k per query head over the row's n keys: [q_heads][n]."""
    group = q.shape[0] // k.shape[1]
    kk = k[:n].float().repeat_interleave(group, dim=1)  # [n][q_heads][d]
    return torch.einsum("hd,nhd->hn", q.float(), kk)


def test_cuda_graph_replays_the_eager_step():
    torch.manual_seed(1)
    q_heads, d, n = 8, 128, 200
    results = []
    for capture in (False, True):
        cache = make_cache("nvfp4")
        wrapper = fp4kv.DecodeWrapper(q_heads).plan(cache)
        tables = block_tables(1, cache.max_pages)
        gen = torch.Generator(device="cuda").manual_seed(5)
        k = torch.randn(n, cache.kv_heads, d, device="cuda", generator=gen)
        v = torch.randn(n, cache.kv_heads, d, device="cuda", generator=gen)
        for layer in range(cache.layers):
            cache.prefill(layer, k, v, tables[0], 0)
        seq_lens = torch.tensor([n + 1], dtype=torch.int32, device="cuda")
        k_new = torch.randn(1, cache.kv_heads, d, device="cuda", generator=gen)
        v_new = torch.randn(1, cache.kv_heads, d, device="cuda", generator=gen)
        q = torch.randn(1, q_heads, d, device="cuda", generator=gen).to(torch.bfloat16)
        out = torch.empty_like(q)

        def step():
            cache.begin_step(tables, seq_lens)
            for layer in range(cache.layers):
                cache.append(layer, k_new, v_new)
                wrapper.run(q, cache, layer, out=out)
            cache.end_step()

        if capture:
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            graph.replay()
        else:
            step()
        torch.cuda.synchronize()
        results.append(out.clone())
    torch.testing.assert_close(results[0], results[1], atol=0, rtol=0)


def test_torch_compile_has_no_graph_break():
    torch.manual_seed(2)
    cache = make_cache("nvfp4", layers=1)
    wrapper = fp4kv.DecodeWrapper(8).plan(cache)
    tables = block_tables(2, cache.max_pages)
    seq_lens = torch.tensor([3, 40], dtype=torch.int32, device="cuda")
    for r, n in enumerate([2, 39]):
        cache.prefill(0, torch.randn(n, 2, 128, device="cuda"), torch.randn(n, 2, 128, device="cuda"), tables[r], 0)
    k_new, v_new = torch.randn(2, 2, 128, device="cuda"), torch.randn(2, 2, 128, device="cuda")
    q = torch.randn(2, 8, 128, device="cuda").to(torch.bfloat16)

    def layer_step(q, k, v):
        cache.append(0, k, v)
        return wrapper.run(q, cache, 0) * 2

    cache.begin_step(tables, seq_lens)
    eager = layer_step(q, k_new, v_new)
    compiled = torch.compile(layer_step, fullgraph=True)  # fullgraph: a graph break raises
    again = compiled(q, k_new, v_new)  # the same token appended again: the same output
    torch.testing.assert_close(again, eager, atol=0, rtol=0)


def test_page_codecs():
    torch.manual_seed(3)
    k, v = torch.randn(PAGE, 64), torch.randn(PAGE, 64)
    for preset, tolerance in (("bf16", 2 ** -8), ("fp8", 2 ** -3), ("nvfp4-vanilla", 0.5), ("mxfp4-vanilla", 0.5)):
        page = fp4kv.quantize_page(k, v, preset)
        assert page.dtype == torch.uint8 and page.numel() == fp4kv.page_bytes(preset, 64)
        dk, dv = fp4kv.dequantize_page(page, preset, 64)
        # Relative to the block's largest value: the FP4 grid's widest step (4 -> 6) is a third of
        # the largest code, FP8's 2^-3, BF16's half ulp 2^-9 (bounded here by 2^-8).
        assert (dk - k).abs().max() <= tolerance * k.abs().max(), preset
        assert (dv - v).abs().max() <= tolerance * v.abs().max(), preset
        if preset == "bf16":  # BF16 values are their own page
            assert torch.equal(fp4kv.quantize_page(dk, dv, preset), page)


def test_errors_are_python_exceptions_with_the_message():
    with pytest.raises(RuntimeError, match="unknown preset"):
        fp4kv.KVCache(1, 2, 128, 4, "nvfp5")
    with pytest.raises(RuntimeError, match="head_dim"):
        fp4kv.KVCache(1, 2, 96, 4, "nvfp4")
    cache = make_cache("nvfp4", layers=1)
    tables = block_tables(1, cache.max_pages)
    with pytest.raises(RuntimeError, match="max_pages"):
        cache.begin_step(tables[:, :2].contiguous(), torch.tensor([1], dtype=torch.int32, device="cuda"))
    cache.begin_step(tables, torch.tensor([1], dtype=torch.int32, device="cuda"))
    with pytest.raises(RuntimeError, match="rows"):
        cache.append(0, torch.randn(2, 2, 128, device="cuda"), torch.randn(2, 2, 128, device="cuda"))
    wrapper = fp4kv.DecodeWrapper(8)
    with pytest.raises(RuntimeError, match="plan"):
        wrapper.run(torch.zeros(1, 8, 128, device="cuda", dtype=torch.bfloat16), cache, 0)
    wrapper.plan(cache)
    with pytest.raises(RuntimeError, match="q must be"):
        wrapper.run(torch.zeros(1, 4, 128, device="cuda", dtype=torch.bfloat16), cache, 0)
    cache.close()
    with pytest.raises(RuntimeError, match="no cache"):
        wrapper.run(torch.zeros(1, 8, 128, device="cuda", dtype=torch.bfloat16), cache, 0)
