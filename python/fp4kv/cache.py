"""The paged cache and the decode wrapper over the fp4kv torch ops.

A cache holds ``num_blocks`` blocks per layer; a block is one 128-token page of every KV head.
A request owns a row of block ids (its block table, ``max_pages`` entries, unused ones any
valid id) and is known to the cache by its first block. Driving it, per request and step,
as an engine's attention backend would:

* prompt: ``cache.prefill(layer, k, v, block_row, start)`` for every layer (k, v: the chunk's
  post-RoPE keys and values ``[tokens][kv_heads][head_dim]``; chunks may start mid-page);
* decode step: ``cache.begin_step(block_tables, seq_lens)`` once (int32 ``[batch][max_pages]``
  and ``[batch]``, the new token counted), then per layer ``cache.append(layer, k, v)`` (the
  step's rows) and ``wrapper.run(q, cache, layer)``, then ``cache.end_step()``;
* a finished request: ``cache.release(first_block)`` frees its BF16 slot.

Every call is asynchronous on PyTorch's current stream and capturable in a CUDA graph;
``plan`` and the constructors allocate, so they run before capture. The tensors given to
``begin_step`` are read by the step's later ops: keep them alive (a captured graph does).
"""
from typing import Optional, Tuple, Union

import torch

_MAX_SLOTS = 2048  # the cache's slot-table capacity (cache/kernels.h)


