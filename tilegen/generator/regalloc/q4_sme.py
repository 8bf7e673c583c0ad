"""Register allocation of the int4 x int8 kernels in streaming mode: the SME SMOPA gemm (ZA
tiles for the int32 sums and the f32 accumulators) and the SME2 ZA-array SDOT gemv; and the
pair of both under one ``sme2`` record for the table-decoded layouts (iq4_nl, mxfp4: LUTI4
through ZT0)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing
from .pool import SME_X_ORDER, Frame, RegisterPool, VectorNeeds
from .q4 import Q4_CHART, Q4_SCALARS, Q4Regs

__all__ = ["Q4SmeRegs", "ALLOCATORS"]


def _allocate_q4_sme2(spec: KernelSpec) -> Q4Regs:
    """SME2 int4 gemv: int32 sums in one ZA-array vector group (SDOT vgx<nv> by lane); the
    unpacked nibbles of a k step's nv RHS vectors in two aligned multi-vector groups."""
    nv = spec.nr
    if not spec.is_gemv:
        raise SpecError(f"sme2 q4 kernels are gemv (ZA-array SDOT): mr must be 1, got "
                        f"mr={spec.mr_str}")
    if nv not in (2, 4):
        raise SpecError(f"sme2 q4 gemv: nr must be 2vl or 4vl (SDOT vgx2/vgx4), got {spec.nr_str}")
    check_packing(spec)
    pool = RegisterPool(Q4_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    # multi-vector groups start at a multiple of their length; indexed operands in z0-z7
    facc = (v.claim(range(20, 20 + nv), "f32 accumulators"),)
    lhs = v.claim((0, 1), "LHS")
    lo_grp = v.claim(range(8, 8 + nv), "unpacked RHS")
    hi_grp = v.claim(range(12, 12 + nv), "unpacked RHS")
    scale = v.claim(range(16, 16 + nv), "column scales")
    # z2 has never been in this kernel's reported demand (the tuner's vregs key): kept so
    dl = v.claim((2,), "LHS scales", counted=False) if spec.info.lhs == "qsi8d32p" else ()
    tmp = v.claim((3, 5, 6), "scratch")
    # a table-decoded layout (its ``table``, in ZT0): LUTI4 writes a k step's vector into an
    # aligned pair, which UZP1 / UZP2 split into lo_grp / hi_grp
    lut = v.claim((24, 25), "unpacked RHS") if _has_table(spec) else ()
    gpr = pool.scalars(Q4_SCALARS)
    lo, hi = tuple(pool.x.take(1, "LHS row pointers")), tuple(pool.x.take(1, "LHS row pointers"))
    pool.settle(f"sme2 q4 gemv 1x{spec.nr_str}")
    return Q4Regs(mode="za4", mr_reg=1, lhs_mr=1, groups=1, facc=facc, iacc=(), lhs=lhs, rhs=(),
                  scale=scale, dl=dl, tmp=tmp, gpr=gpr, lo=lo, hi=hi,
                  pred=tuple(range(1, nv + 1)), lo_grp=lo_grp, hi_grp=hi_grp, table=lut,
                  **pool.frame())


def _has_table(spec: KernelSpec) -> bool:
    """Whether the RHS layout decodes its 4-bit values through a table (its ``table``: the
    int8 values an index selects; iq4_nl, mxfp4), which the SME2 kernels hold in ZT0."""
    return getattr(spec.rhs_layout_class, "table", None) is not None


@dataclass(frozen=True)
class Q4SmeRegs(Frame):
    """SME int4 x int8 outer products: 1vl x nu vl tile; ZA tiles 0..nu-1 hold the block's
    int32 sums (SMOPA), tiles nu..2nu-1 the f32 accumulators (updated per block, one row
    slice at a time)."""

    nu: int
    lhs: tuple[int, int]                 # LHS 4-byte groups of every row: low / high nibble halves
    rhs: tuple[int, int]                 # unpacked RHS: low / high nibbles
    scale: tuple[int, ...]               # column scales per column vector (f32)
    dl: int                              # row scale broadcast (q4_0)
    acc: int                             # one f32 row slice
    tmp: tuple[int, ...]
    clamp: tuple[int, int]
    row_vals: tuple[int, int]            # dx epilogue: row offset, row scale (broadcast)
    col_vals: tuple[int, int]            # dx epilogue: rsum, bias of one column vector
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds


_Q4_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "blk_cnt", "chunk_cnt", "nchunks",
                   "hioff", "lhs_rbs", "dst_blk_stride", "nblocks", "tmp", "lo", "hi", "dlp",
                   "vlw", "rows", "colp")
_Q4_SME_CHART = ("LHS", "RHS", "column scales", "row", "scratch", "clamp", "epilogue")


def _allocate_q4_sme(spec: KernelSpec) -> Q4SmeRegs:
    if not (spec.mr_vl and spec.nr_vl) or spec.mr != 1 or spec.nr not in (1, 2):
        raise SpecError(f"sme q4 outer-product tiles are 1vlx1vl or 1vlx2vl (int32 sums and f32 "
                        f"accumulators share the four ZA tiles), got {spec.mr_str}x{spec.nr_str}")
    check_packing(spec)
    nu = spec.nr
    pool = RegisterPool(_Q4_SME_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs, rhs = v.claim((0, 1), "LHS"), v.claim((2, 3), "RHS")
    scale = v.claim(range(4, 4 + nu), "column scales")
    dl, acc = v.claim((6, 7), "row")
    tmp = v.claim((16, 17, 18), "scratch")
    clamp = v.claim((19, 20), "clamp")
    row_vals, col_vals = v.claim((21, 22), "epilogue"), v.claim((23, 24), "epilogue")
    gpr = pool.scalars(_Q4_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return Q4SmeRegs(nu=nu, lhs=lhs, rhs=rhs, scale=scale, dl=dl, acc=acc, tmp=tmp, clamp=clamp,
                     row_vals=row_vals, col_vals=col_vals, gpr=gpr, **pool.frame())



def _allocate_q4_sme2_pair(spec: KernelSpec) -> Q4SmeRegs | Q4Regs:
    """One ``sme2`` ISA record serving both regimes on one packing (kr/sr = 4): the SMOPA
    gemm's registers for 1vl x nu vl tiles, the ZA-array SDOT gemv's for 1 x nu vl (the
    table-decoded q4-layout families: their LUTI4 pair and ZT0 table from the layout)."""
    if not _has_table(spec):
        raise SpecError(f"the sme2 gemm + gemv pair of a q4 layout decodes through a table in "
                        f"ZT0: {spec.info.rhs} has none")
    return _allocate_q4_sme2(spec) if spec.is_gemv else _allocate_q4_sme(spec)


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4_sme": _allocate_q4_sme, "q4_sme2": _allocate_q4_sme2,
              "q4_sme2_pair": _allocate_q4_sme2_pair}
