"""Register allocation: from a tile shape to named AArch64 registers.

The allocator is where tile-shape rules live: a tile is valid when its accumulators,
operand registers and pointers fit the register file.  Allocators take their registers from
a :class:`RegisterPool`, which keeps the tally of what was taken for what; a tile that does
not fit is refused with that tally (a :class:`SpecError` naming the budget and the numbers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .spec import KernelSpec, SpecError, as_spec

__all__ = ["VectorNeeds", "RegisterPool", "F32NeonRegs", "F32SveRegs", "SmeF32Regs",
           "Sme2GemvRegs", "Q4Regs", "Q4SmeRegs", "allocate", "NUM_VREGS"]

NUM_VREGS = 32
# Allocation orders: caller-saved registers first so that small tiles save nothing.
_V_ORDER = list(range(0, 8)) + list(range(16, 32)) + list(range(8, 16))
_V_CALLEE_SAVED = frozenset(range(8, 16))          # low 64 bits (d8-d15) are callee-saved
# Indexed (by-element) SVE operands must be z0-z7: that order hands them out first.
_Z_LOW_FIRST = list(range(8)) + [r for r in _V_ORDER if r >= 8]
# x0-x7 carry arguments, x18 is the platform register (macOS), x29/x30 frame/link.
_X_ORDER = list(range(8, 18)) + list(range(19, 29))
_X_CALLEE_SAVED = frozenset(range(19, 29))
# SME templates index ZA with w8 (ZA-array vector select) and w12 (tile slice select): the
# allocator keeps those two out of the pool.
_SME_X_ORDER = [r for r in _X_ORDER if r not in (8, 12)]
_GPR_CHART = ("scalars", "LHS row pointers")


@dataclass(frozen=True)
class VectorNeeds:
    """Register demand of a tile, by purpose (for messages and reports): a bank's tally."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{n} {what}" for what, n in self.parts)


class _Bank:
    """One register bank: hands registers out in its allocation order and keeps the tally of
    what each was taken for.  A take past the end still counts (the demand is what a refusal
    reports) and hands out numbers past the bank, which ``RegisterPool.refusal`` never lets
    reach a kernel."""

    def __init__(self, name: str, order: list[int], callee_saved: frozenset, chart: tuple[str, ...],
                 budget: str) -> None:
        self.name, self.order, self.callee_saved, self.budget = name, order, callee_saved, budget
        self.tally = dict.fromkeys(chart, 0)        # the chart fixes the order of the report
        self.used: list[int] = []
        self.misplaced: list[str | None] = []      # rules of operands taken outside their range
        self._next = 0

    def take(self, n: int, role: str, within: int | None = None, rule: str | None = None) -> list[int]:
        """``n`` fresh registers for ``role``; ``within``: they must be numbered below it (an
        indexed operand), ``rule`` the refusal if not (default: the vector tally's)."""
        idx = range(self._next, self._next + n)
        self._next += n
        regs = [self.order[i] if i < len(self.order) else 100 + i for i in idx]
        if within is not None and any(r >= within for r in regs):
            self.misplaced.append(rule)
        self._count(role, regs)
        return regs

    def reuse(self, held: list[int], n: int, role: str) -> list[int]:
        """``n`` registers for ``role`` in a later phase: the (dead by then) ``held`` ones
        first, fresh ones for the rest; only the fresh ones count."""
        return held[:n] + self.take(max(0, n - len(held)), role)

    def claim(self, regs, role: str, counted: bool = True) -> tuple[int, ...]:
        """Fixed registers a template's instruction forms dictate (ZA-array groups, z0-z15
        operands); ``counted=False`` keeps them out of the reported demand."""
        regs = tuple(regs)
        if set(regs) & set(self.used):
            raise AssertionError(f"{self.name}: {role} claims taken registers {regs}")
        if counted:
            self._count(role, regs)
        else:
            self.used += regs
        return regs

    def _count(self, role: str, regs) -> None:
        if role not in self.tally:
            raise AssertionError(f"{self.name}: {role!r} is not an account of this kernel")
        self.tally[role] += len(regs)
        self.used += regs

    @property
    def needs(self) -> VectorNeeds:
        return VectorNeeds(tuple((role, n) for role, n in self.tally.items() if n))

    @property
    def overdrawn(self) -> bool:
        return self._next > len(self.order)

    @property
    def saved(self) -> tuple[int, ...]:
        return tuple(sorted(set(r for r in self.used if r in self.callee_saved)))


