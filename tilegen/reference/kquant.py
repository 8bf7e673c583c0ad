"""numpy references of the K-quant matmuls (issue #24; docs/layouts.md#arith-kquant).

Three computations of ``dst[r][c] = sum_t x[r][t] * w[c][t]`` for ggml K-quant weights ``w``
(n rows of ggml blocks, e.g. Q4_K / Q6_K) and float32 activations ``x``.  Each function takes
the family's RHS layout class (``rhs``: :class:`tilegen.families.q4_k.Q4KP`, ...; a subclass of
:class:`tilegen.layout.kquant.KQuantRhs`), whose hooks give what differs between the formats:
its ggml codec (``split_blocks``) and its integer terms (:meth:`KQuantRhs.terms`: per
super-block the scale per sub-block, the integer weights, and the min term if it has one).

* **tilegen's kernel arithmetic** (:func:`matmul_kernel`), bit exact: it reads the packed LHS
  (``q8kp``) and RHS (``q4kp`` / ``q6kp``) through the layout objects' ``unpack``, so it
  checks the layouts as much as the arithmetic.  Per output and per
  super-block (SB) of 256, in k order, from acc = +0.0f:

  - Q4_K: S1 = sum_j sc_j * (sum over sub-block j of q*a) and S2 = 128 * sum_j m_j*bsum_hi_j
    + sum_j m_j*bsum_lo_j (both exact integers); x = f32(S1) * f32(d) (one rounding);
    x = fma(-f32(dmin), f32(S2), x); acc = fma(da, x, acc).
  - Q6_K: S1 = sum_j sc_j * (sum over sub-block j of 16 of (q - 32)*a); x = f32(S1) * f32(d);
    acc = fma(da, x, acc).

  then clamp: min(max(acc, clamp_min), clamp_max).  f32(S) rounds to nearest (S1 of Q4_K can
  pass 2^24).  :func:`matmul_blocks` is the same arithmetic from the float activations and
  the ggml blocks, without the packed buffers (what the kernel tests compare with).

* **ggml's reference arithmetic** (:func:`quantize_q8_k`, :func:`matmul_ggml`), for the error
  table and the byte comparison with ggml's own code (``bench/q8k_vs_ggml.py``): activations
  quantised as ggml's ``quantize_row_q8_K_ref`` does it — per SB, the value of largest
  magnitude keeps its sign (the first such value), ``iscale = -127/max``, q = ``nearest_int``
  of ``iscale*x`` (ties to even), at most 127, ``d = 1/iscale``, sums per 16 — and the dot
  product in the float order of ggml's generic ``vec_dot_q4_K_q8_K`` /
  ``vec_dot_q6_K_q8_K``: the integer products of each SB are gathered in 8 int32 lanes (lane l
  holds the scale-weighted products of the positions t with t % 8 == l); per SB a factor
  ``f32(d_w) * d_a`` is formed and each lane's float partial becomes ``part_l + factor*f32(lane_l)``;
  the Q4_K min term (``sum_j bsums_j * m_{j/2}``, int) is taken off a separate running float
  ``sumf -= (f32(dmin) * d_a) * f32(that sum)``; after the last SB the 8 partials are added to
  ``sumf`` in lane order.  Every step is one f32 rounding (C's semantics without contraction;
  ``contract=True`` fuses ``part + factor*lane`` and ``sumf - dmin*sum`` as compilers allowed
  to contract do).

* **the float64 product** (:func:`matmul_f64_kquant`) of the dequantised weights (gguf's) and
  the float activations, and :func:`error_summary` / :func:`error_bound` to compare the two
  above with it (``bench/kquant_error.py`` prints the table).
"""
from __future__ import annotations

import numpy as np

from ..layout.ggml import QK_K, check_superblocks
from ..layout.kquant import Q8KP, KQuantTerms
from .f32 import fma_f32

__all__ = ["matmul_kernel", "matmul_blocks", "matmul_tilegen", "nearest_int", "quantize_q8_k", "matmul_ggml",
           "matmul_f64_kquant", "dequantize_kquant", "error_summary", "error_bound"]

f32 = np.float32


def _f16(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint16).view(np.float16).astype(f32)


def _subblock_dots(a: np.ndarray, q: np.ndarray, sub: int) -> np.ndarray:
    """Exact int64 (m, n, 256/sub): per sub-block of ``sub`` values, sum of a[r] * q[c]."""
    m, n = a.shape[0], q.shape[0]
    J = a.shape[1] // sub
    A = a.astype(np.int64).reshape(m, J, sub).transpose(1, 0, 2)        # (J, m, sub)
    W = q.astype(np.int64).reshape(n, J, sub).transpose(1, 2, 0)        # (J, sub, n)
    return np.matmul(A, W).transpose(1, 2, 0)


