"""Hugging Face transformers integration: :class:`FP4Cache`, a transformers ``Cache`` whose layers
keep the model's keys and values in an fp4kv :class:`~fp4kv.KVCache`, and the attention function
``"fp4kv"`` that decodes from it with fp4kv's kernels::

    import fp4kv.hf
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, attn_implementation="fp4kv").cuda()
    out = model.generate(ids, past_key_values=fp4kv.hf.FP4Cache(model.config, preset="nvfp4"), max_new_tokens=64)

How a generate call runs through it: the prompt (the first forward) is written into the cache
layer by layer and attends to itself with PyTorch SDPA on the BF16 keys and values (so the
bf16 preset gives transformers' own numbers); a later forward of several tokens per row (a
continuation: the next turn of a chat on the same cache) runs fp4kv's chunked-prefill
attention, which reads the cached prefix in the cache's format and the chunk's own tokens
in BF16, then writes the chunk; a forward of one token per row is a decode step: layer 0
opens a cache step, each layer appends its token and runs fp4kv's decode attention over the
whole cache, the last layer closes the step. The attention function knows the cache's calls
by the key tensor the cache returned (tagged with the cache), and falls back to SDPA
otherwise, so a model loaded with ``attn_implementation="fp4kv"`` also runs with
transformers' own caches.

Limits: rows of a batch must have the same length (no padding: the cache has no mask), no
beam search (no reordering).
"""
import math
from typing import Optional

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .cache import DecodeWrapper, KVCache

PAGE = 128
_TAG = "_fp4kv_cache"  # attribute on a decode step's key tensor: the FP4Cache it came from


class _FP4Layer(CacheLayerMixin):
    """One layer's view of the FP4Cache (transformers' per-layer cache protocol)."""

    is_compileable = False
    is_sliding = False

    def __init__(self, owner: "FP4Cache", layer_idx: int):
        super().__init__()
        self.owner, self.layer_idx = owner, layer_idx
        self.max_batch_size = owner.block_tables.shape[0]  # what Cache.max_batch_size / max_cache_len read
        self.max_cache_len = owner.max_length

    def lazy_initialization(self, key_states: torch.Tensor):
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        if not self.is_initialized:
            self.lazy_initialization(key_states)
        return self.owner._update(self.layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length) -> tuple:
        # transformers 5 passes the query length; 4.x passed the query's cache positions
        n = query_length if isinstance(query_length, int) else query_length.shape[0]
        return self.owner.length + n, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_cache_shape(self) -> int:
        return self.owner.max_length

    def get_max_length(self) -> int:
        return self.owner.max_length

    def reset(self) -> None:
        raise NotImplementedError("fp4kv.hf.FP4Cache: make a new cache instead of resetting one")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("fp4kv.hf.FP4Cache does not support beam search")