class KVCache:
    """fp4kv's paged KV cache of ``layers`` layers on one CUDA device.

    ``preset`` is a recipe preset (``nvfp4``, ``nvfp4-native``, ``mxfp4``, ``fp8``, ``bf16``, ...,
    optionally with switches: ``nvfp4:no-rotate``). ``mu_k``: the calibrated mean keys
    ``[layers][kv_heads][head_dim]`` the recipe smooths keys with (``fp4kv calibrate`` writes
    them), or None. ``max_batch`` rows per decode step, ``max_pages`` pages per request
    (default ``num_blocks``), ``max_slots`` requests holding BF16 sink/recent rows at once.
    The memory (``pool``, the block pools ``[layers][num_blocks][block_bytes]`` uint8, and the
    slot buffer and step plan) comes from PyTorch's caching allocator.
    """

    def __init__(self, layers: int, kv_heads: int, head_dim: int, num_blocks: int, preset: str = "nvfp4",
                 device: Union[str, torch.device] = "cuda", *, max_batch: int = 256, max_pages: Optional[int] = None,
                 max_slots: Optional[int] = None, mu_k: Optional[torch.Tensor] = None):
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.layers, self.kv_heads, self.head_dim, self.num_blocks = layers, kv_heads, head_dim, num_blocks
        self.preset = preset
        self.max_batch = max_batch
        self.max_pages = max_pages if max_pages is not None else num_blocks
        self.max_slots = max_slots if max_slots is not None else min(max_batch, _MAX_SLOTS)
        self.id = None
        self.id, self.pool = torch.ops.fp4kv.create_cache(layers, kv_heads, head_dim, num_blocks, preset,
                                                          self.max_slots, max_batch, self.max_pages, mu_k, device)
        self.page_bytes = page_bytes(preset, head_dim)

    def prefill(self, layer: int, k: torch.Tensor, v: torch.Tensor, block_row: torch.Tensor, start: int = 0) -> None:
        """Writes tokens ``start .. start + len(k)`` of the request whose block table is ``block_row``."""
        torch.ops.fp4kv.prefill(self.pool, self.id, layer, k, v, block_row, start)

    def prefill_attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          block_row: torch.Tensor, start: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """A prompt chunk's attention on tensor cores: ``q`` [T][q_heads][head_dim], ``k``, ``v``
        [T][kv_heads][head_dim] (BF16, post-RoPE) attend to the request's cached prefix
        ``[0, start)`` (read in the cache's format) and causally to themselves. Returns the
        output [T][q_heads][head_dim] (BF16) and the LSE [T][q_heads]. The chunk is not written:
        call :meth:`prefill` with the same k, v afterwards. The first call for a larger chunk
        allocates a workspace (make one before capturing a CUDA graph)."""
        return torch.ops.fp4kv.prefill_attention(self.pool, self.id, layer, q, k, v, block_row, start)

    def begin_step(self, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> None:
        torch.ops.fp4kv.begin_step(self.pool, self.id, block_tables, seq_lens)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        torch.ops.fp4kv.append(self.pool, self.id, layer, k, v)

    def end_step(self) -> None:
        torch.ops.fp4kv.end_step(self.pool, self.id)

    def release(self, first_block: int) -> None:
        torch.ops.fp4kv.release(self.pool, self.id, first_block)

    def errors(self) -> Tuple[int, int]:
        """(sticky device error bits, non-finite K/V elements stored as 0); synchronizes."""
        return torch.ops.fp4kv.cache_errors(self.id)

    def page(self, layer: int, block: int, head: int) -> torch.Tensor:
        """One KV head's page of a block as uint8 bytes (a view of the pool); decode it with
        :func:`dequantize_page`. Keys are stored as the recipe transforms them."""
        first = head * self.page_bytes
        return self.pool[layer, block, first:first + self.page_bytes]

    def close(self) -> None:
        """Frees the cache now (else when the object is collected)."""
        if self.id is not None:
            torch.ops.fp4kv.destroy(self.id)
            self.id = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the ops may be gone already
            pass


class DecodeWrapper:
    """Decode attention over a :class:`KVCache` for ``q_heads`` query heads (a multiple of the
    cache's KV heads): ``plan(cache)`` once (allocates; outside CUDA-graph capture), then
    ``run(q, cache, layer)`` for every layer of every step."""

    def __init__(self, q_heads: int):
        self.q_heads = q_heads
        self._plan = None
        self._cache = None

    def plan(self, cache: KVCache) -> "DecodeWrapper":
        self.close()
        self._plan = torch.ops.fp4kv.plan_decode(cache.id, self.q_heads)
        self._cache = cache
        return self

    def run(self, q: torch.Tensor, cache: KVCache, layer: int, out: Optional[torch.Tensor] = None,
            return_lse: bool = False):
        """q: BF16 ``[batch][q_heads][head_dim]`` post-RoPE queries of the step's rows. Returns the
        BF16 output of the same shape (written into ``out`` when given) and, with ``return_lse``,
        the float32 log-sum-exp ``[batch][q_heads]`` of the logits q.k / sqrt(head_dim)."""
        if self._plan is None or cache is not self._cache:
            raise RuntimeError("fp4kv.DecodeWrapper.run: call plan(cache) with this cache first")
        o, lse = torch.ops.fp4kv.decode(q, cache.pool, self._plan, layer)
        if out is not None:
            out.copy_(o)
            o = out
        return (o, lse) if return_lse else o

    def close(self) -> None:
        if self._plan is not None:
            torch.ops.fp4kv.destroy(self._plan)
            self._plan = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def page_bytes(preset: str, head_dim: int) -> int:
    """Bytes of one KV head's 128-token page (K and V) in the preset's format."""
    return torch.ops.fp4kv.page_bytes(preset, head_dim)


def quantize_page(k: torch.Tensor, v: torch.Tensor, preset: str) -> torch.Tensor:
    """One KV head's page from k, v ``[n <= 128][head_dim]`` (k as the cache stores keys: the
    recipe's smoothing and rotation already applied), by the CPU quantizer the GPU cache is
    byte-identical to."""
    return torch.ops.fp4kv.quantize_page(k, v, preset)


def dequantize_page(page: torch.Tensor, preset: str, head_dim: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The page's keys and values ``[128][head_dim]`` float32, as the decode kernels read them."""
    return torch.ops.fp4kv.dequantize_page(page, preset, head_dim)
