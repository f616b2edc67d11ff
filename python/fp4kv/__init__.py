"""fp4kv for PyTorch: an FP4 (NVFP4, MXFP4), FP8 or BF16 paged KV cache and decode attention
straight from it, on Hopper GPUs.

The C++ operators live in ``torch.ops.fp4kv`` (``python/csrc/fp4kv_torch.cpp``); this package
loads them, registers their fake kernels for ``torch.compile`` and wraps them:

* :class:`KVCache`: the paged cache of a model's layers (memory from PyTorch's allocator);
* :class:`DecodeWrapper`: decode attention over it, planned once, run per layer and step;
* :func:`quantize_page`, :func:`dequantize_page`, :func:`page_bytes`: one page of one KV head
  in the cache's byte layout, for inspection.
"""
import glob
import os

import torch

_here = os.path.dirname(os.path.abspath(__file__))
_libs = glob.glob(os.path.join(_here, "_C*.so"))
if not _libs:
    raise ImportError(f"fp4kv: the compiled extension _C*.so is not in {_here}; build it with "
                      "`pip install --no-build-isolation ./python`")
torch.ops.load_library(_libs[0])

from . import _fake  # noqa: E402,F401  (fake kernels: shapes for torch.compile)
from .cache import DecodeWrapper, KVCache, dequantize_page, page_bytes, quantize_page  # noqa: E402

__all__ = ["KVCache", "DecodeWrapper", "quantize_page", "dequantize_page", "page_bytes"]
