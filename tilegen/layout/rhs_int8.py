"""int8 per-channel packed-RHS layout of KleidiAI's ``qai8dxp x qsi8cxp`` kernels, and the
per-channel quantisation of the weights it holds (from float32, or from ggml Q8_0 rows as
llama.cpp repacks them).

========================  ==============================================  ==========================
name                      KleidiAI / llama.cpp                            docs/layouts.md
========================  ==============================================  ==========================
:class:`QSI8CXP`          ``kai_run_rhs_pack_nxk_qsi8cxp_qsi8cx_neon``     layouts.md#qsi8cxp
:func:`requantize_q8_0`   llama.cpp ``kleidiai.cpp`` Q8_0 repack           layouts.md#q8_0-requant
========================  ==============================================  ==========================

The LHS of these kernels is :class:`tilegen.layout.lhs_int8.QAI8DXP` (the same packed
activations the ``qai8dxp x qsi4c32p`` kernels read); the ggml Q8_0 blocks are in
:mod:`tilegen.layout.ggml`.

The kernels take one f32 scale per output channel, not one per 32 values, so weights are
quantised per channel, symmetric (:func:`quantize_per_channel`): ``scale = max|w| / 127``,
``q = clamp(roundf(w * (1/scale)), -127, 127)`` (f32 arithmetic; an all-zero row gets scale 0
and q 0).  llama.cpp applies that arithmetic to the dequantised values of a Q8_0 row
(``f32(d) * qs``): :func:`requantize_q8_0`; :func:`requant_error_q8_0` measures what that second
rounding costs.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import (LayoutError, PaddedSlots, RhsGroups, check_pos, round_half_away,
                   rows_index)
from .ggml import QK8_0, check_block_scales, dequantize_q8_0, quantize_q8_0, split_q8_0

__all__ = ["QSI8CXP", "quantize_per_channel", "requantize_q8_0", "requant_error_q8_0"]

F32 = np.dtype("<f4")
I32 = np.dtype("<i4")


# ----------------------------------------------------------------------------------------
# per-channel quantisation
# ----------------------------------------------------------------------------------------
def _per_channel(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Finite float32 (n, k) -> (q int8 (n, k), scale f32 (n,)), symmetric per row."""
    f = np.float32
    amax = np.max(np.abs(v), axis=1, initial=f(0)).astype(f)
    scale = np.where(amax > 0, amax / f(127), f(0)).astype(f)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(scale > 0, f(1) / scale, f(0)).astype(f)
    tiny = np.isinf(inv)        # 1/scale overflows f32 (max|w| < 2**-121): divide those rows
    q = round_half_away((v * np.where(tiny, f(0), inv)[:, None]).astype(f))
    if tiny.any():
        q[tiny] = round_half_away((v[tiny] / scale[tiny, None]).astype(f))
    return np.clip(q, -127, 127).astype(np.int8), scale


def quantize_per_channel(w) -> tuple[np.ndarray, np.ndarray]:
    """float32 (n, k) -> (q int8 (n, k), scale f32 (n,)), symmetric per row (the q8_0 weights
    of :meth:`QSI8CXP.pack_per_channel`)."""
    w = np.asarray(w)
    if w.dtype != np.float32 or w.ndim != 2 or w.shape[0] < 1 or w.shape[1] < 1:
        raise LayoutError(f"q8_0 weights must be non-empty 2-D float32 (n, k), got {w.dtype} "
                          f"{w.shape}")
    if not np.isfinite(w).all():
        raise LayoutError("q8_0 weights must be finite")
    return _per_channel(w)