class RegisterPool:
    """The register file of one kernel: a GPR bank ``x`` and a vector (V/Z) bank ``v``, each
    with its accounts (``chart``: the vector purposes, in report order).  Allocators take
    registers from the banks; ``refusal``/``settle``/``fits`` judge the tally, ``frame()`` gives
    the record's saved_x/saved_d (the callee-saved registers taken) and needs (the vector
    tally).  ``streaming``: SME kernels, which save all of d8-d15."""

    def __init__(self, chart: tuple[str, ...], *, v_order: list[int] = _V_ORDER,
                 x_order: list[int] = _X_ORDER, streaming: bool = False) -> None:
        self.v = _Bank("vector registers", v_order, _V_CALLEE_SAVED, chart,
                       f"{NUM_VREGS} exist")
        self.x = _Bank("general-purpose registers", x_order, _X_CALLEE_SAVED, _GPR_CHART,
                       f"{len(x_order)} are free besides the arguments")
        self.streaming = streaming

    def scalars(self, names: tuple[str, ...]) -> dict[str, int]:
        return dict(zip(names, self.x.take(len(names), "scalars")))

    def refusal(self, subject: str, note: str = "") -> SpecError | None:
        """None if the tally fits the register file, else the refusal: vector total, then the
        placement of indexed operands, then the GPR total."""
        v = self.v.needs
        rule = self.v.misplaced[0] if self.v.misplaced else None
        if self.v.overdrawn or (self.v.misplaced and rule is None):
            return SpecError(f"{subject} needs {v.total} vector registers ({v.describe()}), "
                             f"{self.v.budget}{note}")
        if rule is not None:
            return SpecError(rule)
        if self.x.overdrawn:
            x = self.x.needs
            return SpecError(f"{subject} needs {x.total} general-purpose registers "
                             f"({x.describe()}), {self.x.budget}")
        return None

    def settle(self, subject: str, note: str = "") -> None:
        err = self.refusal(subject, note)
        if err is not None:
            raise err

    @property
    def fits(self) -> bool:
        return not (self.v.overdrawn or self.v.misplaced or self.x.overdrawn)

    def frame(self) -> dict:
        """The fields every register record carries: callee-saved registers and the demand.
        Streaming mode clears the whole vector file: SME kernels save all of d8-d15."""
        return dict(saved_x=self.x.saved,
                    saved_d=tuple(range(8, 16)) if self.streaming else self.v.saved,
                    needs=self.v.needs)


class _Frame:
    """Stack frame shared by the kernels: saved registers + 16 bytes of clamp values."""

    @property
    def frame_bytes(self) -> int:
        """Bytes below the entry sp, 16-byte aligned (AAPCS64)."""
        saved = 8 * (len(self.saved_x) + len(self.saved_d))
        return (saved + 16 + 15) // 16 * 16

    @property
    def clamp_offset(self) -> int:
        """sp offset of the two f32 clamp values (min, max)."""
        return 8 * (len(self.saved_x) + len(self.saved_d))


