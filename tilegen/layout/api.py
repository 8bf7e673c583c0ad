"""Dispatch by format over the layout registry (:mod:`tilegen.layout.registry`: the family
plugins' layouts; the table below is today's).

A format is a layout class's ``format`` stem; :func:`layout_for` also takes a layout's full
``name`` (``"f32p16x1b"``, ``"bf16p12x4b"``: the tile rows and L come from the name).

==========================  ======================================================  ============================
format                      layout class                                            used by
==========================  ======================================================  ============================
``"f32p"`` (RHS)            :class:`~tilegen.layout.f32.F32PackedRHS`               f32 kernels
``"f32p"`` (LHS)            :class:`~tilegen.layout.f32.F32PackedLHS`               f32 SME outer products
``"qsi4c32p"``              :class:`~tilegen.layout.rhs_int4.QSI4C32P`              qai8dxp x qsi4c32p (RHS)
``"qsi4c32pscalef16"``      :class:`~tilegen.layout.rhs_int4.QSI4C32PScaleF16`      qsi8d32p x qsi4c32p (RHS)
``"qsi4c32ps1s0scalef16"``  :class:`~tilegen.layout.rhs_int4.QSI4C32PS1S0ScaleF16`  SME2 q4_0_s1s0 kernels (RHS)
``"qai8dxp"``               :class:`~tilegen.layout.lhs_int8.QAI8DXP`               LHS of qai8dxp kernels
``"qsi8d32p"``              :class:`~tilegen.layout.lhs_int8.QSI8D32P`              LHS of qsi8d32p kernels
``"qsi8d32pscaletail"``     :class:`~tilegen.layout.lhs_int8.QSI8D32PScaleTail`     LHS of q4_0_s1s0 kernels
``"qsi8cxp"``               :class:`~tilegen.layout.rhs_int8.QSI8CXP`               qai8dxp x qsi8cxp (RHS)
``"bf16px4b"``              :class:`~tilegen.layout.bf16.BF16PRhs4B`                NEON bf16 kernels (RHS)
``"bf16px2b"``              :class:`~tilegen.layout.bf16.BF16PRhs2B`                SME bf16 kernels (RHS)
``"bf16px4"``               :class:`~tilegen.layout.bf16.BF16PLhs4`                 LHS of NEON bf16 kernels
``"bf16px2"``               :class:`~tilegen.layout.bf16.BF16PLhs2`                 LHS of SME bf16 kernels
``"q4kp"``                  :class:`~tilegen.families.q4_k.Q4KP`                    q4_K kernels (RHS)
``"q6kp"``                  :class:`~tilegen.families.q6_k.Q6KP`                    q6_K kernels (RHS)
``"q8kp"``                  :class:`~tilegen.layout.kquant.Q8KP`                    LHS of q4_K / q6_K kernels
``"q8ki16p"``               :class:`~tilegen.layout.kquant.Q8KPI16`                 LHS of the K-quant ``:i16`` SME2 gemms
==========================  ======================================================  ============================

``"f32p"`` names a layout of either role: :func:`layout_for` takes the LHS one when given
``mr=`` (the other functions know their role).
"""
from __future__ import annotations

import numpy as np

from .base import LayoutError, RowBlocks
from .rhs_int4 import QSI4C32PScaleF16
from .registry import LAYOUTS, LHS_LAYOUTS, RHS_LAYOUTS, layout_class

__all__ = ["pack_rhs", "pack_lhs", "dequantize_rows", "layout_for", "repack_rhs", "can_repack",
           "RHS_FORMATS", "LHS_FORMATS"]

RHS_FORMATS = tuple(RHS_LAYOUTS)
LHS_FORMATS = tuple(LHS_LAYOUTS)

_ROWS = {"rhs": "nr", "lhs": "mr"}


def _role(fmt: str, geometry: dict) -> str:
    """The role of format or name ``fmt``: the one registry that knows it ("f32p" is in both:
    ``mr=`` selects the LHS)."""
    roles = [r for r, reg in LAYOUTS.items()
             if fmt in reg or any(c.parse_name(fmt) for c in reg.values())]
    if not roles:
        known = ", ".join(dict.fromkeys(RHS_FORMATS + LHS_FORMATS))
        raise LayoutError(f"unknown layout format {fmt!r}; known: {known}")
    if len(roles) > 1:
        return "lhs" if "mr" in geometry and "nr" not in geometry else "rhs"
    return roles[0]


