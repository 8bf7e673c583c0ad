"""The packed layout classes by role and format: the one table both dispatchers read.

:func:`tilegen.layout.base.rhs_layout_for` / ``lhs_layout_for`` (by kernel spec: the family
record names the format) and :func:`tilegen.layout.api.layout_for` (by format, or by a
layout's full name) look the class up here and build the object with its ``for_geometry``.  The classes are the
family plugins' (:data:`tilegen.families.LAYOUTS`), plus the shared K-quant activations.
"""
from __future__ import annotations

from ..families import LAYOUTS as FAMILY_LAYOUTS
from .base import LayoutError
from .kquant import Q8KP, Q8KPI16

__all__ = ["RHS_LAYOUTS", "LHS_LAYOUTS", "LAYOUTS", "layout_class"]

# every family's layouts, in registry order (a layout two families read is listed once), then
# those of layout/ that no one family owns (the K-quant activations every K-quant reads, and
# their int16 widening the SME2 row-group gemms read)
_CLASSES = tuple(dict.fromkeys(FAMILY_LAYOUTS + (Q8KP, Q8KPI16)))


def _registry(role: str) -> dict[str, type]:
    classes = tuple(c for c in _CLASSES if c.role == role)
    out: dict[str, type] = {}
    for cls in classes:
        if cls.format in out:
            raise TypeError(f"format {cls.format!r} of {cls.__name__} is taken by "
                            f"{out[cls.format].__name__}")
        out[cls.format] = cls
    return out


RHS_LAYOUTS: dict[str, type] = _registry("rhs")
LHS_LAYOUTS: dict[str, type] = _registry("lhs")
LAYOUTS: dict[str, dict[str, type]] = {"rhs": RHS_LAYOUTS, "lhs": LHS_LAYOUTS}


def layout_class(role: str, fmt: str) -> type:
    """The layout class of format ``fmt`` (a stem, e.g. ``"qsi4c32p"``) in role ``role``."""
    try:
        return LAYOUTS[role][fmt]
    except KeyError:
        known = ", ".join(LAYOUTS.get(role, {}))
        raise LayoutError(f"unknown {role.upper()} format {fmt!r}; known: {known}") from None
