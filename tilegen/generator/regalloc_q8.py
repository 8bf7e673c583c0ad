"""Register allocation of the int8 x int8 kernels (family ``q8_0``: qai8dxp x qsi8cxp).

Strategies, by ISA and interleave (``kr``; ``sr`` is 1):

``dot4``  dotprod, kr = 4: SDOT by 32-bit lane; one LHS vector holds 4 rows x 4 k values of
          a row block (gemv: 16 k values of the one row), one RHS vector 4 columns x 4 k.
``dot8``  dotprod, kr = 8, gemv only (mr = 1): the row's 8 k values duplicated in both halves
          of a vector, SDOT against 2 columns x 8 k; column halves are added at the end.
``mm``    i8mm, kr = 8, mr a multiple of 4: SMMLA of (2 rows x 8 k) by (2 columns x 8 k).
``neon``  plain NEON, kr = 8 (no dot product instruction): SMULL/SMULL2 give the int16 products
          of 8 k values with 2 columns (|q*w| <= 128*128 fits int16), SADALP adds them pairwise
          into one int32 vector per row and column; ADDP folds the lanes after the loop.

The whole k range is summed in int32 (as KleidiAI does); the epilogue adds ``offset*rsum`` in
int32 and applies the scales in f32 from registers that served the hot loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .regalloc import RegisterPool, VectorNeeds, _Frame, _check_packing, _flatten
from .spec import KernelSpec, SpecError

__all__ = ["Q8NeonRegs", "allocate_q8_neon"]

# epilogue vectors: rsum, scale, bias (one column vector), offset, rscale (one row block),
# clamp min, clamp max, one product
_EPILOGUE = 8
_Q8_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "nk", "lhs_rbs",
               "lhs_blk_stride", "dst_blk_stride", "tmp")


@dataclass(frozen=True)
class Q8NeonRegs(_Frame):
    """Registers of the q8_0 NEON kernels (numbers; templates add the prefix).

    ``acc[row][cv]`` holds the int32 sums, then the f32 results, of columns 4cv..4cv+3 of
    tile row ``row`` -- in dot4 mode from the start; in mm mode the SMMLA accumulators are
    ``iacc[group][row pair][column pair]`` and are rearranged into ``acc`` (same registers)
    after the k loop; in dot8 mode ``iacc[column pair]`` and ``acc[0][cv] = iacc[2cv]``
    after the pairwise add.  ``neon``: ``iacc[row][column]``, ``acc[row][cv] = iacc[row][4cv]``
    after the lanes are folded."""

    mode: str
    mr_reg: int                          # rows computed at once (the tile is mr_reg-row blocks)
    lhs_mr: int                          # rows per packed LHS row block (1 or 4)
    groups: int                          # LHS row blocks per mr_reg rows
    acc: tuple[tuple[int, ...], ...]
    iacc: tuple
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    ep: tuple[int, ...]                  # epilogue vectors (overlap lhs/rhs, see _EPILOGUE)
    tmp: tuple[int, ...]                 # hot-loop scratch (dot8 / neon: duplicated LHS, products)
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...] = ()             # one pointer per LHS row block
    # gemv (dot4, dot8): further int32 accumulator sets, shaped like acc[0] (dot4) or iacc
    # (dot8); consecutive chunks of k go to different sets (independent SDOT chains), summed
    # after the loop (int32 addition wraps exactly like one chain)
    split: tuple[tuple[int, ...], ...] = ()
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])

    @property
    def iacc_flat(self) -> tuple[int, ...]:
        return tuple(_flatten(self.iacc) + _flatten(self.split))


def _check_layouts(spec: KernelSpec, layouts=None) -> None:
    """What the template assumes of the layout objects it reads its offsets from: one k
    granule per loop iteration, fields after the k data at offsets linear in the granule count,
    and the vector-sized runs of bytes each strategy loads (``layouts``: the (RHS, LHS) pair to
    check, default the spec's concrete layouts)."""
    from ..layout import lhs_layout_for, rhs_layout_for
    L, LL = layouts or (rhs_layout_for(spec), lhs_layout_for(spec))
    KG = L.k_padded(1)
    if LL.k_padded(1) != KG or KG not in (16, 32, 64):
        raise SpecError(f"{L.name} pads k to {KG}, {LL.name} to {LL.k_padded(1)}: the q8 kernels "
                        f"need one common power-of-two granule")
    for lay, fields in ((L, ("rsum_offset", "scale_offset", "bias_offset", "group_stride")),
                        (LL, ("offset_field_offset", "rscale_offset", "row_block_stride"))):
        step = (L.rsum_offset(KG) - L.rsum_offset(0)) if lay is L else \
            (LL.offset_field_offset(KG) - LL.offset_field_offset(0))
        for f in fields:
            fn = getattr(lay, f)
            if fn(2 * KG) - fn(KG) != step or fn(KG) - fn(0) != step:
                raise SpecError(f"{lay.name}.{f} does not grow by {step} bytes per {KG} k values")
        cols = range(lay.nr) if lay is L else range(lay.mr)
        for x in cols:
            for t in range(KG):
                if lay.element_offset(x, t + KG) != lay.element_offset(x, t) + step:
                    raise SpecError(f"{lay.name}: element ({x}, {t}) does not repeat per granule")
    kr = spec.kr
    for c in range(0, L.nr, 16 // kr):      # one RHS vector: 16/kr columns x kr values
        for t in range(0, KG, kr):
            base = L.element_offset(c, t)
            if any(L.element_offset(c + i, t + e) != base + i * kr + e
                   for i in range(16 // kr) for e in range(kr)):
                raise SpecError(f"{L.name}: columns {c}.. of chunk {t // kr} are not one vector")
    P = LL.mr
    for t in range(0, KG, kr):              # one LHS chunk: P rows x kr values, contiguous
        base = LL.element_offset(0, t)
        if any(LL.element_offset(x, t + e) != base + x * kr + e for x in range(P) for e in range(kr)):
            raise SpecError(f"{LL.name}: chunk {t // kr} is not contiguous")
        if P == 1 and base != t or P > 1 and base % 16:
            raise SpecError(f"{LL.name}: chunk {t // kr} starts at {base}")


_Q8_STRATEGY = {"dotprod": "dot", "sve_dotprod": "dot", "i8mm": "mm", "sve_i8mm": "mm",
                "neon": "neon"}


def q8_mode(spec: KernelSpec) -> str:
    """The q8_0 hot-loop strategy of a NEON or SVE tile: dot4 / dot8 (SDOT), mm (SMMLA) or
    neon (SMULL/SADALP), by the ISA's instruction and the interleave."""
    mr, kr, isa = spec.mr, spec.kr, spec.isa
    kind = _Q8_STRATEGY.get(isa)
    if kind == "dot":
        if kr == 4:
            return "dot4"
        if kr == 8 and mr == 1:
            return "dot8"
        raise SpecError(f"q8_0 {isa} kernels need kr=4 (SDOT by lane), or kr=8 for gemv "
                        f"(mr=1); got mr={mr}, kr={kr}")
    if kind == "mm":
        seg = " per 128-bit segment" if spec.isa_info.scalable else " operands"
        if kr != 8 or mr % 4:
            raise SpecError(f"q8_0 {isa} (SMMLA, 2x8 int8{seg}) needs kr=8 and mr a multiple "
                            f"of 4; got mr={mr}, kr={kr}")
        return "mm"
    if kind == "neon":
        if kr != 8:
            raise SpecError(f"q8_0 neon kernels (SMULL/SADALP over 8 k values) need kr=8, "
                            f"got kr={kr}")
        return "neon"
    raise SpecError(f"q8_0 has no NEON or SVE strategy for isa {isa!r}")


_GEMV_SPLIT = {"dot4": 4, "dot8": 2}     # accumulator sets of the gemv strategies
_Q8_CHART = ("int32 accumulators", "LHS", "RHS", "further accumulator sets", "scratch",
             "epilogue beyond the LHS/RHS registers")


def _q8_block(spec: KernelSpec, mode: str, mr_reg: int, split: int = 1):
    """The pool and the register fields of ``mr_reg`` rows at once with ``split`` int32
    accumulator sets; the pool's tally is the demand."""
    P, nr = spec.lhs_mr, spec.nr
    G, nv = mr_reg // P, nr // 4
    pool = RegisterPool(_Q8_CHART)
    v = pool.v
    if mode == "dot4":
        n_lhs, n_rhs, n_tmp, n_acc = (G if P == 4 else 2), nv, 0, mr_reg * nv
    elif mode == "dot8":
        n_lhs, n_rhs, n_tmp, n_acc = 2, 2 * nv, 1, 2 * nv
    elif mode == "mm":
        n_lhs, n_rhs, n_tmp, n_acc = 2 * G, 2 * nv, 0, mr_reg * nv
    else:   # neon: per row one int32 vector per column; LHS 8 bytes per row and chunk
        n_lhs, n_rhs, n_tmp, n_acc = (2 * G if P == 4 else 2), 2 * nv, 3, 4 * mr_reg * nv
    lhs = tuple(v.take(n_lhs, "LHS"))
    rhs = tuple(v.take(n_rhs, "RHS"))
    tmp = tuple(v.take(n_tmp, "scratch"))
    # the epilogue reuses the (dead by then) LHS, RHS and scratch registers first
    ep = tuple(v.reuse(list(lhs + rhs + tmp), _EPILOGUE, "epilogue beyond the LHS/RHS registers"))
    flat = v.take(n_acc, "int32 accumulators")
    if mode == "dot4":
        iacc = tuple(tuple(flat[r * nv:(r + 1) * nv]) for r in range(mr_reg))
        acc = iacc
    elif mode == "dot8":
        iacc = tuple(flat)
        acc = (tuple(flat[2 * cv] for cv in range(nv)),)
    elif mode == "mm":
        npair = nr // 2
        iacc = tuple(tuple(tuple(flat[(g * 2 + rp) * npair:(g * 2 + rp + 1) * npair])
                           for rp in range(2)) for g in range(G))
        # after the rearrangement: rows 2rp / 2rp+1 of group g in the two registers of
        # column pairs 2q / 2q+1
        acc = tuple(tuple(iacc[r // 4][(r % 4) // 2][2 * q + (r % 2)] for q in range(nv))
                    for r in range(mr_reg))
    else:
        iacc = tuple(tuple(flat[r * nr:(r + 1) * nr]) for r in range(mr_reg))
        acc = tuple(tuple(iacc[r][4 * cv] for cv in range(nv)) for r in range(mr_reg))
    more = v.take((split - 1) * n_acc, "further accumulator sets")
    split_sets = tuple(tuple(more[i * n_acc:(i + 1) * n_acc]) for i in range(split - 1))
    gpr = pool.scalars(_Q8_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(mode=mode, mr_reg=mr_reg, lhs_mr=P, groups=G, acc=acc, iacc=iacc, lhs=lhs,
                      rhs=rhs, ep=ep, tmp=tmp, gpr=gpr, lo=lo, split=split_sets)


def allocate_q8_neon(spec: KernelSpec) -> Q8NeonRegs:
    mr, nr = spec.mr, spec.nr
    if spec.mr_vl or spec.nr_vl:
        raise SpecError(f"q8_0 NEON tiles have fixed sizes, got {spec.mr_str}x{spec.nr_str}")
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one int32x4 vector per 4 columns)")
    _check_packing(spec)
    if spec.acc_mem:
        raise SpecError("q8_0 kernels keep their int32 sums in registers: acc_mem (:am) is a q4 "
                        "option")
    if 32 * nr > 4095:
        raise SpecError(f"nr={nr}: the RHS step of one 32-value k slice ({32 * nr} bytes) must "
                        f"fit an add immediate (<= 4095)")
    mode = q8_mode(spec)
    _check_layouts(spec)
    P = spec.lhs_mr
    for mr_reg in [r for r in range(mr, 0, -P) if mr % r == 0 and r % P == 0]:
        pool, regs = _q8_block(spec, mode, mr_reg)
        if pool.fits:
            break
    else:
        rows = f"mr={P}," if mr == P else f"a block of {P} of its {mr} rows (the smallest tried) with"
        raise pool.refusal(f"tile {mr}x{nr}: {rows} nr={nr}")
    if mode in _GEMV_SPLIT and P == 1:      # gemv: independent SDOT chains while they fit
        for sp in range(_GEMV_SPLIT[mode], 1, -1):
            more, more_regs = _q8_block(spec, mode, mr_reg, sp)
            if more.fits:
                pool, regs = more, more_regs
                break
    return Q8NeonRegs(**regs, **pool.frame())
