"""Shared helpers for layout objects."""
from __future__ import annotations

from functools import lru_cache


class LayoutError(ValueError):
    """Input that does not fit a packed layout (shape, dtype, alignment)."""


@lru_cache(maxsize=512)
def _compiled(expr: str):
    return compile(expr, "<layout>", "eval")


def eval_expr(expr: str, **env: int) -> int:
    """Evaluate a layout's stride expression (integers, + * //, names k and bl)."""
    return int(eval(_compiled(expr), {"__builtins__": {}}, env))  # noqa: S307 - own strings


def c_expr(expr: str) -> str:
    """The same expression in C over size_t (floor division is C's unsigned division)."""
    return expr.replace("//", "/")


def roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def _dims(spec, vl: int | None) -> tuple[int, int]:
    """Concrete (mr, nr) of a spec; VL-scaled tiles need the CPU's vector length in bytes."""
    from ..generator.spec import SpecError
    try:
        return spec.mr_at(vl), spec.nr_at(vl)
    except SpecError as e:
        raise LayoutError(str(e)) from None


@lru_cache(maxsize=1024)   # layout objects are immutable; the runtime asks on every call
def rhs_layout_for(spec, bl: int = 32, vl: int | None = None):
    """The packed-RHS layout object a kernel spec reads (``bl``: block length of q4 formats;
    ``vl``: vector length in bytes, for tiles given in VL units)."""
    _, nr = _dims(spec, vl)
    if spec.family == "f32":
        from .f32 import F32PackedRHS
        return F32PackedRHS(nr=nr, kr=spec.kr)
    if spec.family == "q4_0":
        from .q4 import QSI4C32PScaleF16
        return QSI4C32PScaleF16(nr=nr, kr=spec.kr, sr=spec.sr, bl=bl)
    if spec.family == "q4_0_dx":
        from .q4 import QSI4C32P
        return QSI4C32P(nr=nr, kr=spec.kr, sr=spec.sr, bl=bl)
    if spec.family == "q8_0":
        from .q8 import QSI8CXP
        return QSI8CXP(nr=nr, kr=spec.kr, sr=spec.sr)
    raise LayoutError(f"no RHS layout for family {spec.family!r}")


_ALL_VLS = tuple(range(16, 257, 16))


def rhs_identity(spec) -> tuple:
    """What a kernel's packed RHS is, as a hashable key: its layout objects at every vector
    length the tile can meet (one layout for fixed-width tiles) and which VL scales them.
    Two kernels read the same packed weights exactly when their keys are equal."""
    vls = _ALL_VLS if spec.vl_scaled else (None,)
    return (spec.vl_kind, tuple(rhs_layout_for(spec, 32, v) for v in vls))


def same_rhs(a, b, vl: int | None = None) -> bool:
    """Whether kernel specs ``a`` and ``b`` read the same packed RHS (equal layout objects):
    at vector length ``vl`` (bytes) if given, else at every vector length."""
    if vl is None:
        return rhs_identity(a) == rhs_identity(b)
    return rhs_layout_for(a, 32, vl) == rhs_layout_for(b, 32, vl)


def _lhs_mr(spec, vl: int | None) -> int:
    from ..generator.spec import SpecError
    try:
        return spec.lhs_mr_at(vl)
    except SpecError as e:
        raise LayoutError(str(e)) from None


@lru_cache(maxsize=1024)
def lhs_layout_for(spec, bl: int = 32, vl: int | None = None):
    """The packed-LHS layout object a kernel spec reads (None: unpacked f32 rows)."""
    if spec.family == "f32":
        if not spec.packs_f32_lhs:
            return None
        from .f32 import F32PackedLHS
        return F32PackedLHS(mr=_dims(spec, vl)[0])
    if spec.family == "q4_0":
        from .q4 import QSI8D32P
        return QSI8D32P(mr=_lhs_mr(spec, vl), kr=spec.kr, sr=spec.sr, bl=bl)
    if spec.family in ("q4_0_dx", "q8_0"):
        from .q4 import QAI8DXP
        return QAI8DXP(mr=_lhs_mr(spec, vl), kr=spec.kr, sr=spec.sr)
    return None
