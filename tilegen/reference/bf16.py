"""Bit-exact numpy reference of KleidiAI's bf16 matmul kernels (docs/layouts.md#arith-bf16):
``kai_matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla`` (BFMMLA) and
``kai_matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa`` (BFMOPA) compute the same bits.

Per output, with the K padding of the packed buffers included::

    acc = bias[j]
    for each k-pair (2p, 2p+1):
        t   = RTO32(P(a[2p]*b[2p]) + P(a[2p+1]*b[2p+1]))   # products, then their sum, rounded
        acc = RTO32(acc + t)
    acc = max(acc, clamp_min);  acc = min(acc, clamp_max)

RTO32 rounds to f32 by round-to-odd: truncate toward zero, and if the value was inexact set the
lowest significand bit; a result of magnitude >= 2**128 is infinite (softfloat's
round_to_odd_inf, which qemu uses).  P is RTO32 of one product: a product of two bf16 values is
an exact f32 unless it leaves the normal range, so P changes it only on overflow (infinite) or
underflow (flushed to zero).  This is the FPCR.EBF = 0 behaviour of BFDOT/BFMMLA/BFMOPA (the Arm
ARM's BFDotAdd: BFMul products, two FPAdd_BF16), which also flushes subnormal inputs and
results to zero (modelled here; the golden vectors contain none of these cases, where P is the
exact product).

The 1xN BFDOT kernel (``..._bf16p1x4_bf16p12x4b_1x36_neon_dot``) sums in another order and is
not covered by this model; :func:`matmul_bf16_f64` gives the float64 result of the same bf16
inputs to check such kernels within a tolerance.
"""
from __future__ import annotations

import numpy as np

from ..layout.bf16 import bf16_to_f32

__all__ = ["rto32_add", "matmul_bf16", "matmul_bf16_f64"]

_F32_MIN_NORMAL = 2.0 ** -126


def _ftz(v: np.ndarray) -> np.ndarray:
    """Subnormal f32 values (as float64) -> signed zero."""
    return np.where(np.abs(v) < _F32_MIN_NORMAL, np.copysign(0.0, v), v)


def rto32_add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """round_to_odd_f32(x + y) as float64, for float64 x, y (each exact); subnormal results
    flush to signed zero, magnitudes >= 2**128 are infinite, infinite or NaN operands give
    x + y.  The sum is made exact with TwoSum (s + e == x + y)."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    with np.errstate(invalid="ignore"):
        out = _rto32_add_finite(x, y)
        special = ~(np.isfinite(x) & np.isfinite(y))
        s = x + y
        out = np.where(special, s, out)
        return np.where(~special & (np.abs(s) >= 2.0 ** 128), np.copysign(np.inf, s), out)


def _rto32_add_finite(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    s = x + y
    bb = s - x
    e = (x - (s - bb)) + (y - bb)
    with np.errstate(over="ignore"):
        r = s.astype(np.float32)
    # r = s truncated toward zero
    over = np.abs(r.astype(np.float64)) > np.abs(s)
    r = np.where(over, np.nextafter(r, np.float32(0)), r)
    r64 = r.astype(np.float64)
    on_f32 = r64 == s
    # s on an f32 value, the exact sum slightly nearer to zero: truncation is one step lower
    below = on_f32 & (e != 0) & (np.sign(e) != np.sign(s))
    r = np.where(below, np.nextafter(r, np.float32(0)), r)
    inexact = ~on_f32 | (e != 0)
    bits = r.view(np.uint32) | inexact.astype(np.uint32)
    return _ftz(bits.view(np.float32).astype(np.float64))


def _inputs(lhs_packed, rhs_packed, m, n, k, lhs_layout, rhs_layout):
    if lhs_layout.kr != rhs_layout.kr:
        raise ValueError(f"LHS kr={lhs_layout.kr} and RHS kr={rhs_layout.kr} differ")
    a = bf16_to_f32(lhs_layout.unpack(lhs_packed, m, k)).astype(np.float64)     # (m, kp)
    bv, bias = rhs_layout.unpack(rhs_packed, n, k)
    b = bf16_to_f32(bv).astype(np.float64)                                       # (n, kp)
    return _ftz(a), _ftz(b), bias


def matmul_bf16(lhs_packed, rhs_packed, m: int, n: int, k: int, lhs_layout, rhs_layout,
                clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of the BFMMLA / BFMOPA kernels from their packed buffers
    (``lhs_layout``/``rhs_layout``: :mod:`tilegen.layout.bf16` objects with equal kr)."""
    a, b, bias = _inputs(lhs_packed, rhs_packed, m, n, k, lhs_layout, rhs_layout)
    acc = _ftz(np.broadcast_to(bias.astype(np.float64), (m, n)))
    zero = np.zeros((m, n))
    for p in range(a.shape[1] // 2):
        p0 = rto32_add(a[:, 2 * p, None] * b[None, :, 2 * p], zero)
        p1 = rto32_add(a[:, 2 * p + 1, None] * b[None, :, 2 * p + 1], zero)
        acc = rto32_add(acc, rto32_add(p0, p1))
    d = acc.astype(np.float32)
    d = np.maximum(d, np.float32(clamp_min))
    return np.minimum(d, np.float32(clamp_max))


def matmul_bf16_f64(lhs_packed, rhs_packed, m: int, n: int, k: int, lhs_layout, rhs_layout
                    ) -> np.ndarray:
    """float64 (m, n): bias + the exact-as-float64 dot products of the packed bf16 values."""
    a, b, bias = _inputs(lhs_packed, rhs_packed, m, n, k, lhs_layout, rhs_layout)
    return a @ b.T + bias.astype(np.float64)[None, :]
