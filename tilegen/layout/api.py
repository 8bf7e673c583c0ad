"""Format-name dispatch over the layout objects.

Format names (``fmt``):

=====================  =======================================  ===========================
fmt                    layout object                            used by
=====================  =======================================  ===========================
``"f32p"`` (or a       :class:`~tilegen.layout.f32.F32PackedRHS`  f32 kernels (RHS)
stem ``"f32p16x1b"``)
``"qsi4c32p"``         :class:`~tilegen.layout.q4.QSI4C32P`       qai8dxp x qsi4c32p (RHS)
``"qsi4c32pscalef16"`` :class:`~tilegen.layout.q4.QSI4C32PScaleF16`  qsi8d32p x qsi4c32p (RHS)
``"qai8dxp"``          :class:`~tilegen.layout.q4.QAI8DXP`        LHS of qai8dxp kernels
``"qsi8d32p"``         :class:`~tilegen.layout.q4.QSI8D32P`       LHS of qsi8d32p kernels
=====================  =======================================  ===========================
"""
from __future__ import annotations

import numpy as np

from .base import LayoutError
from .f32 import F32PackedRHS
from .q4 import QAI8DXP, QSI4C32P, QSI8D32P, QSI4C32PScaleF16

__all__ = ["pack_rhs", "pack_lhs", "dequantize_rows", "layout_for", "repack_rhs", "RHS_FORMATS",
           "LHS_FORMATS"]

RHS_FORMATS = ("f32p", "qsi4c32p", "qsi4c32pscalef16")
LHS_FORMATS = ("qai8dxp", "qsi8d32p")


def _norm(fmt) -> str:
    if not isinstance(fmt, str):
        raise LayoutError(f"format must be a string, got {fmt!r}")
    f = fmt.lower()
    if f.startswith("f32p"):
        return "f32p"
    return f


def layout_for(fmt: str, **geometry):
    """The layout object of format ``fmt``.

    RHS formats take ``nr, kr, sr, bl`` (``f32p``: ``nr``, ``kr=1``; ``sr``/``bl`` ignored if
    1/None resp. any); LHS formats ``mr, kr, sr`` plus ``bl`` and ``rounding`` for qsi8d32p
    (``bl`` is accepted and ignored for qai8dxp)."""
    f = _norm(fmt)
    g = dict(geometry)

    def take(name, default=None, required=False):
        if name in g:
            return g.pop(name)
        if required:
            raise LayoutError(f"layout {fmt!r} needs {name}=")
        return default

    if f == "f32p":
        lay = F32PackedRHS(nr=take("nr", required=True), kr=take("kr", 1))
        sr = take("sr", 1)
        if sr not in (None, 1):
            raise LayoutError(f"f32p layout supports sr=1 only, got sr={sr}")
        take("bl")
    elif f == "qsi4c32p":
        lay = QSI4C32P(take("nr", required=True), take("kr", required=True),
                       take("sr", required=True), take("bl", 32))
    elif f == "qsi4c32pscalef16":
        lay = QSI4C32PScaleF16(take("nr", required=True), take("kr", required=True),
                               take("sr", 2), take("bl", 32))
    elif f == "qai8dxp":
        lay = QAI8DXP(take("mr", required=True), take("kr", required=True), take("sr", required=True))
        take("bl")
        if take("rounding", "away") != "away":
            raise LayoutError("qai8dxp has fixed rounding (values ties-away, zero point ties-even); "
                              "rounding= must be 'away'")
    elif f == "qsi8d32p":
        lay = QSI8D32P(take("mr", required=True), take("kr", required=True), take("sr", required=True),
                       take("bl", 32), take("rounding", "away"))
    else:
        raise LayoutError(f"unknown layout format {fmt!r}; known: {', '.join(RHS_FORMATS + LHS_FORMATS)}")
    if g:
        raise LayoutError(f"unexpected geometry for {fmt!r}: {', '.join(sorted(g))}")
    return lay


