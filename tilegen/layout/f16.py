"""f16 packed LHS: KleidiAI ``f16p<mr>x2`` (``kai_run_lhs_pack_f16pmrx2_f32_neon``,
docs/layouts.md#f16pmrx2), the activations of llama.cpp's SME2 Q4_0 GEMM
(``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``; its weights are
:class:`tilegen.layout.rhs_int4.QSI4C32PS1S0ScaleF16`), byte for byte.

The LHS format ``f16px2`` of the ``q4_0_f16`` kernels (:mod:`tilegen.layout.registry`); the
generated KleidiAI packers (:mod:`tilegen.export.packers_c`) take every size and offset from it.  ``pack`` follows
the LHS conventions of :mod:`tilegen.layout.lhs_int8`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import (LayoutError, PackedLayout, RowBlocks, check_m_idx_start, check_pos, eval_expr,
                   roundup, rows_f32)

__all__ = ["F16PLhs2", "f32_to_f16_bits"]

U16 = np.dtype("<u2")


def f32_to_f16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 f16 bits of float32 ``x`` as Arm's FCVT/FCVTN give them (FPCR.DN = 0): round to
    nearest even, overflow to +-inf, and a NaN quiet with its sign and the top 9 bits of its
    payload (numpy's conversion keeps a signalling NaN signalling)."""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(U16)
    bits = x.view(np.uint32)
    nan = ((bits >> 16) & 0x8000 | 0x7E00 | (bits >> 13) & 0x01FF).astype(U16)
    return np.where(np.isnan(x), nan, h)


@dataclass(frozen=True)
class F16PLhs2(RowBlocks, PackedLayout):
    """KleidiAI ``f16p<mr>x2`` from ``kai_run_lhs_pack_f16pmrx2_f32_neon`` (docs/layouts.md#f16pmrx2).

    Row block of ``mr`` rows, stride ``mr * roundup(k, 2) * 2``: f16 values (f32 rounded to
    nearest even, :func:`f32_to_f16_bits`) ordered [k-pair][row 0..mr)[2].  KleidiAI needs k even (a multiple of bl); an
    odd k is padded with a 0 value here.  ``kr``/``sr`` only have to give L = kr/sr = 2."""

    format = "f16px2"
    label_prefix = "f16p"
    elem_bytes = 2   # one f16 value
    pair = 2         # k values of one row written together (L)
    k_multiple = 2
    packer_template = "lhs_pack_kmajor_neon"     # with f32p, bf16px2: k-major row blocks
    packer_verb = "lhs_pack"
    packer_mr = ("vl",)                          # the LHS of an SME kernel only
    packer_per_row = ("chunk_bytes",)
    fixed_conversion = "f32 -> f16 is round-to-nearest-even (FCVTN)"

    mr: int
    kr: int = 2
    sr: int = 1

    def __post_init__(self) -> None:
        check_pos(mr=self.mr, kr=self.kr, sr=self.sr)
        if self.kr % self.sr or self.kr // self.sr != self.pair:
            raise LayoutError(f"f16p<mr>x2 needs kr/sr = 2, got kr={self.kr}, sr={self.sr}")

    @property
    def activation_limit(self) -> tuple[float, str]:
        """Largest |x| this format represents, and why: each x is converted to f16 (a larger one
        would become Inf)."""
        return (65504.0, "each activation is converted to f16, whose largest finite value is "
                         "65504")

    @property
    def label(self) -> str:
        return self.label_for(self.mr, self.pair, 1)

    def k_padded(self, k: int) -> int:
        return roundup(k, self.k_multiple)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one k-pair of a row block (mr rows x 2 values)."""
        return self.mr * self.pair * self.elem_bytes

    @property
    def stride_expr(self) -> str:
        """Bytes per row block as an expression in k."""
        km = self.k_multiple
        return f"{self.mr} * ((k + {km - 1}) // {km} * {km}) * {self.elem_bytes}"

    def row_block_stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    def element_offset(self, x: int, t: int) -> int:
        """Offset of (slot x, element t) inside a row block."""
        return ((t // self.pair) * self.mr * self.pair + x * self.pair + t % self.pair) * self.elem_bytes

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        x = rows_f32(x)
        m_idx_start = check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1:
            raise LayoutError("f16p<mr>x2 needs k >= 1")
        if m == 0:
            return np.zeros(0, np.uint8)
        kp, P = self.k_padded(k), self.pair
        nblk, rb, slot = self.placement(m, m_idx_start)
        v = np.zeros((m, kp), U16)
        v[:, :k] = f32_to_f16_bits(x)
        data = np.zeros((nblk, kp // P, self.mr, P), U16)
        data[rb, :, slot, :] = v.reshape(m, kp // P, P)
        return data.view(np.uint8).reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int, m_idx_start: int = 0) -> np.ndarray:
        """f16 bits uint16 (m, roundup(k, 2)) of the packed rows."""
        b = np.asarray(buf, np.uint8).reshape(-1)
        kp, P = self.k_padded(k), self.pair
        nblk, rb, slot = self.placement(m, m_idx_start)
        d = np.ascontiguousarray(b[:nblk * self.row_block_stride(k)]).view(U16)
        d = d.reshape(nblk, kp // P, self.mr, P)
        return d[rb, :, slot, :].reshape(m, kp)