def requantize_q8_0(raw: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rows -> (q int8 (n, k), scale f32 (n,)) per output channel, as llama.cpp's KleidiAI
    backend repacks Q8_0 weights (finite scales assumed)::

        value     = f32(d) * qs                    (f32)
        scale     = max|value| / 127  (0 if the row is all zero)
        inv_scale = 1 / scale         (0 if scale == 0)
        q         = clamp(lround(value * inv_scale), -127, 127)   (f32 product, ties away)

    (the arithmetic of :func:`quantize_per_channel`; 1/scale never overflows here: the
    smallest nonzero value of a Q8_0 block is 2**-24)."""
    return _per_channel(dequantize_q8_0(raw, n, k))


def requant_error_q8_0(raw: np.ndarray, n: int, k: int) -> dict:
    """Error the per-channel requantisation adds on top of Q8_0's own dequantisation.

    ``ref = dequantize_q8_0(raw)`` (what ggml computes with), ``got = q * scale`` (what the
    qsi8cxp kernels compute with, from :func:`requantize_q8_0`).  Returns float64 figures:
    ``max_abs`` = max |got - ref|; ``max_rel_row`` = max over rows of max|got - ref| / max|ref|
    (at most 1/254 plus f32 rounding: half a step of max|ref|/127); ``rms_rel`` = RMS(got - ref) /
    RMS(ref) over the whole matrix."""
    ref = dequantize_q8_0(raw, n, k).astype(np.float64)
    q, s = requantize_q8_0(raw, n, k)
    got = q.astype(np.float64) * s.astype(np.float64)[:, None]
    err = np.abs(got - ref)
    rowmax = np.abs(ref).max(axis=1)
    rel_row = np.where(rowmax > 0, err.max(axis=1) / np.where(rowmax > 0, rowmax, 1), 0.0)
    rms_ref = float(np.sqrt(np.mean(ref ** 2)))
    return {"max_abs": float(err.max()), "max_rel_row": float(rel_row.max()),
            "rms_rel": float(np.sqrt(np.mean((got - ref) ** 2)) / rms_ref) if rms_ref else 0.0}


# ----------------------------------------------------------------------------------------
# RHS: qsi8cxp (int8 per-channel weights)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI8CXP(PaddedSlots, RhsGroups):
    """KleidiAI ``qsi8cxp<nr>x<kr>``: int8 weights with one f32 scale per output channel
    (docs/layouts.md#qsi8cxp).

    Group of ``nr`` columns (output channels), stride ``nr*(K32+12)``, ``K32 = roundup(k, 32)``::

        +0              int8 data: K32/kr chunks of nr*kr bytes, chunk c = [col0: kr]...[col nr-1: kr]
        +nr*K32         nr x int32 rsum  = lhs_zero_point * sum_t w[col][t]
        +nr*K32+4*nr    nr x f32 scale   = scale[col] * scale_multiplier
        +nr*K32+8*nr    nr x f32 bias    (0 without bias)

    K padding (``k <= t < K32``) is 0.  The padding columns of the last group copy column n-1
    (values, rsum, scale and bias).  llama.cpp packs with ``lhs_zero_point = 1`` and
    ``scale_multiplier = 1.0``; the kernels add ``offset_lhs * rsum`` with the LHS's stored offset
    (-zero point), so ``rsum`` must be the plain column sum.
    """

    format = "qsi8cxp"
    label_prefix = "qsi8cxp"
    ggml_block = ("Q8_0", QK8_0)

    nr: int
    kr: int
    sr: int = 1

    def __post_init__(self) -> None:
        check_pos(nr=self.nr, kr=self.kr, sr=self.sr)
        if self.sr != 1:
            raise LayoutError(f"qsi8cxp needs sr=1, got sr={self.sr}")
        if 32 % self.kr:
            raise LayoutError(f"kr={self.kr} must divide 32")

    # -- geometry (generator) ------------------------------------------------------------
    # Block-relative facts (the kernel templates read these, never format literals): a group is
    # the k data, K32/kr chunks of chunk_bytes, then a tail of nr rsums, nr scales, nr biases.
    # columns are padded with zeros to a multiple of k_multiple values
    slots = property(lambda self: self.nr)
    rsum_bytes = 4  # bytes of one column's row sum (int32)
    scale_bytes = 4  # bytes of one column's scale (f32)
    bias_bytes = 4  # bytes of one column's bias (f32)

    @property
    def col_tail_bytes(self) -> int:
        """Bytes each column adds to the group after its int8 data (rsum + scale + bias)."""
        return self.rsum_bytes + self.scale_bytes + self.bias_bytes

    rsum_offset_in_tail = 0  # the tail (after the k data) starts with the nr row sums

    @property
    def scale_offset_in_tail(self) -> int:
        """... then the nr scales ..."""
        return self.rsum_offset_in_tail + self.nr * self.rsum_bytes

    @property
    def bias_offset_in_tail(self) -> int:
        """... then the nr biases."""
        return self.scale_offset_in_tail + self.nr * self.scale_bytes

    @property
    def tail_bytes(self) -> int:
        """Bytes of the tail: from the end of the k data to the next group."""
        return self.nr * self.col_tail_bytes

    slot_tail_bytes = property(lambda self: self.col_tail_bytes)

    def group_stride(self, k: int) -> int:
        return self.slots_stride(k)

    def data_bytes(self, k: int) -> int:
        """Bytes of the group's k data (K32/kr chunks)."""
        return self.k_padded(k) // self.kr * self.chunk_bytes

    def data_offset(self, k: int) -> int:
        return 0

    def rsum_offset(self, k: int) -> int:
        """Start of the nr int32 row sums inside a group."""
        return self.data_bytes(k) + self.rsum_offset_in_tail

    def scale_offset(self, k: int) -> int:
        """Start of the nr f32 scales inside a group."""
        return self.data_bytes(k) + self.scale_offset_in_tail

    def bias_offset(self, k: int) -> int:
        """Start of the nr f32 biases inside a group."""
        return self.data_bytes(k) + self.bias_offset_in_tail

    def element_offset(self, col: int, t: int) -> int:
        """Offset of (column slot col, element t) inside a group."""
        return (t // self.kr) * self.chunk_bytes + col * self.kr + t % self.kr

    # -- packers -----------------------------------------------------------------------
    def pack(self, q: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None, *,
             lhs_zero_point: int = 1, scale_multiplier: float = 1.0) -> np.ndarray:
        """int8 weights q (n, k), f32 scale (n,), optional f32 bias (n,) -> packed bytes."""
        q = np.asarray(q)
        if q.dtype != np.int8 or q.ndim != 2:
            raise LayoutError(f"weights must be 2-D int8 (n, k), got {q.dtype} {q.shape}")
        n, k = q.shape
        if n < 1 or k < 1:
            raise LayoutError(f"weights need n >= 1 and k >= 1, got shape {q.shape}")
        s = np.asarray(scale)
        if s.dtype != np.float32 or s.shape != (n,):
            raise LayoutError(f"scale must be float32 of shape ({n},), got {s.dtype} {s.shape}")
        if bias is None:
            b = np.zeros(n, F32)
        else:
            b = np.asarray(bias)
            if b.dtype != np.float32 or b.shape != (n,):
                raise LayoutError(f"bias must be float32 of shape ({n},), got {b.dtype} {b.shape}")
        nr, kr = self.nr, self.kr
        K32 = self.k_padded(k)
        G = -(-n // nr)
        rows = np.minimum(np.arange(G * nr), n - 1)                # replicate column n-1
        qp = np.zeros((G * nr, K32), np.int8)
        qp[:, :k] = q[rows]
        data = qp.reshape(G, nr, K32 // kr, kr).transpose(0, 2, 1, 3).reshape(G, nr * K32)
        rsum = (q.astype(np.int64).sum(axis=1) * int(lhs_zero_point))[rows]
        rsum = ((rsum + 2 ** 31) % 2 ** 32 - 2 ** 31).astype(I32)  # int32 arithmetic
        sc = (s * np.float32(scale_multiplier)).astype(F32)[rows]
        out = np.concatenate([data.view(np.uint8),
                              rsum.view(np.uint8).reshape(G, 4 * nr),
                              sc.view(np.uint8).reshape(G, 4 * nr),
                              np.ascontiguousarray(b[rows]).view(np.uint8).reshape(G, 4 * nr)], axis=1)
        return out.reshape(-1)

    def pack_from_ggml(self, raw: np.ndarray, n: int, k: int, bias: np.ndarray | None = None) -> np.ndarray:
        """Pack ggml Q8_0 rows ((n, k/32*34) bytes or flat) after :func:`requantize_q8_0`, as
        llama.cpp's KleidiAI backend does (lhs_zero_point 1, scale_multiplier 1.0); a block
        whose f16 scale is NaN or Inf is refused."""
        check_block_scales(split_q8_0(raw, n, k)[1], "Q8_0")
        q, s = requantize_q8_0(raw, n, k)
        return self.pack(q, s, bias)

    def pack_from_float(self, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """:func:`quantize_q8_0` (strict: |w| <= 127 x 65504) then :meth:`pack_from_ggml` (the
        GGUF path from f32 weights)."""
        w = np.asarray(w)
        raw = quantize_q8_0(w, strict=True)
        return self.pack_from_ggml(raw, w.shape[0], w.shape[1], bias)

    def pack_per_channel(self, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """:func:`quantize_per_channel` then :meth:`pack` (the runtime's q8_0 weights from
        float32: one rounding, not Q8_0's two)."""
        return self.pack(*quantize_per_channel(w), bias)

    # -- readers -----------------------------------------------------------------------
    # -- repacking (tilegen.layout.api.repack_rhs): what pack takes, read back losslessly
    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        q, _, scale, bias = self.unpack(packed, n, k)        # row sums recomputed by pack
        return np.ascontiguousarray(q[:, :k]), scale, bias

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        return self.pack(*values)

    def unpack(self, packed: np.ndarray, n: int, k: int, rows=None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(q int8 (R, K32), rsum int32 (R,), scale f32 (R,), bias f32 (R,)) of ``rows``
        (default all n); q includes the K padding."""
        nr, kr = self.nr, self.kr
        K32 = self.k_padded(k)
        grp = self.column_groups(packed, n, k)
        idx = np.arange(n) if rows is None else rows_index(rows, n)
        G = grp.shape[0]
        data = np.ascontiguousarray(grp[:, :nr * K32]).view(np.int8).reshape(G, K32 // kr, nr, kr)
        tail = np.ascontiguousarray(grp[:, nr * K32:]).reshape(G, 3, 4 * nr)
        rsum = np.ascontiguousarray(tail[:, 0]).view(I32)
        scale = np.ascontiguousarray(tail[:, 1]).view(F32)
        bias = np.ascontiguousarray(tail[:, 2]).view(F32)
        g, i = idx // nr, idx % nr
        q = data[g, :, i, :].reshape(idx.size, K32)
        return q, rsum[g, i].astype(np.int32), scale[g, i].astype(np.float32), bias[g, i].astype(np.float32)

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k) = q * scale (one f32 multiply: the weights the kernels use)."""
        q, _, s, _ = self.unpack(packed, n, k, rows)
        return (q[:, :k].astype(np.float32) * s[:, None]).astype(np.float32)