def pack_rhs(fmt: str, w: np.ndarray | None = None, *, nr: int, kr: int = 1, sr: int = 1, bl: int = 32,
             bias: np.ndarray | None = None, layout: str = "nk", ggml=None,
             n: int | None = None, k: int | None = None) -> np.ndarray:
    """Pack weights into RHS format ``fmt``; returns uint8 bytes.

    * ``"f32p"``: float32 ``w`` (n, k), or (k, n) with ``layout="kn"``, optional f32 bias.
    * ``"qsi4c32p"``: float32 ``w`` quantised like ggml Q4_0 (bl must be 32), or raw ggml
      block_q4_0 bytes via ``ggml=`` with ``n, k``; optional f32 bias.  f16 d -> bf16 by
      round-to-nearest-even.
    * ``"qsi4c32pscalef16"``: float32 ``w`` quantised per bl-block like Q4_0, or raw
      q4_0(-style) rows via ``ggml=`` (with ``n, k`` when flat).  No bias (KleidiAI asserts
      ``bias == NULL`` for this packer).
    """
    f = _norm(fmt)
    if f not in RHS_FORMATS:
        raise LayoutError(f"unknown RHS format {fmt!r}; known: {', '.join(RHS_FORMATS)}")
    if (w is None) == (ggml is None):
        raise LayoutError("pass exactly one of w (float weights) or ggml= (raw q4_0 bytes)")
    if layout not in ("nk", "kn"):
        raise LayoutError(f"layout must be 'nk' or 'kn', got {layout!r}")
    if f == "f32p":
        if ggml is not None:
            raise LayoutError("f32p weights cannot come from ggml q4_0 data")
        return F32PackedRHS(nr=nr, kr=kr).pack(w, bias=bias, layout=layout)
    if w is not None:
        w = np.asarray(w)
        if w.ndim != 2:
            raise LayoutError(f"weights must be 2-D, got shape {w.shape}")
        if layout == "kn":
            w = np.ascontiguousarray(w.T)
    if f == "qsi4c32p":
        lay = QSI4C32P(nr, kr, sr, bl)
        if ggml is not None:
            if n is None or k is None:
                raise LayoutError("ggml= needs n and k")
            return lay.pack_from_ggml(ggml, n, k, bias)
        return lay.pack_from_float(w, bias)
    lay = QSI4C32PScaleF16(nr, kr, sr, bl)
    if bias is not None:
        raise LayoutError("qsi4c32pscalef16 has no bias (KleidiAI's packer requires bias=NULL)")
    if ggml is not None:
        if layout != "nk":
            raise LayoutError("ggml= data is always n x k rows")
        return lay.pack(ggml, n, k)
    return lay.pack_from_float(w)


def pack_lhs(fmt: str, x: np.ndarray, *, mr: int, kr: int, sr: int, bl: int = 32,
             m_idx_start: int = 0, rounding: str = "away") -> np.ndarray:
    """Quantise and pack activation rows ``x`` (float32 (m, k); x[0] = global row m_idx_start)
    into LHS format ``"qai8dxp"`` or ``"qsi8d32p"``; returns the region from the row block of
    m_idx_start (``ceil(((m_idx_start % mr) + m) / mr)`` row blocks), unused slots zero."""
    f = _norm(fmt)
    if f not in LHS_FORMATS:
        raise LayoutError(f"unknown LHS format {fmt!r}; known: {', '.join(LHS_FORMATS)}")
    return layout_for(f, mr=mr, kr=kr, sr=sr, bl=bl, rounding=rounding).pack(x, m_idx_start=m_idx_start)


def dequantize_rows(packed: np.ndarray, fmt: str, n: int, k: int, nr: int, kr: int, sr: int,
                    bl: int, rows) -> np.ndarray:
    """float32 (len(rows), k): the exact weights packed RHS rows represent."""
    f = _norm(fmt)
    if f == "f32p":
        lay = F32PackedRHS(nr=nr, kr=kr)
        w, _ = lay.unpack(packed, n, k)
        idx = np.asarray(rows, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise LayoutError(f"row indices must be in [0, {n})")
        return w[idx]
    if f not in RHS_FORMATS:
        raise LayoutError(f"unknown RHS format {fmt!r}; known: {', '.join(RHS_FORMATS)}")
    return layout_for(f, nr=nr, kr=kr, sr=sr, bl=bl).dequantize_rows(packed, n, k, rows)


def repack_rhs(packed: np.ndarray, src, dst, n: int, k: int) -> np.ndarray:
    """Packed RHS bytes of n x k weights in layout ``src``, re-laid out for layout ``dst`` of the
    same format and block length (other nr/kr/sr): the bytes packing the same weights for
    ``dst`` gives.  Lossless: each layout's unpack returns what its pack takes (f32p: weights
    and bias; qsi4c32pscalef16: the q4_0 source rows; qsi4c32p: nibbles, bf16 scales, bias;
    its row sums are recomputed in dst's order, as KleidiAI's packer computes them)."""
    if type(src) is not type(dst) or getattr(src, "bl", None) != getattr(dst, "bl", None):
        raise LayoutError(f"cannot repack {src.name} (bl={getattr(src, 'bl', None)}) into "
                          f"{dst.name} (bl={getattr(dst, 'bl', None)}): only layouts of one format "
                          f"and block length hold the same values")
    have, need = np.asarray(packed).nbytes, src.packed_size(n, k)
    if have < need:
        raise LayoutError(f"packed buffer holds {have} bytes, {src.name} needs {need} for n={n}, k={k}")
    if isinstance(src, F32PackedRHS):
        w, bias = src.unpack(packed, n, k)
        return dst.pack(w, bias=bias)
    if isinstance(src, QSI4C32PScaleF16):
        return dst.pack(src.unpack(packed, n, k), n, k)
    if isinstance(src, QSI4C32P):
        u4, scale_bf16, _, bias = src.unpack(packed, n, k)
        return dst.pack_u4(u4, scale_bf16, bias)
    raise LayoutError(f"cannot repack {src.name}: not a packed-RHS layout")
