"""bf16 layouts of KleidiAI's bf16 matmul kernels (f32 in, bf16 multiplies, f32 out), byte for byte.

=====================  ==================================================  =====================
class                  KleidiAI packer                                     docs/layouts.md
=====================  ==================================================  =====================
:class:`BF16PLhs4`     ``kai_run_lhs_quant_pack_bf16p8x4_f32_neon``        layouts.md#bf16p
                       (mr = 1: ``..._bf16p1x4_f32_neon``)
:class:`BF16PRhs4B`    ``kai_run_rhs_quant_pack_kxn_bf16p12x4biasf32_f32_neon``  layouts.md#bf16p
:class:`BF16PLhs2`     ``kai_run_lhs_pack_bf16p2vlx2_f32_sme``              layouts.md#bf16p
:class:`BF16PRhs2B`    ``kai_run_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme``     layouts.md#bf16p
=====================  ==================================================  =====================

``x4`` layouts feed NEON BFMMLA (a 2x4 by 4x2 bf16 product per instruction), ``x2`` layouts
SME BFMOPA (one k-pair per outer product).  f32 -> bf16 is round-to-nearest-even
(:func:`f32_to_bf16_rne`).  The SME layouts take the concrete tile size; for a
tile of ``units`` vector lengths use ``for_vl(vl_bytes, units)`` (mr = nr = units * VL / 4, the
f32 lanes of ``units`` vectors), as the SME f32 layouts do.  Data packed for one VL does not fit
a CPU with another.

All packers return flat ``uint8`` arrays.  Bytes KleidiAI leaves unwritten are zero here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import LayoutError, PackedLayout, check_pos, eval_expr, flat_u8, roundup, rows_index

__all__ = ["BF16PLhs4", "BF16PRhs4B", "BF16PLhs2", "BF16PRhs2B", "f32_to_bf16_rne", "bf16_to_f32"]

F32 = np.dtype("<f4")
U16 = np.dtype("<u2")


def f32_to_bf16_rne(x: np.ndarray) -> np.ndarray:
    """float32 -> raw bf16 bits (uint16), round to nearest even; NaN stays a quiet NaN."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    nan = (b & 0x7FFFFFFF) > 0x7F800000
    r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    r = np.where(nan, (b >> 16) | 0x0040, r)
    return r.astype(np.uint16)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """raw bf16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _f32_2d(x, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32 or x.ndim != 2:
        raise LayoutError(f"{what} must be 2-D float32, got {x.dtype} {x.shape}")
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise LayoutError(f"{what} needs both dimensions >= 1, got shape {x.shape}")
    return x


# the smallest |x| f32 -> bf16 (nearest even) rounds to Inf: bf16's largest value plus half a step
BF16_OVERFLOW = float(np.uint32(0x7F7F8000).view(np.float32))


def _check_bf16_range(w: np.ndarray, bits: np.ndarray) -> None:
    """LayoutError naming the first row of float32 ``w`` with a finite value whose bf16
    ``bits`` overflowed to Inf (|w| >= :data:`BF16_OVERFLOW`)."""
    over = ((bits & 0x7FFF) == 0x7F80) & np.isfinite(w)
    if over.any():
        r = int(np.argwhere(over)[0][0])
        raise LayoutError(f"bf16 weights must be below {BF16_OVERFLOW:.8g} in magnitude (larger "
                          f"finite values round to Inf; bf16's largest is "
                          f"{float(bf16_to_f32(np.uint16(0x7F7F))):.8g}); row {r} of the (n, k) "
                          f"weights has |w| = {float(np.abs(w[r][over[r]]).max()):.8g}")


class _Bf16Blocks(PackedLayout):
    """Shared geometry: k padded to a multiple of kr, blocks of ``tile`` rows or columns with
    the bf16 values ordered [k-chunk of kr][row or column of the tile][kr]."""

    kr: int
    sr = 1
    label_prefix = "bf16p"
    # each format sets fixed_kr (its k interleave: 4 BFMMLA/BFDOT, 2 BFMOPA) and its role
    # class tile_field ("mr": LHS row blocks, "nr": RHS column blocks)

    def __post_init__(self) -> None:
        check_pos(**{self.tile_field: self.tile})
        if self.kr != self.fixed_kr:
            raise LayoutError(f"{self.format} has kr={self.fixed_kr}, got kr={self.kr}")

    @classmethod
    def for_vl(cls, vl_bytes: int, units: int = 2):
        """The layout at vector length ``vl_bytes`` for a tile of ``units`` vectors of f32."""
        check_pos(vl_bytes=vl_bytes, units=units)
        if vl_bytes % 4:
            raise LayoutError(f"vector length {vl_bytes} bytes is not a multiple of 4")
        return cls(**{cls.tile_field: units * vl_bytes // 4})

    def k_padded(self, k: int) -> int:
        return roundup(k, self.kr)

    slot_head_bytes = 0     # bytes before a slot's bf16 values in a block (RHS: its f32 bias)

    @property
    def stride_expr(self) -> str:
        """Bytes per block as an expression in k (one source for Python and C getters)."""
        kr = self.kr
        return f"{self.tile} * ({self.slot_head_bytes} + (k + {kr - 1}) // {kr} * {kr} * 2)"

    def _block_stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    def packed_size(self, rows: int, k: int) -> int:
        return -(-rows // self.tile) * self._block_stride(k)

    def packed_offset(self, idx: int, k: int) -> int:
        if idx % self.tile:
            raise LayoutError(f"{self.tile_field[0]}_idx={idx} is not a multiple of "
                              f"{self.tile_field}={self.tile}")
        return idx // self.tile * self._block_stride(k)

    @property
    def tile(self) -> int:
        raise NotImplementedError

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one k-chunk (tile rows/columns x kr bf16 values)."""
        return self.tile * self.kr * 2

    def element_offset(self, x: int, t: int) -> int:
        """Offset of (slot x, element t) from the start of the block's bf16 data."""
        return ((t // self.kr) * self.tile * self.kr + x * self.kr + t % self.kr) * 2

    def _interleave(self, vals_u16: np.ndarray) -> np.ndarray:
        """(blocks*tile, kp) uint16 -> (blocks, kp*tile*2) bytes in [chunk][slot][kr] order."""
        rows, kp = vals_u16.shape
        T, kr = self.tile, self.kr
        G = rows // T
        d = vals_u16.reshape(G, T, kp // kr, kr).transpose(0, 2, 1, 3)
        return np.ascontiguousarray(d).astype(U16).view(np.uint8).reshape(G, kp * T * 2)

    def _deinterleave(self, data: np.ndarray, kp: int) -> np.ndarray:
        """Inverse of :meth:`_interleave`: (blocks, kp*tile*2) bytes -> (blocks*tile, kp) uint16."""
        G = data.shape[0]
        T, kr = self.tile, self.kr
        d = np.ascontiguousarray(data).view(U16).reshape(G, kp // kr, T, kr).transpose(0, 2, 1, 3)
        return d.reshape(G * T, kp)


# ----------------------------------------------------------------------------------------
# LHS
# ----------------------------------------------------------------------------------------
class _Bf16Lhs(_Bf16Blocks):
    mr: int
    role = "lhs"
    tile_field = "mr"
    repeat_pad_rows = False
    fixed_conversion = "f32 -> bf16 is round-to-nearest-even"

    @property
    def tile(self) -> int:
        return self.mr

    def row_block_stride(self, k: int) -> int:
        return self._block_stride(k)

    def region_size(self, m: int, k: int, m_idx_start: int = 0) -> int:
        """Bytes a pack call for m rows starting at row m_idx_start (a multiple of mr) touches."""
        if m_idx_start % self.mr:
            raise LayoutError(f"bf16 LHS packing starts at a row block: m_idx_start="
                              f"{m_idx_start} is not a multiple of mr={self.mr}")
        return self.packed_size(m, k) if m else 0

    def pack(self, x: np.ndarray) -> np.ndarray:
        """f32 rows (m, k) -> bf16 row blocks; K padding 0.  Padding rows of the last block are
        0 (SME packer) or a copy of the block's first row (NEON packers)."""
        x = _f32_2d(x, "lhs")
        m, k = x.shape
        G, kp = -(-m // self.mr), self.k_padded(k)
        v = np.zeros((G * self.mr, kp), U16)
        v[:m, :k] = f32_to_bf16_rne(x)
        if self.repeat_pad_rows and m % self.mr:
            v[m:] = v[(G - 1) * self.mr]
        return self._interleave(v).reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int) -> np.ndarray:
        """bf16 bits uint16 (m, kp) of the m packed rows (K padding included)."""
        b = flat_u8(buf)
        size = self.packed_size(m, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for m={m}, k={k}")
        G = -(-m // self.mr)
        return self._deinterleave(b[:size].reshape(G, -1), self.k_padded(k))[:m]


@dataclass(frozen=True)
class BF16PLhs4(_Bf16Lhs):
    """KleidiAI ``bf16p<mr>x4`` (NEON BFMMLA/BFDOT LHS; mr = 8 or 1).

    Row block of ``mr`` rows, stride ``mr * roundup(k, 4) * 2``: bf16 values ordered
    [k-chunk of 4][row 0..mr)[4].  K padding 0; padding rows repeat the block's first row."""

    format = "bf16px4"
    fixed_kr = 4
    packer_template = "lhs_pack_bf16px4_neon"
    packer_mr = ("fixed",)

    mr: int = 8
    kr: int = 4
    repeat_pad_rows = True


@dataclass(frozen=True)
class BF16PLhs2(_Bf16Lhs):
    """KleidiAI ``bf16p<mr>x2`` (SME BFMOPA LHS, mr = units * VL/4; ``bf16p2vlx2``: units = 2).

    Row block of ``mr`` rows, stride ``mr * roundup(k, 2) * 2``: bf16 values ordered
    [k-pair][row 0..mr)[2].  K padding and padding rows 0."""

    format = "bf16px2"
    fixed_kr = 2
    packer_template = "lhs_pack_kmajor_neon"     # with f32p: k-major row blocks, mr in VL units
    packer_template_sme = "lhs_pack_kmajor_sme"  # streaming twin (ZA transpose)
    packer_sme_isa = "sme2"                      # two-vector loads and BFCVT (SME2 kernels)
    packer_verb = "lhs_pack"
    packer_mr = ("vl",)                          # the LHS of SME kernels only
    packer_per_row = ("chunk_bytes",)

    mr: int
    kr: int = 2


# ----------------------------------------------------------------------------------------
# RHS
# ----------------------------------------------------------------------------------------
class _Bf16Rhs(_Bf16Blocks):
    nr: int
    role = "rhs"
    tile_field = "nr"
    slot_head_bytes = 4     # one f32 bias per column
    label_tail = "b"

    @property
    def tile(self) -> int:
        return self.nr

    @property
    def bias_bytes(self) -> int:
        """Bytes of the f32 bias row at the start of each block."""
        return self.nr * self.slot_head_bytes

    def data_offset(self, k: int = 0) -> int:
        """Start of the bf16 values inside a block (after the nr f32 biases)."""
        return self.bias_bytes

    def group_stride(self, k: int) -> int:
        return self._block_stride(k)

    def pack(self, w: np.ndarray, bias: np.ndarray | None = None, layout: str = "nk") -> np.ndarray:
        """f32 weights, (n, k) for ``layout="nk"`` or (k, n) for ``"kn"`` (KleidiAI's input),
        and optional f32 bias (n,) -> packed bytes.  The K padding of a valid column holds the
        bf16 of its K-row 0 (as KleidiAI writes it; the LHS K padding is 0, so it adds nothing);
        padding columns hold 0 values and a 0 bias."""
        w = _f32_2d(w, "weights")
        if layout == "kn":
            w = w.T
        elif layout != "nk":
            raise LayoutError(f"layout must be 'nk' or 'kn', got {layout!r}")
        n, k = w.shape
        b = np.zeros(n, F32)
        if bias is not None:
            b = np.asarray(bias)
            if b.dtype != np.float32 or b.shape != (n,):
                raise LayoutError(f"bias must be float32 of shape ({n},), got {b.dtype} {b.shape}")
        G, kp = -(-n // self.nr), self.k_padded(k)
        v = np.zeros((G * self.nr, kp), U16)
        bits = f32_to_bf16_rne(w)
        _check_bf16_range(w, bits)
        v[:n, :k] = bits
        v[:n, k:] = bits[:, :1]
        bb = np.zeros(G * self.nr, F32)
        bb[:n] = b
        out = np.concatenate([bb.view(np.uint8).reshape(G, 4 * self.nr), self._interleave(v)], axis=1)
        return out.reshape(-1)

    # -- repacking (tilegen.layout.api.repack_rhs): what pack takes, read back losslessly
    rhs_values = "bf16"     # bf16 weights (exact in f32 and in any bf16 layout), f32 bias

    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        v, bias = self.unpack(packed, n, k)       # K padding rewritten by pack
        return bf16_to_f32(v[:, :k]), bias        # weights (n, k) as f32, exact

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        w, bias = values
        return self.pack(np.ascontiguousarray(w), bias=bias)

    def unpack(self, buf: np.ndarray, n: int, k: int, rows=None) -> tuple[np.ndarray, np.ndarray]:
        """(bf16 bits uint16 (R, kp) incl. K padding, bias f32 (R,)) of columns ``rows``."""
        b = flat_u8(buf)
        size = self.packed_size(n, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for n={n}, k={k}")
        idx = np.arange(n) if rows is None else rows_index(rows, n)
        G = -(-n // self.nr)
        blk = b[:size].reshape(G, self.group_stride(k))
        bias = np.ascontiguousarray(blk[:, :4 * self.nr]).view(F32).reshape(-1)
        vals = self._deinterleave(blk[:, 4 * self.nr:], self.k_padded(k))
        return vals[idx], bias[idx].astype(np.float32)

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k): the bf16 weights as f32 (exact)."""
        v, _ = self.unpack(packed, n, k, rows)
        return bf16_to_f32(v[:, :k])


@dataclass(frozen=True)
class BF16PRhs4B(_Bf16Rhs):
    """KleidiAI ``bf16p<nr>x4b`` (``bf16p12x4biasf32``; NEON BFMMLA/BFDOT RHS, nr = 12).

    Column block of ``nr``, stride ``nr * (4 + roundup(k, 4) * 2)``: nr f32 biases, then bf16
    values ordered [k-chunk of 4][col 0..nr)[4].  KleidiAI never writes the bias slots of padding
    columns (zero here)."""

    format = "bf16px4b"
    fixed_kr = 4

    nr: int = 12
    kr: int = 4


@dataclass(frozen=True)
class BF16PRhs2B(_Bf16Rhs):
    """KleidiAI ``bf16p<nr>x2b`` (SME BFMOPA RHS, nr = units * VL/4; ``bf16p2vlx2b``: units = 2).

    Column block of ``nr``, stride ``nr * (4 + roundup(k, 2) * 2)``: nr f32 biases, then bf16
    values ordered [k-pair][col 0..nr)[2].  Padding columns 0 (bias and values)."""

    format = "bf16px2b"
    fixed_kr = 2

    nr: int
    kr: int = 2
