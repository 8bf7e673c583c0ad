"""int8 packed-LHS layouts of KleidiAI's quantised matmul kernels (activations quantised per
row or per block at run time), byte for byte.

=============================  ==================================================  ===================================
class                          KleidiAI packer                                     docs/layouts.md
=============================  ==================================================  ===================================
:class:`QAI8DXP`               ``kai_run_lhs_quant_pack_qai8dxp_f32``              layouts.md#qai8dxp
:class:`QSI8D32P`              ``kai_run_lhs_quant_pack_qsi8d32p_f32``             layouts.md#qsi8d32p
                               (``rounding="even"``: ``..._qsi8d32p4x8sb_f32_neon``)
:class:`QSI8D32PScaleTail`     ``kai_run_lhs_quant_pack_qsi8d32p_f32_neon``        layouts.md#qsi8d32p-scale-tail
=============================  ==================================================  ===================================

Each class is a frozen dataclass holding the format's geometry parameters.  It gives the
assembly generator the byte offsets and strides (methods/properties), the runtime the packed
sizes/offsets, and numpy packers/unpackers.  All packers return flat ``uint8`` arrays.

``pack(x, m_idx_start)`` takes the (m, k) float32 rows to pack (``x[0]`` is global row
``m_idx_start``) and returns the region a KleidiAI call with
``lhs_packed = base + packed_offset(m_idx_start, k)`` can touch:
``ceil(((m_idx_start % mr) + m) / mr)`` row blocks.  Slots of rows that are not packed (before
``m_idx_start`` in the first block, past the last row in the last block) are zero; KleidiAI leaves
them untouched and the kernels never use them.  (KleidiAI's qsi8d32p packers take the pointer to
row 0 of the whole matrix instead of the first packed row; that is a C-API detail only.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import (Interleaved, LayoutError, PackedLayout, PaddedSlots, RowBlocks, ScaleBlocks,
                   check_m_idx_start, eval_expr, f32_to_i32_sat, flat_u8,
                   round_half_away, rows_f32)

__all__ = ["QAI8DXP", "QSI8D32P", "QSI8D32PScaleTail"]

F32 = np.dtype("<f4")
I32 = np.dtype("<i4")
U16 = np.dtype("<u2")


class LhsRowBlocks(RowBlocks, Interleaved):
    """The interleaved packed-LHS layouts (row blocks, :class:`~tilegen.layout.base.RowBlocks`)."""

    def k_span_bytes(self, n: int) -> int:
        """Bytes that ``n`` consecutive k values of the row block's ``mr`` rows occupy in its
        int8 data (``n`` a multiple of L, within one k-block): the distance a kernel moves
        its LHS pointer to advance ``n`` values of k."""
        return n * self.mr


@dataclass(frozen=True)
class QAI8DXP(PaddedSlots, LhsRowBlocks):
    """KleidiAI ``qai8dxp<mr>x<L>``: per-row asymmetric int8, L = kr/sr interleave (docs/layouts.md#qai8dxp).

    Row block of ``mr`` rows (stride ``mr*(K32+8)``, ``K32 = roundup(k, 32)``)::

        +0            int8 data: K32/L chunks of mr*L bytes, chunk c = [row0: L][row1: L]...
        +mr*K32       mr x int32 offset (= -zero point)
        +mr*K32+4*mr  mr x f32 rscale (= 1/scale)
    """

    format = "qai8dxp"
    label_prefix = "qai8dxp"
    rounding = "away"     # fixed: values ties-away, zero point ties-even
    packer_template = "lhs_pack_qai8dxp_neon"
    packer_per_row = ("row_block_tail_bytes", "chunk_bytes", "rscale_after_offset")

    mr: int
    kr: int
    sr: int

    def __post_init__(self) -> None:
        L = self.check_interleave(mr=self.mr)
        if 32 % L:
            raise LayoutError(f"L = kr/sr = {L} must divide 32")

    # -- geometry (generator) ------------------------------------------------------------
    # rows are padded (repeating their last value) to a multiple of k_multiple values
    slots = property(lambda self: self.mr)
    offset_bytes = 4  # bytes of one row's offset (-zero point, int32)
    rscale_bytes = 4  # bytes of one row's reciprocal scale (f32)

    @property
    def row_tail_bytes(self) -> int:
        """Bytes each row adds to the row block after its int8 data (offset + rscale)."""
        return self.offset_bytes + self.rscale_bytes

    @property
    def row_block_tail_bytes(self) -> int:
        """Bytes after the int8 data of a row block: mr offsets, then mr rscales."""
        return self.mr * self.row_tail_bytes

    @property
    def rscale_after_offset(self) -> int:
        """Distance from the row block's offsets to its rscales (the mr int32 offsets)."""
        return self.mr * self.offset_bytes

    slot_tail_bytes = property(lambda self: self.row_tail_bytes)

    def row_block_stride(self, k: int) -> int:
        return self.slots_stride(k)

    def data_offset(self, k: int) -> int:
        return 0

    def offset_field_offset(self, k: int) -> int:
        """Start of the mr int32 offsets (-zero point) inside a row block."""
        return self.mr * self.k_padded(k)

    def rscale_offset(self, k: int) -> int:
        """Start of the mr f32 reciprocal scales inside a row block."""
        return self.offset_field_offset(k) + self.rscale_after_offset

    def element_offset(self, x: int, t: int) -> int:
        """Offset of (slot x, element t) inside a row block."""
        return (t // self.L) * self.mr * self.L + x * self.L + t % self.L

    # -- quantisation ------------------------------------------------------------------
    @staticmethod
    def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(m, k) float32 -> (q int8 (m, k), offset int32 (m,), rscale float32 (m,))
        (docs/layouts.md#qai8dxp-quant)."""
        f = np.float32
        mx = x.max(axis=1)
        mn = x.min(axis=1)
        # KAI_MIN(a, b) = a < b ? a : b and KAI_MAX(a, b) = a > b ? a : b, NaN included: for
        # finite rows with a subnormal range, scale = inf and 0 * inf = NaN reach these.
        rmin = np.where(f(0) < mn, f(0), mn)
        rmax = np.where(f(0) > mx, f(0), mx)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            scale = np.where(rmin == rmax, f(1), f(255) / (rmax - rmin)).astype(f)
            rscale = np.where(scale == 0, f(0), f(1) / scale).astype(f)
            dmin = (rmin * scale).astype(f)
            dmax = (rmax * scale).astype(f)
            e1 = f(-128) + dmin
            e2 = f(127) + dmax
            zp = np.where((e1 + e2) > 0, f(-128) - dmin, f(127) - dmax).astype(f)
            zp = np.where(zp > f(-128), zp, f(-128))
            zp = np.where(zp < f(127), zp, f(127))
            nzp = np.rint(zp).astype(np.int64)                     # ties to even
            v = (x * scale[:, None]).astype(f)
            r = f32_to_i32_sat(round_half_away(v))             # ties away, (int32_t) saturating
        r = (r + nzp[:, None] + 2 ** 31) % 2 ** 32 - 2 ** 31      # int32 wrap-around of the add
        q = np.clip(r, -128, 127).astype(np.int8)
        return q, (-nzp).astype(np.int32), rscale

    # -- packer ------------------------------------------------------------------------
    @property
    def activation_limit(self) -> tuple[float, str]:
        """Largest |x| this format represents, and why: the per-row scale spans the range."""
        return (float(np.finfo(np.float32).max) / 2,
                "the per-row range max(x) - min(x) must be a finite float32")

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        """Quantise and pack rows ``x`` (float32 (m, k), x[0] = global row m_idx_start)."""
        x = rows_f32(x)
        m_idx_start = check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1:
            raise LayoutError("qai8dxp needs k >= 1")
        if m == 0:
            return np.zeros(0, np.uint8)
        mr, L = self.mr, self.L
        K32 = self.k_padded(k)
        nblk, rb, slot = self.placement(m, m_idx_start)
        q, off, rs = self.quantize_rows(x)
        qf = np.empty((m, K32), np.int8)
        qf[:, :k] = q
        qf[:, k:] = q[:, k - 1:k]                                  # pad repeats the last value
        data = np.zeros((nblk, K32 // L, mr, L), np.int8)
        data[rb, :, slot, :] = qf.reshape(m, K32 // L, L)
        offs = np.zeros((nblk, mr), I32)
        offs[rb, slot] = off
        rsc = np.zeros((nblk, mr), F32)
        rsc[rb, slot] = rs
        out = np.concatenate([data.view(np.uint8).reshape(nblk, -1),
                              offs.view(np.uint8).reshape(nblk, -1),
                              rsc.view(np.uint8).reshape(nblk, -1)], axis=1)
        return out.reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int, m_idx_start: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Read back (q int8 (m, K32), offset int32 (m,), rscale float32 (m,)) from a region as
        returned by :meth:`pack` (or a whole buffer with m_idx_start = 0)."""
        b = flat_u8(buf)
        m_idx_start = check_m_idx_start(m_idx_start)
        mr, L = self.mr, self.L
        K32 = self.k_padded(k)
        S = self.row_block_stride(k)
        need = self.region_size(m, k, m_idx_start)
        if b.size < need:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {need} needed for m={m}, k={k}")
        if m == 0:
            return np.zeros((0, K32), np.int8), np.zeros(0, np.int32), np.zeros(0, np.float32)
        nblk = need // S
        blk = b[:need].reshape(nblk, S)
        data = np.ascontiguousarray(blk[:, :mr * K32]).view(np.int8).reshape(nblk, K32 // L, mr, L)
        o, r = self.offset_field_offset(k), self.rscale_offset(k)
        offs = np.ascontiguousarray(blk[:, o:r]).view(I32)
        rsc = np.ascontiguousarray(blk[:, r:]).view(F32)
        _, rb, slot = self.placement(m, m_idx_start)
        q = data[rb, :, slot, :].reshape(m, K32)
        return q, offs[rb, slot].astype(np.int32), rsc[rb, slot].astype(np.float32)


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p (per-block symmetric int8, f16 scales)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI8D32P(LhsRowBlocks):
    """KleidiAI ``qsi8d32p<mr>x<L>``: per-bl-block symmetric int8 with f16 scales.

    Group of ``mr`` rows, per k-block ``b`` (``block_stride = mr*(bl+2)`` bytes)::

        +b*block_stride           mr x f16 scale (slot order)
        +b*block_stride + 2*mr    bl/L chunks, chunk c = [slot0: L int8]...[slot mr-1: L int8]

    ``rounding="away"`` is ``kai_lhs_quant_pack_qsi8d32p_f32`` (C ``roundf``), ``"even"`` is
    ``kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon`` (FCVTNS).  This model follows the layout for
    every ``m_idx_start`` and geometry; KleidiAI's own 4x8sb code exists only for (4, 16, 2) and
    agrees with it only when ``m_idx_start % 4 == 0`` (or fewer than 4 rows are packed) and the
    source rows are contiguous (docs/layouts.md#qsi8d32p-quant).
    """

    mr: int
    kr: int
    sr: int
    bl: int = 32
    rounding: str = "away"

    format = "qsi8d32p"
    label_prefix = "qsi8d32p"
    packer_template = "lhs_pack_qsi8d32p_neon"
    packer_per_row = ("chunk_bytes", "data_offset_in_block")
    packer_quad = True
    packer_lhs_at_row0 = True

    def __post_init__(self) -> None:
        L = self.check_interleave(mr=self.mr, bl=self.bl)
        if self.bl % L:
            raise LayoutError(f"L = kr/sr = {L} must divide bl={self.bl}")
        if self.rounding not in ("away", "even"):
            raise LayoutError(f"rounding must be one of away, even; got {self.rounding!r}")

    @classmethod
    def check_packer_geometry(cls, kr: int, sr: int) -> None:
        """One generated routine serves every bl: L must divide 32 (not only the bl of one
        call), and its groups of 4 values need L a multiple of 4."""
        L = kr // sr
        if L % 4 or 32 % L:
            raise LayoutError(f"qsi8d32p needs L = kr/sr to be a multiple of 4 dividing 32 "
                              f"(4, 8, 16 or 32), got L={L} (kr={kr}, sr={sr})")

    # -- geometry ----------------------------------------------------------------------

    scale_bytes = 2  # bytes of one row's scale per k-block (f16)

    @property
    def data_offset_in_block(self) -> int:
        """The k-block's int8 data follows its mr scales (which start the block)."""
        return self.mr * self.scale_bytes

    @property
    def block_stride(self) -> int:
        """Bytes of one k-block of one row group: mr f16 scales + mr*bl int8."""
        return self.mr * (self.bl + self.scale_bytes)

    @property
    def chunk_bytes(self) -> int:
        return self.mr * self.L

    @property
    def stride_expr(self) -> str:
        """Bytes per row group as an expression in k and bl (Python and C getters)."""
        return f"{self.mr} * (k // bl) * (bl + {self.scale_bytes})"

    def row_block_stride(self, k: int) -> int:
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)

    def scale_offset(self, b: int) -> int:
        return b * self.block_stride

    def data_offset(self, b: int) -> int:
        return b * self.block_stride + self.data_offset_in_block

    def element_offset(self, x: int, e: int) -> int:
        """Offset of (slot x, element e of the row) inside a row group."""
        b, eb = divmod(e, self.bl)
        return self.data_offset(b) + (eb // self.L) * self.mr * self.L + x * self.L + eb % self.L

    # -- quantisation ------------------------------------------------------------------
    def quantize_rows(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(m, k) float32 -> (q int8 (m, k), f16 scale bits uint16 (m, k/bl))."""
        f = np.float32
        m, k = x.shape
        B = self.num_blocks(k)
        xb = x.reshape(m, B, self.bl)
        amax = np.maximum(np.abs(xb).max(axis=2), f(0))
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            d = (amax / f(127)).astype(f)
            inv = np.where(d != 0, f(1) / d, f(0)).astype(f)
            v = (xb * inv[..., None]).astype(f)
            r = round_half_away(v) if self.rounding == "away" else np.rint(v)
            scale = d.astype(np.float16).view(np.uint16)
        q = f32_to_i32_sat(r).astype(np.int8)          # low byte of the int32
        return q.reshape(m, k), scale

    @property
    def activation_limit(self) -> tuple[float, str]:
        """Largest |x| this format represents, and why: the per-block scale is an f16."""
        return (127 * float(np.finfo(np.float16).max),
                "the per-block scale max|x|/127 is stored as f16, largest 65504")

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        """Quantise and pack rows ``x`` (float32 (m, k), x[0] = global row m_idx_start)."""
        x = rows_f32(x)
        m_idx_start = check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        if m == 0:
            return np.zeros(0, np.uint8)
        mr, L, bl = self.mr, self.L, self.bl
        B = k // bl
        nblk, rb, slot = self.placement(m, m_idx_start)
        q, sc = self.quantize_rows(x)
        scales = np.zeros((nblk, B, mr), U16)
        scales[rb, :, slot] = sc
        data = np.zeros((nblk, B, bl // L, mr, L), np.int8)
        data[rb, :, :, slot, :] = q.reshape(m, B, bl // L, L)
        out = np.concatenate([scales.view(np.uint8).reshape(nblk, B, 2 * mr),
                              data.view(np.uint8).reshape(nblk, B, mr * bl)], axis=2)
        return out.reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int, m_idx_start: int = 0
               ) -> tuple[np.ndarray, np.ndarray]:
        """Read back (q int8 (m, k), f16 scale bits uint16 (m, k/bl))."""
        b = flat_u8(buf)
        m_idx_start = check_m_idx_start(m_idx_start)
        mr, L, bl = self.mr, self.L, self.bl
        B = self.num_blocks(k)
        need = self.region_size(m, k, m_idx_start)
        if b.size < need:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {need} needed for m={m}, k={k}")
        if m == 0:
            return np.zeros((0, k), np.int8), np.zeros((0, B), np.uint16)
        nblk = need // self.row_block_stride(k)
        blk = b[:need].reshape(nblk, B, self.block_stride)
        d0 = self.data_offset_in_block
        scales = np.ascontiguousarray(blk[..., :d0]).view(U16)                        # (nblk, B, mr)
        data = np.ascontiguousarray(blk[..., d0:]).view(np.int8).reshape(nblk, B, bl // L, mr, L)
        _, rb, slot = self.placement(m, m_idx_start)
        q = data[rb, :, :, slot, :].reshape(m, k)
        return q, scales[rb, :, slot].astype(np.uint16)


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p with the scales behind the values (the "_neon" packer)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI8D32PScaleTail(RowBlocks, ScaleBlocks, PackedLayout):
    """The block-symmetric int8 LHS of ``kai_run_lhs_quant_pack_qsi8d32p_f32_neon``
    (docs/layouts.md#qsi8d32p-scale-tail): the quantisation of
    :class:`QSI8D32P` (ties away), another byte order.

    Row block of ``mr`` rows, stride ``mr * (k/bl) * (bl + 2)``::

        +0          int8 values, k/kr chunks over the whole row (blocks do not interrupt them):
                    chunk c = [slot0: kr][slot1: kr]...[slot mr-1: kr]
        +mr*k       f16 scales ordered [block][slot]

    KleidiAI requires kr = 4 and bl = 32 and ignores sr; the kernel that reads it
    (``qsi8d32p1x4_..._sme2_sdot``) has mr = 1."""

    format = "qsi8d32pscaletail"
    label_prefix = "qsi8d32p"
    name_suffix = "scaletail"
    scale_bytes = 2
    rounding = "away"       # the quantisation of QSI8D32P, ties away (no option)
    # the generated packer: the qsi8d32p template's scale-tail mode, one row per block (the
    # gemv's LHS)
    packer_template = "lhs_pack_qsi8d32p_neon"
    packer_mr = ("fixed",)
    packer_rows = (1,)
    packer_lhs_at_row0 = True

    @classmethod
    def check_packer_geometry(cls, kr: int, sr: int) -> None:
        if (kr, sr) != (4, 1):
            raise LayoutError(f"the qsi8d32p scale-tail packer takes kr = 4, sr = 1 (KleidiAI's "
                              f"kr; the layout ignores sr), got kr={kr}, sr={sr}")

    mr: int
    kr: int = 4
    sr: int = 1
    bl: int = 32

    def __post_init__(self) -> None:
        self.check_blocks(mr=self.mr)
        if self.bl % self.kr:
            raise LayoutError(f"bl={self.bl} must be a multiple of kr={self.kr}")
        if self.sr != 1:    # KleidiAI ignores sr: one layout per (mr, kr), named with sr = 1
            raise LayoutError(f"the qsi8d32p scale-tail layout takes sr = 1, got sr={self.sr}")

    @property
    def label(self) -> str:
        return self.label_for(self.mr, self.kr, 1)

    @property
    def chunk_bytes(self) -> int:
        return self.mr * self.kr

    @property
    def stride_expr(self) -> str:
        """Bytes per row block as an expression in k and bl."""
        return f"{self.mr} * (k // bl) * (bl + {self.scale_bytes})"

    def row_block_stride(self, k: int) -> int:
        return self.blocks_stride(k)

    def data_bytes(self, k: int) -> int:
        """Bytes of the int8 values of a row block (the scales follow them)."""
        return self.mr * k

    def scale_offset(self, x: int, b: int, k: int) -> int:
        """Offset of the scale of (slot x, block b) inside a row block."""
        return self.data_bytes(k) + (b * self.mr + x) * self.scale_bytes

    def element_offset(self, x: int, e: int) -> int:
        """Offset of (slot x, element e of the row) inside a row block."""
        return (e // self.kr) * self.chunk_bytes + x * self.kr + e % self.kr

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        x = rows_f32(x)
        m_idx_start = check_m_idx_start(m_idx_start)
        m, k = x.shape
        B = self.num_blocks(k)
        if m == 0:
            return np.zeros(0, np.uint8)
        q, sc = QSI8D32P(1, 4, 1, self.bl, "away").quantize_rows(x)
        nblk, rb, slot = self.placement(m, m_idx_start)
        mr, kr = self.mr, self.kr
        data = np.zeros((nblk, k // kr, mr, kr), np.int8)
        data[rb, :, slot, :] = q.reshape(m, k // kr, kr)
        scales = np.zeros((nblk, B, mr), U16)
        scales[rb, :, slot] = sc
        return np.concatenate([data.view(np.uint8).reshape(nblk, -1),
                               scales.view(np.uint8).reshape(nblk, -1)], axis=1).reshape(-1)
