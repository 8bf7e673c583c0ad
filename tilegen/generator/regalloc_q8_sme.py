"""Register allocation of the q8_0 kernels in streaming mode (qai8dxp x qsi8cxp, kr = 4):

``sme``   SMOPA gemm, tile 1vl x nu vl (nu = 1..4): the int32 sums of column vector cv in ZA
          tile za<cv>.s over the whole k range; the epilogue reads one row slice at a time.
``sme2``  gemv (mr = 1), nr = 2vl or 4vl: SDOT by lane on a multi-vector RHS group into the
          ZA-array group at w8 (vgx<nv>); consecutive chunks of k go to different ZA-array
          offsets (independent accumulation chains, at most 4: distinct at SVL 128), added
          after the k loop.  Template q8_sve.S.j2 (strategy ``za4``), in streaming mode.

Both read the RHS qsi8cxp<nv>vlx4 at the streaming vector length: a gemm and a gemv of the same
nr share the packed weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .regalloc import _SME_X_ORDER, RegisterPool, VectorNeeds, _check_packing, _Frame
from .regalloc_q8 import _Q8_SCALARS, _check_layouts
from .regalloc_q8_sve import Q8SveRegs
from .spec import KernelSpec, SpecError

__all__ = ["Q8SmeRegs", "allocate_q8_sme", "allocate_q8_sme2"]

_SME_CHART = ("LHS", "RHS", "column values", "row", "clamp")
_Q8_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "nk", "lhs_rbs",
                   "dst_blk_stride", "tmp", "lo", "vlw", "rows", "offp", "rscp")
_ZA_SPLIT = 4


@dataclass(frozen=True)
class Q8SmeRegs(_Frame):
    """SMOPA q8_0 gemm: LHS / RHS vectors (double-buffered by chunk), the column values of
    the epilogue (rsum, scale, bias per column vector), one row's offset and rscale
    (broadcast), the row slice being finished and a product, the clamp bounds."""

    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    col_vals: tuple[int, ...]            # [3cv + 0/1/2]: rsum / scale / bias of column vector cv
    row_vals: tuple[int, int]
    row_tmp: tuple[int, int]
    clamp: tuple[int, int]
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())


def _common_checks(spec: KernelSpec) -> None:
    _check_packing(spec)
    if spec.kr != 4:
        raise SpecError(f"q8_0 {spec.isa} kernels read 4-byte k groups (SMOPA / SDOT by lane): "
                        f"kr must be 4, got kr={spec.kr}")
    if spec.acc_mem:
        raise SpecError("q8_0 kernels keep their int32 sums in ZA: acc_mem (:am) is a q4 option")


def _granule_layouts(spec: KernelSpec):
    from ..layout import lhs_layout_for, rhs_layout_for
    from .render import VL_GRANULE
    return rhs_layout_for(spec, 32, VL_GRANULE), lhs_layout_for(spec, 32, VL_GRANULE)


def allocate_q8_sme(spec: KernelSpec) -> Q8SmeRegs:
    if not (spec.mr_vl and spec.nr_vl) or spec.mr != 1 or not 1 <= spec.nr <= 4:
        raise SpecError(f"sme q8_0 outer-product tiles are 1vl x 1-4vl (one int32 ZA tile per "
                        f"column vector, four exist), got {spec.mr_str}x{spec.nr_str}")
    _common_checks(spec)
    _check_layouts(spec, _granule_layouts(spec))
    nu = spec.nr
    pool = RegisterPool(_SME_CHART, x_order=_SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = tuple(v.take(2, "LHS"))
    rhs = tuple(v.take(2 * nu, "RHS"))
    col_vals = tuple(v.take(3 * nu, "column values"))
    row_vals = tuple(v.take(2, "row"))
    row_tmp = tuple(v.take(2, "row"))
    clamp = tuple(v.take(2, "clamp"))
    gpr = pool.scalars(_Q8_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return Q8SmeRegs(lhs=lhs, rhs=rhs, col_vals=col_vals, row_vals=row_vals, row_tmp=row_tmp,
                     clamp=clamp, gpr=gpr, **pool.frame())


_SME2_CHART = ("int32 accumulators", "LHS", "RHS", "further accumulator sets", "scratch",
               "epilogue beyond the LHS/RHS registers")


def allocate_q8_sme2(spec: KernelSpec) -> Q8SveRegs:
    nv = spec.nr
    if not spec.is_gemv:
        raise SpecError(f"sme2 q8_0 kernels are gemv (ZA-array SDOT): mr must be 1, got "
                        f"mr={spec.mr_str}")
    if nv not in (2, 4):
        raise SpecError(f"sme2 q8_0 gemv: nr must be 2vl or 4vl (SDOT vgx2/vgx4), got "
                        f"{spec.nr_str}")
    _common_checks(spec)
    _check_layouts(spec, _granule_layouts(spec))
    pool = RegisterPool(_SME2_CHART, x_order=_SME_X_ORDER, streaming=True)
    v = pool.v
    # multi-vector groups start at a multiple of their length; indexed operands in z0-z15
    lhs = v.claim((0, 1), "LHS")
    rhs = v.claim(range(8, 8 + nv), "RHS")
    acc = v.claim(range(20, 20 + nv), "int32 accumulators")
    ep = v.claim((2, 3, 4, 5, 6, 7, 16, 17), "epilogue beyond the LHS/RHS registers")
    gpr = pool.scalars(_Q8_SCALARS)
    lo = tuple(pool.x.take(1, "LHS row pointers"))
    pool.settle(f"sme2 q8_0 gemv 1x{spec.nr_str}")
    return Q8SveRegs(mode="za4", mr_reg=1, lhs_mr=1, groups=1, acc=(acc,), iacc=(acc,),
                     lhs=lhs, rhs=rhs, ep=ep, gpr=gpr, lo=lo, pred=tuple(range(1, nv + 1)),
                     za_split=_ZA_SPLIT, **pool.frame())
