"""The packed layout classes by role and format: the one table both dispatchers read.

:func:`tilegen.layout.base.rhs_layout_for` / ``lhs_layout_for`` (by kernel spec: the family
record names the format) and :func:`tilegen.layout.api.layout_for` (by format, or by a
layout's full name) look the class up here and build the object with its ``for_geometry``.
"""
from __future__ import annotations

from .base import LayoutError
from .bf16 import BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B
from .f16 import F16PLhs2
from .f32 import F32PackedLHS, F32PackedRHS
from .kquant import Q4KP, Q6KP, Q8KP
from .lhs_int8 import QAI8DXP, QSI8D32P, QSI8D32PScaleTail
from .rhs_int4 import QSI4C32P, QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from .rhs_int8 import QSI8CXP

__all__ = ["RHS_LAYOUTS", "LHS_LAYOUTS", "LAYOUTS", "layout_class"]


def _registry(role: str, classes: tuple) -> dict[str, type]:
    out: dict[str, type] = {}
    for cls in classes:
        if cls.role != role:
            raise TypeError(f"{cls.__name__} is a {cls.role} layout, not {role}")
        if cls.format in out:
            raise TypeError(f"format {cls.format!r} of {cls.__name__} is taken by "
                            f"{out[cls.format].__name__}")
        out[cls.format] = cls
    return out


RHS_LAYOUTS: dict[str, type] = _registry("rhs", (
    F32PackedRHS, QSI4C32P, QSI4C32PScaleF16, QSI8CXP, BF16PRhs4B, BF16PRhs2B,
    QSI4C32PS1S0ScaleF16, Q4KP, Q6KP))
LHS_LAYOUTS: dict[str, type] = _registry("lhs", (
    F32PackedLHS, QAI8DXP, QSI8D32P, BF16PLhs4, BF16PLhs2, QSI8D32PScaleTail, F16PLhs2, Q8KP))
LAYOUTS: dict[str, dict[str, type]] = {"rhs": RHS_LAYOUTS, "lhs": LHS_LAYOUTS}


def layout_class(role: str, fmt: str) -> type:
    """The layout class of format ``fmt`` (a stem, e.g. ``"qsi4c32p"``) in role ``role``."""
    try:
        return LAYOUTS[role][fmt]
    except KeyError:
        known = ", ".join(LAYOUTS.get(role, {}))
        raise LayoutError(f"unknown {role.upper()} format {fmt!r}; known: {known}") from None