def _clamp(acc: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return np.minimum(np.maximum(acc, f32(lo)), f32(hi)).astype(f32)


# ----------------------------------------------------------------------------------------
# tilegen's kernel arithmetic (bit exact)
# ----------------------------------------------------------------------------------------
def matmul_kernel(rhs, lhs_packed, rhs_packed, m: int, n: int, k: int, mr: int, nr: int,
                  kr: int, clamp_min: float = -np.inf, clamp_max: float = np.inf) -> np.ndarray:
    """dst float32 (m, n) of a K-quant kernel reading ``q8kp<mr>x<kr>`` and the family's RHS
    layout ``rhs`` (class) at ``<nr>x<kr>``: per output and super-block, S1 = sum_j sc_j *
    (sub-block j's integer dot product), x = f32(S1) * f32(d); with a min term S2 = 128 *
    sum_j m_j*bsum_hi_j + sum_j m_j*bsum_lo_j, x = fma(-f32(dmin), f32(S2), x); acc =
    fma(da, x, acc)."""
    check_superblocks(k)
    return _arith(*Q8KP(mr, kr).unpack(lhs_packed, m, k),
                  rhs.terms(*rhs(nr, kr).unpack(rhs_packed, n, k)), clamp_min, clamp_max)


def matmul_blocks(rhs, x: np.ndarray, raw, n: int, clamp_min: float = -np.inf,
                  clamp_max: float = np.inf) -> np.ndarray:
    """tilegen's kernel arithmetic, bit for bit as :func:`matmul_kernel`, from the float32
    activations ``x`` (m, k) and the family's ggml blocks ``raw`` (n rows) themselves, never
    through a packed buffer: the LHS fields are ``Q8KP.quantize_rows`` (sub-block sums split
    hi/lo), the RHS fields the family's ``split_blocks`` (``rhs``: its RHS layout class).  A
    kernel test against it fails when a packer and the kernel disagree on where a byte goes
    (:func:`matmul_kernel` reads the bytes the way the kernel does)."""
    x = np.asarray(x, dtype=f32)
    k = x.shape[1]
    check_superblocks(k)
    qa, da, bsum = Q8KP.quantize_rows(x)
    return _arith(qa, da, *Q8KP.split_bsum(bsum), rhs.terms(*rhs.split_blocks(raw, n, k)),
                  clamp_min, clamp_max)


def _arith(qa, da, hi, lo, t: KQuantTerms, clamp_min: float, clamp_max: float) -> np.ndarray:
    """The kernels' arithmetic on the logical fields: LHS (q, d, bsum hi, lo), RHS terms."""
    m, S = qa.shape[0], qa.shape[1] // QK_K
    n = t.w.shape[0]
    acc = np.zeros((m, n), f32)
    for s in range(S):
        ks = slice(QK_K * s, QK_K * (s + 1))
        P = _subblock_dots(qa[:, ks], t.w[:, ks], t.sub)                     # (m, n, J)
        S1 = (P * t.sc[None, :, s, :].astype(np.int64)).sum(axis=2)
        x = (S1.astype(f32) * _f16(t.d[:, s])[None, :]).astype(f32)
        if t.mins is not None:
            mm = t.mins[:, s, :].astype(np.int64)                            # (n, 8)
            S2 = 128 * (hi[:, s, :].astype(np.int64) @ mm.T) + lo[:, s, :].astype(np.int64) @ mm.T
            x = fma_f32(-_f16(t.dmin[:, s])[None, :], S2.astype(f32), x)
        acc = fma_f32(da[:, s:s + 1], x, acc)
    return _clamp(acc, clamp_min, clamp_max)


def matmul_tilegen(rhs, x: np.ndarray, raw, n: int, *, mr: int = 4, nr: int = 4,
                   kr: int = 16, clamp_min: float = -np.inf, clamp_max: float = np.inf
                   ) -> np.ndarray:
    """Pack float32 activations ``x`` (m, k) as q8kp and ggml blocks ``raw`` (n rows) in the
    family's RHS layout ``rhs`` (class), then tilegen's kernel arithmetic."""
    m, k = x.shape
    lhs = Q8KP(mr, kr).pack(x)
    return matmul_kernel(rhs, lhs, rhs(nr, kr).pack_from_ggml(raw, n, k), m, n, k, mr, nr, kr,
                         clamp_min, clamp_max)


# ----------------------------------------------------------------------------------------
# ggml's reference arithmetic (for the error table)
# ----------------------------------------------------------------------------------------
def nearest_int(v: np.ndarray) -> np.ndarray:
    """int64: ggml's ``nearest_int`` of float32 values ``v`` (ggml-quants.c): the bits of
    ``f32(v + 12582912)``, masked to the low 23, minus 2^22 — round to nearest, ties to even, for
    |v| < 2^22; for +-inf and NaN it gives -2^22 and 0."""
    w = (np.asarray(v, dtype=f32) + f32(12582912)).astype(f32)
    return (w.view(np.int32).astype(np.int64) & 0x7FFFFF) - 0x400000


def quantize_q8_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 (m, k) -> (q int8 (m, k), d f32 (m, S), bsums int32 (m, S, 16)) as ggml's
    ``quantize_row_q8_K_ref`` computes them (what llama.cpp runs on Arm: the NEON
    ``quantize_row_q8_K`` calls it, and the repack's ``ggml_quantize_mat_q8_K_4x4/4x8`` compute
    the same values per row): per SB, ``max`` = the first value of largest magnitude, with its
    sign; amax = 0: d = 0 and every q = 0; else ``iscale = -127/max``, q = MIN(127,
    :func:`nearest_int` (iscale*x)) stored as int8 (two's complement truncation), ``d =
    1/iscale`` (f32 divides and product), sums per 16.  A tiny SB (127/amax overflows:
    iscale = -+inf) gets q = 0 (nearest_int of +-inf and NaN is -2^22 or 0, whose low byte is 0)
    and d = -+0.

    Against :meth:`tilegen.layout.kquant.Q8KP.quantize_rows`: ggml's (q, d) = s * tilegen's
    (q, d) with s = -sign(max) (tilegen keeps d >= 0), so every product d * q, and every result
    of the kernels, is the same (docs/layouts.md#q8kp)."""
    x = np.asarray(x, dtype=f32)
    m, k = x.shape
    S = check_superblocks(k)
    xb = x.reshape(m, S, QK_K)
    imax = np.abs(xb).argmax(axis=2)[..., None]               # the first of equal magnitudes
    mx = np.take_along_axis(xb, imax, axis=2)[..., 0]         # keeps its sign
    nz = mx != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = np.where(nz, f32(-127) / np.where(nz, mx, f32(1)), f32(0)).astype(f32)
        v = (xb * iscale[..., None]).astype(f32)
        q = np.minimum(nearest_int(v), 127).astype(np.int8)  # int64 -> int8 wraps, as C's store
        d = np.where(nz, f32(1) / np.where(nz, iscale, f32(1)), f32(0)).astype(f32)
    q = np.where(nz[..., None], q, np.int8(0))
    bsums = q.astype(np.int32).reshape(m, S, 16, 16).sum(axis=3)
    return q.reshape(m, k), d, bsums


def _ggml_lanes(qa: np.ndarray, w: np.ndarray, sc: np.ndarray, sub: int) -> np.ndarray:
    """int64 (m, n, 8): lane l = sum over the SB's positions t with t % 8 == l of
    sc[sub-block of t] * qa[t] * w[t] (ggml's aux32)."""
    m, n = qa.shape[0], w.shape[0]
    J = QK_K // sub
    A = qa.astype(np.int64).reshape(m, J, sub // 8, 8)
    W = w.astype(np.int64).reshape(n, J, sub // 8, 8) * sc.astype(np.int64).reshape(n, J, 1, 1)
    return np.einsum("mjgl,njgl->mnl", A, W)


def matmul_ggml(rhs, x: np.ndarray, raw, n: int, *, contract: bool = False) -> np.ndarray:
    """float32 (m, n): ggml's Q8_K path — :func:`quantize_q8_k` of ``x`` and the generic
    ``vec_dot_<kind>_q8_K`` float order (module docstring) per output, for the family of RHS
    layout class ``rhs``."""
    m, k = x.shape
    S = check_superblocks(k)
    qa, da, bsums = quantize_q8_k(x)
    t: KQuantTerms = rhs.terms(*rhs.split_blocks(raw, n, k))
    parts = np.zeros((8, m, n), f32)
    sumf = np.zeros((m, n), f32)
    for s in range(S):
        ks = slice(QK_K * s, QK_K * (s + 1))
        lanes = _ggml_lanes(qa[:, ks], t.w[:, ks], t.sc[:, s], t.sub).astype(f32)   # exact ints
        fac = (_f16(t.d[:, s])[None, :] * da[:, s:s + 1]).astype(f32)              # (m, n)
        for l in range(8):
            if contract:
                parts[l] = fma_f32(fac, lanes[..., l], parts[l])
            else:
                parts[l] = (parts[l] + (fac * lanes[..., l]).astype(f32)).astype(f32)
        if t.mins is not None:
            # bsums per 16: sub-block j of 32 holds sums 2j and 2j+1
            sumi = (bsums[:, s, :].astype(np.int64) @ np.repeat(t.mins[:, s, :], 2, axis=1).astype(np.int64).T)
            fmin = (_f16(t.dmin[:, s])[None, :] * da[:, s:s + 1]).astype(f32)
            if contract:
                sumf = fma_f32(-fmin, sumi.astype(f32), sumf)
            else:
                sumf = (sumf - (fmin * sumi.astype(f32)).astype(f32)).astype(f32)
    for l in range(8):
        sumf = (sumf + parts[l]).astype(f32)
    return sumf


# ----------------------------------------------------------------------------------------
# float64 product and error figures
# ----------------------------------------------------------------------------------------
def dequantize_kquant(rhs, raw, n: int, k: int) -> np.ndarray:
    """float32 (n, k): gguf's dequantisation of ggml blocks of the family of RHS layout class
    ``rhs``."""
    return rhs.values(*rhs.split_blocks(raw, n, k))


def matmul_f64_kquant(rhs, x: np.ndarray, raw, n: int) -> np.ndarray:
    """float64 (m, n): the dequantised weights times the float activations, in float64."""
    w = dequantize_kquant(rhs, raw, n, x.shape[1]).astype(np.float64)
    return np.asarray(x, dtype=np.float64) @ w.T


def _exact_terms(rhs, raw, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """float64 (n, k): |w| of the exact weights (d*sc*q - dmin*m, unrounded) and the sum of
    the magnitudes of their parts (|d*sc*q| + |dmin*m|)."""
    t: KQuantTerms = rhs.terms(*rhs.split_blocks(raw, n, k))
    S = k // QK_K
    J = QK_K // t.sub
    a = (_f16(t.d).astype(np.float64)[..., None] * t.sc).reshape(n, S, J, 1) * \
        t.w.astype(np.float64).reshape(n, S, J, t.sub)
    a = a.reshape(n, S, 8, QK_K // 8)
    if t.mins is None:
        return np.abs(a).reshape(n, k), np.abs(a).reshape(n, k)
    b = np.broadcast_to((_f16(t.dmin).astype(np.float64)[..., None] * t.mins).reshape(n, S, 8, 1),
                        a.shape)
    return np.abs(a - b).reshape(n, k), (np.abs(a) + np.abs(b)).reshape(n, k)


def error_bound(rhs, x: np.ndarray, raw, n: int) -> np.ndarray:
    """float64 (m, n): a bound on |result - float64 product| that holds for both tilegen's and
    ggml's arithmetic (docs/layouts.md#arith-kquant):

    * activation rounding: each activation is off by at most half a step, amax_s/254 (ggml's
      reciprocal scales add at most a relative 2^-14): sum_s amax_s/254 * (1 + 2^-14) *
      sum_{t in s} |w_t|;
    * float roundings: each f32 step (conversions, products, sums; at most S + 12 of them on any
      path, S super-blocks) is off by 2^-24 of a partial sum, and every partial sum is at most
      T = sum_s amax_s * (1 + 1/127) * sum_{t in s} (|d sc q_t| + |dmin m_t|): (S + 12) * 2^-23 * T;
    * the float64 reference's own weights are gguf's f32 dequantisation (3 roundings per weight,
      2^-24 each, of the parts' magnitudes): 3 * 2^-24 * sum_t |x_t| (|d sc q_t| + |dmin m_t|).
    """
    x = np.asarray(x, dtype=np.float64)
    m, k = x.shape
    S = check_superblocks(k)
    w_abs, parts = _exact_terms(rhs, raw, n, k)
    amax = np.abs(x).reshape(m, S, QK_K).max(axis=2)                           # (m, S)
    wsum = w_abs.reshape(n, S, QK_K).sum(axis=2)                               # (n, S)
    psum = parts.reshape(n, S, QK_K).sum(axis=2)
    quant = (amax / 254 * (1 + 2.0 ** -14)) @ wsum.T
    T = (amax * (1 + 1 / 127)) @ psum.T
    return quant + (S + 12) * 2.0 ** -23 * T + 3 * 2.0 ** -24 * (np.abs(x) @ parts.T)


def error_summary(got: np.ndarray, ref: np.ndarray) -> dict:
    """float64 figures of ``got`` against ``ref`` (m, n): ``max_abs``; ``max_rel`` = max |err|
    / max |ref|; ``rms_rel`` = RMS(err) / RMS(ref)."""
    err = np.asarray(got, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    top = float(np.abs(ref).max())
    rms = float(np.sqrt(np.mean(ref ** 2)))
    return {"max_abs": float(np.abs(err).max()),
            "max_rel": float(np.abs(err).max()) / top if top else 0.0,
            "rms_rel": float(np.sqrt(np.mean(err ** 2))) / rms if rms else 0.0}
