"""Packing for a loaded library: weights in the layout of the kernel its table prefers (or
the best gemm / gemv), and activations with its generated LHS packers.

:class:`tilegen.runtime.library.Library` forwards ``pack_weights``, ``packer``,
``lhs_packer`` and ``pack_lhs`` here (their docs are the Library methods')."""
from __future__ import annotations

import numpy as np

from ..generator.packers import PACKER_FORMATS, packer_for, streaming_packer_for
from ..layout import LayoutError
from ..families import FLOAT_KINDS, GGML_BLOCKS, GGML_KINDS, pack
from ..layout.api import LHS_FORMATS, layout_class, layout_for
from ..layout.api import pack_lhs as numpy_pack_lhs
from .binding import Kernel, Packer
from .checks import positive_int
from .errors import ArgumentError
from .packed import OPS, PackedLayouts, PackedWeights
from .table import KernelTable

__all__ = ["pack_weights", "pack_for", "pack_experts", "expert_count", "find_packer", "lhs_packer", "pack_lhs", "check_ops"]


def pack_weights(table: KernelTable, w, kind: str, bias, layout: str, nr: int | None,
                 from_ggml, n, k, for_ops) -> PackedWeights | PackedLayouts:
    """See :meth:`tilegen.runtime.library.Library.pack_weights`."""
    experts = expert_count(w, from_ggml)
    if experts is not None:
        if for_ops is not None:
            raise ArgumentError("for_ops= does not take an expert stack (E, n, k): a stack is "
                                "packed once, for the default pair (gemm and gemv share its "
                                "layout)")
        return pack_experts(table.pairs(kind, nr)[0].gemm, w, kind, bias, layout, from_ggml,
                            n, k, experts)
    if for_ops is not None:
        ops = check_ops(for_ops)
        if nr is not None:
            raise ArgumentError("nr= and for_ops= do not combine (for_ops packs for the "
                                "best kernels of each op)")
        best = table.best_kernels(kind)
        by_layout: dict = {}
        by_op = {}
        for op in ops:
            kern = best[op]
            lay = kern.rhs_layout()
            if lay not in by_layout:
                by_layout[lay] = pack_for(kern, w, kind, bias, layout, from_ggml, n, k)
            by_op[op] = by_layout[lay]
        return PackedLayouts(by_op)
    return pack_for(table.pairs(kind, nr)[0].gemm, w, kind, bias, layout, from_ggml, n, k)


def pack_for(kern: Kernel, w, kind: str, bias, layout: str, from_ggml, n, k) -> PackedWeights:
    """The weights packed in the layout ``kern`` reads, by its family's packing protocol
    (:func:`tilegen.families.pack`)."""
    _check_source(kind, w, layout, from_ggml, n, k)
    if from_ggml is None:
        w = np.asarray(w)
        if kind not in FLOAT_KINDS:         # the quantisers take (n, k)
            if w.ndim != 2:
                raise ArgumentError(f"weights must be 2-D ({layout[0]}, {layout[1]}), got shape "
                                    f"{w.shape}")
            if layout == "kn":
                w = np.ascontiguousarray(w.T)
                layout = "nk"
        if w.ndim == 2:
            n, k = (w.shape if layout == "nk" else w.shape[::-1])
    lay = kern.rhs_layout()
    try:
        data = pack(kern.family, lay, kind, w, from_ggml, n, k, bias, layout)
    except LayoutError as e:
        raise ArgumentError(str(e)) from None
    return PackedWeights(lay, int(n), int(k), data, bias is not None, kind)


def expert_count(w, from_ggml) -> int | None:
    """E when the weight source is a stack of E expert matrices: float weights of shape
    (E, n, k) (or (E, k, n) with layout "kn"), or ggml blocks as a uint8 array (E, n, row
    bytes); None for one matrix."""
    src = w if from_ggml is None else from_ggml
    if src is None or isinstance(src, (bytes, bytearray, memoryview)):
        return None
    shape = np.shape(src)
    return shape[0] if len(shape) == 3 else None


def pack_experts(kern: Kernel, w, kind: str, bias, layout: str, from_ggml, n, k,
                 experts: int) -> PackedWeights:
    """A stack of E expert matrices, each packed as :func:`pack_for` packs one, into one
    buffer (:meth:`PackedWeights.stack`); ``bias`` None or float32 (E, n)."""
    if experts < 1:
        raise ArgumentError(f"an expert stack needs at least one expert, got shape "
                            f"{np.shape(w if from_ggml is None else from_ggml)}")
    if bias is not None:
        b = np.asarray(bias)
        if b.ndim != 2 or b.shape[0] != experts:
            raise ArgumentError(f"the bias of {experts} experts must have shape ({experts}, n), "
                                f"got {b.shape}")
    src = np.asarray(w if from_ggml is None else from_ggml)
    parts = []
    for e in range(experts):
        one = (src[e], None) if from_ggml is None else (None, src[e])
        try:
            parts.append(pack_for(kern, one[0], kind, None if bias is None else bias[e],
                                  layout, one[1], n, k))
        except ArgumentError as err:
            raise ArgumentError(f"expert {e} of {experts}: {err}") from None
    return PackedWeights.stack(parts)


def find_packer(packers: dict[str, Packer], fmt: str, mr: int, kr: int, sr: int,
                rounding: str = "away") -> Packer | None:
    """See :meth:`tilegen.runtime.library.Library.packer`."""
    try:
        layout_for(fmt, mr=mr, kr=kr, sr=sr)     # the format's rules on the geometry
    except LayoutError:
        return None
    L = kr // sr
    scaled = []
    for p in packers.values():
        sp = p.spec
        if (sp.fmt, sp.L, sp.rounding) != (fmt, L, rounding) or sp.streaming:
            continue
        if not sp.mr_vl and sp.mr == mr:
            return p
        if sp.mr_vl and sp.accepts_mr(mr):
            scaled.append(p)
    if not scaled:
        return None
    return max(scaled, key=lambda p: (p.spec.mr, p.name)).at(mr)


