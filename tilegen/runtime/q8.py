"""Runtime pieces of the q8_0 family (qai8dxp x qsi8cxp kernels): weight packing.

Weights arrive as float (n, k) -- quantised here per output channel, symmetric:
``scale = max|w| / 127``, ``q = clamp(roundf(w * (1/scale)), -127, 127)`` (f32 arithmetic; an
all-zero row gets scale 0 and q 0), the arithmetic llama.cpp applies to Q8_0 rows -- or as ggml
Q8_0 bytes, requantised per channel by :func:`tilegen.layout.q8.requantize_q8_0`.
"""
from __future__ import annotations

import numpy as np

from ..layout import LayoutError
from ..layout.q4 import _round_half_away

__all__ = ["quantize_per_channel", "pack_q8_0"]


def quantize_per_channel(w) -> tuple[np.ndarray, np.ndarray]:
    """float32 (n, k) -> (q int8 (n, k), scale f32 (n,)), symmetric per row."""
    w = np.asarray(w)
    if w.dtype != np.float32 or w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise LayoutError(f"q8_0 weights must be non-empty 2-D float32 (n, k), got {w.dtype} "
                          f"{w.shape}")
    if not np.isfinite(w).all():
        raise LayoutError("q8_0 weights must be finite")
    f = np.float32
    amax = np.abs(w).max(axis=1).astype(f)
    scale = np.where(amax > 0, amax / f(127), f(0)).astype(f)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(scale > 0, f(1) / scale, f(0)).astype(f)
    tiny = np.isinf(inv)        # 1/scale overflows f32 (max|w| < 2**-121): divide those rows
    q = _round_half_away((w * np.where(tiny, f(0), inv)[:, None]).astype(f))
    if tiny.any():
        q[tiny] = _round_half_away((w[tiny] / scale[tiny, None]).astype(f))
    return np.clip(q, -127, 127).astype(np.int8), scale


def pack_q8_0(kern, w=None, bias=None, from_ggml=None, n=None, k=None):
    """PackedWeights for kernel ``kern`` (its qsi8cxp layout) from float or Q8_0 weights."""
    from .errors import ArgumentError
    from .packed import PackedWeights
    lay = kern.rhs_layout()
    if bias is not None:
        bias = np.asarray(bias)
    if from_ggml is not None:
        if n is None or k is None:
            raise ArgumentError("from_ggml= needs n and k")
        data = lay.pack_from_ggml(np.frombuffer(from_ggml, np.uint8) if isinstance(
            from_ggml, (bytes, bytearray, memoryview)) else from_ggml, int(n), int(k), bias)
    else:
        q, scale = quantize_per_channel(w)
        n, k = q.shape
        data = lay.pack(q, scale, bias)
    return PackedWeights(lay, int(n), int(k), data, bias is not None, "q8_0")
