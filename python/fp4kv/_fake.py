"""Fake (meta) kernels of the fp4kv ops: what torch.compile and the functionalization pass need
to trace a function that calls them without running them. The cache ops return nothing and
declare their write through the mutated ``pool`` argument; decode returns the output
[batch][q_heads][head_dim] in q's dtype and the LSE [batch][q_heads] in float32, and
prefill_attention the same for the chunk's [T][q_heads][head_dim]."""
import torch


@torch.library.register_fake("fp4kv::decode")
def _decode_fake(q, pool, plan, layer):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.register_fake("fp4kv::prefill_attention")
def _prefill_attention_fake(pool, cache, layer, q, k, v, block_row, start):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


def _nothing(*args):
    return None


for _name in ("prefill", "begin_step", "append", "end_step", "release"):
    torch.library.register_fake(f"fp4kv::{_name}")(_nothing)