def _rows(flat: list[int], n: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive runs of ``n`` registers: [row][vec] of a flat take."""
    return tuple(tuple(flat[i:i + n]) for i in range(0, len(flat), n))


@dataclass(frozen=True)
class F32NeonRegs(_Frame):
    """Registers of the f32 NEON FMLA kernel (numbers; templates add the prefix)."""

    acc: tuple[tuple[int, ...], ...]     # acc[row][vec] holds dst[row][4*vec : 4*vec+4]
    lhs: tuple[int, ...]                  # one vector per row: 4 consecutive k values
    rhs: tuple[int, ...]                  # streamed RHS vectors (double-buffered)
    gpr: dict[str, int] = field(hash=False)   # named scalar registers
    lhs_ptr: tuple[int, ...]              # one LHS row pointer per tile row
    saved_x: tuple[int, ...]              # callee-saved GPRs the kernel uses
    saved_d: tuple[int, ...]              # callee-saved d-registers the kernel uses
    needs: VectorNeeds

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])


@dataclass(frozen=True)
class F32SveRegs(_Frame):
    """Registers of the f32 SVE FMLA kernel: Z registers in the NEON kernel's roles (acc[row][vec]
    holds one VL of columns), ``pred[j]`` the store predicate of column vector j."""

    acc: tuple[tuple[int, ...], ...]
    lhs: tuple[int, ...]                  # z0-z7: the indexed FMLA operand, one per row
    rhs: tuple[int, ...]
    gpr: dict[str, int] = field(hash=False)
    lhs_ptr: tuple[int, ...]
    pred: tuple[int, ...]
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])


_F32_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_blk_stride", "dst_blk_stride")
_F32_CHART = ("accumulators", "LHS", "RHS")
_RHS_BUFFERS = 2
_SVE_MAX_VECS = 8     # st1w/ld1w immediate offsets reach vector 7 of a panel row


def _f32_fma_regs(spec: KernelSpec, v_order: list[int], lhs_within: int | None = None) -> dict:
    """The f32 FMLA kernels' registers (NEON and SVE): RHS buffers, LHS, accumulators; the
    scalars and one LHS row pointer per row; refused if they do not fit."""
    mr, nv = spec.mr, (spec.nr if spec.nr_vl else spec.nr // 4)
    pool = RegisterPool(_F32_CHART, v_order=v_order)
    if lhs_within is None:
        rhs = pool.v.take(_RHS_BUFFERS, "RHS")
        lhs = pool.v.take(mr, "LHS")
    else:     # LHS vectors (the indexed operand) in z0-z7, then the RHS buffers
        lhs = pool.v.take(mr, "LHS", within=lhs_within,
                          rule=f"mr={mr} > 8: the indexed FMLA reads its LHS vector from z0-z7, "
                               f"one per row")
        rhs = pool.v.take(_RHS_BUFFERS, "RHS")
    acc = _rows(pool.v.take(mr * nv, "accumulators"), nv)
    gpr = pool.scalars(_F32_SCALARS)
    lhs_ptr = tuple(pool.x.take(mr, "LHS row pointers"))
    pool.settle(f"mr={mr}, nr={spec.nr_str}")
    return dict(acc=acc, lhs=tuple(lhs), rhs=tuple(rhs), gpr=gpr, lhs_ptr=lhs_ptr,
                **pool.frame())


def _allocate_f32_neon(spec: KernelSpec) -> F32NeonRegs:
    if spec.nr % 4:
        raise SpecError(f"nr={spec.nr} must be a multiple of 4 (one f32x4 vector per 4 columns)")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p{spec.nr}x1b panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    return F32NeonRegs(**_f32_fma_regs(spec, _V_ORDER))


def _store_preds(nv: int) -> tuple[int, ...]:
    """Store predicates (st1w takes p0-p7): p1.. per vector; an eighth reuses p0, which the
    template re-arms with ptrue at the next tile."""
    return tuple(range(1, min(nv, 7) + 1)) + ((0,) if nv == 8 else ())


def _allocate_f32_sve(spec: KernelSpec) -> F32SveRegs:
    mr, nv = spec.mr, spec.nr
    if spec.mr_vl:
        raise SpecError(f"sve f32 kernels have a fixed row count: give mr as a number "
                        f"(e.g. 6x{spec.nr_str}), got mr={spec.mr_str}")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    if nv > _SVE_MAX_VECS:
        raise SpecError(f"nr={spec.nr_str} exceeds {_SVE_MAX_VECS}vl (vector offsets of one "
                        f"panel row must fit the ld1w/st1w immediate)")
    return F32SveRegs(pred=_store_preds(nv), **_f32_fma_regs(spec, _Z_LOW_FIRST, lhs_within=8))


@dataclass(frozen=True)
class Q4Regs(_Frame):
    """Registers of the int4 x int8 kernels on NEON and SVE (V or Z registers; the SVE ones
    hold VL/32 columns per column vector) and of the SME2 gemv.

    The tile's ``mr`` rows are computed ``mr_reg`` rows at a time (``groups`` packed LHS row
    blocks of ``lhs_mr`` rows); ``mr_reg`` is the largest such block that fits the register file.
    ``mode`` names the strategy whose macros the template runs (see templates/q4_*.S.j2).
    """

    mode: str   # "dot4" (SDOT by lane), "dot8" (SDOT, column pairs), "mm" (SMMLA),
                # "neon4" (SMULL+SADALP), "za4" (SME2: ZA-array SDOT by lane)
    mr_reg: int
    lhs_mr: int
    groups: int
    facc: tuple[tuple[int, ...], ...]      # facc[row][vec]: f32 results
    iacc: tuple     # NEON dot4: [row][vec]; dot8: [pair]; mm: [group][row pair][col pair];
                    # neon4: [row][vec] (cols 0-1, cols 2-3 partials); SVE dot8: [2*cv + h];
                    # SVE mm: [group][row pair][2*cv + h]; za4: () (ZA array)
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]                   # unpacked (low, high) nibbles of RHS vectors, in pairs
    scale: tuple[int, ...]                 # per-column block scales (f32), one per column vector
    dl: tuple[int, ...]                    # per-group LHS block scales (q4_0 family)
    tmp: tuple[int, ...]                   # three scratch vectors
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...]                    # per-group pointer to the low-nibble LHS half
    hi: tuple[int, ...]                    # per-group pointer to the high-nibble LHS half
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    mask: int | None = None                # NEON: 0xF0 in every byte (SVE: an immediate)
    streamed: bool = False                 # LHS streamed per row block, block-end regs reused
    acc_mem: bool = False                  # f32 accumulators in the frame; facc = final regs
    fa: int | None = None                  # acc_mem: the accumulator vector being updated
    pred: tuple[int, ...] = ()             # SVE: store predicate of column vector cv
    lo_grp: tuple[int, ...] = ()           # za4: the k step's unpacked low nibbles (vgx<nv>)
    hi_grp: tuple[int, ...] = ()           # za4: ... high nibbles
    # mm in registers: the f32 accumulators keep SMMLA's 2x2 order through the block loop
    # (facc flattened = [group][row pair][col pair]), the block scales are arranged to match
    # (col_pat[cp]: column pair cp's two scales, twice; row_pat[rp]: rows of pair rp, each
    # twice) and the rows are put back in order once per tile, into ``final``
    interleaved: bool = False
    # NEON, f32 accumulators in registers: the int32 accumulators are zeroed each block by
    # loads of the frame's zero bytes (load pipes), not by vector-pipe moves
    zero_loads: bool = False
    # one register for every row block's LHS scales: each is read just before its conversion
    dl_shared: bool = False
    col_pat: tuple[int, ...] = ()
    row_pat: tuple[int, ...] = ()

    @property
    def n_vec(self) -> int:
        return len(self.facc[0])

    @property
    def macros(self) -> str:
        """The template file of the strategy's phases (zero, chunk, convert)."""
        return f"{Q4_STRATEGY_MACROS[self.mode]}.S.j2"

    @property
    def iacc_regs(self) -> list[int]:
        """Every int32 accumulator, in the order of ``iacc``'s nesting."""
        return _flatten(self.iacc)

    @property
    def ifacc(self) -> tuple:
        """interleaved: the f32 accumulators as [group][row pair][col pair] (SMMLA's order)."""
        np_ = 2 * self.n_vec
        return _rows(_rows(_flatten(self.facc), np_), 2)

    @property
    def final(self) -> tuple[tuple[int, ...], ...]:
        """[row][vec] of the f32 results after the block loop: ``facc``, or (interleaved) the
        int32 accumulators, which receive the rows put back in order."""
        if not self.interleaved:
            return self.facc
        return tuple(tuple(self.iacc[r // 4][(r % 4) // 2][2 * q + r % 2] for q in range(self.n_vec))
                     for r in range(self.mr_reg))

    @property
    def acc_bytes(self) -> int:
        """acc_mem: bytes of the f32 accumulator area (one vector per row and 4 columns)."""
        return 16 * self.mr_reg * self.n_vec if self.acc_mem else 0

    @property
    def acc_offset(self) -> int:
        """sp offset of the f32 accumulator area (above the clamp values, 16-byte aligned)."""
        return (self.clamp_offset + 16 + 15) // 16 * 16

    @property
    def zero_offset(self) -> int:
        """zero_loads: sp offset of 32 zero bytes, the source of the int32 accumulators'
        per-block zeroing (a load, no vector-pipe operation)."""
        return self.acc_offset

    @property
    def frame_bytes(self) -> int:
        if self.zero_loads:
            return self.zero_offset + 32
        if not self.acc_mem:
            return super().frame_bytes
        return self.acc_offset + self.acc_bytes


# q4 strategy (``Q4Regs.mode``) -> its macro file in templates/ (the hot loop and block end
# that q4_neon.S.j2 / q4_sve.S.j2 run)
Q4_STRATEGY_MACROS = {"dot4": "q4_sdot_lane", "dot8": "q4_sdot_pair", "mm": "q4_smmla",
                      "neon4": "q4_smull", "za4": "q4_za_sdot"}
_Q4_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "blk_cnt", "chunk_cnt", "nchunks",
               "hioff", "lhs_rbs", "lhs_blk_stride", "dst_blk_stride", "nblocks", "tmp", "blk_base")
_Q4_EXTRA = "block scales and scratch beyond the LHS/RHS registers"
# the q4 kernels' vector accounts, in report order
_Q4_CHART = ("f32 accumulators", "int32 accumulators", "LHS", "RHS", "unpacked RHS",
             "nibble mask", "column scales", "LHS scales", _Q4_EXTRA, "scratch")


def _q4_mode(spec: KernelSpec) -> str:
    L = spec.L
    if spec.isa == "neon":
        if L == 4:
            return "neon4"
        raise SpecError(f"plain-NEON q4 kernels (SMULL/SADALP) need kr/sr = 4; got kr={spec.kr}, "
                        f"sr={spec.sr} (kr/sr={L})")
    if spec.isa == "dotprod":
        if L == 4:
            return "dot4"
        if L == 8 and spec.mr == 1:
            return "dot8"
        raise SpecError(f"dotprod kernels need kr/sr = 4, or kr/sr = 8 for gemv (mr=1); "
                        f"got mr={spec.mr}, kr={spec.kr}, sr={spec.sr} (kr/sr={L})")
    if spec.isa == "i8mm":
        if L == 8 and spec.mr % 4 == 0:
            return "mm"
        if spec.mr == 1 and L in (4, 8):     # gemv: SDOT (every i8mm core has dotprod) + FMLAL
            return "dot4" if L == 4 else "dot8"
        raise SpecError(f"i8mm (SMMLA, 2x8 int8 operands) kernels need kr/sr = 8 and mr a multiple "
                        f"of 4 (gemv, mr = 1: kr/sr = 4 or 8); got mr={spec.mr}, kr={spec.kr}, "
                        f"sr={spec.sr}")
    raise SpecError(f"no q4 kernel for isa {spec.isa!r}")


def _q4_streamed(mode: str, P: int) -> bool:
    """Multi-row tiles (SDOT by lane over 4-row LHS blocks, SMMLA) stream the LHS: a segment's
    RHS registers are unpacked once, then each row block's LHS is loaded into the same few
    registers (renaming keeps the blocks independent).  The block scales, the scratch vectors
    and the conversion reuse the hot loop's LHS/RHS registers once the chunk loop is done."""
    return mode == "mm" or (mode == "dot4" and P == 4)


def _check_packing(spec: KernelSpec) -> None:
    """The packed layouts' own rules (interleave, sr, block length; checked once, by the layout
    classes) as SpecErrors, and the spec's LHS row-block rule."""
    from ..layout import LayoutError, lhs_layout_for, rhs_layout_for
    vl = 16 if spec.vl_scaled else None          # VL-scaled tiles: the rules hold at every VL
    try:
        rhs_layout_for(spec, 32, vl)
        lhs_layout_for(spec, 32, vl)
    except LayoutError as e:
        raise SpecError(f"the {spec.family} layouts refuse kr={spec.kr}, sr={spec.sr}: {e}") from None
    if not spec.mr_vl and spec.mr % spec.lhs_mr:
        raise SpecError(f"mr={spec.mr} must be 1 (gemv) or a multiple of {spec.lhs_mr} (LHS "
                        f"packed {spec.lhs_mr} rows at a time)")


def _q4_first_fit(spec: KernelSpec, attempt, note: str = "") -> Q4Regs:
    """Row blocks from the whole tile down to one packed LHS block (``P`` rows): the first
    whose pool fits.  Else the refusal from the smallest block's tally, naming the tile
    asked for and the block tried."""
    P = spec.lhs_mr
    for mr_reg in [r for r in range(spec.mr, 0, -P) if spec.mr % r == 0 and r % P == 0]:
        pool, regs = attempt(mr_reg)
        if pool.fits:
            return Q4Regs(mr_reg=mr_reg, lhs_mr=P, groups=mr_reg // P, **regs, **pool.frame())
    rows = (f"mr={P}," if spec.mr == P else
            f"a block of {P} of its {spec.mr} rows (the smallest block tried) with")
    raise pool.refusal(f"tile {spec.mr_str}x{spec.nr_str}: {rows} nr={spec.nr_str}", note)


def _q4_neon_block(spec: KernelSpec, mode: str, mr_reg: int, narrow: bool = False):
    """Registers of one row block of ``mr_reg`` rows (NEON).  ``narrow`` (SMMLA, f32
    accumulators in registers): one LHS register pair (the low-nibble pair, then the high one,
    renamed) and one row block's LHS scales at a time, so that more rows share an unpack."""
    P, nv = spec.lhs_mr, spec.nr // 4
    G = mr_reg // P
    n_dl = G if spec.family == "q4_0" else 0
    dl_regs = 1 if narrow and n_dl else n_dl
    streamed = _q4_streamed(mode, P)
    pool = RegisterPool(_Q4_CHART)
    v = pool.v
    fa = None
    col_pat = row_pat = ()
    if spec.acc_mem:
        # LHS: one register pair (SMMLA: the low-nibble pair, then the high one, renamed);
        # block end: 2 scratch + the accumulator in flight + column scales + one row block's
        # LHS scales, in the LHS/RHS registers first
        rhs = v.take(spec.nr if mode == "mm" else 2 * nv, "RHS")
        lhs = v.take(2, "LHS")
        mask = v.take(1, "nibble mask")[0]
        epi = v.reuse(rhs + lhs, 3 + nv + (1 if n_dl else 0), _Q4_EXTRA)
        tmp = [epi[0], epi[1], epi[0]]
        fa = epi[2]
        scale = epi[3:3 + nv]
        dl = [epi[3 + nv]] * n_dl if n_dl else []     # one row block at a time
    elif streamed:
        rhs = v.take(spec.nr if mode == "mm" else 2 * nv, "RHS")
        lhs = v.take(4 if mode == "mm" and not narrow else 2, "LHS")
        mask = v.take(1, "nibble mask")[0]
        # block-end registers: the (dead) RHS then LHS registers, then spares; t1/t2 are RHS
        # registers so that the dx epilogue may hold lhs[0], lhs[1] at the same time
        # (mm: + the column-pair scale patterns and one row pattern register)
        n_pat = (2 * nv + (1 if n_dl else 0)) if mode == "mm" else 0
        epi = v.reuse(rhs + lhs, 2 + nv + dl_regs + n_pat, _Q4_EXTRA)
        tmp = [epi[0], epi[1], epi[0]]          # the third scratch serves neon4 only
        scale = epi[2:2 + nv]
        dl = epi[2 + nv:2 + nv + dl_regs] * (G if narrow and n_dl else 1)
        pat = epi[2 + nv + dl_regs:]
        col_pat, row_pat = tuple(pat[:2 * nv]), tuple(pat[2 * nv:])
    else:
        rhs = v.take(2, "RHS")
        mask = v.take(1, "nibble mask")[0]
        # i8mm q4_0: the FMLAL by element reads its LHS scale from v0-v15
        dl = v.take(n_dl, "LHS scales", within=16) if spec.isa == "i8mm" else []
        tmp = v.take(3, "scratch")
        lhs = v.take(2 * G if P == 4 else 2, "LHS")
        scale = v.take(nv, "column scales")
        if spec.isa != "i8mm":
            dl = v.take(n_dl, "LHS scales")
    if mode == "dot8":
        iacc = tuple(v.take(2 * nv, "int32 accumulators"))
    elif mode == "neon4":   # [row][vec] -> (columns 0-1 partials, columns 2-3 partials)
        iacc = tuple(tuple(zip(*[iter(r)] * 2))
                     for r in _rows(v.take(2 * mr_reg * nv, "int32 accumulators"), 2 * nv))
    elif mode == "dot4":
        iacc = _rows(v.take(mr_reg * nv, "int32 accumulators"), nv)
    else:  # mm: [group][row pair][col pair]
        npair = spec.nr // 2
        iacc = _rows(_rows(v.take(G * 2 * npair, "int32 accumulators"), npair), 2)
    if spec.acc_mem:    # after the block loop the int32 accumulators receive the results
        fl = _flatten(iacc)
    else:
        fl = v.take(mr_reg * nv, "f32 accumulators")
    gpr = pool.scalars(_Q4_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    # acc_mem tiles address both LHS halves from one pointer per row block
    hi = () if spec.acc_mem else tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(
        mode=mode, facc=_rows(fl, nv), iacc=iacc, lhs=tuple(lhs), rhs=tuple(rhs), mask=mask,
        scale=tuple(scale), dl=tuple(dl), tmp=tuple(tmp), gpr=gpr, lo=lo, hi=hi,
        streamed=streamed, acc_mem=spec.acc_mem, fa=fa,
        interleaved=mode == "mm" and not spec.acc_mem, zero_loads=not spec.acc_mem,
        dl_shared=narrow and bool(n_dl), col_pat=col_pat, row_pat=row_pat)


def _flatten(t) -> list[int]:
    return [t] if isinstance(t, int) else [v for x in t for v in _flatten(x)]


def _allocate_q4_neon(spec: KernelSpec) -> Q4Regs:
    if spec.nr % 4:
        raise SpecError(f"nr={spec.nr} must be a multiple of 4 (one int32x4 vector per 4 columns)")
    _check_packing(spec)
    mode = _q4_mode(spec)
    if spec.acc_mem and not _q4_streamed(mode, spec.lhs_mr):
        raise SpecError(f"acc_mem (f32 accumulators in memory) needs a multi-row dotprod tile "
                        f"with kr/sr = 4 or an i8mm tile; got {spec.isa} mr={spec.mr} kr/sr={spec.L}")
    def attempt(mr_reg):
        pool, regs = _q4_neon_block(spec, mode, mr_reg)
        if not pool.fits and mode == "mm" and not spec.acc_mem:
            pool, regs = _q4_neon_block(spec, mode, mr_reg, narrow=True)
        return pool, regs
    return _q4_first_fit(spec, attempt)


def _q4_sve_mode(spec: KernelSpec) -> str:
    mr, L = spec.mr, spec.L
    if spec.isa == "sve_dotprod":
        if L == 8 and mr == 1:
            return "dot8"       # gemv reading the i8mm kernels' packed RHS (kr/sr = 8)
        if L != 4:
            raise SpecError(f"sve_dotprod kernels need kr/sr = 4 (SDOT by 32-bit lane), or "
                            f"kr/sr = 8 for gemv (mr=1); got mr={mr}, kr={spec.kr}, sr={spec.sr}")
        return "dot4"
    if L != 8 or mr % 4:
        raise SpecError(f"sve_i8mm (SMMLA, 2x8 int8 per 128-bit segment) needs kr/sr = 8 "
                        f"and mr a multiple of 4; got mr={mr}, kr={spec.kr}, sr={spec.sr}")
    return "mm"


def _q4_sve_block(spec: KernelSpec, mode: str, mr_reg: int):
    """Registers of one row block of ``mr_reg`` rows (SVE).  Indexed operands in z0-z7: the
    LHS scales (q4_0), the LHS lanes of the indexed SDOT (dot4) and the first two LHS
    registers (the dx epilogue's per-row values)."""
    P, nv = spec.lhs_mr, spec.nr
    G = mr_reg // P
    pool = RegisterPool(_Q4_CHART, v_order=_Z_LOW_FIRST)
    v = pool.v
    dl = v.take(G if spec.family == "q4_0" else 0, "LHS scales", within=8)
    if mode == "dot4":
        lhs = v.take(2 * G if P == 4 else 2, "LHS", within=8)
    else:
        lhs = v.take(2, "LHS", within=8) + v.take(4 * G - 2 if mode == "mm" else 0, "LHS")
    rhs = v.take(2, "RHS")
    tmp = v.take(3, "scratch")
    scale = v.take(nv, "column scales")
    if mode == "dot4":
        iacc = _rows(v.take(mr_reg * nv, "int32 accumulators"), nv)
    elif mode == "dot8":     # [2*cv + h]: half h of column vector cv, 2 lanes per column
        iacc = tuple(v.take(2 * nv, "int32 accumulators"))
    else:                    # mm: [group][row pair][2*cv + h]
        iacc = _rows(_rows(v.take(G * 2 * 2 * nv, "int32 accumulators"), 2 * nv), 2)
    facc = _rows(v.take(mr_reg * nv, "f32 accumulators"), nv)
    gpr = pool.scalars(_Q4_SCALARS)
    lo, hi = tuple(pool.x.take(G, "LHS row pointers")), tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(
        mode=mode, facc=facc, iacc=iacc, lhs=tuple(lhs), rhs=tuple(rhs), scale=tuple(scale),
        dl=tuple(dl), tmp=tuple(tmp), gpr=gpr, lo=lo, hi=hi, pred=tuple(range(1, nv + 1)))


def _allocate_q4_sve(spec: KernelSpec) -> Q4Regs:
    if spec.mr_vl:
        raise SpecError(f"sve q4 kernels have a fixed row count: give mr as a number, "
                        f"got mr={spec.mr_str}")
    _check_packing(spec)
    if spec.nr > 7:
        raise SpecError(f"nr={spec.nr_str} exceeds 7vl (per-column-vector offsets and store "
                        f"predicates p1-p7)")
    mode = _q4_sve_mode(spec)
    return _q4_first_fit(spec, lambda mr_reg: _q4_sve_block(spec, mode, mr_reg),
                         " (LHS and LHS scales, indexed operands, in z0-z7)")


def _allocate_q4_sme2(spec: KernelSpec) -> Q4Regs:
    """SME2 int4 gemv: int32 sums in one ZA-array vector group (SDOT vgx<nv> by lane); the
    unpacked nibbles of a k step's nv RHS vectors in two aligned multi-vector groups."""
    nv = spec.nr
    if not spec.is_gemv:
        raise SpecError(f"sme2 q4 kernels are gemv (ZA-array SDOT): mr must be 1, got "
                        f"mr={spec.mr_str}")
    if nv not in (2, 4):
        raise SpecError(f"sme2 q4 gemv: nr must be 2vl or 4vl (SDOT vgx2/vgx4), got {spec.nr_str}")
    if spec.L != 4:
        raise SpecError(f"sme2 q4 gemv reads 4-byte groups (SDOT by lane): kr/sr must be 4, "
                        f"got kr={spec.kr}, sr={spec.sr}")
    _check_packing(spec)
    pool = RegisterPool(_Q4_CHART, x_order=_SME_X_ORDER, streaming=True)
    v = pool.v
    # multi-vector groups start at a multiple of their length; indexed operands in z0-z7
    facc = (v.claim(range(20, 20 + nv), "f32 accumulators"),)
    lhs = v.claim((0, 1), "LHS")
    lo_grp = v.claim(range(8, 8 + nv), "unpacked RHS")
    hi_grp = v.claim(range(12, 12 + nv), "unpacked RHS")
    scale = v.claim(range(16, 16 + nv), "column scales")
    # z2 has never been in this kernel's reported demand (the tuner's vregs key): kept so
    dl = v.claim((2,), "LHS scales", counted=False) if spec.family == "q4_0" else ()
    tmp = v.claim((3, 5, 6), "scratch")
    gpr = pool.scalars(_Q4_SCALARS)
    lo, hi = tuple(pool.x.take(1, "LHS row pointers")), tuple(pool.x.take(1, "LHS row pointers"))
    pool.settle(f"sme2 q4 gemv 1x{spec.nr_str}")
    return Q4Regs(mode="za4", mr_reg=1, lhs_mr=1, groups=1, facc=facc, iacc=(), lhs=lhs, rhs=(),
                  scale=scale, dl=dl, tmp=tmp, gpr=gpr, lo=lo, hi=hi,
                  pred=tuple(range(1, nv + 1)), lo_grp=lo_grp, hi_grp=hi_grp, **pool.frame())


@dataclass(frozen=True)
class SmeF32Regs(_Frame):
    """Registers of the f32 SME outer-product kernel (``mu x nu`` ZA tiles of VL x VL f32).

    ``tile[i][j]`` is the ZA tile number holding rows i*VL.., columns j*VL..; the LHS column
    of a k step is ``lhs[i]``, the RHS row ``rhs[j]``.  Streaming mode clears the whole vector
    file, so every SME kernel saves d8-d15 (``saved_d``)."""

    tile: tuple[tuple[int, ...], ...]
    lhs: tuple[tuple[int, ...], ...]     # lhs[set][i]: two register sets, k steps alternate
    rhs: tuple[tuple[int, ...], ...]
    row_pred: tuple[int, ...]
    col_pred: tuple[int, ...]
    clamp: tuple[int, int]               # z registers holding clamp_min, clamp_max
    tmp: tuple[int, ...]                 # vectors for the ZA slice store path
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8                # pn8: SME2 multi-vector loads
    # SME2 f32: the 4-k hot loop's LHS / RHS vectors in 4-vector load groups (k-major: vector
    # t*mu + i of the LHS block is k step t, row block i); empty: the two-set k2 loop
    k4_lhs: tuple[tuple[int, ...], ...] = ()
    k4_rhs: tuple[tuple[int, ...], ...] = ()


_ZA_F32_TILES = 4
_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_ptr", "tmp",
                "lhs_blk_stride", "dst_blk_stride", "vlw", "rows")
# Z registers: two k-steps in flight (sets A and B); SME2 multi-vector loads need each LHS
# and RHS group to start at a multiple of its length, so groups start at multiples of 4.
_SME_SETS = ((0, 4), (24, 28))
_SME_F32_CHART = ("LHS", "RHS", "clamp", "store")


def _allocate_f32_sme(spec: KernelSpec) -> SmeF32Regs:
    if not (spec.mr_vl and spec.nr_vl):
        raise SpecError(f"sme f32 outer-product tiles are whole ZA tiles: give mr and nr in VL "
                        f"units (e.g. 2vlx2vl), got {spec.mr_str}x{spec.nr_str}")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    return _allocate_sme_tiles(spec)


def _allocate_sme_tiles(spec: KernelSpec, regs_cls=None) -> SmeF32Regs:
    """ZA f32 tiles, two LHS/RHS k-step sets, clamp and store registers of an SME outer-product
    kernel (f32 FMOPA, bf16 BFMOPA)."""
    mu, nu = spec.mr, spec.nr
    if mu * nu > _ZA_F32_TILES:
        raise SpecError(f"{spec.mr_str}x{spec.nr_str} needs {mu * nu} ZA f32 tiles, "
                        f"{_ZA_F32_TILES} exist (za0.s-za3.s)")
    if spec.isa == "sme2" and (mu == 3 or nu == 3):
        raise SpecError(f"sme2 multi-vector loads take 1, 2 or 4 vectors: {spec.mr_str}x"
                        f"{spec.nr_str} has a group of 3")
    pool = RegisterPool(_SME_F32_CHART, x_order=_SME_X_ORDER, streaming=True)
    v = pool.v
    if spec.isa == "sme2" and regs_cls is None:
        return _allocate_sme2_f32_k4(spec, pool)
    lhs = tuple(v.claim(range(a, a + mu), "LHS") for a, _ in _SME_SETS)
    rhs = tuple(v.claim(range(b, b + nu), "RHS") for _, b in _SME_SETS)
    clamp = v.claim((16, 17), "clamp")
    tmp = v.claim(range(20, 20 + nu), "store")
    gpr = pool.scalars(_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return (regs_cls or SmeF32Regs)(
        tile=tuple(tuple(i * nu + j for j in range(nu)) for i in range(mu)),
        lhs=lhs, rhs=rhs, row_pred=tuple(range(1, mu + 1)),
        col_pred=tuple(range(mu + 1, mu + nu + 1)), clamp=clamp, tmp=tmp, gpr=gpr,
        **pool.frame())


def _allocate_sme2_f32_k4(spec: KernelSpec, pool: RegisterPool) -> SmeF32Regs:
    """SME2 f32 FMOPA: 4 k steps of LHS (4*mu vectors) and RHS (4*nu vectors) in 4-vector load
    groups z0..z(4(mu+nu)-1), each reloaded for the next 4 k right after its last FMOPA; the
    one-k remainder steps and the bias row reuse the first vectors of the first groups."""
    mu, nu = spec.mr, spec.nr
    v = pool.v
    k4_lhs = tuple(v.claim(range(4 * c, 4 * c + 4), "LHS") for c in range(mu))
    k4_rhs = tuple(v.claim(range(4 * (mu + c), 4 * (mu + c) + 4), "RHS") for c in range(nu))
    one = (k4_lhs[0][:mu], k4_rhs[0][:nu])
    clamp = v.claim((24, 25), "clamp")
    tmp = v.claim(range(28, 28 + nu), "store")
    gpr = pool.scalars(_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return SmeF32Regs(
        tile=tuple(tuple(i * nu + j for j in range(nu)) for i in range(mu)),
        lhs=(one[0], one[0]), rhs=(one[1], one[1]), row_pred=tuple(range(1, mu + 1)),
        col_pred=tuple(range(mu + 1, mu + nu + 1)), clamp=clamp, tmp=tmp, gpr=gpr,
        k4_lhs=k4_lhs, k4_rhs=k4_rhs, **pool.frame())


@dataclass(frozen=True)
class Sme2GemvRegs(_Frame):
    """Registers of the f32 SME2 gemv (1 x nu VL): ZA-array FMLA into nu/4 vector groups of 4
    (vgx4; nu = 2: one group of 2, vgx2).  The 4-k hot loop broadcasts 4 LHS values per
    128-bit segment (ld1rqw, FMLA by lane) and streams the RHS groups through ``ring``."""

    rhs: tuple[tuple[int, ...], ...]     # rhs[g]: the vectors of ZA group g (bias, store, k tail)
    ring: tuple[tuple[int, ...], ...]    # rotating RHS load groups of the 4-k loop
    lhs: tuple[int, ...]                 # (4-value quad of the 4-k loop, one-value broadcast)
    clamp: tuple[int, int]
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8                # pn8: all lanes; pn9: store predicate (vlx<vg>)

    @property
    def vg(self) -> int:                 # vectors per ZA group (vgx2 / vgx4)
        return len(self.rhs[0])


_SME2_GEMV_SCALARS = ("n_rem", "rhs_ptr", "dst_ptr", "lhs_ptr", "k_cnt", "tmp", "col", "step",
                      "lhs_hi")


def _allocate_f32_sme2_gemv(spec: KernelSpec) -> Sme2GemvRegs:
    nu = spec.nr
    if nu not in (2, 4, 8, 16):
        raise SpecError(f"the sme2 gemv accumulates nr in ZA vector groups of 4 (vgx4; 2vl: one "
                        f"vgx2 group): nr must be 2vl, 4vl, 8vl or 16vl, got {spec.nr_str}")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    pool = RegisterPool(("RHS", "LHS", "clamp"), x_order=_SME_X_ORDER, streaming=True)
    v = pool.v
    vg = min(nu, 4)
    # multi-vector groups start at multiples of their length; the single-vector (by-lane)
    # operand of multi-vector FMLA must be one of z0-z15
    ring = tuple(v.claim(range(b, b + vg), "RHS") for b in (16, 20, 24, 28, 4, 8))
    rhs = ring[:nu // vg]
    lhs = v.claim((0, 1), "LHS")
    clamp = v.claim((2, 3), "clamp")
    gpr = pool.scalars(_SME2_GEMV_SCALARS)
    pool.settle(f"1x{spec.nr_str}")
    return Sme2GemvRegs(rhs=rhs, ring=ring, lhs=lhs, clamp=clamp, gpr=gpr, **pool.frame())


def _allocate_f32_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_f32_sme2_gemv(spec)
    return _allocate_f32_sme(spec)


@dataclass(frozen=True)
class Q4SmeRegs(_Frame):
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
    if spec.L != 4:
        raise SpecError(f"SMOPA reads 4-byte groups: kr/sr must be 4, got kr={spec.kr}, "
                        f"sr={spec.sr}")
    _check_packing(spec)
    nu = spec.nr
    pool = RegisterPool(_Q4_SME_CHART, x_order=_SME_X_ORDER, streaming=True)
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


# allocator name (``IsaImpl.allocator`` of the family records in spec.py) -> function
ALLOCATORS = {"f32_neon": _allocate_f32_neon, "f32_sve": _allocate_f32_sve,
              "f32_sme": _allocate_f32_sme, "f32_sme2": _allocate_f32_sme2,
              "q4_neon": _allocate_q4_neon, "q4_sve": _allocate_q4_sve,
              "q4_sme": _allocate_q4_sme, "q4_sme2": _allocate_q4_sme2}

from .regalloc_q8 import allocate_q8_neon  # noqa: E402 - it builds on the helpers above
ALLOCATORS["q8_neon"] = allocate_q8_neon
from .regalloc_q8_sve import allocate_q8_sve  # noqa: E402
ALLOCATORS["q8_sve"] = allocate_q8_sve
from .regalloc_q8_sme import allocate_q8_sme, allocate_q8_sme2  # noqa: E402
ALLOCATORS["q8_sme"] = allocate_q8_sme
ALLOCATORS["q8_sme2"] = allocate_q8_sme2
from .regalloc_bf16 import allocate_bf16_neon, allocate_bf16_sme2  # noqa: E402
ALLOCATORS["bf16_sme2"] = allocate_bf16_sme2
ALLOCATORS["bf16_neon"] = allocate_bf16_neon
from .regalloc_q4_luti4 import allocate_q4_sme2_luti4  # noqa: E402
ALLOCATORS["q4_sme2_luti4"] = allocate_q4_sme2_luti4


def allocate(spec: KernelSpec | str):
    """Allocate registers for ``spec`` (a KernelSpec or a spec string) or raise
    :class:`SpecError` naming the violated rule."""
    spec = as_spec(spec)
    try:
        fn = ALLOCATORS[spec.impl.allocator]
    except KeyError:
        raise SpecError(f"no register allocator {spec.impl.allocator!r} for "
                        f"{spec.family}/{spec.isa}") from None
    return fn(spec)
