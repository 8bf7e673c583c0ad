"""numpy reference arithmetic for the kernels (bit-exact where the spec defines the bits).

``fma_f32`` is an exact binary32 fused multiply-add for finite inputs (docs/layouts.md#fma-f32);
``matmul_f32`` reproduces the f32 kernel's sequential FMA chain bit for bit (docs/layouts.md#arith-f32).
"""
from __future__ import annotations

import numpy as np

__all__ = ["fma_f32", "matmul_f32", "matmul_f64"]


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """round_f32(a*b + c) with a single rounding, elementwise, for finite float32 inputs."""
    a64 = np.asarray(a, dtype=np.float32).astype(np.float64)
    b64 = np.asarray(b, dtype=np.float32).astype(np.float64)
    c64 = np.asarray(c, dtype=np.float32).astype(np.float64)
    p = a64 * b64                       # exact: 24 + 24 bits fit in 53
    s = p + c64
    z = s - p
    e = (p - (s - z)) + (c64 - z)       # TwoSum: s + e == p + c exactly
    r = s.astype(np.float32)            # may double-round, but only when s is an f32 midpoint
    r64 = r.astype(np.float64)
    nb = np.nextafter(r, np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32))
    nb64 = nb.astype(np.float64)
    on_mid = (s != r64) & (s == (r64 + nb64) * 0.5) & (e != 0)
    # on a midpoint the exact value s + e lies on the side of e's sign
    fix = on_mid & (((e > 0) & (nb64 > r64)) | ((e < 0) & (nb64 < r64)))
    out = np.where(fix, nb, r)
    return out.astype(np.float32)


def matmul_f32(lhs: np.ndarray, w_nk: np.ndarray, bias: np.ndarray | None,
               clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst[i][j] = max(min(chain_fma(bias_j, lhs[i][:], w[j][:]), clamp_max), clamp_min)."""
    lhs = np.asarray(lhs, dtype=np.float32)
    w = np.asarray(w_nk, dtype=np.float32)
    m, k = lhs.shape
    n = w.shape[0]
    acc = np.broadcast_to(np.zeros(n, np.float32) if bias is None else bias.astype(np.float32),
                          (m, n)).copy()
    for t in range(k):
        acc = fma_f32(lhs[:, t:t + 1], w[None, :, t], acc)
    acc = np.minimum(acc, np.float32(clamp_max))
    return np.maximum(acc, np.float32(clamp_min))


def matmul_f64(lhs: np.ndarray, w_nk: np.ndarray, bias: np.ndarray | None,
               clamp_min: float, clamp_max: float) -> np.ndarray:
    """The same computation in float64 (for tolerance checks)."""
    r = lhs.astype(np.float64) @ w_nk.astype(np.float64).T
    if bias is not None:
        r += bias.astype(np.float64)
    return np.maximum(np.minimum(r, clamp_max), clamp_min)
