"""Register allocation of the q8_0 kernels on SVE Z registers (qai8dxp x qsi8cxp, tiles with
nr in VL units: one column vector holds VL/32 columns, 4 per 128-bit segment).

Strategies, by ISA and interleave (``kr``; ``sr`` is 1):

``dot4``  sve_dotprod, kr = 4: SDOT by 32-bit lane.  The LHS is read 16 bytes at a time,
          replicated per 128-bit segment (ld1rqb): 4 rows x 4 k values of a row block (lane r =
          row r), or 16 k values of the one row of a gemv tile (lane s = k step s).
``dot8``  sve_dotprod, kr = 8, gemv only (mr = 1): the row's 8 k values of a chunk broadcast
          to every 64-bit lane (dup from the row's quadwords, ld1rqb), SDOT against the 2 columns x 8 k of each segment of the i8mm layout;
          the two partial sums per column are added after the k loop (uzp1/uzp2 on 32-bit lanes).
``mm``    sve_i8mm, kr = 8, mr a multiple of 4: SMMLA per segment, (2 rows x 8 k) by
          (2 columns x 8 k); the 2x2 int32 blocks go back to row order with uzp1/uzp2 on 64-bit
          lanes.

Indexed SDOT operands must be z0-z7: the LHS registers are taken first from the low-first
order.  The whole k range is summed in int32; the epilogue is the NEON kernels' (offset*rsum in
int32, two f32 multiplies, bias, clamp).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .regalloc import (_Z_LOW_FIRST, RegisterPool, VectorNeeds, _check_packing, _flatten, _Frame,
                       _rows)
from .regalloc_q8 import _EPILOGUE, _Q8_CHART, _Q8_SCALARS, _check_layouts, q8_mode
from .spec import KernelSpec, SpecError

__all__ = ["Q8SveRegs", "allocate_q8_sve"]

_MAX_NV = 7                 # store predicates p1-p7, per-vector offsets in addvl/ld1w range
_GEMV_SPLIT = {"dot4": 4, "dot8": 2}


@dataclass(frozen=True)
class Q8SveRegs(_Frame):
    """Registers of the q8_0 SVE kernels (numbers; templates add the prefix).

    ``acc[row][cv]``: int32 sums, then f32 results, of column vector cv of tile row ``row``.
    dot4: ``iacc = acc``.  dot8: ``iacc[h]`` is half h of the column vectors (h = 2cv, 2cv+1)
    and ``acc[0][cv] = iacc[2cv]`` after the partial sums are added.  mm:
    ``iacc[group][row pair][h]`` and ``acc[4g + 2rp + i][cv] = iacc[g][rp][2cv + i]`` after
    the rearrangement."""

    mode: str
    mr_reg: int
    lhs_mr: int
    groups: int
    acc: tuple[tuple[int, ...], ...]
    iacc: tuple
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    ep: tuple[int, ...]
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...] = ()
    pred: tuple[int, ...] = ()
    split: tuple[tuple[int, ...], ...] = ()
    za_split: int = 1                    # za4: ZA-array offsets the k chunks rotate through
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])

    @property
    def iacc_flat(self) -> tuple[int, ...]:
        return tuple(_flatten(self.iacc))

    @property
    def all_acc(self) -> tuple[int, ...]:
        """Every int32 accumulator (the sets of ``split`` too): zeroed before the k loop."""
        return self.iacc_flat + tuple(v for s in self.split for v in s)


def _block(spec: KernelSpec, mode: str, mr_reg: int, split: int = 1):
    P, nv = spec.lhs_mr, spec.nr
    G = mr_reg // P
    pool = RegisterPool(_Q8_CHART, v_order=_Z_LOW_FIRST)
    v = pool.v
    rule = "indexed SDOT operands (the LHS registers) must be z0-z7"
    if mode == "dot4":
        n_lhs, n_rhs, n_acc = 2, nv, mr_reg * nv
    elif mode == "dot8":     # the row's 32 bytes (two quadwords), two broadcast chunks
        n_lhs, n_rhs, n_acc = 4, 2 * nv, 2 * nv
    else:
        n_lhs, n_rhs, n_acc = 4, 2 * nv, mr_reg * nv
    lhs = tuple(v.take(n_lhs, "LHS", within=8 if mode == "dot4" else None, rule=rule))
    rhs = tuple(v.take(n_rhs, "RHS"))
    ep = tuple(v.reuse(list(lhs + rhs), _EPILOGUE, "epilogue beyond the LHS/RHS registers"))
    flat = v.take(n_acc, "int32 accumulators")
    if mode == "dot4":
        iacc = _rows(flat, nv)
        acc = iacc
    elif mode == "dot8":
        iacc = tuple(flat)
        acc = (tuple(flat[2 * cv] for cv in range(nv)),)
    else:
        iacc = _rows(_rows(flat, 2 * nv), 2)
        acc = tuple(tuple(iacc[r // 4][(r % 4) // 2][2 * cv + r % 2] for cv in range(nv))
                    for r in range(mr_reg))
    more = v.take((split - 1) * n_acc, "further accumulator sets")
    split_sets = tuple(tuple(more[i * n_acc:(i + 1) * n_acc]) for i in range(split - 1))
    gpr = pool.scalars(_Q8_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(mode=mode, mr_reg=mr_reg, lhs_mr=P, groups=G, acc=acc, iacc=iacc,
                      lhs=lhs, rhs=rhs, ep=ep, gpr=gpr, lo=lo, split=split_sets,
                      pred=tuple(range(1, nv + 1)))


def allocate_q8_sve(spec: KernelSpec) -> Q8SveRegs:
    from ..layout import lhs_layout_for, rhs_layout_for
    from .render import VL_GRANULE
    mr, nv = spec.mr, spec.nr
    if spec.mr_vl:
        raise SpecError(f"sve q8_0 kernels have a fixed row count: give mr as a number, "
                        f"got mr={spec.mr_str}")
    if nv > _MAX_NV:
        raise SpecError(f"nr={spec.nr_str} exceeds {_MAX_NV}vl (store predicates p1-p7)")
    _check_packing(spec)
    if spec.acc_mem:
        raise SpecError("q8_0 kernels keep their int32 sums in registers: acc_mem (:am) is a q4 "
                        "option")
    mode = q8_mode(spec)
    # the granule layouts (render.template_layouts): every RHS offset in VL units
    _check_layouts(spec, (rhs_layout_for(spec, 32, VL_GRANULE), lhs_layout_for(spec, 32, VL_GRANULE)))
    P = spec.lhs_mr
    for mr_reg in [r for r in range(mr, 0, -P) if mr % r == 0 and r % P == 0]:
        pool, regs = _block(spec, mode, mr_reg)
        if pool.fits:
            break
    else:
        rows = f"mr={P}," if mr == P else f"a block of {P} of its {mr} rows (the smallest tried) with"
        raise pool.refusal(f"tile {mr}x{spec.nr_str}: {rows} nr={spec.nr_str}",
                           " (indexed LHS operands in z0-z7)")
    if mode in _GEMV_SPLIT and P == 1:      # gemv: independent SDOT chains while they fit
        for sp in range(_GEMV_SPLIT[mode], 1, -1):
            more, more_regs = _block(spec, mode, mr_reg, sp)
            if more.fits:
                pool, regs = more, more_regs
                break
    return Q8SveRegs(**regs, **pool.frame())
