"""int4 packed-RHS layouts (weights with 4-bit values and a scale per block of bl), byte for byte.

=============================  ===============================================================  =================================
class                          KleidiAI packer                                                  docs/layouts.md
=============================  ===============================================================  =================================
:class:`QSI4C32P`              ``kai_run_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0``                    layouts.md#qsi4c32p
:class:`QSI4C32PScaleF16`      ``kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0``           layouts.md#qsi4c32pscalef16
:class:`QSI4C32PS1S0ScaleF16`  ``kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon``  layouts.md#qsi4c32ps1s0scalef16
=============================  ===============================================================  =================================

Their LHS are the int8 layouts of :mod:`tilegen.layout.lhs_int8` (``qai8dxp`` for
``qsi4c32p``, ``qsi8d32p`` for ``qsi4c32pscalef16``) and, for the SME2 ``qsi4c32p4vlx4``
kernels of llama.cpp's Q4_0 path that read ``qsi4c32ps1s0scalef16``, the f16 LHS of
:mod:`tilegen.layout.f16` and the scale-tail qsi8d32p.  Weights arrive as ggml Q4_0 blocks
(:mod:`tilegen.layout.ggml`) or float32, quantised like Q4_0.

Packers return flat ``uint8`` arrays and replicate row ``n - 1`` into the padding slots of the
last nr-group, as KleidiAI does (``qsi4c32ps1s0scalef16``: those slots are never written, zero
here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..reference.f32 import fma_f32
from .base import (ColumnGroups, LayoutError, PackedLayout, RhsGroups, ScaleBlocks, check_pos,
                   checked_c_expr, eval_expr, rows_index)
from .bf16 import bf16_to_f32, f32_to_bf16_rne
from .ggml import (QK4_0, as_bytes, check_block_scales, dequantize_q4_0, f16_bits_to_f32,
                   quantize_q4_0, split_q4_0)

__all__ = ["QSI4C32P", "QSI4C32PScaleF16", "QSI4C32PS1S0ScaleF16"]

F32 = np.dtype("<f4")
U16 = np.dtype("<u2")


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32p (s1s0 input, bf16 scales, rsum, bias)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI4C32P(RhsGroups):
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
    label_prefix = "qsi4c32p"
    ggml_block = ("Q4_0", QK4_0)

    def __post_init__(self) -> None:
        L = self.check_interleave(nr=self.nr, bl=self.bl)
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
        nr, L, bl = self.nr, self.L, self.bl
        B, C, Sg = self.num_blocks(k), bl // 32, 16 // L
        grp = self.column_groups(packed, n, k)
        idx = np.arange(n) if rows is None else rows_index(rows, n)
        G = grp.shape[0]
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
class QSI4C32PScaleF16(RhsGroups):
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
    label_prefix = "qsi4c32p"         # KleidiAI's kernel names: qsi4c32p<nr>x<L>, as QSI4C32P
    name_suffix = "scalef16"
    ggml_block = ("Q4_0", QK4_0)

    def __post_init__(self) -> None:
        check_pos(sr=self.sr)
        if self.sr != 2:
            raise LayoutError(f"qsi4c32pscalef16 needs sr=2, got sr={self.sr}")
        self.check_interleave(nr=self.nr, bl=self.bl)
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
    #: the block scales' 2-byte format, "f16" or "bf16" (a subclass's, e.g. mxfp4p): the
    #: NEON/SVE q4 skeletons widen them to f32 by it (FCVTL / a 16-bit shift)
    scale_format = "f16"
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
        nr, kr, bl = self.nr, self.kr, self.bl
        B = self.num_blocks(k)
        grp = self.column_groups(packed, n, k)
        idx = np.arange(n) if rows is None else rows_index(rows, n)
        G = grp.shape[0]
        blk = grp.reshape(G, B, self.block_stride)
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

    @classmethod
    def c_repack_exprs(cls, geo: list[dict], marked_block) -> dict[str, str]:
        """The C expressions of a repack of ggml's 32-k blocks into this geometry, one block per
        record (the export's RHS packer skeleton export/pack/kquant_rhs.c.j2, for a family on
        this base: iq4nlp, mxfp4p), each checked against the layout class ``cls`` at the
        geometries ``geo`` (dicts of nr, kr, k; those whose k is no multiple of the block or
        whose tile ``cls`` refuses are left out): ``rec`` (a record: nr scales, then the code
        bytes), ``stride`` (a group), ``d_f`` (column c's scale in a record) and ``byte_f``
        (source code byte q of column c in a record), found by packing ``marked_block(nr, c,
        q)`` -- nr source rows of one block whose only 0xa5 byte is that one -- with the class's
        own packer."""
        def takes(nr, kr):
            try:
                cls(nr, kr)
            except LayoutError:
                return False
            return True

        def byte_position(nr, kr, c, q):
            packed = cls(nr, kr).pack(marked_block(nr, c, q), nr, qk)
            where = np.flatnonzero(packed == 0xa5)
            assert where.size == 1, (cls.__name__, nr, kr, c, q)
            return int(where[0])

        ref = cls(4, 8)
        sb, qk = ref.scale_bytes, ref.bl
        geo = [g for g in geo if g["k"] % qk == 0 and takes(g["nr"], g["kr"])]
        lay = lambda nr, kr, **_: cls(nr, kr)  # noqa: E731
        rec = checked_c_expr(f"nr * ({sb} + {qk} // 2)", lambda k, **g: lay(**g).block_stride, geo)
        stride = checked_c_expr(f"(k // {qk}) * nr * ({sb} + {qk} // 2)",
                                lambda k, **g: lay(**g).group_stride(k), geo)
        d_f = checked_c_expr(f"c * {sb}", lambda c, **g: lay(**g).scale_offset(0) + c * sb,
                             [dict(g, c=c) for g in geo for c in (0, g["nr"] - 1)])
        byte_f = checked_c_expr(
            f"nr * {sb} + (q // (kr // 2)) * (nr * kr // 2) + c * (kr // 2) + q % (kr // 2)",
            lambda c, q, nr, kr, **_: byte_position(nr, kr, c, q),
            [dict(g, c=c, q=q) for g in geo if g["k"] == geo[0]["k"]
             for c in sorted({0, g["nr"] // 2, g["nr"] - 1}) for q in (0, 1, 5, 8, 15)])
        return dict(stride=stride, rec=rec, d_f=d_f, byte_f=byte_f, qk=qk)


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32ps1s0scalef16 (q4_0-style rows -> s1s0 nibble order, f16 scales at the end)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI4C32PS1S0ScaleF16(ColumnGroups, ScaleBlocks, PackedLayout):
    """KleidiAI's ``kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon`` output
    (docs/layouts.md#qsi4c32ps1s0scalef16), read by the SME2 ``qsi4c32p4vlx4`` kernels.

    Source rows as :class:`QSI4C32PScaleF16`: ``k/bl`` blocks of
    ``[f16 d][bl/2 bytes]``, byte q = element q (low nibble) | element q + bl/2 (high).
    Group of ``nr`` rows, stride ``nr * (k/bl) * (bl/2 + 2)``::

        +0          nibble data: [block][k-chunk of kr][slot 0..nr)[kr/2 bytes], chunk byte j =
                    element 2j (low nibble) | element 2j+1 (high nibble): "s1s0", unsigned
                    (zero point 8, no XOR)
        +nr*k/2     f16 scales ordered [block][slot] (raw copies)

    KleidiAI requires kr = 4 (one uint16 of four nibbles per slot) and sr = 2.  Slots past n in
    the last group are never written (zero here).

    No byte depends on ``sr``: it only names the layout (``qsi4c32p<nr>x<kr/sr>``: the f16 gemm
    of llama.cpp's entry says ``x2``, tilegen's int8 LUTI4 kernels ``x4``), so it takes no part
    in equality: every kernel reading this format at one nr, kr and bl reads the same packed
    weights (the f16 gemm and the int8 gemv of the entry share them, as in llama.cpp)."""

    nr: int
    kr: int = 4
    sr: int = field(default=2, compare=False)
    bl: int = 32

    format = "qsi4c32ps1s0scalef16"
    label_prefix = "qsi4c32p"
    name_suffix = "s1s0scalef16"
    ggml_block = ("Q4_0", QK4_0)
    scale_bytes = 2

    def __post_init__(self) -> None:
        self.check_blocks(nr=self.nr)
        if self.kr % 2 or self.bl % self.kr:
            raise LayoutError(f"kr={self.kr} must be even and divide bl={self.bl}")

    @property
    def src_block_bytes(self) -> int:
        return self.scale_bytes + self.bl // 2

    def src_row_bytes(self, k: int) -> int:
        return self.num_blocks(k) * self.src_block_bytes

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one k-chunk (kr values of each of the nr slots)."""
        return self.nr * self.kr // 2

    @property
    def stride_expr(self) -> str:
        """Bytes per nr-group as an expression in k and bl."""
        return f"{self.nr} * (k // bl) * (bl // 2 + {self.scale_bytes})"

    def group_stride(self, k: int) -> int:
        return self.blocks_stride(k)

    def data_bytes(self, k: int) -> int:
        return self.nr * k // 2

    def scale_offset(self, i: int, b: int, k: int) -> int:
        """Offset of the scale of (slot i, block b) inside a group."""
        return self.data_bytes(k) + (b * self.nr + i) * self.scale_bytes

    def byte_offset(self, i: int, t: int) -> int:
        """Offset of the byte holding elements t, t+1 (t even) of slot i inside a group."""
        return (t // self.kr) * self.chunk_bytes + i * (self.kr // 2) + (t % self.kr) // 2

    def pack(self, raw, n: int | None = None, k: int | None = None) -> np.ndarray:
        """Pack q4_0-style source rows (uint8 (n, B*(2+bl/2)), or flat with n and k)."""
        raw = as_bytes(raw)
        if raw.dtype != np.uint8:
            raise LayoutError(f"source rows must be uint8 bytes, got {raw.dtype}")
        if n is None or k is None:
            if raw.ndim != 2:
                raise LayoutError("pass n and k with flat source bytes")
            n, k = raw.shape[0], raw.shape[1] // self.src_block_bytes * self.bl
        B = self.num_blocks(k)
        if n < 1 or raw.size != n * self.src_row_bytes(k):
            raise LayoutError(f"source for n={n}, k={k} must hold {n * self.src_row_bytes(k)} bytes")
        u, d = split_q4_0(np.ascontiguousarray(raw).reshape(n, -1), n, k, bl=self.bl)
        nr, kr = self.nr, self.kr
        G = -(-n // nr)
        byte = (u[:, 0::2] | (u[:, 1::2] << 4)).astype(np.uint8)          # (n, k/2) s1s0
        data = np.zeros((G * nr, k // kr, kr // 2), np.uint8)
        data[:n] = byte.reshape(n, k // kr, kr // 2)
        data = data.reshape(G, nr, k // kr, kr // 2).transpose(0, 2, 1, 3).reshape(G, -1)
        scales = np.zeros((G * nr, B), U16)
        scales[:n] = d
        scales = np.ascontiguousarray(scales.reshape(G, nr, B).transpose(0, 2, 1))
        return np.concatenate([data, scales.view(np.uint8).reshape(G, -1)], axis=1).reshape(-1)

    def pack_from_ggml(self, raw: np.ndarray, n: int, k: int, bias: None = None) -> np.ndarray:
        """:meth:`pack` for ggml block_q4_0 bytes (needs bl = 32; finite block scales);
        ``bias`` must be None (the kernels take none: ``matmul(bias=)`` adds it)."""
        QSI4C32PScaleF16.require_no_bias(bias)
        if self.bl != 32:
            raise LayoutError(f"ggml block_q4_0 data has bl=32, this layout has bl={self.bl}")
        raw = as_bytes(raw)
        check_block_scales(split_q4_0(np.ascontiguousarray(raw).reshape(int(n), -1), int(n),
                                      int(k), bl=self.bl)[1], "Q4_0")
        return self.pack(raw, n, k)

    def pack_from_float(self, w: np.ndarray, bias: None = None) -> np.ndarray:
        """Quantise float32 (n, k) like ggml Q4_0 (per bl-block) and pack; ``bias`` must be
        None; |w| <= 8 x 65504 (the f16 block scales' range)."""
        QSI4C32PScaleF16.require_no_bias(bias)
        return self.pack(quantize_q4_0(w, bl=self.bl, strict=True))

    def written_mask(self, n: int, k: int) -> np.ndarray:
        """1 where KleidiAI's packer writes (every byte but those of slots past n)."""
        G, nr = -(-n // self.nr), self.nr
        rows = np.arange(G * nr)
        B = self.num_blocks(k)
        d = np.broadcast_to((rows < n).reshape(G, 1, nr, 1), (G, k // self.kr, nr, self.kr // 2))
        s = np.broadcast_to((rows < n).reshape(G, 1, nr, 1), (G, B, nr, self.scale_bytes))
        return np.concatenate([d.reshape(G, -1), s.reshape(G, -1)], axis=1).astype(np.uint8).reshape(-1)

    def unpack(self, packed: np.ndarray, n: int, k: int, rows=None) -> tuple[np.ndarray, np.ndarray]:
        """(u4 uint8 (R, k) in k order, f16 scale bits uint16 (R, k/bl)) of ``rows`` (default
        all n): what llama.cpp's ``dequantize_row_qsi4c32ps1s0scalef16`` reads."""
        nr, kr, B = self.nr, self.kr, self.num_blocks(k)
        grp = self.column_groups(packed, n, k)
        idx = np.arange(n) if rows is None else np.asarray(rows, np.int64).reshape(-1)
        G = grp.shape[0]
        data = grp[:, :self.data_bytes(k)].reshape(G, k // kr, nr, kr // 2)
        scales = np.ascontiguousarray(grp[:, self.data_bytes(k):]).view(U16).reshape(G, B, nr)
        g, i = idx // nr, idx % nr
        d = data[g, :, i, :].reshape(idx.size, k // 2)
        u = np.empty((idx.size, k), np.uint8)
        u[:, 0::2], u[:, 1::2] = d & 0x0F, d >> 4
        return u, scales[g, :, i].astype(np.uint16)

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k) = (u - 8) * f32(f16 scale); equal to ggml's Q4_0
        dequantisation of the source rows (bl = 32)."""
        u, s = self.unpack(packed, n, k, rows)
        R = u.shape[0]
        vals = (u.astype(np.int16) - 8).astype(np.float32).reshape(R, k // self.bl, self.bl)
        sf = s.view(np.float16).astype(np.float32)
        with np.errstate(invalid="ignore"):
            return (vals * sf[..., None]).astype(np.float32).reshape(R, k)
