"""f32 layouts: plain strided f32 matrices and KleidiAI's ``f32p<nr>x1b`` packed RHS.

``f32p<nr>x1b`` (docs/layouts.md#f32p-rhs): the n columns are cut into panels of ``nr``;
each panel holds ``nr`` f32 bias values, then ``k`` rows of ``nr`` f32 weights
(row ``t`` = ``W[t][panel columns]``).  Columns past n are zero in bias and data.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .base import LayoutError, PackedLayout, eval_expr, roundup

F32 = np.dtype("<f4")


@dataclass(frozen=True)
class StridedF32:
    """Row-major f32 matrix with a byte row stride (the f32 kernels' LHS and dst)."""

    elem_bytes: int = 4

    def offset(self, row: int, col: int, stride_row: int) -> int:
        return row * stride_row + col * self.elem_bytes

    def size(self, rows: int, cols: int, stride_row: int) -> int:
        """Bytes a (rows x cols) matrix with this row stride spans."""
        if rows == 0 or cols == 0:
            return 0
        return (rows - 1) * stride_row + cols * self.elem_bytes


@dataclass(frozen=True)
class F32PackedRHS(PackedLayout):
    """KleidiAI ``f32p<nr>x<kr>b``: bias-prefixed panels of nr columns (kr = 1)."""

    format = "f32p"
    role = "rhs"
    label_prefix, label_tail = "f32p", "b"
    sr = 1

    nr: int
    kr: int = 1
    elem_bytes: int = 4

    def __post_init__(self) -> None:
        if self.kr != 1:
            raise LayoutError(f"f32p layout supports kr=1 only, got kr={self.kr}")

    # -- geometry used by the generator ---------------------------------------------
    @property
    def bias_bytes(self) -> int:
        """Bytes of the bias row at the start of each panel."""
        return self.nr * self.elem_bytes

    @property
    def row_bytes(self) -> int:
        """Bytes of one k-row of a panel (nr values)."""
        return self.nr * self.kr * self.elem_bytes

    @property
    def stride_expr(self) -> str:
        """Bytes per panel as an expression in k (one source for Python and C getters)."""
        return f"{self.bias_bytes} + k * {self.row_bytes}"

    def panel_stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    # -- sizes/offsets used by the runtime -------------------------------------------
    def packed_size(self, n: int, k: int) -> int:
        return roundup(n, self.nr) // self.nr * self.panel_stride(k)

    def packed_offset(self, n_idx: int, k: int) -> int:
        if n_idx % self.nr:
            raise LayoutError(f"n_idx={n_idx} is not a multiple of nr={self.nr}")
        return n_idx // self.nr * self.panel_stride(k)

    # -- numpy packer -----------------------------------------------------------------
    def pack(self, w: np.ndarray, bias: np.ndarray | None = None, layout: str = "nk") -> np.ndarray:
        """Pack f32 weights, (n, k) for ``layout="nk"`` or (k, n) for ``"kn"``, into uint8 bytes."""
        w = np.asarray(w)
        if w.ndim != 2:
            raise LayoutError(f"weights must be 2-D, got shape {w.shape}")
        if w.dtype != np.float32:
            raise LayoutError(f"weights must be float32, got {w.dtype}")
        if layout == "nk":
            w_kn = w.T
        elif layout == "kn":
            w_kn = w
        else:
            raise LayoutError(f"layout must be 'nk' or 'kn', got {layout!r}")
        k, n = w_kn.shape
        if n < 1 or k < 1:
            raise LayoutError(f"weights need n >= 1 and k >= 1, got n={n}, k={k}")
        panels = roundup(n, self.nr) // self.nr
        out = np.zeros((panels, 1 + k, self.nr), dtype=F32)
        if bias is not None:
            bias = np.asarray(bias)
            if bias.dtype != np.float32 or bias.shape != (n,):
                raise LayoutError(f"bias must be float32 of shape ({n},), got {bias.dtype} {bias.shape}")
            b = np.zeros(panels * self.nr, dtype=F32)
            b[:n] = bias
            out[:, 0, :] = b.reshape(panels, self.nr)
        wp = np.zeros((k, panels * self.nr), dtype=F32)
        wp[:, :n] = w_kn
        out[:, 1:, :] = wp.reshape(k, panels, self.nr).transpose(1, 0, 2)
        return out.reshape(-1).view(np.uint8)

    # -- repacking (tilegen.layout.api.repack_rhs): what pack takes, read back losslessly
    rhs_values = "f32"      # f32 weights and bias

    def packed_values(self, packed: np.ndarray, n: int, k: int) -> tuple:
        return self.unpack(packed, n, k)                       # weights (n, k), bias (n,)

    def pack_values(self, values: tuple, n: int, k: int) -> np.ndarray:
        w, bias = values
        return self.pack(w, bias=bias)

    def unpack(self, packed: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Inverse of :meth:`pack`: (weights (n, k), bias (n,))."""
        panels = roundup(n, self.nr) // self.nr
        a = np.asarray(packed, dtype=np.uint8)[: self.packed_size(n, k)].view(F32)
        a = a.reshape(panels, 1 + k, self.nr)
        bias = a[:, 0, :].reshape(-1)[:n].copy()
        w_kn = a[:, 1:, :].transpose(1, 0, 2).reshape(k, panels * self.nr)[:, :n]
        return np.ascontiguousarray(w_kn.T), bias

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k): the weights of the given rows (output channels)."""
        w, _ = self.unpack(packed, n, k)
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise LayoutError(f"row indices must be in [0, {n})")
        return w[idx]


@dataclass(frozen=True)
class F32PackedLHS(PackedLayout):
    """``f32p<mr>x1`` (the SME outer-product kernels' LHS): rows cut into blocks of ``mr``;
    each block holds, for t = 0..k-1, the ``mr`` values ``x[block rows][t]`` (a k-major
    transpose of the block).  Rows past m are zero."""

    format = "f32p"
    role = "lhs"
    label_prefix = "f32p"
    kr = sr = 1
    packer_template = "lhs_pack_kmajor_neon"     # with bf16px2: k-major row blocks
    packer_template_sme = "lhs_pack_kmajor_sme"  # streaming twin (ZA transpose)
    packer_sme_from_svl = 256                    # at 128 bits the NEON transpose is cheaper
    packer_verb = "lhs_pack"
    packer_mr = ("vl",)                          # the LHS of SME kernels only
    packer_per_row = ("chunk_bytes",)
    fixed_conversion = "f32 values are stored as they are"

    mr: int
    elem_bytes: int = 4

    @property
    def k_step_bytes(self) -> int:
        """Bytes of one k step of a row block (its mr values)."""
        return self.mr * self.elem_bytes

    @property
    def stride_expr(self) -> str:
        """Bytes per row block as an expression in k."""
        return f"k * {self.k_step_bytes}"

    def block_stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    row_block_stride = block_stride

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one k-chunk (kr = 1 value of each of the mr rows): the k step."""
        return self.k_step_bytes

    def element_offset(self, x: int, t: int) -> int:
        """Offset of (row x of the block, element t) from the start of the row block."""
        return t * self.k_step_bytes + x * self.elem_bytes

    def packed_size(self, m: int, k: int) -> int:
        return roundup(m, self.mr) // self.mr * self.block_stride(k)

    def region_size(self, m: int, k: int, m_idx_start: int = 0) -> int:
        """Bytes packing m rows from a block start (m_idx_start a multiple of mr) writes."""
        if m_idx_start % self.mr:
            raise LayoutError(f"m_idx_start={m_idx_start} is not a multiple of mr={self.mr}")
        return self.packed_size(m, k)

    def packed_offset(self, m_idx: int, k: int) -> int:
        if m_idx % self.mr:
            raise LayoutError(f"m_idx={m_idx} is not a multiple of mr={self.mr}")
        return m_idx // self.mr * self.block_stride(k)

    def pack(self, x: np.ndarray) -> np.ndarray:
        """Pack f32 rows (m, k) into uint8 bytes."""
        x = np.asarray(x)
        if x.ndim != 2 or x.dtype != np.float32:
            raise LayoutError(f"LHS must be 2-D float32, got {x.dtype} {x.shape}")
        m, k = x.shape
        if m < 1 or k < 1:
            raise LayoutError(f"LHS needs m >= 1 and k >= 1, got shape {x.shape}")
        blocks = roundup(m, self.mr) // self.mr
        xp = np.zeros((blocks * self.mr, k), dtype=F32)
        xp[:m] = x
        out = xp.reshape(blocks, self.mr, k).transpose(0, 2, 1)
        return np.ascontiguousarray(out).reshape(-1).view(np.uint8)

    def unpack(self, packed: np.ndarray, m: int, k: int) -> np.ndarray:
        blocks = roundup(m, self.mr) // self.mr
        a = np.asarray(packed, dtype=np.uint8)[: self.packed_size(m, k)].view(F32)
        return np.ascontiguousarray(a.reshape(blocks, k, self.mr).transpose(0, 2, 1)
                                    .reshape(-1, k)[:m])
