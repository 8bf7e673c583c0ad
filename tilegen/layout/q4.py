"""int8 LHS / int4 RHS layouts of KleidiAI's quantised matmul kernels, byte for byte.

=====================  ==============================================  ==========================
class                  KleidiAI packer                                 docs/layouts.md
=====================  ==============================================  ==========================
:class:`QAI8DXP`       ``kai_run_lhs_quant_pack_qai8dxp_f32``          layouts.md#qai8dxp
:class:`QSI8D32P`      ``kai_run_lhs_quant_pack_qsi8d32p_f32``          layouts.md#qsi8d32p
                       (``rounding="even"``: ``..._qsi8d32p4x8sb_f32_neon``)
:class:`QSI4C32P`      ``kai_run_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0``    layouts.md#qsi4c32p
:class:`QSI4C32PScaleF16` ``kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0``  layouts.md#qsi4c32pscalef16
=====================  ==============================================  ==========================

Each class is a frozen dataclass holding the format's geometry parameters.  It gives the
assembly generator the byte offsets and strides (methods/properties), the runtime the packed
sizes/offsets, and numpy packers/unpackers.  All packers return flat ``uint8`` arrays.

Conventions shared by the LHS packers: ``pack(x, m_idx_start)`` takes the (m, k) float32 rows
to pack (``x[0]`` is global row ``m_idx_start``) and returns the region a KleidiAI call with
``lhs_packed = base + packed_offset(m_idx_start, k)`` can touch:
``ceil(((m_idx_start % mr) + m) / mr)`` row blocks.  Slots of rows that are not packed (before
``m_idx_start`` in the first block, past the last row in the last block) are zero; KleidiAI leaves
them untouched and the kernels never use them.  (KleidiAI's qsi8d32p packers take the pointer to
row 0 of the whole matrix instead of the first packed row; that is a C-API detail only.)

RHS packers replicate row ``n - 1`` into the padding slots of the last nr-group, as KleidiAI does.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..reference import fma_f32
from .base import LayoutError, PackedLayout, eval_expr, roundup
from .ggml import as_bytes, check_block_scales, dequantize_q4_0, quantize_q4_0, split_q4_0

__all__ = ["QAI8DXP", "QSI8D32P", "QSI4C32P", "QSI4C32PScaleF16",
           "f32_to_bf16_rne", "bf16_to_f32", "f16_bits_to_f32"]

F32 = np.dtype("<f4")
I32 = np.dtype("<i4")
U16 = np.dtype("<u2")


# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------
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


def f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """raw IEEE half bits -> float32 (exact)."""
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint16)).view(np.float16).astype(np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C roundf on float32 values (exact: v - trunc(v) is exact in f32)."""
    t = np.trunc(v)
    f = v - t
    return t + np.where(np.abs(f) >= np.float32(0.5), np.sign(v), np.float32(0)).astype(v.dtype)


def _f32_to_i32_sat(v: np.ndarray) -> np.ndarray:
    """AArch64 float -> int32 conversion of already-integral values (saturating, NaN -> 0)."""
    v = np.where(np.isnan(v), 0.0, np.clip(v.astype(np.float64), -2.0 ** 31, 2.0 ** 31 - 1))
    return v.astype(np.int64)


def _rows_f32(x, what: str = "lhs") -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise LayoutError(f"{what} must be float32, got {x.dtype}")
    if x.ndim != 2:
        raise LayoutError(f"{what} must be 2-D (rows, k), got shape {x.shape}")
    return x


def _u8(buf, what: str = "packed buffer") -> np.ndarray:
    b = np.asarray(buf)
    if b.dtype != np.uint8:
        b = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return b.reshape(-1)


def _check_pos(**kw) -> None:
    for name, v in kw.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise LayoutError(f"{name} must be a positive integer, got {v!r}")


def _check_m_idx_start(m_idx_start) -> int:
    if not isinstance(m_idx_start, (int, np.integer)) or m_idx_start < 0:
        raise LayoutError(f"m_idx_start must be a non-negative integer, got {m_idx_start!r}")
    return int(m_idx_start)


def _rows_index(rows, n: int) -> np.ndarray:
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise LayoutError(f"row indices must be in [0, {n}), got {idx.min()}..{idx.max()}")
    return idx


