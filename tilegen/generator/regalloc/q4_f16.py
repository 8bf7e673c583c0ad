"""Registers of the SME2 gemm of f16 activations x q4_0 weights (family q4_0_f16: KleidiAI's
``f16p<mr>x2`` LHS x ``qsi4c32ps1s0scalef16`` RHS, tile 1vl x 4vl, FMOPA f16 -> f32)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from .pool import SME_X_ORDER, Frame, RegisterPool, VectorNeeds

__all__ = ["Q4F16MopaRegs", "ALLOCATORS"]


@dataclass(frozen=True)
class Q4F16MopaRegs(Frame):
    """``lhs[h]``: four LHS k-pair vectors (SVL/32 rows x 2 f16 each; one 4-vector load);
    ``src[h]``: the two nibble vectors of one 4-k chunk (ld2b: byte 0 of every column = k-pair
    0, byte 1 = k-pair 1); ``unp[h]``: the 4 f16 vectors LUTI4 makes of one nibble vector (the
    4vl columns, 2 k each), multiplied by ``scl`` in place; ``scl``: the block's column scales,
    each twice (pairs, as the unpacked values); ``raw``: the scales as loaded; ``out``: one
    output row (4 vectors of ZA row slices), ``clamp`` the clamp pair; ``table``: the LUTI4
    table's source vector."""

    lhs: tuple[tuple[int, ...], ...]
    src: tuple[tuple[int, ...], ...]
    unp: tuple[tuple[int, ...], ...]
    scl: tuple[int, ...]
    raw: tuple[int, int]
    clamp: tuple[int, int]
    out: tuple[int, ...]
    table: int
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8
    col_pred: int = 9


_SCALARS = ("n_rem", "rhs_ptr", "rsc", "dst_tile", "dst_row", "lhs_ptr", "lhs_rb", "blk_cnt",
            "nblocks", "nchunks", "chunk_cnt", "rows", "tmp")
_CHART = ("LHS", "packed RHS", "unpacked RHS", "scales", "clamp", "output row")


def _allocate(spec: KernelSpec) -> Q4F16MopaRegs:
    if not (spec.mr_vl and spec.nr_vl and spec.mr == 1 and spec.nr == 4):
        raise SpecError(f"the f16 x q4 SME2 kernel fills ZA with four f32 tiles of one LHS "
                        f"vector each: the tile is 1vlx4vl, got {spec.mr_str}x{spec.nr_str}")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    # multi-vector operands start at multiples of 4 (4-vector loads, LUTI4, MOVA) or 2 (ld2b,
    # ld1h pairs, ZIP pairs)
    lhs = (v.claim(range(0, 4), "LHS"), v.claim(range(4, 8), "LHS"))
    unp = (v.claim(range(8, 12), "unpacked RHS"), v.claim(range(12, 16), "unpacked RHS"))
    src = (v.claim((16, 17), "packed RHS"), v.claim((18, 19), "packed RHS"))
    scl = v.claim(range(20, 24), "scales")
    raw = v.claim((24, 25), "scales")
    clamp = v.claim((26, 27), "clamp")
    out = v.claim(range(28, 32), "output row")
    gpr = pool.scalars(_SCALARS)
    pool.settle(f"sme2 f16 x q4 gemm {spec.mr_str}x{spec.nr_str}")
    return Q4F16MopaRegs(lhs=lhs, src=src, unp=unp, scl=scl, raw=raw, clamp=clamp, out=out,
                         table=out[0], gpr=gpr, **pool.frame())


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4_sme2_f16": _allocate}
