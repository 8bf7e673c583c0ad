"""The packed layouts of a kernel spec as the generator reads them: the layout objects a
template takes its offsets from, and the layouts' refusals as spec errors."""
from __future__ import annotations

from ..layout import LayoutError, lhs_layout_for, rhs_layout_for
from ..records import VL_GRANULE, SpecError
from .spec import KernelSpec

__all__ = ["template_layouts", "check_packing"]


def template_layouts(spec: KernelSpec):
    """(RHS, LHS) layout objects a kernel template takes its offsets from (LHS None: unpacked
    f32 rows).  Fixed-width tiles get their concrete layouts.  VL-scaled tiles get the layouts
    at one 128-bit granule (vl = VL_GRANULE bytes): every size and offset of those layouts is
    proportional to the vector length, so the granule layout's byte count divided by 16 (filter
    ``vl``) or 2 (``pl``) is the same quantity in units the addvl/addpl/``mul vl`` operands take
    at every vector length."""
    vl = VL_GRANULE if spec.vl_scaled else None
    return rhs_layout_for(spec, 32, vl), lhs_layout_for(spec, 32, vl)


def check_packing(spec: KernelSpec) -> None:
    """The packed layouts' own rules (interleave, sr, block length; checked once, by the layout
    classes) as SpecErrors, and the spec's LHS row-block rule."""
    vl = VL_GRANULE if spec.vl_scaled else None      # VL-scaled tiles: the rules hold at every VL
    try:
        rhs_layout_for(spec, 32, vl)
        lhs_layout_for(spec, 32, vl)
    except LayoutError as e:
        raise SpecError(f"the {spec.family} layouts refuse kr={spec.kr}, sr={spec.sr}: {e}") from None
    if not spec.mr_vl and spec.mr % spec.lhs_mr:
        raise SpecError(f"mr={spec.mr} must be 1 (gemv) or a multiple of {spec.lhs_mr} (LHS "
                        f"packed {spec.lhs_mr} rows at a time)")