def lhs_packer(packers: dict[str, Packer], kern: Kernel, bl: int = 32) -> Packer | None:
    """See :meth:`tilegen.runtime.library.Library.lhs_packer`."""
    want = packer_for(kern.spec)
    if want is None:
        return None
    mr = kern.lhs_layout(bl).mr
    twin = streaming_packer_for(kern.spec)
    p = packers.get(twin.name) if twin is not None else None
    if (p is not None and p.features <= kern.features and p.accepts_mr(mr)
            and 8 * p.svl_bytes >= p.spec.streaming_from_svl):
        return p.at(mr)     # the SME kernel's LHS packed in streaming mode (ZA transpose)
    p = packers.get(want.name)
    if p is not None and p.spec.accepts_mr(mr):
        return p.at(mr)
    return find_packer(packers, want.fmt, mr, want.kr, want.sr, want.rounding)


def pack_lhs(packers: dict[str, Packer], libname: str, fmt: str, x: np.ndarray, *, mr: int,
             kr: int, sr: int, bl: int = 32, m_idx_start: int = 0,
             rounding: str = "away") -> np.ndarray:
    """See :meth:`tilegen.runtime.library.Library.pack_lhs`."""
    if isinstance(fmt, str) and fmt not in PACKER_FORMATS and fmt in LHS_FORMATS:
        return _numpy_pack_lhs(fmt, x, mr=mr, kr=kr, sr=sr, bl=bl, m_idx_start=m_idx_start,
                               rounding=rounding)
    p = find_packer(packers, fmt, mr, kr, sr, rounding)
    if p is None:
        raise ArgumentError(f"no {fmt} packer with mr={mr}, kr/sr={kr // max(sr, 1)} "
                            f"({rounding}) in {libname}; it has: "
                            f"{', '.join(sorted(packers)) or 'none'}")
    return p(x, bl=bl, m_idx_start=m_idx_start)


def _numpy_pack_lhs(fmt: str, x: np.ndarray, *, mr: int, kr: int, sr: int, bl: int,
                    m_idx_start: int, rounding: str) -> np.ndarray:
    """A format with no generated packer (q8ki16p): its layout object's numpy packer, as
    ``matmul`` packs it (``tilegen.pack_lhs``).  A format of fixed conversion takes only the
    default rounding, "away" (as its generated packers would)."""
    m_idx_start = positive_int("m_idx_start", m_idx_start, minimum=0)
    fixed = layout_class("lhs", fmt).fixed_conversion
    if fixed and rounding != "away":
        raise ArgumentError(f"{fmt} takes no rounding option ({fixed}); got {rounding!r}")
    try:
        return numpy_pack_lhs(fmt, x, mr=mr, kr=kr, sr=sr, bl=bl, m_idx_start=m_idx_start,
                              rounding=None if fixed else rounding)
    except LayoutError as e:
        raise ArgumentError(str(e)) from None


_LAYOUTS = ("nk", "kn")


def _check_source(kind: str, w, layout, from_ggml, n, k) -> None:
    """ArgumentError unless pack_weights got one weight source that fits ``kind``: ``w`` in
    ``layout`` "nk" or "kn", or (the kinds of ``GGML_BLOCKS``) ggml blocks ``from_ggml`` with
    n and k, always n rows of k/QK blocks (ggml's (n, k) order: layout "nk")."""
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ArgumentError(f"layout must be 'nk' ((n, k) weights) or 'kn' ((k, n) weights), "
                            f"got {layout!r}")
    if from_ggml is None:
        if w is None:
            raise ArgumentError("no weights: pass w (or ggml blocks via from_ggml= with n and "
                                f"k, for kinds {', '.join(GGML_KINDS)})")
        return
    if kind not in GGML_KINDS:
        types = "/".join(dict.fromkeys(t for t, _ in GGML_BLOCKS.values()))
        raise ArgumentError(f"from_ggml= takes ggml {types} blocks, for kinds "
                            f"{', '.join(GGML_KINDS)}; kind {kind!r} has no ggml block form: "
                            f"pass its weights as w")
    if w is not None:
        raise ArgumentError("pass either w or from_ggml=, not both")
    if layout != "nk":
        btype, qk = GGML_BLOCKS[kind]
        raise ArgumentError(f"from_ggml= blocks are always n rows of k/{qk} {btype} blocks "
                            f"(ggml's (n, k) order): layout must be 'nk' with from_ggml=, got "
                            f"'kn'")
    if n is None or k is None:
        raise ArgumentError("from_ggml= needs n and k")


def check_ops(for_ops) -> tuple[str, ...]:
    """``for_ops`` as a tuple: both of "gemm" and "gemv", each once, in any order."""
    if isinstance(for_ops, str) or not isinstance(for_ops, (tuple, list)):
        raise ArgumentError(f"for_ops must be a tuple of op names, e.g. ('gemm', 'gemv'), "
                            f"got {for_ops!r}")
    ops = tuple(for_ops)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ArgumentError(f"unknown op {bad[0]!r} in for_ops; known: {', '.join(OPS)}")
    if len(set(ops)) != len(ops):
        raise ArgumentError(f"for_ops names an op twice: {ops!r}")
    if set(ops) != set(OPS):
        raise ArgumentError(f"for_ops must name both ops, ('gemm', 'gemv'), got {ops!r} (without "
                            f"for_ops the weights are packed once for the default pair)")
    return tuple(OPS)
