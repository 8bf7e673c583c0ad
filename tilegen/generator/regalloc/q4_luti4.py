"""Registers of the SME2 q4 gemv with a LUTI4 unpack (family q4_0_s1s0: KleidiAI's
qsi8d32p scale-tail LHS x qsi4c32ps1s0scalef16 RHS, 1 x 4vl)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from .pool import SME_X_ORDER, Frame, RegisterPool, VectorNeeds

__all__ = ["Q4Luti4Regs", "Q4Luti4MopaRegs", "ALLOCATORS"]


@dataclass(frozen=True)
class Q4Luti4Regs(Frame):
    """``src[h]``: two 4-vector groups of packed nibbles (2 k-chunks of 4 each); ``grp[c]``:
    the 4 unpacked int8 vectors of k-chunk c (c < 4, one SDOT vgx4 each; LUTI4 writes pairs);
    ``lhs``: the two 16-byte LHS quads of a 32-k chunk; ``acc``: the f32 sums of the 4vl
    columns; ``table``: the LUTI4 table's source vector (u - 8 for u < 16)."""

    src: tuple[tuple[int, ...], ...]
    grp: tuple[tuple[int, ...], ...]
    lhs: tuple[int, int]
    acc: tuple[int, ...]
    clamp: tuple[int, int]
    table: int
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8

    # block conversion: int32 sums (grp[0]), column scales (grp[1]), row scale, products (grp[3])

    @property
    def sums(self) -> tuple[int, ...]:
        return self.grp[0]

    @property
    def dr(self) -> tuple[int, ...]:
        return self.grp[1]

    @property
    def dl(self) -> int:
        return self.grp[2][0]

    @property
    def prod(self) -> tuple[int, ...]:
        return self.grp[3]


_SCALARS = ("n_rem", "rhs_ptr", "rsc", "dst_ptr", "lhs_ptr", "lsc", "lhs_row", "blk_cnt",
            "chunk_cnt", "nblocks", "nchunks", "tmp")
_CHART = ("LHS", "packed RHS", "unpacked RHS", "f32 accumulators", "clamp", "table")


@dataclass(frozen=True)
class Q4Luti4MopaRegs(Frame):
    """The 1vl x 4vl SMOPA gemm: ``lhs[h]``: LHS k-chunks 4h..4h+3 of a 32-k chunk (one vector
    each: SVL/32 rows x 4 bytes); ``src``/``grp`` as the gemv; ZA tile t holds the int32 sums
    of column vector t.  Block fold per row slice: ``sums`` (int32 -> f32), ``dr`` the column
    scales, ``dl`` the row scale, ``prod`` the scale products, ``acc`` the f32 row read from
    and written back to dst (the f32 sums live in dst between blocks)."""

    lhs: tuple[tuple[int, ...], ...]
    src: tuple[tuple[int, ...], ...]
    grp: tuple[tuple[int, ...], ...]
    sums: tuple[int, ...]
    dr: tuple[int, ...]
    dl: int
    prod: tuple[int, ...]
    acc: tuple[int, ...]
    clamp: tuple[int, int]
    table: int
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8


_MOPA_SCALARS = ("n_rem", "rhs_ptr", "rsc", "dst_tile", "dst_row", "lhs_ptr", "lsc", "dlp",
                 "lhs_rb", "blk_cnt", "nblocks", "nchunks", "rows", "tmp")


def _allocate_mopa(spec: KernelSpec) -> Q4Luti4MopaRegs:
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = (v.claim(range(0, 4), "LHS"), v.claim(range(4, 8), "LHS"))
    src = (v.claim(range(8, 12), "packed RHS"), v.claim(range(12, 16), "packed RHS"))
    grp = tuple(v.claim(range(b, b + 4), "unpacked RHS") for b in (16, 20, 24, 28))
    gpr = pool.scalars(_MOPA_SCALARS)
    pool.settle(f"sme2 luti4 q4 gemm {spec.mr_str}x{spec.nr_str}")
    # the fold and the store passes reuse the dead loop registers
    return Q4Luti4MopaRegs(lhs=lhs, src=src, grp=grp, sums=grp[0], dr=src[0], dl=lhs[0][0],
                           prod=grp[1], acc=grp[3], clamp=(lhs[1][0], lhs[1][1]),
                           table=grp[2][0], gpr=gpr, **pool.frame())


def _allocate_q4_sme2_luti4(spec: KernelSpec) -> Q4Luti4Regs | Q4Luti4MopaRegs:
    if not spec.nr_vl or spec.nr != 4 or spec.mr != 1:
        raise SpecError(f"the LUTI4 q4 kernels read qsi4c32p4vlx4 panels: the tile is 1x4vl "
                        f"(gemv) or 1vlx4vl (gemm), got {spec.mr_str}x{spec.nr_str}")
    if spec.mr_vl:
        return _allocate_mopa(spec)
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    # by-lane SDOT operands in z0-z15; multi-vector groups start at multiples of 4 (LUTI4 pairs
    # at multiples of 2)
    lhs = v.claim((0, 1), "LHS")
    clamp = v.claim((2, 3), "clamp")
    acc = v.claim(range(4, 8), "f32 accumulators")
    src = (v.claim(range(12, 16), "packed RHS"), v.claim(range(8, 12), "packed RHS"))
    grp = tuple(v.claim(range(b, b + 4), "unpacked RHS") for b in (16, 20, 24, 28))
    gpr = pool.scalars(_SCALARS)
    pool.settle(f"sme2 luti4 q4 gemv 1x{spec.nr_str}")
    return Q4Luti4Regs(src=src, grp=grp, lhs=lhs, acc=acc, clamp=clamp, table=grp[0][0],
                       gpr=gpr, **pool.frame())


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4_sme2_luti4": _allocate_q4_sme2_luti4}
