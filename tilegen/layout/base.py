"""Shared helpers for layout objects."""
from __future__ import annotations


class LayoutError(ValueError):
    """Input that does not fit a packed layout (shape, dtype, alignment)."""


def roundup(a: int, b: int) -> int:
    return -(-a // b) * b


def rhs_layout_for(spec):
    """The packed-RHS layout object a kernel spec reads."""
    if spec.family == "f32":
        from .f32 import F32PackedRHS
        return F32PackedRHS(nr=spec.nr, kr=spec.kr)
    raise LayoutError(f"no RHS layout for family {spec.family!r}")