# ----------------------------------------------------------------------------------------
# LHS: qai8dxp (dynamic per-row asymmetric int8)
# ----------------------------------------------------------------------------------------
class _Interleaved(PackedLayout):
    """Shared by the q4 layouts: interleave chunk L = kr/sr and blocks of bl elements."""

    def _check_interleave(self, **positive) -> int:
        """The rules every interleaved layout shares: positive geometry, a whole chunk
        L = kr/sr and (layouts with blocks, ``bl`` among ``positive``) ggml's block multiple
        of 32; returns L."""
        _check_pos(kr=self.kr, sr=self.sr, **positive)
        if self.kr % self.sr:
            raise LayoutError(f"kr={self.kr} must be a multiple of sr={self.sr}")
        if "bl" in positive and self.bl % 32:
            raise LayoutError(f"bl={self.bl} must be a multiple of 32")
        return self.kr // self.sr

    @property
    def L(self) -> int:
        return self.kr // self.sr

    def num_blocks(self, k: int) -> int:
        if k % self.bl:
            raise LayoutError(f"k={k} is not a multiple of bl={self.bl}")
        return k // self.bl


def _region_blocks(m: int, mr: int, m_idx_start: int) -> int:
    """Row blocks a pack call for m rows starting at m_idx_start touches."""
    return -(-((m_idx_start % mr) + m) // mr) if m else 0


class _RowBlocks:
    """Sizes and offsets of a packed-LHS layout made of ceil(m / mr) row blocks of
    ``row_block_stride(k)`` bytes (the q4 layouts here, the SME ones in layout.q4_sme)."""

    def packed_size(self, m: int, k: int) -> int:
        return -(-m // self.mr) * self.row_block_stride(k)

    def packed_offset(self, m_idx: int, k: int) -> int:
        return (m_idx // self.mr) * self.row_block_stride(k)

    def region_size(self, m: int, k: int, m_idx_start: int = 0) -> int:
        """Bytes a pack call for m rows starting at m_idx_start can touch."""
        return _region_blocks(m, self.mr, m_idx_start) * self.row_block_stride(k)


class _LhsRowBlocks(_RowBlocks, _Interleaved):
    """The interleaved packed-LHS layouts (row blocks, :class:`_RowBlocks`)."""

    def k_span_bytes(self, n: int) -> int:
        """Bytes that ``n`` consecutive k values of the row block's ``mr`` rows occupy in its
        int8 data (``n`` a multiple of L, within one k-block): the distance a kernel moves
        its LHS pointer to advance ``n`` values of k."""
        return n * self.mr


class _RhsGroups(_Interleaved):
    """Sizes and offsets of the packed-RHS layouts: ceil(n / nr) groups of
    ``group_stride(k)`` bytes."""

    def packed_size(self, n: int, k: int) -> int:
        return -(-n // self.nr) * self.group_stride(k)

    def packed_offset(self, n_idx: int, k: int) -> int:
        if n_idx % self.nr:
            raise LayoutError(f"n_idx={n_idx} is not a multiple of nr={self.nr}")
        return (n_idx // self.nr) * self.group_stride(k)


class _PaddedSlots:
    """Blocks of ``slots`` rows (LHS) or columns (RHS) whose k values are padded to
    ``k_multiple`` and interleaved in chunks of L, then ``slot_tail_bytes`` per slot."""

    k_multiple = 32

    def k_padded(self, k: int) -> int:
        return roundup(k, self.k_multiple)

    @property
    def stride_expr(self) -> str:
        """Bytes per block as an expression in k (one source for Python and C getters)."""
        km = self.k_multiple
        return f"{self.slots} * ((k + {km - 1}) // {km} * {km} + {self.slot_tail_bytes})"

    def _stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one interleave chunk (the block's slots x L values)."""
        return self.slots * self.L


@dataclass(frozen=True)
class QAI8DXP(_PaddedSlots, _LhsRowBlocks):
    """KleidiAI ``qai8dxp<mr>x<L>``: per-row asymmetric int8, L = kr/sr interleave (docs/layouts.md#qai8dxp).

    Row block of ``mr`` rows (stride ``mr*(K32+8)``, ``K32 = roundup(k, 32)``)::

        +0            int8 data: K32/L chunks of mr*L bytes, chunk c = [row0: L][row1: L]...
        +mr*K32       mr x int32 offset (= -zero point)
        +mr*K32+4*mr  mr x f32 rscale (= 1/scale)
    """

    format = "qai8dxp"
    role = "lhs"
    label_prefix = "qai8dxp"
    rounding = "away"     # fixed: values ties-away, zero point ties-even

    mr: int
    kr: int
    sr: int

    def __post_init__(self) -> None:
        L = self._check_interleave(mr=self.mr)
        if 32 % L:
            raise LayoutError(f"L = kr/sr = {L} must divide 32")

    @property
    def L(self) -> int:
        """Bytes of one row written contiguously (interleave chunk)."""
        return self.kr // self.sr

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
        return self._stride(k)

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
            r = _f32_to_i32_sat(_round_half_away(v))             # ties away, (int32_t) saturating
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
        x = _rows_f32(x)
        m_idx_start = _check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1:
            raise LayoutError("qai8dxp needs k >= 1")
        if m == 0:
            return np.zeros(0, np.uint8)
        mr, L = self.mr, self.L
        K32 = self.k_padded(k)
        first = m_idx_start % mr
        nblk = -(-(first + m) // mr)
        q, off, rs = self.quantize_rows(x)
        qf = np.empty((m, K32), np.int8)
        qf[:, :k] = q
        qf[:, k:] = q[:, k - 1:k]                                  # pad repeats the last value
        g = first + np.arange(m)
        rb, slot = g // mr, g % mr
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
        b = _u8(buf)
        m_idx_start = _check_m_idx_start(m_idx_start)
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
        g = m_idx_start % mr + np.arange(m)
        rb, slot = g // mr, g % mr
        q = data[rb, :, slot, :].reshape(m, K32)
        return q, offs[rb, slot].astype(np.int32), rsc[rb, slot].astype(np.float32)


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p (per-block symmetric int8, f16 scales)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI8D32P(_LhsRowBlocks):
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
    role = "lhs"
    label_prefix = "qsi8d32p"

    def __post_init__(self) -> None:
        L = self._check_interleave(mr=self.mr, bl=self.bl)
        if self.bl % L:
            raise LayoutError(f"L = kr/sr = {L} must divide bl={self.bl}")
        if self.rounding not in ("away", "even"):
            raise LayoutError(f"rounding must be one of away, even; got {self.rounding!r}")


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
            r = _round_half_away(v) if self.rounding == "away" else np.rint(v)
            scale = d.astype(np.float16).view(np.uint16)
        q = _f32_to_i32_sat(r).astype(np.int8)          # low byte of the int32
        return q.reshape(m, k), scale

    @property
    def activation_limit(self) -> tuple[float, str]:
        """Largest |x| this format represents, and why: the per-block scale is an f16."""
        return (127 * float(np.finfo(np.float16).max),
                "the per-block scale max|x|/127 is stored as f16, largest 65504")

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        """Quantise and pack rows ``x`` (float32 (m, k), x[0] = global row m_idx_start)."""
        x = _rows_f32(x)
        m_idx_start = _check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        if m == 0:
            return np.zeros(0, np.uint8)
        mr, L, bl = self.mr, self.L, self.bl
        B = k // bl
        first = m_idx_start % mr
        nblk = -(-(first + m) // mr)
        q, sc = self.quantize_rows(x)
        g = first + np.arange(m)
        rb, slot = g // mr, g % mr
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
        b = _u8(buf)
        m_idx_start = _check_m_idx_start(m_idx_start)
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
        g = m_idx_start % mr + np.arange(m)
        rb, slot = g // mr, g % mr
        q = data[rb, :, :, slot, :].reshape(m, k)
        return q, scales[rb, :, slot].astype(np.uint16)


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32p (s1s0 input, bf16 scales, rsum, bias)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI4C32P(_RhsGroups):
    """KleidiAI ``qsi4c32p<nr>x<L>`` from ``kai_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0`` (docs/layouts.md#qsi4c32p).

    Group of ``nr`` rows (stride ``nr*(B*(bl/2+2) + 8)``, ``B = k/bl``)::

        +b*block_bytes                 block b: nr*bl/2 nibble bytes, then nr x bf16 scales
        +B*block_bytes                 nr x f32 rsum
        +B*block_bytes + 4*nr          nr x f32 bias

    Nibble bytes of a block: 32-chunks c of 16*nr bytes, each split in 16/L segments of
    nr*L bytes, each [slot0: L bytes]...; byte e = s4(t0) | s4(t0+16) << 4, t0 = c*32 + s*L + e.
    """

    nr: int
    kr: int
    sr: int
    bl: int = 32

    format = "qsi4c32p"
    role = "rhs"
    label_prefix = "qsi4c32p"

    def __post_init__(self) -> None:
        L = self._check_interleave(nr=self.nr, bl=self.bl)
        if self.bl % self.kr:
            raise LayoutError(f"bl={self.bl} must be a multiple of kr={self.kr}")
        if self.nr % 4:
            raise LayoutError(f"nr={self.nr} must be a multiple of 4")
        if L % 2 or 16 % L:
            raise LayoutError(f"L = kr/sr = {L} must be even and divide 16")


    # -- geometry ----------------------------------------------------------------------

    scale_bytes = 2  # bytes of one column's scale per k-block (bf16)

    @property
    def block_scales_bytes(self) -> int:
        """Bytes of a block's nr scales."""
        return self.nr * self.scale_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one k-block of one nr-group (data + scales)."""
        return self.block_data_bytes + self.block_scales_bytes

    @property
    def block_data_bytes(self) -> int:
        return self.nr * self.bl // 2

    @property
    def scale_offset_in_block(self) -> int:
        """The block's nr bf16 scales follow its nibble bytes."""
        return self.block_data_bytes

    @property
    def segment_bytes(self) -> int:
        """Bytes of one segment (nr slots x L bytes = 2L elements per slot)."""
        return self.nr * self.L

    chunk_k = 32  # k values of one chunk (the unit the kernels' inner loop consumes)

    @property
    def chunk_k_step(self) -> int:
        """k distance between the low-nibble elements of consecutive chunks (chunk c holds
        elements c*32 .. c*32+31)."""
        return self.chunk_k

    @property
    def pair_distance(self) -> int:
        """k distance from a byte's low-nibble element to its high-nibble element."""
        return self.chunk_k // 2

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one 32-element chunk of a block (16*nr)."""
        return self.nr * self.chunk_k // 2

    rsum_bytes = 4  # bytes of one column's rsum (f32)
    bias_bytes = 4  # bytes of one column's bias (f32)
    rsum_offset_in_tail = 0  # the group's tail (after its k-blocks) starts with the nr rsums 

    @property
    def bias_offset_in_tail(self) -> int:
        """... followed by the nr biases."""
        return self.rsum_offset_in_tail + self.nr * self.rsum_bytes

    @property
    def tail_bytes(self) -> int:
        """Bytes of a group's tail: nr rsums + nr biases."""
        return self.nr * (self.rsum_bytes + self.bias_bytes)

    @property
    def stride_expr(self) -> str:
        """Bytes per nr-group as an expression in k and bl (Python and C getters)."""
        return (f"{self.nr} * ((k // bl) * (bl // 2 + {self.scale_bytes}) + "
                f"{self.rsum_bytes + self.bias_bytes})")

    def group_stride(self, k: int) -> int:
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)

    def block_offset(self, b: int) -> int:
        return b * self.block_bytes

    def rsum_offset(self, k: int) -> int:
        return self.num_blocks(k) * self.block_bytes + self.rsum_offset_in_tail

    def bias_offset(self, k: int) -> int:
        return self.num_blocks(k) * self.block_bytes + self.bias_offset_in_tail

    # -- packers -----------------------------------------------------------------------
    def _check_k(self, k: int) -> int:
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        return k // self.bl

    def _bias(self, bias, n: int) -> np.ndarray:
        if bias is None:
            return np.zeros(n, F32)
        b = np.asarray(bias)
        if b.dtype != np.float32 or b.shape != (n,):
            raise LayoutError(f"bias must be float32 of shape ({n},), got {b.dtype} {b.shape}")
        return b

    def pack(self, rhs_s1s0: np.ndarray, scale_bf16: np.ndarray, bias: np.ndarray | None = None,
             *, k: int | None = None) -> np.ndarray:
        """KleidiAI's inputs -> packed bytes.

        rhs_s1s0: uint8 (n, rhs_stride), element 2t = low nibble of byte t, 2t+1 = high
        (u4, zero point 8); bytes past k/2 are ignored.  scale_bf16: raw bf16 bits, uint16
        (n, >= k/bl).  k defaults to ``scale_bf16.shape[1] * bl``.  bias: float32 (n,) or None.
        """
        r = np.asarray(rhs_s1s0)
        s = np.asarray(scale_bf16)
        if r.dtype != np.uint8 or r.ndim != 2:
            raise LayoutError(f"rhs must be a 2-D uint8 array (n, rhs_stride), got {r.dtype} {r.shape}")
        if s.dtype != np.uint16 or s.ndim != 2:
            raise LayoutError(f"scale_bf16 must be a 2-D uint16 array (n, k/bl) of raw bf16 bits, "
                              f"got {s.dtype} {s.shape}")
        n = r.shape[0]
        if n < 1 or s.shape[0] != n:
            raise LayoutError(f"rhs has {n} rows but scale_bf16 has {s.shape[0]} (need n >= 1)")
        if k is None:
            k = s.shape[1] * self.bl
        B = self._check_k(k)
        if s.shape[1] < B:
            raise LayoutError(f"scale_bf16 has {s.shape[1]} columns, k/bl = {B} needed")
        if r.shape[1] * 2 < k:
            raise LayoutError(f"rhs rows have {r.shape[1]} bytes, k/2 = {k // 2} needed")
        half = r[:, :k // 2]
        u = np.empty((n, k), np.uint8)
        u[:, 0::2] = half & 0x0F
        u[:, 1::2] = half >> 4
        return self._pack_u4(u, s[:, :B], self._bias(bias, n))

    def pack_u4(self, u4: np.ndarray, scale_bf16: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """Pack logical unsigned nibbles u4 (n, k) values 0..15 with raw bf16 scales (n, k/bl)."""
        u = np.asarray(u4)
        s = np.asarray(scale_bf16)
        if u.dtype != np.uint8 or u.ndim != 2:
            raise LayoutError(f"u4 must be a 2-D uint8 array (n, k), got {u.dtype} {u.shape}")
        n, k = u.shape
        B = self._check_k(k)
        if u.size and u.max() > 15:
            raise LayoutError("u4 values must be in 0..15")
        if s.dtype != np.uint16 or s.shape != (n, B):
            raise LayoutError(f"scale_bf16 must be uint16 of shape ({n}, {B}), got {s.dtype} {s.shape}")
        if n < 1:
            raise LayoutError("need n >= 1 rows")
        return self._pack_u4(u, s, self._bias(bias, n))

    def _pack_u4(self, u: np.ndarray, sbf: np.ndarray, bias: np.ndarray) -> np.ndarray:
        n, k = u.shape
        nr, L, bl = self.nr, self.L, self.bl
        B, C, Sg = k // bl, bl // 32, 16 // L
        G = -(-n // nr)
        rows = np.minimum(np.arange(G * nr), n - 1)                # replicate row n-1
        ub = u[rows].reshape(G * nr, B, C, 2, Sg, L)
        byte = (ub[:, :, :, 0] ^ 8) | ((ub[:, :, :, 1] ^ 8) << 4)   # (Np, B, C, Sg, L)
        data = byte.reshape(G, nr, B, C, Sg, L).transpose(0, 2, 3, 4, 1, 5).reshape(G, B, nr * bl // 2)
        s = np.ascontiguousarray(sbf[rows], dtype=U16)
        scl = np.ascontiguousarray(s.reshape(G, nr, B).transpose(0, 2, 1)).view(np.uint8)
        blocks = np.concatenate([data.astype(np.uint8), scl.reshape(G, B, 2 * nr)], axis=2)
        # rsum: one f32 rounding per segment of 2L elements, block -> chunk -> segment order
        v = ub.astype(np.int32) - 8
        p = (v[:, :, :, 0] + v[:, :, :, 1]).sum(axis=-1).astype(np.float32)   # (Np, B, C, Sg)
        sf = bf16_to_f32(s)
        rsum = np.zeros(G * nr, F32)
        for b in range(B):
            for c in range(C):
                for sg in range(Sg):
                    rsum = fma_f32(p[:, b, c, sg], sf[:, b], rsum)
        bb = np.ascontiguousarray(bias[rows], dtype=F32)
        out = np.concatenate([blocks.reshape(G, -1),
                              rsum.astype(F32).view(np.uint8).reshape(G, 4 * nr),
                              bb.view(np.uint8).reshape(G, 4 * nr)], axis=1)
        return out.reshape(-1)

    def pack_from_ggml(self, raw: np.ndarray, n: int, k: int, bias: np.ndarray | None = None) -> np.ndarray:
        """Pack ggml block_q4_0 bytes ((n, k/32*18) or flat); needs bl = 32.

        The f16 ``d`` of each block becomes the bf16 scale by **round-to-nearest-even** of its
        (exact) f32 value (f16 has 11 significant bits, bf16 8, so this is lossy: the packed
        weights are ``(q-8) * bf16(d)``, not exactly ggml's ``(q-8) * d``)."""
        if self.bl != 32:
            raise LayoutError(f"ggml block_q4_0 data has bl=32, this layout has bl={self.bl}")
        B = self._check_k(k)
        if n < 1:
            raise LayoutError("need n >= 1 rows")
        u, d = split_q4_0(raw, n, k)
        check_block_scales(d, "Q4_0")
        return self._pack_u4(u, f32_to_bf16_rne(f16_bits_to_f32(d)).reshape(n, B), self._bias(bias, n))

    def pack_from_float(self, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        """quantize_q4_0(w) then :meth:`pack_from_ggml` (bl = 32); |w| <= 8 x 65504, the
        range of Q4_0's f16 block scales (the bf16 scales here come from those)."""
        if self.bl != 32:
            raise LayoutError(f"pack_from_float quantises like ggml Q4_0 (bl=32); this layout has bl={self.bl}")
        raw = quantize_q4_0(w, strict=True)
        n, k = np.asarray(w).shape
        return self.pack_from_ggml(raw, n, k, bias)

    # -- readers -----------------------------------------------------------------------
    # -- repacking (tilegen.layout.api.repack_rhs): what pack takes, read back losslessly
    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        u4, scale_bf16, _, bias = self.unpack(packed, n, k)   # row sums follow dst's order
        return u4, scale_bf16, bias

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        return self.pack_u4(*values)

    def unpack(self, packed: np.ndarray, n: int, k: int, rows=None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(u4 uint8 (R, k), scale_bf16 uint16 (R, k/bl), rsum f32 (R,), bias f32 (R,)) of rows."""
        b = _u8(packed)
        nr, L, bl = self.nr, self.L, self.bl
        B, C, Sg = self.num_blocks(k), bl // 32, 16 // L
        size = self.packed_size(n, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for n={n}, k={k}")
        idx = np.arange(n) if rows is None else _rows_index(rows, n)
        G, GS = -(-n // nr), self.group_stride(k)
        grp = b[:size].reshape(G, GS)
        blocks = grp[:, :B * self.block_bytes].reshape(G, B, self.block_bytes)
        data = blocks[..., :self.block_data_bytes].reshape(G, B, C, Sg, nr, L)
        scl = np.ascontiguousarray(blocks[..., self.block_data_bytes:]).view(U16)   # (G, B, nr)
        tail = np.ascontiguousarray(grp[:, B * self.block_bytes:]).view(F32)        # (G, 2nr)
        g, i = idx // nr, idx % nr
        d = data[g, :, :, :, i, :]                                              # (R, B, C, Sg, L)
        u = np.stack([(d & 0x0F) ^ 8, (d >> 4) ^ 8], axis=3).reshape(idx.size, k)
        return (u.astype(np.uint8), scl[g, :, i].astype(np.uint16),
                tail[g, i].astype(np.float32), tail[g, nr + i].astype(np.float32))

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k) = (u - 8) * f32(bf16 scale), exact."""
        u, s, _, _ = self.unpack(packed, n, k, rows)
        R = u.shape[0]
        vals = (u.astype(np.int16) - 8).astype(np.float32).reshape(R, k // self.bl, self.bl)
        with np.errstate(invalid="ignore"):
            return (vals * bf16_to_f32(s)[..., None]).astype(np.float32).reshape(R, k)


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32pscalef16 (q4_0-style rows, f16 scales; llama.cpp's Q4_0 path)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI4C32PScaleF16(_RhsGroups):
    """KleidiAI's ``kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0`` output (docs/layouts.md#qsi4c32pscalef16).

    Group of ``nr`` rows (stride ``nr*B*(bl/2+2)``), per block ``b``
    (``block_stride = nr*(bl/2+2)``)::

        +b*block_stride           nr x f16 scale (raw copy)
        +b*block_stride + 2*nr    bl/kr segments of nr*kr/2 bytes: [slot0: kr/2 bytes]...
                                  = source data bytes s*kr/2 .. (s+1)*kr/2 - 1, XOR 0x88

    Source row = ``B`` blocks of ``[f16 d][bl/2 bytes]``; byte q = element q (low nibble) and
    element q + bl/2 (high nibble), unsigned with zero point 8.  For bl = 32 a source row is a
    row of ggml ``block_q4_0``.  The consumers pair element q with q + bl/2 (same section).
    """

    nr: int
    kr: int
    sr: int = 2
    bl: int = 32

    format = "qsi4c32pscalef16"
    role = "rhs"
    label_prefix = "qsi4c32p"         # KleidiAI's kernel names: qsi4c32p<nr>x<L>, as QSI4C32P
    name_suffix = "scalef16"

    def __post_init__(self) -> None:
        _check_pos(sr=self.sr)
        if self.sr != 2:
            raise LayoutError(f"qsi4c32pscalef16 needs sr=2, got sr={self.sr}")
        self._check_interleave(nr=self.nr, bl=self.bl)
        if self.kr > 16:
            raise LayoutError(f"qsi4c32pscalef16 needs kr <= 16, got kr={self.kr}")
        if self.bl % self.kr:
            raise LayoutError(f"bl={self.bl} must be a multiple of kr={self.kr}")



    # -- geometry ----------------------------------------------------------------------

    @property
    def src_block_bytes(self) -> int:
        """Bytes of one source block: f16 d + bl/2 data bytes (18 for bl = 32)."""
        return 2 + self.bl // 2

    def src_row_bytes(self, k: int) -> int:
        return self.num_blocks(k) * self.src_block_bytes

    scale_bytes = 2  # bytes of one column's scale per k-block (f16)
    scale_offset_in_block = 0  # the block's nr f16 scales start it 
    data_xor = 0x88  # each data byte XOR this: u4 (zero point 8) -> s4, both nibbles

    @property
    def data_offset_in_block(self) -> int:
        """... and its nibble bytes follow them."""
        return self.scale_offset_in_block + self.nr * self.scale_bytes

    @property
    def block_stride(self) -> int:
        return self.nr * (self.bl // 2 + self.scale_bytes)

    @property
    def segment_bytes(self) -> int:
        return self.nr * self.kr // 2

    chunk_k = 32  # k values of one chunk: 16 data bytes per column (the kernels' inner-loop unit)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one chunk of a block (16*nr)."""
        return self.nr * self.chunk_k // 2

    @property
    def chunk_k_step(self) -> int:
        """k distance between the low-nibble elements of consecutive chunks: chunk c holds
        elements 16c .. 16c+15 (low nibbles) and bl/2 + 16c .. (high nibbles)."""
        return self.chunk_k // 2

    @property
    def pair_distance_bl_shift(self) -> int:
        """A byte's high-nibble element is ``bl >> pair_distance_bl_shift`` after its low one
        (bl is a run-time argument of the kernels)."""
        return 1

    @property
    def segments_per_block(self) -> int:
        return self.bl // self.kr

    @property
    def stride_expr(self) -> str:
        """Bytes per nr-group as an expression in k and bl (Python and C getters)."""
        return f"{self.nr} * (k // bl) * (bl // 2 + {self.scale_bytes})"

    def group_stride(self, k: int) -> int:
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)

    def scale_offset(self, b: int) -> int:
        return b * self.block_stride + self.scale_offset_in_block

    def data_offset(self, b: int) -> int:
        return b * self.block_stride + self.data_offset_in_block

    # -- packers -----------------------------------------------------------------------
    def _shape(self, raw: np.ndarray, n, k) -> tuple[int, int]:
        sb = self.src_block_bytes
        if n is None and k is None:
            if raw.ndim != 2:
                raise LayoutError(f"source rows must be 2-D (n, k/bl*{sb}) bytes, or pass n and k; "
                                  f"got shape {raw.shape}")
            n, rb = raw.shape
            if rb == 0 or rb % sb:
                raise LayoutError(f"source row length {rb} is not a positive multiple of {sb} "
                                  f"bytes (f16 scale + bl/2 data bytes, bl={self.bl})")
            k = rb // sb * self.bl
        elif n is None or k is None:
            raise LayoutError("pass both n and k (or neither, with 2-D source rows)")
        n, k = int(n), int(k)
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        if n < 1:
            raise LayoutError("need n >= 1 rows")
        if raw.size != n * self.src_row_bytes(k):
            raise LayoutError(f"source for n={n}, k={k}, bl={self.bl} must hold "
                              f"{n * self.src_row_bytes(k)} bytes, got shape {raw.shape}")
        return n, k

    def pack(self, raw: np.ndarray, n: int | None = None, k: int | None = None, *,
             finite_scales: bool = False) -> np.ndarray:
        """Pack source rows (uint8 (n, B*(2+bl/2)), or flat with n and k); bl = 32 means ggml
        block_q4_0 rows, byte for byte; bytes-like objects are taken as flat bytes.
        ``finite_scales``: refuse a block whose f16 scale is NaN or Inf (KleidiAI's packer
        copies any bits)."""
        raw = as_bytes(raw)
        if raw.dtype != np.uint8:
            raise LayoutError(f"source rows must be uint8 bytes, got {raw.dtype}")
        n, k = self._shape(raw, n, k)
        if finite_scales:
            check_block_scales(split_q4_0(raw, n, k, bl=self.bl)[1], "Q4_0")
        nr, kr, bl = self.nr, self.kr, self.bl
        B, G = k // bl, -(-n // nr)
        rows = np.minimum(np.arange(G * nr), n - 1)
        src = np.ascontiguousarray(raw).reshape(n, B, self.src_block_bytes)[rows]
        scales = src[..., :2].reshape(G, nr, B, 2).transpose(0, 2, 1, 3).reshape(G, B, 2 * nr)
        data = (src[..., 2:] ^ np.uint8(self.data_xor)).reshape(G, nr, B, bl // kr, kr // 2)
        data = data.transpose(0, 2, 3, 1, 4).reshape(G, B, nr * bl // 2)
        return np.concatenate([scales, data], axis=2).reshape(-1)

    @staticmethod
    def require_no_bias(bias) -> None:
        if bias is not None:
            raise LayoutError("qsi4c32pscalef16 weights carry no bias (KleidiAI's packer requires "
                              "bias=NULL): pass the bias to matmul(bias=) instead")

    def pack_from_ggml(self, raw: np.ndarray, n: int | None = None, k: int | None = None,
                       bias: None = None) -> np.ndarray:
        """:meth:`pack` for ggml block_q4_0 bytes (needs bl = 32); ``bias`` must be None."""
        self.require_no_bias(bias)
        if self.bl != 32:
            raise LayoutError(f"ggml block_q4_0 data has bl=32, this layout has bl={self.bl}")
        return self.pack(raw, n, k, finite_scales=True)

    def pack_from_float(self, w: np.ndarray, bias: None = None) -> np.ndarray:
        """Quantise float32 (n, k) like ggml Q4_0 (per bl-block; bl = 32 is ggml's) and pack;
        ``bias`` must be None; |w| <= 8 x 65504 (the f16 block scales' range)."""
        self.require_no_bias(bias)
        return self.pack(quantize_q4_0(w, bl=self.bl, strict=True))

    # -- readers -----------------------------------------------------------------------
    # -- repacking (tilegen.layout.api.repack_rhs): what pack takes, read back losslessly
    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        return (self.unpack(packed, n, k),)                   # the q4_0-style source rows

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        return self.pack(values[0], n, k)

    def unpack(self, packed: np.ndarray, n: int, k: int, rows=None) -> np.ndarray:
        """Source bytes of ``rows`` (uint8 (R, B*(2+bl/2))): the inverse of :meth:`pack`."""
        b = _u8(packed)
        nr, kr, bl = self.nr, self.kr, self.bl
        B = self.num_blocks(k)
        size = self.packed_size(n, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for n={n}, k={k}")
        idx = np.arange(n) if rows is None else _rows_index(rows, n)
        G = -(-n // nr)
        blk = b[:size].reshape(G, B, self.block_stride)
        s0, d0 = self.scale_offset_in_block, self.data_offset_in_block
        scales = blk[..., s0:d0].reshape(G, B, nr, 2)
        data = blk[..., d0:].reshape(G, B, bl // kr, nr, kr // 2)
        g, i = idx // nr, idx % nr
        d = scales[g, :, i, :]                                            # (R, B, 2)
        q = (data[g, :, :, i, :] ^ np.uint8(self.data_xor)).reshape(idx.size, B, bl // 2)
        return np.concatenate([d, q], axis=2).reshape(idx.size, B * self.src_block_bytes)

    def unpack_values(self, packed: np.ndarray, n: int, k: int, rows=None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(s4 values int8 (R, k) in k order = u - 8, f16 scale bits uint16 (R, k/bl))."""
        src = self.unpack(packed, n, k, rows)
        u, d = split_q4_0(src, src.shape[0], k, bl=self.bl)
        return (u.astype(np.int8) - 8).astype(np.int8), d

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k) = (q - 8) * f32(f16 d); for bl = 32 identical to ggml/gguf's
        Q4_0 dequantisation of the same rows."""
        src = self.unpack(packed, n, k, rows)
        return dequantize_q4_0(src, src.shape[0], k, bl=self.bl)