def _build(role: str, fmt, geometry: dict):
    """The layout of format (or name) ``fmt`` in ``role``: the registry's class, built by its
    ``for_geometry`` from ``geometry`` (``nr``/``mr``, kr, sr, bl, rounding; None: the
    format's default)."""
    if not isinstance(fmt, str):
        raise LayoutError(f"format must be a string, got {fmt!r}")
    reg = LAYOUTS[role]
    g = {key: v for key, v in geometry.items() if v is not None}
    dim = _ROWS[role]
    rows = g.pop(dim, None)
    if fmt in reg:
        if rows is None:
            raise LayoutError(f"layout {fmt!r} needs {dim}=")
        return reg[fmt].for_geometry(rows, **g)
    # a full name: the tile rows and L are in it
    err = None
    for cls in reg.values():
        parsed = cls.parse_name(fmt)
        if parsed is None:
            continue
        n_rows, L = parsed
        if rows is not None and rows != n_rows:
            raise LayoutError(f"layout {fmt!r} has {dim}={n_rows}, got {dim}={rows}")
        try:
            lay = cls.for_geometry(n_rows, **g)
        except LayoutError as e:
            err = err or e
            continue
        if lay.name == fmt:
            return lay
        err = err or LayoutError(f"layout {fmt!r} has L={L}, the geometry gives {lay.name}")
    if err is not None:
        raise err
    layout_class(role, fmt)       # raises: unknown format of this role
    raise AssertionError("unreachable")


def layout_for(fmt: str, **geometry):
    """The layout object of format ``fmt`` (a stem, or a layout's full ``name``).

    RHS formats take ``nr, kr, sr, bl``, LHS formats ``mr, kr, sr, bl`` and ``rounding``
    (qsi8d32p); a parameter left out is the format's default, formats without blocks ignore
    ``bl``, and fixed values (``sr=1`` of f32p, bf16 and qsi8cxp, qai8dxp's rounding) must
    match."""
    return _build(_role(fmt, geometry) if isinstance(fmt, str) else "rhs", fmt, geometry)


def pack_rhs(fmt: str, w: np.ndarray | None = None, *, nr: int, kr: int | None = None,
             sr: int | None = None, bl: int = 32, bias: np.ndarray | None = None,
             layout: str = "nk", ggml=None, n: int | None = None, k: int | None = None) -> np.ndarray:
    """Pack weights into RHS format ``fmt`` (geometry as :func:`layout_for`); returns uint8 bytes.

    * ``"f32p"``, bf16: float32 ``w`` (n, k), or (k, n) with ``layout="kn"``, optional f32 bias.
    * ``"qsi4c32p"``: float32 ``w`` quantised like ggml Q4_0 (bl must be 32), or raw ggml
      block_q4_0 bytes via ``ggml=`` with ``n, k``; optional f32 bias.  f16 d -> bf16 by
      round-to-nearest-even.
    * ``"qsi4c32pscalef16"``: float32 ``w`` quantised per bl-block like Q4_0, or raw
      q4_0(-style) rows via ``ggml=`` (with ``n, k`` when flat).  No bias (KleidiAI asserts
      ``bias == NULL`` for this packer).
    * ``"qsi8cxp"``: float32 ``w`` or raw ggml block_q8_0 bytes via ``ggml=`` with ``n, k``.
    * ``"q4kp"``, ``"q6kp"``: raw ggml block_q4_K / block_q6_K bytes via ``ggml=`` with ``n, k``
      only (float ``w`` is refused); no bias.
    """
    lay = _build("rhs", fmt, {"nr": nr, "kr": kr, "sr": sr, "bl": bl})
    if (w is None) == (ggml is None):
        raise LayoutError("pass exactly one of w (float weights) or ggml= (raw ggml bytes)")
    if layout not in ("nk", "kn"):
        raise LayoutError(f"layout must be 'nk' or 'kn', got {layout!r}")
    if not hasattr(lay, "pack_from_float"):         # f32 formats: the weights as they are
        if ggml is not None:
            raise LayoutError(f"{lay.format} weights are float32, not ggml data")
        return lay.pack(w, bias=bias, layout=layout)
    if ggml is not None:
        if isinstance(lay, QSI4C32PScaleF16):     # q4_0-style rows of any block length
            if layout != "nk":
                raise LayoutError("ggml= data is always n x k rows")
            lay.require_no_bias(bias)
            return lay.pack(ggml, n, k, finite_scales=True)
        if n is None or k is None:
            raise LayoutError("ggml= needs n and k")
        return lay.pack_from_ggml(ggml, n, k, bias)
    w = np.asarray(w)
    if w.ndim != 2:
        raise LayoutError(f"weights must be 2-D, got shape {w.shape}")
    if layout == "kn":
        w = np.ascontiguousarray(w.T)
    return lay.pack_from_float(w, bias)


