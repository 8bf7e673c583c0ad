"""Bit-exact numpy reference of KleidiAI's ``kai_matmul_clamp_f32_qai8dxp*_qsi8cxp*`` kernels
(docs/layouts.md#arith-qai8dxp-qsi8cxp).

It reads the packed buffers through the layout objects' unpack methods, so it checks the layouts
as much as the arithmetic.  Only dst[0:m, 0:n] is produced.
"""
from __future__ import annotations

import numpy as np

from ..layout.lhs_int8 import QAI8DXP
from ..layout.rhs_int8 import QSI8CXP

__all__ = ["matmul_qai8dxp_qsi8cxp"]


def _wrap_i32(v: np.ndarray) -> np.ndarray:
    return (v + 2 ** 31) % 2 ** 32 - 2 ** 31


def matmul_qai8dxp_qsi8cxp(lhs_packed, rhs_packed, m: int, n: int, k: int,
                           mr: int, nr: int, kr: int, sr: int,
                           clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of ``kai_run_matmul_clamp_f32_qai8dxp<mr>x<kr>_qsi8cxp<nr>x<kr>_*``.

    acc = sum_t qL[i,t]*qR[j,t] + offset_i * rsum_j          (int32, over the K32 padded values)
    a   = f32(acc) * (rscale_i * scale_j)                    (two f32 multiplies, not fused)
    a   = a + bias_j;  a = max(a, clamp_min);  a = min(a, clamp_max)
    """
    q, off, rsc = QAI8DXP(mr, kr, sr).unpack(lhs_packed, m, k)
    w, rsum, scale, bias = QSI8CXP(nr, kr).unpack(rhs_packed, n, k)
    # the RHS K padding is 0, so the LHS padding values do not contribute
    dot = q.astype(np.int64) @ w.astype(np.int64).T
    acc = _wrap_i32(dot + _wrap_i32(off.astype(np.int64)[:, None] * rsum.astype(np.int64)[None, :]))
    f = np.float32
    s = (rsc[:, None] * scale[None, :]).astype(f)
    a = (acc.astype(f) * s).astype(f)
    a = (a + bias[None, :]).astype(f)
    a = np.maximum(a, f(clamp_min))
    return np.minimum(a, f(clamp_max))
