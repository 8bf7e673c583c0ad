"""Register allocation of the int8 x int8 kernels (family ``q8_0``: qai8dxp x qsi8cxp) on NEON
V registers and SVE Z registers (tiles with nr in VL units: one column vector holds VL/32
columns, 4 per 128-bit segment, laid out per segment exactly as the NEON kernels' registers).

Strategies, by ISA and interleave (``kr``; ``sr`` is 1):

``dot4``  dotprod / sve_dotprod, kr = 4: SDOT by 32-bit lane; one LHS vector holds 4 rows x 4
          k values of a row block (gemv: 16 k values of the one row), one RHS vector 4 columns
          x 4 k.  SVE reads the LHS 16 bytes at a time, replicated per 128-bit segment (ld1rqb;
          lane r = row r, or k step s of a gemv row); indexed SDOT operands must be z0-z7, so
          the LHS registers are taken first from the low-first order.
``dot8``  dotprod / sve_dotprod, kr = 8, gemv only (mr = 1): the row's 8 k values of a chunk
          in both halves of a vector (SVE: broadcast to every 64-bit lane), SDOT against 2
          columns x 8 k; the column halves are added after the k loop (SVE: uzp1/uzp2).
``mm``    i8mm / sve_i8mm, kr = 8, mr a multiple of 4: SMMLA of (2 rows x 8 k) by (2 columns x
          8 k) (SVE: per segment); the 2x2 int32 blocks go back to row order after the k loop.
``neon``  plain NEON, kr = 8 (no dot product instruction): SMULL/SMULL2 give the int16 products
          of 8 k values with 2 columns (|q*w| <= 128*128 fits int16), SADALP adds them pairwise
          into one int32 vector per row and column; ADDP folds the lanes after the loop.

The whole k range is summed in int32 (as KleidiAI does); the epilogue adds ``offset*rsum`` in
int32 and applies the scales in f32 from registers that served the hot loop.  The streaming
kernels (SME SMOPA, SME2 gemv) are :mod:`.q8_sme`'s.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing, template_layouts
from .pool import V_ORDER, Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, first_fit, flatten, rows

__all__ = ["Q8Regs", "EPILOGUE", "Q8_SCALARS", "Q8_CHART", "q8_mode", "check_layouts",
           "ALLOCATORS"]

# epilogue vectors: rsum, scale, bias (one column vector), offset, rscale (one row block),
# clamp min, clamp max, one product
EPILOGUE = 8
Q8_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "nk", "lhs_rbs",
              "lhs_blk_stride", "dst_blk_stride", "tmp")
Q8_CHART = ("int32 accumulators", "LHS", "RHS", "further accumulator sets", "scratch",
            "epilogue beyond the LHS/RHS registers")
_SVE_MAX_NV = 7             # store predicates p1-p7, per-vector offsets in addvl/ld1w range
_GEMV_SETS = {"dot4": 4, "dot8": 2}     # accumulator sets of the gemv strategies


@dataclass(frozen=True)
class Q8Regs(Frame):
    """Registers of the q8_0 NEON, SVE and SME2-gemv kernels (numbers; templates add the
    prefix).

    ``acc[row][cv]`` holds the int32 sums, then the f32 results, of column vector cv (NEON:
    columns 4cv..4cv+3) of tile row ``row``.  dot4: ``iacc = acc`` from the start.  dot8:
    ``iacc[h]`` is half h of the column vectors (h = 2cv, 2cv+1) and ``acc[0][cv] = iacc[2cv]``
    after the partial sums are added.  mm: ``iacc[group][row pair][h]`` and ``acc[4g + 2rp +
    i][cv] = iacc[g][rp][2cv + i]`` after the rearrangement (same registers).  neon:
    ``iacc[row][column]``, ``acc[row][cv] = iacc[row][4cv]`` after the lanes are folded.
    za4 (SME2 gemv): ``acc[0]`` the vectors the ZA-array group is read back into."""

    mode: str
    mr_reg: int                          # rows computed at once (the tile is mr_reg-row blocks)
    lhs_mr: int                          # rows per packed LHS row block (1 or 4)
    groups: int                          # LHS row blocks per mr_reg rows
    acc: tuple[tuple[int, ...], ...]
    iacc: tuple
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    ep: tuple[int, ...]                  # epilogue vectors (overlap lhs/rhs, see EPILOGUE)
    gpr: dict[str, int] = field(hash=False)
    tmp: tuple[int, ...] = ()            # NEON hot-loop scratch (dot8 / neon: duplicated LHS,
    #                                      products)
    lo: tuple[int, ...] = ()             # one pointer per LHS row block
    pred: tuple[int, ...] = ()           # SVE: store predicate of column vector cv
    # gemv (dot4, dot8): further int32 accumulator sets, shaped like acc[0] (dot4) or iacc
    # (dot8); consecutive chunks of k go to different sets (independent SDOT chains), summed
    # after the loop (int32 addition wraps exactly like one chain)
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
        return tuple(flatten(self.iacc))

    @property
    def all_acc(self) -> tuple[int, ...]:
        """Every int32 accumulator (the sets of ``split`` too): zeroed before the k loop."""
        return self.iacc_flat + tuple(v for s in self.split for v in s)


def check_layouts(spec: KernelSpec) -> None:
    """What the template assumes of the layout objects it reads its offsets from (the spec's
    template layouts: granule layouts for VL-scaled tiles): one k granule per loop iteration,
    fields after the k data at offsets linear in the granule count, and the vector-sized runs
    of bytes each strategy loads."""
    L, LL = template_layouts(spec)
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


def _counts(mode: str, sve: bool, P: int, G: int, mr_reg: int, nv: int) -> tuple[int, ...]:
    """(LHS, RHS, scratch, int32 accumulator) vectors of one accumulator set."""
    if mode == "dot4":
        return (2 if sve or P != 4 else G), nv, 0, mr_reg * nv
    if mode == "dot8":     # SVE: the row's 32 bytes (two quadwords), two broadcast chunks
        return (4 if sve else 2), 2 * nv, (0 if sve else 1), 2 * nv
    if mode == "mm":
        return (4 if sve else 2 * G), 2 * nv, 0, mr_reg * nv
    # neon: per row one int32 vector per column; LHS 8 bytes per row and chunk
    return (2 * G if P == 4 else 2), 2 * nv, 3, 4 * mr_reg * nv


def _block(spec: KernelSpec, mode: str, mr_reg: int, sets: int = 1):
    """The pool and the register fields of ``mr_reg`` rows at once with ``sets`` int32
    accumulator sets; the pool's tally is the demand."""
    sve = spec.isa_info.scalable
    P = spec.lhs_mr
    G, nv = mr_reg // P, (spec.nr if sve else spec.nr // 4)
    pool = RegisterPool(Q8_CHART, v_order=Z_LOW_FIRST if sve else V_ORDER)
    v = pool.v
    n_lhs, n_rhs, n_tmp, n_acc = _counts(mode, sve, P, G, mr_reg, nv)
    lhs = tuple(v.take(n_lhs, "LHS", within=8 if sve and mode == "dot4" else None,
                       rule="indexed SDOT operands (the LHS registers) must be z0-z7"))
    rhs = tuple(v.take(n_rhs, "RHS"))
    tmp = tuple(v.take(n_tmp, "scratch"))
    # the epilogue reuses the (dead by then) LHS, RHS and scratch registers first
    ep = tuple(v.reuse(list(lhs + rhs + tmp), EPILOGUE, "epilogue beyond the LHS/RHS registers"))
    flat = v.take(n_acc, "int32 accumulators")
    if mode == "dot4":
        iacc = acc = rows(flat, nv)
    elif mode == "dot8":
        iacc = tuple(flat)
        acc = (tuple(flat[2 * cv] for cv in range(nv)),)
    elif mode == "mm":
        iacc = rows(rows(flat, 2 * nv), 2)
        # after the rearrangement: rows 2rp / 2rp+1 of group g in the two registers of
        # column pairs 2q / 2q+1
        acc = tuple(tuple(iacc[r // 4][(r % 4) // 2][2 * cv + r % 2] for cv in range(nv))
                    for r in range(mr_reg))
    else:
        iacc = rows(flat, 4 * nv)
        acc = tuple(tuple(iacc[r][4 * cv] for cv in range(nv)) for r in range(mr_reg))
    more = v.take((sets - 1) * n_acc, "further accumulator sets")
    split = tuple(tuple(more[i * n_acc:(i + 1) * n_acc]) for i in range(sets - 1))
    gpr = pool.scalars(Q8_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(mode=mode, acc=acc, iacc=iacc, lhs=lhs, rhs=rhs, ep=ep, tmp=tmp, gpr=gpr,
                      lo=lo, split=split, pred=tuple(range(1, nv + 1)) if sve else ())


def _allocate(spec: KernelSpec, note: str = "") -> Q8Regs:
    mode = q8_mode(spec)
    check_layouts(spec)
    return Q8Regs(**first_fit(spec, lambda mr_reg, sets=1: _block(spec, mode, mr_reg, sets),
                              note, sets=_GEMV_SETS.get(mode, 1)))


def _allocate_q8_neon(spec: KernelSpec) -> Q8Regs:
    nr = spec.nr
    if spec.mr_vl or spec.nr_vl:
        raise SpecError(f"q8_0 NEON tiles have fixed sizes, got {spec.mr_str}x{spec.nr_str}")
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one int32x4 vector per 4 columns)")
    check_packing(spec)
    if 32 * nr > 4095:
        raise SpecError(f"nr={nr}: the RHS step of one 32-value k slice ({32 * nr} bytes) must "
                        f"fit an add immediate (<= 4095)")
    return _allocate(spec)


def _allocate_q8_sve(spec: KernelSpec) -> Q8Regs:
    if spec.mr_vl:
        raise SpecError(f"sve q8_0 kernels have a fixed row count: give mr as a number, "
                        f"got mr={spec.mr_str}")
    if spec.nr > _SVE_MAX_NV:
        raise SpecError(f"nr={spec.nr_str} exceeds {_SVE_MAX_NV}vl (store predicates p1-p7)")
    check_packing(spec)
    return _allocate(spec, " (indexed LHS operands in z0-z7)")


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q8_neon": _allocate_q8_neon, "q8_sve": _allocate_q8_sve}