class FP4Cache(Cache):
    """A transformers cache in fp4kv's paged format for a decoder config (Qwen3 and other
    full-attention GQA models). ``preset``: an fp4kv recipe preset; ``max_length``: tokens per
    row (default the config's max_position_embeddings); ``max_batch``: rows; ``mu_k``: the
    calibrated mean keys ``[layers][kv_heads][head_dim]`` (``fp4kv calibrate``), or None."""

    def __init__(self, config, preset: str = "nvfp4", max_length: Optional[int] = None, max_batch: int = 1,
                 device="cuda", mu_k: Optional[torch.Tensor] = None):
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        self.num_layers = text.num_hidden_layers
        q_heads, kv_heads = text.num_attention_heads, text.num_key_value_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // q_heads
        self.max_length = max_length or text.max_position_embeddings
        pages = math.ceil(self.max_length / PAGE)
        self.kv = KVCache(self.num_layers, kv_heads, head_dim, max_batch * pages, preset, device, max_batch=max_batch,
                          max_pages=pages, mu_k=mu_k)
        self.wrapper = DecodeWrapper(q_heads).plan(self.kv)
        self.block_tables = torch.arange(max_batch * pages, dtype=torch.int32, device=self.kv.pool.device).view(
            max_batch, pages)
        self.length = 0  # tokens every row holds
        self._seq_lens = None
        super().__init__(layers=[_FP4Layer(self, layer) for layer in range(self.num_layers)])

    def _update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """k, v: [batch][kv_heads][tokens][head_dim], post-RoPE."""
        batch, _, tokens, _ = k.shape
        if batch > self.block_tables.shape[0]:
            raise ValueError(f"fp4kv.hf.FP4Cache: batch {batch} exceeds max_batch {self.block_tables.shape[0]}")
        if self.length == 0:  # the prompt
            for row in range(batch):
                self.kv.prefill(layer, k[row].transpose(0, 1), v[row].transpose(0, 1), self.block_tables[row], 0)
            if layer == self.num_layers - 1:
                self.length = tokens
            return k, v
        if self.length + tokens > self.max_length:
            raise ValueError(f"fp4kv.hf.FP4Cache: the cache holds at most {self.max_length} tokens per row")
        if tokens > 1:  # a continuation chunk: written by _attend_chunk after its attention
            setattr(k, _TAG, self)
            return k, v
        if layer == 0:
            self._seq_lens = torch.full((batch,), self.length + 1, dtype=torch.int32, device=k.device)
            self.kv.begin_step(self.block_tables[:batch], self._seq_lens)
        self.kv.append(layer, k[:, :, 0, :], v[:, :, 0, :])
        setattr(k, _TAG, self)
        return k, v

    def _attend_chunk(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        """query [batch][q_heads][T][head_dim], key/value [batch][kv_heads][T][head_dim] of a
        continuation chunk -> the attention output [batch][T][q_heads][head_dim]; then writes
        the chunk into the cache."""
        layer, tokens = module.layer_idx, key.shape[2]
        outs = []
        for row in range(key.shape[0]):
            q = query[row].transpose(0, 1).to(torch.bfloat16).contiguous()
            k = key[row].transpose(0, 1).to(torch.bfloat16).contiguous()
            v = value[row].transpose(0, 1).to(torch.bfloat16).contiguous()
            out, _ = self.kv.prefill_attention(layer, q, k, v, self.block_tables[row], self.length)
            self.kv.prefill(layer, k, v, self.block_tables[row], self.length)
            outs.append(out)
        if layer == self.num_layers - 1:
            self.length += tokens
        return torch.stack(outs).to(query.dtype)

    def _decode(self, module, query: torch.Tensor) -> torch.Tensor:
        """query [batch][q_heads][1][head_dim] -> the attention output [batch][1][q_heads][head_dim]."""
        q = query[:, :, 0, :].to(torch.bfloat16).contiguous()
        out = self.wrapper.run(q, self.kv, module.layer_idx)
        if module.layer_idx == self.num_layers - 1:
            self.kv.end_step()
            self.length += 1
        return out[:, None, :, :].to(query.dtype)


def fp4kv_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers attention function: fp4kv's kernels for a decode step or a continuation
    chunk over an FP4Cache, PyTorch SDPA for everything else (the prompt, other caches)."""
    cache = getattr(key, _TAG, None)
    if cache is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    head_dim = query.shape[-1]
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        raise NotImplementedError(f"fp4kv: attention scaling {scaling} (fp4kv attends with 1/sqrt(head_dim))")
    if key.shape[2] > 1:
        return cache._attend_chunk(module, query, key, value), None
    return cache._decode(module, query), None


AttentionInterface.register("fp4kv", fp4kv_attention)
# The masks of SDPA's format. transformers builds no mask at all for an attention function
# without a registered mask function, and SDPA's own causal flag aligns the mask to the top
# left: a multi-token forward after a prefix through the SDPA fallback (transformers' own
# caches) would attend only to the first keys. fp4kv's kernels ignore the mask (causal by
# construction, rows without padding).
AttentionMaskInterface.register("fp4kv", sdpa_mask)
