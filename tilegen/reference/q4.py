"""Bit-exact numpy references of KleidiAI's int8 x int4 and f16 x int4 matmul kernels.

* :func:`matmul_qai8dxp_qsi4c32p` — ``kai_matmul_clamp_f32_qai8dxp*_qsi4c32p*``
  (docs/layouts.md#arith-qai8dxp)
* :func:`matmul_qsi8d32p_qsi4c32pscalef16` — ``kai_matmul_clamp_f32_qsi8d32p*_qsi4c32p*``
  reading qsi4c32pscalef16 weights (docs/layouts.md#arith-qsi8d32p)
* :func:`matmul_f16p_qsi4c32ps1s0` — ``kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``
  (f16 activations, qsi4c32ps1s0scalef16 weights; docs/layouts.md#arith-f16p-q4)

Both read the packed buffers through the layout objects' unpack methods, so they check the
layouts as much as the arithmetic.  Only dst[0:m, 0:n] is produced.
"""
from __future__ import annotations

import numpy as np

from ..layout.bf16 import bf16_to_f32
from ..layout.f16 import F16PLhs2
from ..layout.ggml import f16_bits_to_f32
from ..layout.lhs_int8 import QAI8DXP, QSI8D32P
from ..layout.rhs_int4 import QSI4C32P, QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from .f32 import fma_f32

__all__ = ["matmul_qai8dxp_qsi4c32p", "matmul_qsi8d32p_qsi4c32pscalef16",
           "matmul_f16p_qsi4c32ps1s0"]


def _block_dots(q: np.ndarray, v: np.ndarray, k: int, bl: int) -> np.ndarray:
    """Exact integer block dots S[i, j, b] = sum_{t in block b} q[i, t] * v[j, t]."""
    m, n, B = q.shape[0], v.shape[0], k // bl
    qb = q[:, :k].astype(np.int64).reshape(m, B, bl).transpose(1, 0, 2)     # (B, m, bl)
    vb = v[:, :k].astype(np.int64).reshape(n, B, bl).transpose(1, 2, 0)     # (B, bl, n)
    return np.matmul(qb, vb).transpose(1, 2, 0)                               # (m, n, B)


def matmul_qai8dxp_qsi4c32p(lhs_packed, rhs_packed, m: int, n: int, k: int, bl: int,
                            mr: int, nr: int, kr: int, sr: int,
                            clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of ``kai_run_matmul_clamp_f32_qai8dxp<mr>x.._qsi4c32p<nr>x..``.

    a = +0; per block b: a = fma(f32(S_b), d_jb, a); a = fma(rsum_j, f32(offset_i), a);
    a = a * rscale_i; a = a + bias_j; a = max(a, clamp_min); a = min(a, clamp_max).
    """
    q, off, rsc = QAI8DXP(mr, kr, sr).unpack(lhs_packed, m, k)
    u, sbf, rsum, bias = QSI4C32P(nr, kr, sr, bl).unpack(rhs_packed, n, k)
    S = _block_dots(q, u.astype(np.int16) - 8, k, bl)
    d = bf16_to_f32(sbf)                                                      # (n, B)
    a = np.zeros((m, n), np.float32)
    for b in range(k // bl):
        a = fma_f32(S[:, :, b].astype(np.float32), d[None, :, b], a)
    a = fma_f32(rsum[None, :], off.astype(np.float32)[:, None], a)
    a = (a * rsc[:, None]).astype(np.float32)
    a = (a + bias[None, :]).astype(np.float32)
    a = np.maximum(a, np.float32(clamp_min))
    return np.minimum(a, np.float32(clamp_max))


#: the column-scale decoders of the QSI4C32PScaleF16 family of layouts, by ``scale_format``
_SCALE_TO_F32 = {"f16": f16_bits_to_f32, "bf16": bf16_to_f32}


def matmul_qsi8d32p_qsi4c32pscalef16(lhs_packed, rhs_packed, m: int, n: int, k: int, bl: int,
                                     mr: int, nr: int, kr: int, sr: int,
                                     clamp_min: float, clamp_max: float,
                                     rhs_layout: type = QSI4C32PScaleF16) -> np.ndarray:
    """dst float32 (m, n) of ``kai_run_matmul_clamp_f32_qsi8d32p<mr>x.._qsi4c32p<nr>x..``.

    a = +0; per block b: a = fma(f32(S_b), f32(dr_jb) * f32(dl_ib), a);
    a = max(a, clamp_min); a = min(a, clamp_max).  No bias, no zero point.
    ``rhs_layout``: the packed RHS's layout class, QSI4C32PScaleF16 or one on it (the table
    families': its ``unpack_values`` gives the weights' int8 values, its ``scale_format`` how
    dr is widened, f16 or bf16 — the same arithmetic after that).
    """
    q, dl_bits = QSI8D32P(mr, kr, sr, bl).unpack(lhs_packed, m, k)
    v, dr_bits = rhs_layout(nr, kr, sr, bl).unpack_values(rhs_packed, n, k)
    S = _block_dots(q, v, k, bl)
    dl = f16_bits_to_f32(dl_bits)                                             # (m, B)
    dr = _SCALE_TO_F32[rhs_layout.scale_format](dr_bits)                      # (n, B)
    a = np.zeros((m, n), np.float32)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        for b in range(k // bl):
            s = (dr[None, :, b] * dl[:, None, b]).astype(np.float32)
            a = fma_f32(S[:, :, b].astype(np.float32), s, a)
    a = np.maximum(a, np.float32(clamp_min))
    return np.minimum(a, np.float32(clamp_max))


def matmul_f16p_qsi4c32ps1s0(lhs_packed, rhs_packed, m: int, n: int, k: int, bl: int,
                             mr: int, nr: int, clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of ``kai_run_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``
    (and tilegen's ``q4_0_f16:sme2:1vlx4vl``) from an ``f16p<mr>x2`` LHS and a
    ``qsi4c32ps1s0scalef16`` RHS of ``nr`` columns per group.

    w[j, t] = f16((u[j, t] - 8) * d[j, t // bl])   (the product rounded to f16: FMUL .h)
    a = +0; per k-pair p in k order:
        a = a + RN32(x[i, 2p] * w[j, 2p] + x[i, 2p+1] * w[j, 2p+1])   (FMOPA f16 -> f32: the
            pair's sum rounded once, then added with a second rounding)
    a = max(a, clamp_min); a = min(a, clamp_max).

    Every product of two f16 values is exact in f32 (22 significant bits, no underflow), so the
    pair is ``fma_f32(x1, w1, x0 * w0)``.  Finite inputs only (fma_f32's domain)."""
    x = F16PLhs2(mr, 4, 2).unpack(lhs_packed, m, k).view(np.float16).astype(np.float32)
    u, d_bits = QSI4C32PS1S0ScaleF16(nr, 4, 2, bl).unpack(rhs_packed, n, k)
    d = f16_bits_to_f32(d_bits)                                             # (n, k/bl)
    q = u.astype(np.float32) - 8
    with np.errstate(over="ignore", invalid="ignore"):
        w = (q * np.repeat(d, bl, axis=1)).astype(np.float16).astype(np.float32)   # (n, k)
        a = np.zeros((m, n), np.float32)
        for p in range(k // 2):
            p0 = x[:, 2 * p, None] * w[None, :, 2 * p]                       # exact
            a = a + fma_f32(x[:, 2 * p + 1, None], w[None, :, 2 * p + 1], p0)
    a = np.maximum(a, np.float32(clamp_min))
    return np.minimum(a, np.float32(clamp_max))
