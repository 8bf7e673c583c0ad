"""Register allocation of the q8_0 kernels in streaming mode (qai8dxp x qsi8cxp, kr = 4):

``sme``   SMOPA gemm, tile 1vl x nu vl (nu = 1..4): the int32 sums of column vector cv in ZA
          tile za<cv>.s over the whole k range; the epilogue reads one row slice at a time.
``sme2``  the same SMOPA gemm (template q8_sme.S.j2) with SME2 multi-vector loads: a 32-k slice
          is 8 LHS and 8*nu RHS vectors, read as groups of four consecutive Z registers (LD1B
          {z<4i>-z<4i+3>}, predicate-as-counter pn8): two LHS groups and two RHS groups (the
          RHS groups alternate along the slice's vectors), 2 + 2*nu loads per slice instead of
          8 + 8*nu; the epilogue's column and row values reuse those 16 registers.
          And the gemv (mr = 1), nr = 2vl or 4vl: SDOT by lane on a multi-vector RHS group
          into the ZA-array group at w8 (vgx<nv>); consecutive chunks of k go to different ZA-array
          offsets (independent accumulation chains, at most 4: distinct at SVL 128), added
          after the k loop.  Template q8_sve.S.j2 (strategy ``za4``), in streaming mode.

Both read the RHS qsi8cxp<nv>vlx4 at the streaming vector length: a gemm and a gemv of the same
nr share the packed weights.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing
from .pool import SME_X_ORDER, Frame, RegisterPool, VectorNeeds
from .q8 import Q8_CHART, Q8_SCALARS, Q8Regs, check_layouts

__all__ = ["Q8SmeRegs", "ALLOCATORS"]

_SME_CHART = ("LHS", "RHS", "column values", "row", "clamp")
_Q8_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "nk", "lhs_rbs",
                   "dst_blk_stride", "tmp", "lo", "vlw", "rows", "offp", "rscp")
_ZA_SPLIT = 4
_GROUP = 4          # SME2 multi-vector loads: four consecutive Z registers


@dataclass(frozen=True)
class Q8SmeRegs(Frame):
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
    counter_pred: int = 8                # pn8: all lanes, the SME2 multi-vector loads
    load_group: int = _GROUP             # SME2: vectors per load (lhs / rhs: two groups each)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())


def _allocate_q8_sme(spec: KernelSpec) -> Q8SmeRegs:
    """The SMOPA gemm: SME (single-vector loads, double-buffered by chunk) or SME2 (groups of
    four vectors, see the module doc)."""
    if not (spec.mr_vl and spec.nr_vl) or spec.mr != 1 or not 1 <= spec.nr <= 4:
        raise SpecError(f"sme q8_0 outer-product tiles are 1vl x 1-4vl (one int32 ZA tile per "
                        f"column vector, four exist), got {spec.mr_str}x{spec.nr_str}")
    check_packing(spec)
    check_layouts(spec)
    nu = spec.nr
    pool = RegisterPool(_SME_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    if spec.isa == "sme2":
        # groups of four start at a multiple of four (V_ORDER hands out z0-z7, z16-z23)
        lhs = tuple(v.take(2 * _GROUP, "LHS"))
        rhs = tuple(v.take(2 * _GROUP, "RHS"))
        if any(g[0] % _GROUP or list(g) != list(range(g[0], g[0] + _GROUP))
               for g in (lhs[:_GROUP], lhs[_GROUP:], rhs[:_GROUP], rhs[_GROUP:])):
            raise AssertionError(f"q8_0 sme2 gemm: load groups {lhs} {rhs} are not z<4i>-z<4i+3>")
        held = list(lhs + rhs)          # dead after the k loop: the epilogue's values
        col_vals = tuple(v.reuse(held, 3 * nu, "column values"))
        row_vals = tuple(v.reuse(held[3 * nu:], 2, "row"))
        row_tmp = tuple(v.reuse(held[3 * nu + 2:], 2, "row"))
    else:
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


def _allocate_q8_sme2(spec: KernelSpec) -> Q8SmeRegs | Q8Regs:
    """sme2: the gemm (mr in VL units) is the SMOPA gemm with multi-vector loads, the gemv
    (mr = 1) ZA-array SDOT."""
    nv = spec.nr
    if not spec.is_gemv:
        if not spec.mr_vl:
            raise SpecError(f"sme2 q8_0 kernels are the 1vl x 1-4vl gemm (SMOPA) or the "
                            f"1 x 2/4vl gemv (ZA-array SDOT), got {spec.mr_str}x{spec.nr_str}")
        return _allocate_q8_sme(spec)
    if nv not in (2, 4):
        raise SpecError(f"sme2 q8_0 gemv: nr must be 2vl or 4vl (SDOT vgx2/vgx4), got "
                        f"{spec.nr_str}")
    check_packing(spec)
    check_layouts(spec)
    pool = RegisterPool(Q8_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    # multi-vector groups start at a multiple of their length; indexed operands in z0-z15
    lhs = v.claim((0, 1), "LHS")
    rhs = v.claim(range(8, 8 + nv), "RHS")
    acc = v.claim(range(20, 20 + nv), "int32 accumulators")
    ep = v.claim((2, 3, 4, 5, 6, 7, 16, 17), "epilogue beyond the LHS/RHS registers")
    gpr = pool.scalars(Q8_SCALARS)
    lo = tuple(pool.x.take(1, "LHS row pointers"))
    pool.settle(f"sme2 q8_0 gemv 1x{spec.nr_str}")
    return Q8Regs(mode="za4", mr_reg=1, lhs_mr=1, groups=1, acc=(acc,), iacc=(acc,),
                  lhs=lhs, rhs=rhs, ep=ep, gpr=gpr, lo=lo, pred=tuple(range(1, nv + 1)),
                  za_split=_ZA_SPLIT, **pool.frame())


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q8_sme": _allocate_q8_sme, "q8_sme2": _allocate_q8_sme2}
