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
``"qsi8cxp"``          :class:`~tilegen.layout.q8.QSI8CXP`        qai8dxp x qsi8cxp (RHS)
``"bf16p<nr>x4b"``     :class:`~tilegen.layout.bf16.BF16PRhs4B`   NEON bf16 kernels (RHS)
``"bf16p<nr>x2b"``     :class:`~tilegen.layout.bf16.BF16PRhs2B`   SME bf16 kernels (RHS)
``"bf16p<mr>x4"``      :class:`~tilegen.layout.bf16.BF16PLhs4`    LHS of NEON bf16 kernels
``"bf16p<mr>x2"``      :class:`~tilegen.layout.bf16.BF16PLhs2`    LHS of SME bf16 kernels
=====================  =======================================  ===========================

bf16 formats give the tile either in the name (``"bf16p12x4b"``) or as ``nr=``/``mr=`` with the
name's number left out (``"bf16px4b"``).
"""
from __future__ import annotations

import re

import numpy as np

from .base import LayoutError
from .f32 import F32PackedRHS
from .q4 import QAI8DXP, QSI4C32P, QSI8D32P, QSI4C32PScaleF16
from .q8 import QSI8CXP
from .bf16 import BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B

__all__ = ["pack_rhs", "pack_lhs", "dequantize_rows", "layout_for", "repack_rhs", "RHS_FORMATS",
           "LHS_FORMATS"]

RHS_FORMATS = ("f32p", "qsi4c32p", "qsi4c32pscalef16", "qsi8cxp", "bf16px4b", "bf16px2b")
LHS_FORMATS = ("qai8dxp", "qsi8d32p", "bf16px4", "bf16px2")

_BF16_RE = re.compile(r"^bf16p(\d*)x([24])(b?)$")
_BF16_CLASSES = {("4", ""): BF16PLhs4, ("2", ""): BF16PLhs2, ("4", "b"): BF16PRhs4B, ("2", "b"): BF16PRhs2B}


def _bf16_fmt(f: str):
    """(canonical format, tile from the name or None) of a bf16 format name, or None."""
    mt = _BF16_RE.match(f)
    if not mt:
        return None
    return f"bf16px{mt.group(2)}{mt.group(3)}", (int(mt.group(1)) if mt.group(1) else None)


def _norm(fmt) -> str:
    if not isinstance(fmt, str):
        raise LayoutError(f"format must be a string, got {fmt!r}")
    f = fmt.lower()
    if f.startswith("f32p"):
        return "f32p"
    b = _bf16_fmt(f)
    return b[0] if b else f


def layout_for(fmt: str, **geometry):
    """The layout object of format ``fmt``.

    RHS formats take ``nr, kr, sr, bl`` (``f32p``: ``nr``, ``kr=1``; ``sr``/``bl`` ignored if
    1/None resp. any); LHS formats ``mr, kr, sr`` plus ``bl`` and ``rounding`` for qsi8d32p
    (``bl`` is accepted and ignored for qai8dxp)."""
    f = _norm(fmt)
    g = dict(geometry)
    bf = _bf16_fmt(fmt.lower()) if isinstance(fmt, str) else None

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
    elif f == "qsi8cxp":
        lay = QSI8CXP(take("nr", required=True), take("kr", required=True), take("sr", 1))
        take("bl")
    elif bf is not None:
        cls = _BF16_CLASSES[(f[-2] if f.endswith("b") else f[-1], "b" if f.endswith("b") else "")]
        dim = "nr" if f.endswith("b") else "mr"
        tile = take(dim, bf[1])
        if tile is None:
            raise LayoutError(f"layout {fmt!r} needs {dim}=")
        if bf[1] is not None and tile != bf[1]:
            raise LayoutError(f"layout {fmt!r} has {dim}={bf[1]}, got {dim}={tile}")
        kr = take("kr", cls.kr)
        if take("sr", 1) not in (None, 1):
            raise LayoutError(f"{fmt!r} supports sr=1 only")
        take("bl")
        lay = cls(tile, kr)
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
    if f in ("bf16px4b", "bf16px2b"):
        if ggml is not None:
            raise LayoutError(f"{fmt!r} weights are float32, not ggml data")
        geom = {"nr": nr} if kr == 1 else {"nr": nr, "kr": kr}      # kr=1: the format's own
        return layout_for(fmt, **geom).pack(w, bias=bias, layout=layout)
    if w is not None:
        w = np.asarray(w)
        if w.ndim != 2:
            raise LayoutError(f"weights must be 2-D, got shape {w.shape}")
        if layout == "kn":
            w = np.ascontiguousarray(w.T)
    if f == "qsi8cxp":
        lay = QSI8CXP(nr, kr, sr)
        if ggml is not None:
            if n is None or k is None:
                raise LayoutError("ggml= needs n and k")
            return lay.pack_from_ggml(ggml, n, k, bias)
        return lay.pack_from_float(w, bias)
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
    if f in ("bf16px4", "bf16px2"):
        if m_idx_start:
            raise LayoutError(f"{fmt!r} packs whole row blocks from row 0 (m_idx_start=0)")
        return layout_for(fmt, mr=mr, kr=kr).pack(x)
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
    its row sums are recomputed in dst's order, as KleidiAI's packer computes them; qsi8cxp:
    int8 weights, scales, bias)."""
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
    if isinstance(src, QSI8CXP):     # row sums recomputed (lhs_zero_point 1, as the kernels need)
        q, _, scale, bias = src.unpack(packed, n, k)
        return dst.pack(np.ascontiguousarray(q[:, :k]), scale, bias)
    raise LayoutError(f"cannot repack {src.name}: not a packed-RHS layout")
