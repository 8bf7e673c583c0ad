"""Register allocation of the bf16 NEON kernels (family ``bf16``: bf16p<mr>x4 x bf16p<nr>x4b).

Strategies, by tile:

``mmla``  mr even, nr a multiple of 4: BFMMLA of (2 rows x 4 k) by (4 k x 2 columns) into
          ``acc[row pair][column pair]`` (f32 lanes r0c0, r0c1, r1c0, r1c1); the RHS vectors of
          a k-chunk are streamed through ``rhs`` (each used by every row pair once); after the
          k loop ZIP1/ZIP2 turn the 2x2 blocks into rows of 4 columns (same registers).
``dot``   mr = 1 (gemv): the RHS vectors of 4 columns are transposed by UZP1/UZP2 into
          (k-pair 0 of 4 columns) and (k-pair 1 of 4 columns); BFDOT by element adds the LHS
          pair to one accumulator lane per column, so each column is one chain in k order.

Both keep one accumulation chain per output starting at the bias, one rounded k-pair at a time
in k order (tilegen.reference.bf16).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import template_layouts
from .f32 import SmeF32Regs, allocate_sme_tiles
from .pool import Frame, RegisterPool, VectorNeeds

__all__ = ["Bf16NeonRegs", "SmeBf16Regs", "ALLOCATORS"]

_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "nk", "lhs_ptr", "lhs_rbs",
            "dst_blk_stride", "tmp")
_CHART = ("f32 accumulators", "LHS", "RHS", "scratch", "epilogue beyond the LHS/RHS registers")
# epilogue vectors: clamp min, clamp max, one ZIP temporary
_EPILOGUE = 3


@dataclass(frozen=True)
class Bf16NeonRegs(Frame):
    """Registers of the bf16 NEON kernels (numbers; templates add the prefix).

    ``mmla``: ``mm[rp][cp]`` are the BFMMLA accumulators of rows 2rp, 2rp+1 and columns
    2cp, 2cp+1; after the k loop ``acc[row][cv]`` (columns 4cv..4cv+3 of tile row ``row``) name
    the same registers.  ``dot``: ``acc[0][cv]`` from the start."""

    mode: str
    acc: tuple[tuple[int, ...], ...]
    mm: tuple[tuple[int, ...], ...]
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    tmp: tuple[int, ...]                  # dot: the two transposed RHS vectors
    ep: tuple[int, ...]
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])

    @property
    def acc_flat(self) -> tuple[int, ...]:
        return tuple(v for row in (self.mm if self.mode == "mmla" else self.acc) for v in row)


def _check_layouts(spec: KernelSpec) -> None:
    """What the template assumes of the layout objects: one k-chunk of kr = 4 values per loop
    iteration, 2 columns (or rows) x 4 values per 16-byte vector, the bias row first."""
    R, L = template_layouts(spec)
    if R.kr != 4 or L.kr != 4:
        raise SpecError(f"{R.name} / {L.name}: the bf16 NEON kernels read k-chunks of 4")
    for lay, rows in ((R, R.nr), (L, L.mr)):
        for x in range(rows):
            for t in range(8):
                want = ((t // 4) * rows * 4 + x * 4 + t % 4) * 2
                if lay.element_offset(x, t) != want:
                    raise SpecError(f"{lay.name}: element ({x}, {t}) is not at byte {want}")


def _allocate_bf16_neon(spec: KernelSpec) -> Bf16NeonRegs:
    mr, nr = spec.mr, spec.nr
    if spec.mr_vl or spec.nr_vl:
        raise SpecError(f"bf16 NEON tiles have fixed sizes, got {spec.mr_str}x{spec.nr_str}")
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one f32x4 vector per 4 columns)")
    if mr != 1 and mr % 2:
        raise SpecError(f"mr={mr} must be 1 (gemv, BFDOT) or even (BFMMLA takes 2 rows)")
    if 8 * nr > 4095 or 8 * mr > 4095:
        raise SpecError(f"tile {mr}x{nr}: one k-chunk ({8 * nr} RHS / {8 * mr} LHS bytes) must fit "
                        f"an add immediate (<= 4095)")
    _check_layouts(spec)
    nv = nr // 4
    pool = RegisterPool(_CHART)
    v = pool.v
    if mr == 1:
        mode = "dot"
        lhs = tuple(v.take(1, "LHS"))
        rhs = tuple(v.take(2, "RHS"))
        tmp = tuple(v.take(2, "scratch"))
        ep = tuple(v.reuse(list(lhs + rhs + tmp), _EPILOGUE, "epilogue beyond the LHS/RHS registers"))
        acc = (tuple(v.take(nv, "f32 accumulators")),)
        mm: tuple = ()
    else:
        mode = "mmla"
        lhs = tuple(v.take(mr // 2, "LHS"))
        rhs = tuple(v.take(min(2, nr // 2), "RHS"))       # streamed, double-buffered
        tmp = ()
        ep = tuple(v.reuse(list(lhs + rhs), _EPILOGUE, "epilogue beyond the LHS/RHS registers"))
        flat = v.take(mr // 2 * nr // 2, "f32 accumulators")
        npair = nr // 2
        mm = tuple(tuple(flat[rp * npair:(rp + 1) * npair]) for rp in range(mr // 2))
        # after ZIP1/ZIP2 of column pairs 2q, 2q+1: row 2rp in the first, 2rp+1 in the second
        acc = tuple(tuple(mm[r // 2][2 * q + r % 2] for q in range(nv)) for r in range(mr))
    gpr = pool.scalars(_SCALARS)
    pool.settle(f"bf16 tile {mr}x{nr}")
    return Bf16NeonRegs(mode=mode, acc=acc, mm=mm, lhs=lhs, rhs=rhs, tmp=tmp, ep=ep, gpr=gpr,
                        **pool.frame())


@dataclass(frozen=True)
class SmeBf16Regs(SmeF32Regs):
    """The f32 SME tile registers plus an all-true predicate of 16-bit lanes (BFMOPA's row and
    column predicates govern each bf16 element of a pair)."""

    pair_pred: int = 7


def _allocate_bf16_sme2(spec: KernelSpec) -> SmeBf16Regs:
    if not (spec.mr_vl and spec.nr_vl):
        raise SpecError(f"sme2 bf16 outer-product tiles are whole ZA tiles: give mr and nr in VL "
                        f"units (e.g. 2vlx2vl), got {spec.mr_str}x{spec.nr_str}")
    return allocate_sme_tiles(spec, SmeBf16Regs)


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"bf16_neon": _allocate_bf16_neon, "bf16_sme2": _allocate_bf16_sme2}
