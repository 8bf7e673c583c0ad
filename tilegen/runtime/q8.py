"""Runtime pieces of the q8_0 family (qai8dxp x qsi8cxp kernels): weight packing and calls.

Weights arrive as float (n, k) -- quantised here per output channel, symmetric:
``scale = max|w| / 127``, ``q = clamp(roundf(w * (1/scale)), -127, 127)`` (f32 arithmetic; an
all-zero row gets scale 0 and q 0), the arithmetic llama.cpp applies to Q8_0 rows -- or as ggml
Q8_0 bytes, requantised per channel by :func:`tilegen.layout.q8.requantize_q8_0`.
"""
from __future__ import annotations

import numpy as np

from ..layout import LayoutError
from ..layout.q4 import _round_half_away

__all__ = ["quantize_per_channel", "pack_q8_0", "call_q8"]


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
    with np.errstate(divide="ignore"):
        inv = np.where(scale > 0, f(1) / scale, f(0)).astype(f)
    q = _round_half_away((w * inv[:, None]).astype(f))
    return np.clip(q, -127, 127).astype(np.int8), scale


def pack_q8_0(kern, w=None, bias=None, from_ggml=None, n=None, k=None):
    """PackedWeights for kernel ``kern`` (its qsi8cxp layout) from float or Q8_0 weights."""
    from .library import ArgumentError, PackedWeights
    lay = kern.rhs_layout()
    if bias is not None:
        bias = np.asarray(bias)
    if from_ggml is not None:
        if n is None or k is None:
            raise ArgumentError("from_ggml= needs n and k")
        data = lay.pack_from_ggml(from_ggml, int(n), int(k), bias)
    else:
        q, scale = quantize_per_channel(w)
        n, k = q.shape
        data = lay.pack(q, scale, bias)
    return PackedWeights(lay.format, int(n), int(k), kern.nr, kern.kr, kern.sr, data,
                         bias is not None, None, "q8_0")


def call_q8(kern, lhs_packed, rhs_packed, dst, clamp_min, clamp_max, k=None):
    """Check the arguments of a q8_0 kernel call and run it (dst (m, n) float32 view)."""
    from .library import (ArgumentError, PackedWeights, _check_bytes, _check_matrix, _clamps,
                          _row_stride)
    dst = _check_matrix("dst", dst, writeable=True)
    m, n = dst.shape
    if isinstance(rhs_packed, PackedWeights):
        if not kern.rhs_matches(rhs_packed):
            raise ArgumentError(
                f"packed weights are {rhs_packed.format} nr={rhs_packed.nr} kr={rhs_packed.kr} "
                f"sr={rhs_packed.sr}; kernel {kern.name} reads {kern.rhs_layout().format} "
                f"nr={kern.nr} kr={kern.kr} sr={kern.sr}")
        if rhs_packed.n != n:
            raise ArgumentError(f"packed weights have n={rhs_packed.n}, dst has {n} columns")
        if k is not None and k != rhs_packed.k:
            raise ArgumentError(f"k={k} but the packed weights have k={rhs_packed.k}")
        k = rhs_packed.k
        rhs_packed = rhs_packed.data
    if k is None:
        raise ArgumentError("k is needed when rhs_packed is raw bytes")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ArgumentError(f"k must be a positive int, got {k!r}")
    k = int(k)
    rbuf = _check_bytes("rhs_packed", rhs_packed, kern.rhs_packed_size(n, k))
    lbuf = _check_bytes("lhs_packed", lhs_packed, kern.lhs_packed_size(m, k))
    cmin, cmax = _clamps(clamp_min, clamp_max)
    kern._invoke(m, n, k, lbuf.ctypes.data, rbuf.ctypes.data, dst.ctypes.data,
                 _row_stride(dst), 4, cmin, cmax)
    return dst
