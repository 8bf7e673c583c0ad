"""Layouts of llama.cpp's SME2 Q4_0 path (KleidiAI), byte for byte.

=============================  ===============================================================  =====================================
class                          KleidiAI packer                                                  docs/layouts.md
=============================  ===============================================================  =====================================
:class:`F16PLhs2`              ``kai_run_lhs_pack_f16pmrx2_f32_neon``                           layouts.md#f16pmrx2
:class:`QSI8D32PScaleTail`     ``kai_run_lhs_quant_pack_qsi8d32p_f32_neon``                     layouts.md#qsi8d32p-scale-tail
:class:`QSI4C32PS1S0ScaleF16`  ``kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon``  layouts.md#qsi4c32ps1s0scalef16
=============================  ===============================================================  =====================================

llama.cpp runs them on SME2 CPUs for Q4_0 weights: the GEMM
(``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa``) takes f16 activations, the GEMV
(``matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot``) int8 activations with the scales
behind the values, and both the same ``qsi4c32ps1s0scalef16`` weights.

These formats are not in :mod:`tilegen.layout.registry` (no tilegen kernel reads them); the
generated KleidiAI packers (:mod:`tilegen.export.packers_c`) take every size and offset from them.

LHS conventions as :mod:`tilegen.layout.q4`: ``pack(x, m_idx_start)`` takes the rows to pack
(``x[0]`` = global row ``m_idx_start``) and returns the region from the row block of
``m_idx_start``; slots of rows that are not packed are zero (KleidiAI leaves them untouched).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import LayoutError, PackedLayout, eval_expr, roundup
from .ggml import as_bytes
from .q4 import _RowBlocks, _check_m_idx_start, _check_pos, _region_blocks, _rows_f32

__all__ = ["F16PLhs2", "QSI8D32PScaleTail", "QSI4C32PS1S0ScaleF16"]

U16 = np.dtype("<u2")


class _LhsBlocks(_RowBlocks, PackedLayout):
    role = "lhs"

    def _placement(self, m: int, m_idx_start: int):
        """(row blocks of the region, block of each row, slot of each row)."""
        first = m_idx_start % self.mr
        g = first + np.arange(m)
        return _region_blocks(m, self.mr, m_idx_start), g // self.mr, g % self.mr


# ----------------------------------------------------------------------------------------
# LHS: f16p<mr>x2 (f32 rows rounded to f16, k-pairs interleaved)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class F16PLhs2(_LhsBlocks):
    """KleidiAI ``f16p<mr>x2`` from ``kai_run_lhs_pack_f16pmrx2_f32_neon`` (docs/layouts.md#f16pmrx2).

    Row block of ``mr`` rows, stride ``mr * roundup(k, 2) * 2``: f16 values (f32 rounded to
    nearest even) ordered [k-pair][row 0..mr)[2].  KleidiAI needs k even (a multiple of bl); an
    odd k is padded with a 0 value here.  ``kr``/``sr`` only have to give L = kr/sr = 2."""

    format = "f16px2"
    label_prefix = "f16p"
    elem_bytes = 2   # one f16 value
    pair = 2         # k values of one row written together (L)
    k_multiple = 2

    mr: int
    kr: int = 2
    sr: int = 1

    def __post_init__(self) -> None:
        _check_pos(mr=self.mr, kr=self.kr, sr=self.sr)
        if self.kr % self.sr or self.kr // self.sr != self.pair:
            raise LayoutError(f"f16p<mr>x2 needs kr/sr = 2, got kr={self.kr}, sr={self.sr}")

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
        x = _rows_f32(x)
        m_idx_start = _check_m_idx_start(m_idx_start)
        m, k = x.shape
        if k < 1:
            raise LayoutError("f16p<mr>x2 needs k >= 1")
        if m == 0:
            return np.zeros(0, np.uint8)
        kp, P = self.k_padded(k), self.pair
        nblk, rb, slot = self._placement(m, m_idx_start)
        v = np.zeros((m, kp), np.float16)
        with np.errstate(over="ignore"):
            v[:, :k] = x.astype(np.float16)
        data = np.zeros((nblk, kp // P, self.mr, P), U16)
        data[rb, :, slot, :] = v.view(U16).reshape(m, kp // P, P)
        return data.view(np.uint8).reshape(-1)

    def unpack(self, buf: np.ndarray, m: int, k: int, m_idx_start: int = 0) -> np.ndarray:
        """f16 bits uint16 (m, roundup(k, 2)) of the packed rows."""
        b = np.asarray(buf, np.uint8).reshape(-1)
        kp, P = self.k_padded(k), self.pair
        nblk, rb, slot = self._placement(m, m_idx_start)
        d = np.ascontiguousarray(b[:nblk * self.row_block_stride(k)]).view(U16)
        d = d.reshape(nblk, kp // P, self.mr, P)
        return d[rb, :, slot, :].reshape(m, kp)


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p with the scales behind the values (the "_neon" packer)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI8D32PScaleTail(_LhsBlocks):
    """The block-symmetric int8 LHS of ``kai_run_lhs_quant_pack_qsi8d32p_f32_neon``
    (docs/layouts.md#qsi8d32p-scale-tail): the quantisation of
    :class:`tilegen.layout.q4.QSI8D32P` (ties away), another byte order.

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

    mr: int
    kr: int = 4
    sr: int = 1
    bl: int = 32

    def __post_init__(self) -> None:
        _check_pos(mr=self.mr, kr=self.kr, sr=self.sr, bl=self.bl)
        if self.bl % 32:
            raise LayoutError(f"bl={self.bl} must be a multiple of 32")
        if self.bl % self.kr:
            raise LayoutError(f"bl={self.bl} must be a multiple of kr={self.kr}")
        if self.sr != 1:    # KleidiAI ignores sr: one layout per (mr, kr), named with sr = 1
            raise LayoutError(f"the qsi8d32p scale-tail layout takes sr = 1, got sr={self.sr}")

    @property
    def label(self) -> str:
        return self.label_for(self.mr, self.kr, 1)

    def num_blocks(self, k: int) -> int:
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        return k // self.bl

    @property
    def chunk_bytes(self) -> int:
        return self.mr * self.kr

    @property
    def stride_expr(self) -> str:
        """Bytes per row block as an expression in k and bl."""
        return f"{self.mr} * (k // bl) * (bl + {self.scale_bytes})"

    def row_block_stride(self, k: int) -> int:
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)

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
        from .q4 import QSI8D32P
        x = _rows_f32(x)
        m_idx_start = _check_m_idx_start(m_idx_start)
        m, k = x.shape
        B = self.num_blocks(k)
        if m == 0:
            return np.zeros(0, np.uint8)
        q, sc = QSI8D32P(1, 4, 1, self.bl, "away").quantize_rows(x)
        nblk, rb, slot = self._placement(m, m_idx_start)
        mr, kr = self.mr, self.kr
        data = np.zeros((nblk, k // kr, mr, kr), np.int8)
        data[rb, :, slot, :] = q.reshape(m, k // kr, kr)
        scales = np.zeros((nblk, B, mr), U16)
        scales[rb, :, slot] = sc
        return np.concatenate([data.view(np.uint8).reshape(nblk, -1),
                               scales.view(np.uint8).reshape(nblk, -1)], axis=1).reshape(-1)


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32ps1s0scalef16 (q4_0-style rows -> s1s0 nibble order, f16 scales at the end)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QSI4C32PS1S0ScaleF16(PackedLayout):
    """KleidiAI's ``kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon`` output
    (docs/layouts.md#qsi4c32ps1s0scalef16), read by the SME2 ``qsi4c32p4vlx4`` kernels.

    Source rows as :class:`tilegen.layout.q4.QSI4C32PScaleF16`: ``k/bl`` blocks of
    ``[f16 d][bl/2 bytes]``, byte q = element q (low nibble) | element q + bl/2 (high).
    Group of ``nr`` rows, stride ``nr * (k/bl) * (bl/2 + 2)``::

        +0          nibble data: [block][k-chunk of kr][slot 0..nr)[kr/2 bytes], chunk byte j =
                    element 2j (low nibble) | element 2j+1 (high nibble): "s1s0", unsigned
                    (zero point 8, no XOR)
        +nr*k/2     f16 scales ordered [block][slot] (raw copies)

    KleidiAI requires kr = 4 (one uint16 of four nibbles per slot) and sr = 2.  Slots past n in
    the last group are never written (zero here)."""

    format = "qsi4c32ps1s0scalef16"
    role = "rhs"
    label_prefix = "qsi4c32p"
    name_suffix = "s1s0scalef16"
    scale_bytes = 2

    nr: int
    kr: int = 4
    sr: int = 2
    bl: int = 32

    def __post_init__(self) -> None:
        _check_pos(nr=self.nr, kr=self.kr, sr=self.sr, bl=self.bl)
        if self.bl % 32:
            raise LayoutError(f"bl={self.bl} must be a multiple of 32")
        if self.kr % 2 or self.bl % self.kr:
            raise LayoutError(f"kr={self.kr} must be even and divide bl={self.bl}")

    @property
    def src_block_bytes(self) -> int:
        return self.scale_bytes + self.bl // 2

    def src_row_bytes(self, k: int) -> int:
        return self.num_blocks(k) * self.src_block_bytes

    def num_blocks(self, k: int) -> int:
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        return k // self.bl

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one k-chunk (kr values of each of the nr slots)."""
        return self.nr * self.kr // 2

    @property
    def stride_expr(self) -> str:
        """Bytes per nr-group as an expression in k and bl."""
        return f"{self.nr} * (k // bl) * (bl // 2 + {self.scale_bytes})"

    def group_stride(self, k: int) -> int:
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)

    def packed_size(self, n: int, k: int) -> int:
        return -(-n // self.nr) * self.group_stride(k)

    def packed_offset(self, n_idx: int, k: int) -> int:
        if n_idx % self.nr:
            raise LayoutError(f"n_idx={n_idx} is not a multiple of nr={self.nr}")
        return n_idx // self.nr * self.group_stride(k)

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
        from .ggml import split_q4_0
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
        b = np.asarray(packed, np.uint8).reshape(-1)
        nr, kr, B = self.nr, self.kr, self.num_blocks(k)
        size = self.packed_size(n, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for n={n}, k={k}")
        idx = np.arange(n) if rows is None else np.asarray(rows, np.int64).reshape(-1)
        G = -(-n // nr)
        grp = b[:size].reshape(G, self.group_stride(k))
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
