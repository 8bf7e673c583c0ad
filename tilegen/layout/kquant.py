"""The K-quant layout bases (issue #24): the Q8_K-style activations every K-quant kernel reads
(:class:`Q8KP`, LHS ``q8kp<mr>x<kr>``: int8 per row per super-block, f32 d, sub-block sums
hi/lo; docs/layouts.md#q8kp) and what the K-quant RHS layouts share (:class:`KQuantRhs`:
groups of nr columns of super-block records, the nibble interleave, the [j][c] scales).  Each
RHS format is its family plugin's subclass: ``q4kp`` in :mod:`tilegen.families.q4_k`,
``q6kp`` in :mod:`tilegen.families.q6_k` (docs/layouts.md#q4kp, #q6kp).

Common to all of them: k is a multiple of 256 (QK_K, one super-block "SB"; anything else is a
LayoutError saying so), the packed data is one fixed-size record per SB (per row block of mr
rows, or per group of nr columns), ``sr = 2`` is fixed (a byte holds two k values L = kr/2
apart) and ``kr`` is even and divides 32.  Labels name L = kr/2 like the other
layouts: ``q8kp4x8`` has kr = 16.

The RHS packers take only ggml blocks (``pack_from_ggml``; lossless, ``dequantize_rows`` equals
``gguf.quants.dequantize`` bit for bit); float weights are refused.  Padding columns of the
last group are all zero bytes (weight 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .base import (Interleaved, LayoutError, RhsGroups, RowBlocks, check_m_idx_start,
                   f32_to_i32_sat, flat_u8, rows_f32, rows_index)
from .ggml import QK_K, check_superblocks, refuse_float_kquant

__all__ = ["Q8KP", "Q8KPI16", "KQuantRhs", "KQuantTerms", "KQuantInterleave", "U16"]

F32 = np.dtype("<f4")
U16 = np.dtype("<u2")


class KQuantTerms(NamedTuple):
    """A K-quant weight as integer terms: w = f32(d) * sc[sub-block] * w_int - f32(dmin) *
    mins[sub-block of 32] (no min term: dmin and mins None)."""

    d: np.ndarray               # f16 bits (n, S)
    sc: np.ndarray              # integer scale per sub-block (n, S, 256/sub)
    w: np.ndarray               # integer weights (n, k), zero point taken off
    sub: int                    # k values per scale
    dmin: np.ndarray | None = None      # f16 bits (n, S)
    mins: np.ndarray | None = None      # integer min per sub-block of 32 (n, S, 8)


def _part_start(prev: tuple[str, int | str] | None) -> property:
    """A property: where an SB-record part starts, right after ``prev`` (0 for the first)."""
    if prev is None:
        return property(lambda self: 0, doc="0: the first part of an SB record")
    name, per = prev
    return property(lambda self: getattr(self, f"{name}_offset") + self.part_bytes(per),
                    doc=f"the end of the SB record's {name}")


def _part_size(per: int | str) -> property:
    return property(lambda self: self.part_bytes(per), doc=f"{per} bytes per slot")


class KQuantInterleave(Interleaved):
    """sr = 2 fixed, kr even and dividing 32, k in SBs."""

    sr = 2                      # fixed: one byte holds two k values, L = kr/2 apart
    qk = QK_K                   # k values of one super-block
    sub_k = 32                  # k values of one Q4_K sub-block (one bsum, one scale/min)

    #: the parts of one SB record, in record order: (name, bytes per row or column slot, an
    #: int or the name of the layout's attribute giving it).  A layout lists them once;
    #: ``<name>_offset`` (each part starts where the one before ends), ``<name>_bytes`` (its
    #: size, where the class has no attribute of that name: ``d_bytes`` stays the per-slot size
    #: of one d) and ``sb_record_bytes`` (where the last part ends) derive from the list, times
    #: the slot count ``sb_slots`` (``"nr"`` columns of a group, ``"mr"`` rows of a block)
    sb_parts = ()               # ((name, bytes per slot), ...)
    sb_slots = "nr"

    def __init_subclass__(cls, **kw) -> None:
        super().__init_subclass__(**kw)
        if "sb_parts" not in cls.__dict__:
            return
        prev = None
        for name, per in cls.sb_parts:
            setattr(cls, f"{name}_offset", _part_start(prev))
            if not hasattr(cls, f"{name}_bytes"):
                setattr(cls, f"{name}_bytes", _part_size(per))
            prev = (name, per)
        cls.sb_record_bytes = _part_start(prev)

    def part_bytes(self, per: int | str) -> int:
        """Bytes of an SB-record part of ``per`` bytes (or attribute ``per``) per slot."""
        return getattr(self, self.sb_slots) * (getattr(self, per) if isinstance(per, str)
                                               else per)

    def check_kquant(self, **positive) -> None:
        self.check_interleave(**positive)
        if self.kr % 2 or 32 % self.kr:
            raise LayoutError(f"{self.format} needs kr even and dividing 32 (2, 4, 8, 16, 32), "
                              f"got kr={self.kr}")

    @staticmethod
    def num_superblocks(k: int) -> int:
        """k / 256; LayoutError naming the rule otherwise."""
        return check_superblocks(k)

    @property
    def stride_expr(self) -> str:
        """Bytes per row block / column group as an expression in k (Python and C getters)."""
        return f"{self.sb_record_bytes} * (k // {self.qk})"


# ----------------------------------------------------------------------------------------
# LHS: q8kp
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Q8KP(RowBlocks, KQuantInterleave):
    """``q8kp<mr>x<kr>``: activations quantised per row per SB (docs/layouts.md#q8kp).

    Row block of ``mr`` rows = k/256 SB records of ``276*mr`` bytes::

        +0        int8 values: 256/L chunks of mr*L bytes; chunk i, row r, byte b at
                  i*mr*L + r*L + b holds q[r][256s + L*i + b]
        +256*mr   mr x f32 d
        +260*mr   bsum_hi: mr x 8 int8 ([r][j] at 260mr + 8r + j)
        +268*mr   bsum_lo: mr x 8 int8 ([r][j] at 268mr + 8r + j)

    bsum_j (sum of the 32 q of sub-block j) = 128*bsum_hi + bsum_lo, bsum_lo in [0, 127].
    """

    mr: int
    kr: int

    format = "q8kp"
    label_prefix = "q8kp"
    # fixed: ggml's Q8_K rounding (docs/layouts.md#q8kp); the packers take no rounding option
    fixed_conversion = ("q8kp rounds x * (127/amax) to nearest, ties to even, as ggml's Q8_K "
                        "(FCVTNS)")
    # the generated NEON packer (tilegen.generator.packers): one row at a time, a compile-time
    # mr, or mr in VL units (the SME2 kernels' row blocks of SVL/32 rows) taken at run time
    packer_template = "lhs_pack_q8kp_neon"
    packer_mr = ("fixed", "vl")
    packer_per_row = ("sb_record_bytes", "values_bytes", "chunk_bytes", "d_offset",
                      "bsum_hi_offset", "bsum_lo_offset")

    def __post_init__(self) -> None:
        self.check_kquant(mr=self.mr)

    # -- geometry (generator) ------------------------------------------------------------
    value_bytes = 1             # bytes of one stored value (Q8KPI16: 2, widened to int16)
    value_dtype = np.dtype("i1")
    d_bytes = 4                 # one row's f32 d per SB
    bsum_count = 8              # sub-block sums per row per SB (sub-blocks of 32)
    bsum_hi_shift = 7           # bsum = (bsum_hi << 7) + bsum_lo, bsum_lo in [0, 127]
    # an SB record of a row block, per row: 256 int8 values, f32 d, 8 bsum_hi, 8 bsum_lo
    # ([r][j] each); values_offset (0), d_offset, bsum_hi_offset, bsum_lo_offset,
    # values_bytes and sb_record_bytes (276*mr) derive from it
    sb_slots = "mr"
    sb_parts = (("values", "row_values_bytes"), ("d", "d_bytes"), ("bsum_hi", "bsum_count"),
                ("bsum_lo", "bsum_count"))

    @property
    def row_values_bytes(self) -> int:
        """Bytes of one row's 256 values of an SB record."""
        return QK_K * self.value_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one interleave chunk of values (mr rows x L)."""
        return self.mr * self.L * self.value_bytes

    def k_span_bytes(self, n: int) -> int:
        """Bytes that ``n`` consecutive k values (a multiple of L, within one SB) of the row
        block's mr rows occupy: the distance the kernels advance their LHS pointer."""
        return n * self.mr * self.value_bytes

    def row_block_stride(self, k: int) -> int:
        return self.num_superblocks(k) * self.sb_record_bytes

    def element_offset(self, r: int, t: int) -> int:
        """Offset of (row slot r, value t of the row) inside a row block."""
        s, u = divmod(t, self.qk)
        return (s * self.sb_record_bytes + (u // self.L) * self.chunk_bytes
                + (r * self.L + u % self.L) * self.value_bytes)

    # -- quantisation --------------------------------------------------------------------
    @property
    def activation_limit(self) -> tuple[float, str]:
        """Largest |x| this format represents, and why: d = 1/(127/max|x|) is an f32."""
        return (float(np.finfo(np.float32).max),
                "the per-super-block scale 1/(127/max|x|) is an f32 (x must be finite)")

    @staticmethod
    def quantize_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """float32 (m, k) -> (q int8 (m, k), d f32 (m, k/256), bsum int32 (m, k/256, 8)):
        per row per SB, amax = max|x|, inv = 127/amax (f32 divide); inv = +inf (amax = 0 or
        amax < 127/FLT_MAX): d = 0 and every q = 0 (flushed); else d = 1/inv (f32 divide: ggml's
        |d|) and q = clamp(rint(x*inv), -127, 127) (f32 product, to nearest with ties to even:
        FCVTNS, NaN -> 0)."""
        f = np.float32
        m, k = x.shape
        S = check_superblocks(k)
        xb = np.ascontiguousarray(x).reshape(m, S, QK_K)
        amax = np.abs(xb).max(axis=2).astype(f)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            inv = (f(127) / amax).astype(f)
            keep = inv != f(np.inf)
            inv = np.where(keep, inv, f(0)).astype(f)
            d = np.where(keep, f(1) / np.where(keep, inv, f(1)), f(0)).astype(f)
            v = (xb * inv[..., None]).astype(f)
            r = f32_to_i32_sat(np.rint(v))
        q = np.clip(r, -127, 127).astype(np.int8)
        bsum = q.astype(np.int32).reshape(m, S, 8, 32).sum(axis=3).astype(np.int32)
        return q.reshape(m, k), d, bsum

    @staticmethod
    def split_bsum(bsum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """bsum int32 -> (hi = bsum >> 7 (floor), lo = bsum - 128*hi in [0, 127]) as int8."""
        b = np.asarray(bsum, dtype=np.int32)
        hi = b >> Q8KP.bsum_hi_shift
        return hi.astype(np.int8), (b - (hi << Q8KP.bsum_hi_shift)).astype(np.int8)

    def pack(self, x: np.ndarray, m_idx_start: int = 0) -> np.ndarray:
        """Quantise and pack rows ``x`` (float32 (m, k), x[0] = global row m_idx_start): the
        region of ``ceil(((m_idx_start % mr) + m) / mr)`` row blocks, unused slots zero."""
        x = rows_f32(x)
        m_idx_start = check_m_idx_start(m_idx_start)
        m, k = x.shape
        S = check_superblocks(k)
        if m == 0:
            return np.zeros(0, np.uint8)
        mr, L = self.mr, self.L
        nblk, rb, slot = self.placement(m, m_idx_start)
        q, d, bsum = self.quantize_rows(x)
        hi, lo = self.split_bsum(bsum)
        vals = np.zeros((nblk, S, QK_K // L, mr, L), self.value_dtype)
        vals[rb, :, :, slot, :] = q.reshape(m, S, QK_K // L, L)
        dd = np.zeros((nblk, S, mr), F32)
        dd[rb, :, slot] = d
        h = np.zeros((nblk, S, mr, 8), np.int8)
        h[rb, :, slot] = hi
        lw = np.zeros((nblk, S, mr, 8), np.int8)
        lw[rb, :, slot] = lo
        out = np.concatenate([vals.view(np.uint8).reshape(nblk, S, -1),
                              dd.view(np.uint8).reshape(nblk, S, -1),
                              h.view(np.uint8).reshape(nblk, S, -1),
                              lw.view(np.uint8).reshape(nblk, S, -1)], axis=2)
        return out.reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int, m_idx_start: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Read back (q int8 (m, k), d f32 (m, S), bsum_hi int8 (m, S, 8), bsum_lo int8
        (m, S, 8)) from a region as :meth:`pack` returns it (or a whole buffer, m_idx_start 0)."""
        b = flat_u8(buf)
        m_idx_start = check_m_idx_start(m_idx_start)
        S = check_superblocks(k)
        mr, L = self.mr, self.L
        need = self.region_size(m, k, m_idx_start)
        if b.size < need:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {need} needed for m={m}, k={k}")
        if m == 0:
            return (np.zeros((0, k), np.int8), np.zeros((0, S), np.float32),
                    np.zeros((0, S, 8), np.int8), np.zeros((0, S, 8), np.int8))
        nblk = need // self.row_block_stride(k)
        rec = b[:need].reshape(nblk, S, self.sb_record_bytes)
        vals = np.ascontiguousarray(rec[..., :self.d_offset]).view(self.value_dtype)
        vals = vals.reshape(nblk, S, QK_K // L, mr, L).astype(np.int8)
        d = np.ascontiguousarray(rec[..., self.d_offset:self.bsum_hi_offset]).view(F32)
        hi = np.ascontiguousarray(rec[..., self.bsum_hi_offset:self.bsum_lo_offset]).view(np.int8)
        lo = np.ascontiguousarray(rec[..., self.bsum_lo_offset:]).view(np.int8)
        _, rb, slot = self.placement(m, m_idx_start)
        q = vals[rb, :, :, slot, :].reshape(m, k)
        return (q, d.reshape(nblk, S, mr)[rb, :, slot].astype(np.float32),
                hi.reshape(nblk, S, mr, 8)[rb, :, slot], lo.reshape(nblk, S, mr, 8)[rb, :, slot])


@dataclass(frozen=True)
class Q8KPI16(Q8KP):
    """``q8ki16p<mr>x<kr>``: :class:`Q8KP` with its values widened to int16 at pack time
    (docs/layouts.md#q8ki16p), for the SME2 gemms whose 2-way int16 SMOPA read k pairs of
    rows: one multi-vector ``LD1H`` loads four vectors of them, no widening load or SUNPK in
    the hot loop.  Everything else is q8kp's: the same quantisation (``quantize_rows``), the
    same order of values (chunk i, row r, value b at i*mr*L + r*L + b, now in int16 units), then
    the same f32 d and bsum hi/lo bytes.  Row block of ``mr`` rows = k/256 SB records of
    ``532*mr`` bytes::

        +0        int16 values: 256/L chunks of mr*L int16; chunk i, row r, value b at byte
                  2*(i*mr*L + r*L + b) holds q[r][256s + L*i + b] (sign-extended int8)
        +512*mr   mr x f32 d
        +516*mr   bsum_hi: mr x 8 int8
        +524*mr   bsum_lo: mr x 8 int8

    No generated packer: the runtime packs it with :meth:`pack` (numpy)."""

    format = "q8ki16p"
    label_prefix = "q8ki16p"
    packer_template = None
    value_bytes = 2
    value_dtype = np.dtype("<i2")


# ----------------------------------------------------------------------------------------
# RHS: q4kp, q6kp
# ----------------------------------------------------------------------------------------
class KQuantRhs(RhsGroups, KQuantInterleave):
    """What the two K-quant RHS layouts share: groups of nr columns of k/256 SB records."""

    def group_stride(self, k: int) -> int:
        return self.num_superblocks(k) * self.sb_record_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one nibble chunk: kr values (kr/2 bytes) of each of the nr columns."""
        return self.nr * self.kr // 2

    def _records(self, packed, n: int, k: int, rows):
        """(records uint8 (G, S, sb_record_bytes), group of each row, slot of each row)."""
        S = self.num_superblocks(k)
        grp = self.column_groups(packed, n, k)
        idx = np.arange(n) if rows is None else rows_index(rows, n)
        return grp.reshape(grp.shape[0], S, self.sb_record_bytes), idx // self.nr, idx % self.nr

    def _padded(self, a: np.ndarray, n: int) -> np.ndarray:
        """``a`` (n, ...) with zero rows appended up to a whole number of groups."""
        G = -(-n // self.nr)
        out = np.zeros((G * self.nr,) + a.shape[1:], a.dtype)
        out[:n] = a
        return out

    def _interleave(self, v: np.ndarray, G: int, S: int, span: int) -> np.ndarray:
        """Values v (G*nr, S, span) of spans of k -> nibble bytes (G, S, nr*span/2) in the
        chunk order: chunk i of kr values, column c, byte b = v[kr*i + b] | v[kr*i + b + L] << 4."""
        nr, kr, L = self.nr, self.kr, self.L
        c = v.reshape(G, nr, S, span // kr, 2, L)
        byte = (c[:, :, :, :, 0] & 15) | ((c[:, :, :, :, 1] & 15) << 4)     # (G, nr, S, C, L)
        return byte.transpose(0, 2, 3, 1, 4).reshape(G, S, -1).astype(np.uint8)

    def _deinterleave(self, nib: np.ndarray, span: int) -> np.ndarray:
        """Inverse of :meth:`_interleave` on the nibble values: (G, S, C, nr, 2, L) 4-bit values
        from bytes (G, S, nr*span/2) — the low then the high nibble of each byte."""
        G, S = nib.shape[:2]
        b = nib.reshape(G, S, span // self.kr, self.nr, 1, self.L)
        return np.concatenate([b & 15, b >> 4], axis=4)

    def scale_offset(self, j: int, c: int) -> int:
        """Scale of sub-block j, column slot c: the scales are [j][c] in both layouts."""
        return self.scales_offset + j * self.nr + c

    def _split_geometry(self, q) -> tuple[np.ndarray, int, int, int]:
        """(q uint8 (n, k), n, S, G) of pack_split's values; q must be 2-D with n >= 1."""
        q = np.asarray(q, dtype=np.uint8)
        if q.ndim != 2 or q.shape[0] < 1:
            raise LayoutError(f"q must be 2-D (n, k) with n >= 1, got shape {q.shape}")
        n, k = q.shape
        return q, n, self.num_superblocks(k), -(-n // self.nr)

    def _f16_columns(self, bits: np.ndarray, G: int, S: int) -> np.ndarray:
        """f16 bits (G*nr, S) -> bytes (G, S, 2*nr): an SB record's nr f16 fields."""
        return np.ascontiguousarray(bits.reshape(G, self.nr, S).transpose(0, 2, 1)).view(np.uint8)

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        return self.pack_split(*values)

    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        """What :meth:`pack_split` takes, read back losslessly (repacking between nr/kr)."""
        return self.unpack(packed, n, k)

    # -- what a family's subclass fills in: its runtime kind, its ggml block codec ---------
    kind = ""                   # the runtime weight kind ("q4_K"), for messages

    def __init_subclass__(cls, **kw) -> None:
        """A family's layout takes only its ggml blocks (``block_<kind>``, 256 values each):
        ``ggml_block`` and ``ggml_only`` follow from its ``kind``."""
        super().__init_subclass__(**kw)
        if cls.kind:
            cls.ggml_block = (cls.kind.upper(), QK_K)
            cls.ggml_only = cls.kind

    @staticmethod
    def split_blocks(raw, n: int, k: int) -> tuple:
        """The family's ggml blocks split into :meth:`pack_split`'s fields, its scale checks
        applied (LayoutError naming the first bad block)."""
        raise NotImplementedError

    @staticmethod
    def values(*fields) -> np.ndarray:
        """float32 (R, k) weights of split fields, in gguf.quants' float order."""
        raise NotImplementedError

    @staticmethod
    def terms(*fields) -> "KQuantTerms":
        """The integer terms of split (or unpacked) fields that the kernels and ggml's dot
        product multiply (tilegen.reference.kquant)."""
        raise NotImplementedError

    # -- the family plugin's protocol (tilegen.families), the same for every K-quant -------
    @staticmethod
    def pack_weights(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
        """The packing protocol: the family's ggml blocks, repacked without loss; float
        weights are refused (tilegen does not quantise to K-quants)."""
        if from_ggml is None:
            return lay.pack_from_float(w, bias=bias)
        return lay.pack_from_ggml(from_ggml, n, k, bias=bias)

    @classmethod
    def gguf_layout(cls, kind: str, nr: int | None):
        """The layout of GGUF tensors read without a library: the i8mm kernels' (nr 4 unless
        given, kr 16)."""
        return cls(nr or 4, 16)

    # -- packers and readers every K-quant RHS shares -------------------------------------
    def pack_from_ggml(self, raw, n: int, k: int, bias=None) -> np.ndarray:
        """Pack ggml blocks of the family's type ((n, blocks) or flat bytes), losslessly;
        refuses a bias, a block whose scales are NaN or Inf, truncated data and k not a
        multiple of 256."""
        self.require_no_bias(bias)
        return self.pack_split(*self.split_blocks(raw, n, k))

    def pack_from_float(self, w, bias=None) -> np.ndarray:
        refuse_float_kquant(self.kind)

    def dequantize_rows(self, packed, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k): gguf.quants' dequantisation of the packed rows, bit for
        bit."""
        return self.values(*self.unpack(packed, n, k, rows))

    @staticmethod
    def require_no_bias(bias) -> None:
        if bias is not None:
            raise LayoutError("K-quant weights carry no bias (the kernels use the Q8 calling "
                              "convention, no bias): pass the bias to matmul(bias=) instead")