def pack_lhs(fmt: str, x: np.ndarray, *, mr: int, kr: int, sr: int, bl: int = 32,
             m_idx_start: int = 0, rounding: str | None = None) -> np.ndarray:
    """Quantise and pack activation rows ``x`` (float32 (m, k); x[0] = global row m_idx_start)
    into LHS format ``fmt`` (``rounding``: qsi8d32p's, default "away"); returns the region from
    the row block of m_idx_start (``ceil(((m_idx_start % mr) + m) / mr)`` row blocks), unused
    slots zero: the row-block formats (:class:`~tilegen.layout.base.RowBlocks`: the int8 ones).
    f32p and bf16 formats pack whole row blocks from row 0."""
    lay = _build("lhs", fmt, {"mr": mr, "kr": kr, "sr": sr, "bl": bl, "rounding": rounding})
    if isinstance(lay, RowBlocks):
        return lay.pack(x, m_idx_start=m_idx_start)
    if m_idx_start:
        raise LayoutError(f"{lay.format} packs whole row blocks from row 0 (m_idx_start=0)")
    return lay.pack(x)


def dequantize_rows(packed: np.ndarray, fmt: str, n: int, k: int, nr: int, kr: int, sr: int,
                    bl: int, rows) -> np.ndarray:
    """float32 (len(rows), k): the exact weights packed RHS rows represent."""
    lay = _build("rhs", fmt, {"nr": nr, "kr": kr, "sr": sr, "bl": bl})
    return lay.dequantize_rows(packed, n, k, rows)


# value kinds of RHS layouts (their ``rhs_values``) -> the value kinds that hold them exactly
_HELD_BY = {"bf16": ("bf16", "f32"), "f32": ("f32",)}


def can_repack(src, dst) -> bool:
    """Whether :func:`repack_rhs` takes ``src`` to ``dst`` without loss: layouts of one format
    and block length, or a layout of bf16 values (any bf16 format) into another bf16 layout
    or into f32p (bf16 widens to f32 exactly)."""
    if type(src) is type(dst):
        return getattr(src, "bl", None) == getattr(dst, "bl", None)
    have, want = getattr(src, "rhs_values", None), getattr(dst, "rhs_values", None)
    return have is not None and want in _HELD_BY.get(have, ())


def repack_rhs(packed: np.ndarray, src, dst, n: int, k: int) -> np.ndarray:
    """Packed RHS bytes of n x k weights in layout ``src``, re-laid out for layout ``dst`` of the
    same format and block length (other nr/kr/sr; bf16 weights: any bf16 layout or f32p, see
    :func:`can_repack`): the bytes packing the same weights for ``dst`` gives.  Lossless: each
    layout's unpack returns what its pack takes (f32p and bf16: weights and bias;
    qsi4c32pscalef16: the q4_0 source rows; qsi4c32p: nibbles, bf16 scales, bias; its row sums
    are recomputed in dst's order, as KleidiAI's packer computes them; qsi8cxp: int8 weights,
    scales, bias)."""
    if not can_repack(src, dst):
        raise LayoutError(f"cannot repack {src.name} (bl={getattr(src, 'bl', None)}) into "
                          f"{dst.name} (bl={getattr(dst, 'bl', None)}): only layouts of one format "
                          f"and block length hold the same values (and bf16 layouts: any bf16 "
                          f"layout or f32p)")
    have, need = np.asarray(packed).nbytes, src.packed_size(n, k)
    if have < need:
        raise LayoutError(f"packed buffer holds {have} bytes, {src.name} needs {need} for n={n}, k={k}")
    if not hasattr(src, "packed_values"):
        raise LayoutError(f"cannot repack {src.name}: not a packed-RHS layout")
    return dst.pack_values(src.packed_values(packed, n, k), n, k)
