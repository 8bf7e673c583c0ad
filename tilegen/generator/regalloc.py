"""Register allocation: from a tile shape to named AArch64 registers.

The allocator is where tile-shape rules live: a tile is valid when its accumulators,
operand registers and pointers fit the register file.  Every refusal is a
:class:`SpecError` that names the budget and the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .spec import KernelSpec, SpecError, as_spec

__all__ = ["VectorNeeds", "F32NeonRegs", "F32SveRegs", "SmeF32Regs", "Q4NeonRegs", "allocate", "NUM_VREGS"]

NUM_VREGS = 32
# Allocation orders: caller-saved registers first so that small tiles save nothing.
_V_ORDER = list(range(0, 8)) + list(range(16, 32)) + list(range(8, 16))
_V_CALLEE_SAVED = frozenset(range(8, 16))          # low 64 bits (d8-d15) are callee-saved
# x0-x7 carry arguments, x18 is the platform register (macOS), x29/x30 frame/link.
_X_ORDER = list(range(8, 18)) + list(range(19, 29))
_X_CALLEE_SAVED = frozenset(range(19, 29))
# SME templates index ZA with w8 (ZA-array vector select) and w12 (tile slice select): the
# allocator keeps those two out of the pool.
_SME_X_ORDER = [r for r in _X_ORDER if r not in (8, 12)]


@dataclass(frozen=True)
class VectorNeeds:
    """Vector-register demand of a tile, by purpose (for messages and reports)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{n} {what}" for what, n in self.parts)


class _Pool:
    def __init__(self, kind: str, order: list[int], budget_name: str) -> None:
        self.kind, self.free, self.budget_name = kind, list(order), budget_name
        self.used: list[int] = []

    def take(self, n: int) -> list[int]:
        if n > len(self.free):  # callers check budgets first; this is a safety net
            raise SpecError(f"out of {self.budget_name}")
        regs, self.free = self.free[:n], self.free[n:]
        self.used += regs
        return regs


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


@dataclass(frozen=True)
class F32NeonRegs(_Frame):
    """Registers of the f32 NEON FMLA kernel (numbers; templates add the prefix)."""

    acc: tuple[tuple[int, ...], ...]     # acc[row][vec] holds dst[row][4*vec : 4*vec+4]
    lhs: tuple[int, ...]                  # one vector per row: 4 consecutive k values
    rhs: tuple[int, ...]                  # streamed RHS vectors (double-buffered)
    gpr: dict[str, int] = field(hash=False)   # named scalar registers
    lhs_ptr: tuple[int, ...] = ()         # one LHS row pointer per tile row
    saved_x: tuple[int, ...] = ()         # callee-saved GPRs the kernel uses
    saved_d: tuple[int, ...] = ()         # callee-saved d-registers the kernel uses
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])



_F32_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_blk_stride", "dst_blk_stride")
_RHS_BUFFERS = 2


def _allocate_f32_neon(spec: KernelSpec) -> F32NeonRegs:
    mr, nr = spec.mr, spec.nr
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one f32x4 vector per 4 columns)")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p{nr}x1b panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    n_vec = nr // 4
    needs = VectorNeeds((("accumulators", mr * n_vec), ("LHS", mr), ("RHS", _RHS_BUFFERS)))
    if needs.total > NUM_VREGS:
        raise SpecError(f"mr={mr}, nr={nr} needs {needs.total} vector registers "
                        f"({needs.describe()}), {NUM_VREGS} exist")
    n_gpr = len(_F32_SCALARS) + mr
    if n_gpr > len(_X_ORDER):
        raise SpecError(f"mr={mr}, nr={nr} needs {n_gpr} general-purpose registers "
                        f"({len(_F32_SCALARS)} scalars + {mr} LHS row pointers), "
                        f"{len(_X_ORDER)} are free besides the arguments")
    vp = _Pool("v", _V_ORDER, "vector registers")
    rhs = vp.take(_RHS_BUFFERS)
    lhs = vp.take(mr)
    flat = vp.take(mr * n_vec)
    acc = tuple(tuple(flat[r * n_vec:(r + 1) * n_vec]) for r in range(mr))
    xp = _Pool("x", _X_ORDER, "general-purpose registers")
    gpr = dict(zip(_F32_SCALARS, xp.take(len(_F32_SCALARS))))
    lhs_ptr = tuple(xp.take(mr))
    return F32NeonRegs(
        acc=acc, lhs=tuple(lhs), rhs=tuple(rhs), gpr=gpr, lhs_ptr=lhs_ptr,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        saved_d=tuple(sorted(r for r in vp.used if r in _V_CALLEE_SAVED)),
        needs=needs,
    )


@dataclass(frozen=True)
class Q4NeonRegs(_Frame):
    """Registers of the int4 x int8 kernels (dotprod SDOT / i8mm SMMLA).

    The tile's ``mr`` rows are computed ``mr_reg`` rows at a time (``groups`` packed LHS row
    blocks of ``lhs_mr`` rows); ``mr_reg`` is the largest such block that fits the register file.
    """

    mode: str   # "dot4" (SDOT by lane), "dot8" (SDOT, column pairs), "mm" (SMMLA), "neon4" (SMULL+SADALP)
    mr_reg: int
    lhs_mr: int
    groups: int
    facc: tuple[tuple[int, ...], ...]      # facc[row][vec]: f32 results, 4 columns per vector
    iacc: tuple                            # dot4: [row][vec]; dot8: [pair]; mm: [group][row pair][col pair]
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]                   # unpacked (low, high) nibbles of RHS vectors, in pairs
    mask: int                              # 0xF0 in every byte
    scale: tuple[int, ...]                 # per-column block scales (f32), nr/4 vectors
    dl: tuple[int, ...]                    # per-group LHS block scales (q4_0 family)
    tmp: tuple[int, ...]                   # three scratch vectors
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...] = ()               # per-group pointer to the low-nibble LHS half
    hi: tuple[int, ...] = ()               # per-group pointer to the high-nibble LHS half
    streamed: bool = False                 # LHS streamed per row block, block-end regs reused
    acc_mem: bool = False                  # f32 accumulators in the frame; facc = final regs
    fa: int = -1                           # acc_mem: the accumulator vector being updated
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.facc[0])

    @property
    def acc_bytes(self) -> int:
        """acc_mem: bytes of the f32 accumulator area (one vector per row and 4 columns)."""
        return 16 * self.mr_reg * self.n_vec if self.acc_mem else 0

    @property
    def acc_offset(self) -> int:
        """sp offset of the f32 accumulator area (above the clamp values, 16-byte aligned)."""
        return (self.clamp_offset + 16 + 15) // 16 * 16

    @property
    def frame_bytes(self) -> int:
        if not self.acc_mem:
            return super().frame_bytes
        return self.acc_offset + self.acc_bytes


_Q4_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "blk_cnt", "chunk_cnt", "nchunks",
               "hioff", "lhs_rbs", "lhs_blk_stride", "dst_blk_stride", "nblocks", "tmp", "blk_base")


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
        raise SpecError(f"i8mm (SMMLA, 2x8 int8 operands) kernels need kr/sr = 8 and mr a multiple "
                        f"of 4; got mr={spec.mr}, kr={spec.kr}, sr={spec.sr}")
    raise SpecError(f"no q4 kernel for isa {spec.isa!r}")


def _q4_streamed(mode: str, P: int) -> bool:
    """Multi-row tiles (SDOT by lane over 4-row LHS blocks, SMMLA) stream the LHS: a segment's
    RHS registers are unpacked once, then each row block's LHS is loaded into the same few
    registers (renaming keeps the blocks independent).  The block scales, the scratch vectors
    and the conversion reuse the hot loop's LHS/RHS registers once the chunk loop is done."""
    return mode == "mm" or (mode == "dot4" and P == 4)


def _q4_vector_needs(spec: KernelSpec, mode: str, mr_reg: int, P: int) -> VectorNeeds:
    G, nv = mr_reg // P, spec.nr // 4
    iacc = {"dot4": mr_reg * nv, "dot8": 2 * nv, "mm": mr_reg * nv, "neon4": 2 * mr_reg * nv}[mode]
    dl = G if spec.family == "q4_0" else 0
    if spec.acc_mem:
        # LHS: one register pair (SMMLA: the low-nibble pair, then the high one, renamed);
        # block end: 2 scratch + the accumulator in flight + column scales + one row block's
        # LHS scales, in the LHS/RHS registers first
        lhs, rhs = 2, (spec.nr if mode == "mm" else 2 * nv)
        parts = [("int32 accumulators", iacc), ("LHS", lhs), ("RHS", rhs), ("nibble mask", 1)]
        extra = 3 + nv + (1 if dl else 0) - (lhs + rhs)
        if extra > 0:
            parts.append(("block scales and scratch beyond the LHS/RHS registers", extra))
        return VectorNeeds(tuple(parts))
    if _q4_streamed(mode, P):
        lhs, rhs = (4, spec.nr) if mode == "mm" else (2, 2 * nv)
        parts = [("f32 accumulators", mr_reg * nv), ("int32 accumulators", iacc), ("LHS", lhs),
                 ("RHS", rhs), ("nibble mask", 1)]
        # after the chunk loop: 2 scratch + column scales + LHS scales in the LHS/RHS registers
        extra = 2 + nv + dl - (lhs + rhs)
        if extra > 0:
            parts.append(("block scales and scratch beyond the LHS/RHS registers", extra))
        return VectorNeeds(tuple(parts))
    lhs = {"dot4": 2 * G if P == 4 else 2, "dot8": 2,
           "neon4": 2 * G if P == 4 else 2}[mode]
    parts = [("f32 accumulators", mr_reg * nv), ("int32 accumulators", iacc), ("LHS", lhs),
             ("RHS", 2), ("nibble mask", 1), ("column scales", nv)]
    if dl:
        parts.append(("LHS scales", G))
    parts.append(("scratch", 3))
    return VectorNeeds(tuple(parts))


def _flatten(t) -> list[int]:
    return [t] if isinstance(t, int) else [v for x in t for v in _flatten(x)]


def _check_q4_packing(spec: KernelSpec) -> None:
    """Rules of the packed q4 layouts every q4 allocator shares (interleave, rows per block)."""
    if spec.kr % spec.sr:
        raise SpecError(f"kr={spec.kr} must be a multiple of sr={spec.sr}")
    if spec.family == "q4_0" and spec.sr != 2:
        raise SpecError(f"the q4_0 RHS layout (qsi4c32pscalef16) needs sr=2, got sr={spec.sr}")
    if not spec.mr_vl and spec.mr != 1 and spec.mr % 4:
        raise SpecError(f"mr={spec.mr} must be 1 (gemv) or a multiple of 4 (LHS packed 4 rows "
                        f"at a time)")


def _q4_refusal(spec: KernelSpec, P: int, needs: VectorNeeds, note: str = "") -> SpecError:
    """The refusal of a q4 tile whose smallest row block (``P`` rows, demand ``needs``) does
    not fit: names the tile asked for and the block tried."""
    rows = (f"mr={P}," if spec.mr == P else
            f"a block of {P} of its {spec.mr} rows (the smallest block tried) with")
    return SpecError(f"tile {spec.mr_str}x{spec.nr_str}: {rows} nr={spec.nr_str} needs "
                     f"{needs.total} vector registers ({needs.describe()}), {NUM_VREGS} exist{note}")


def _allocate_q4_neon(spec: KernelSpec) -> Q4NeonRegs:
    mr, nr = spec.mr, spec.nr
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one int32x4 vector per 4 columns)")
    _check_q4_packing(spec)
    mode = _q4_mode(spec)
    P = spec.lhs_mr
    if spec.acc_mem and not _q4_streamed(mode, P):
        raise SpecError(f"acc_mem (f32 accumulators in memory) needs a multi-row dotprod tile "
                        f"with kr/sr = 4 or an i8mm tile; got {spec.isa} mr={mr} kr/sr={spec.L}")
    # acc_mem tiles address both LHS halves from one pointer per row block
    ptrs = 1 if spec.acc_mem else 2
    candidates = [r for r in range(mr, 0, -P) if mr % r == 0 and r % P == 0]
    chosen = None
    for mr_reg in candidates:
        needs = _q4_vector_needs(spec, mode, mr_reg, P)
        n_gpr = len(_Q4_SCALARS) + ptrs * (mr_reg // P)
        if needs.total <= NUM_VREGS and n_gpr <= len(_X_ORDER):
            chosen = (mr_reg, needs)
            break
    if chosen is None:
        raise _q4_refusal(spec, P, _q4_vector_needs(spec, mode, P, P))
    mr_reg, needs = chosen
    G, nv = mr_reg // P, nr // 4
    n_dl = G if spec.family == "q4_0" else 0
    vp = _Pool("v", _V_ORDER, "vector registers")
    parts = dict(needs.parts)
    fa = -1
    if spec.acc_mem:
        rhs = vp.take(parts["RHS"])
        lhs = vp.take(parts["LHS"])
        mask = vp.take(1)[0]
        n_epi = 3 + nv + (1 if n_dl else 0)
        epi = rhs + lhs + vp.take(max(0, n_epi - len(rhs) - len(lhs)))
        tmp = [epi[0], epi[1], epi[0]]
        fa = epi[2]
        scale = epi[3:3 + nv]
        dl = [epi[3 + nv]] * n_dl if n_dl else []     # one row block at a time
    elif _q4_streamed(mode, P):
        rhs = vp.take(parts["RHS"])
        lhs = vp.take(parts["LHS"])
        mask = vp.take(1)[0]
        # block-end registers: the (dead) RHS then LHS registers, then spares; t1/t2 are RHS
        # registers so that the dx epilogue may hold lhs[0], lhs[1] at the same time
        epi = rhs + lhs + vp.take(max(0, 2 + nv + n_dl - len(rhs) - len(lhs)))
        tmp = [epi[0], epi[1], epi[0]]          # the third scratch serves neon4 only
        scale = epi[2:2 + nv]
        dl = epi[2 + nv:2 + nv + n_dl]
    else:
        rhs = vp.take(2)
        mask = vp.take(1)[0]
        tmp = vp.take(3)
        lhs = vp.take(parts["LHS"])
        scale = vp.take(nv)
        dl = vp.take(G) if spec.family == "q4_0" else []
    if mode == "dot8":
        iacc = tuple(vp.take(2 * nv))
    elif mode == "neon4":   # [row][vec] -> (columns 0-1 partials, columns 2-3 partials)
        flat = vp.take(2 * mr_reg * nv)
        iacc = tuple(tuple((flat[2 * (r * nv + c)], flat[2 * (r * nv + c) + 1]) for c in range(nv))
                     for r in range(mr_reg))
    elif mode == "dot4":
        flat = vp.take(mr_reg * nv)
        iacc = tuple(tuple(flat[r * nv:(r + 1) * nv]) for r in range(mr_reg))
    else:  # mm: [group][row pair][col pair]
        npair = nr // 2
        flat = vp.take(G * 2 * npair)
        iacc = tuple(tuple(tuple(flat[(g * 2 + rp) * npair:(g * 2 + rp + 1) * npair])
                           for rp in range(2)) for g in range(G))
    if spec.acc_mem:    # after the block loop the int32 accumulators receive the results
        fl = [v for v in _flatten(iacc)]
    else:
        fl = vp.take(mr_reg * nv)
    facc = tuple(tuple(fl[r * nv:(r + 1) * nv]) for r in range(mr_reg))
    xp = _Pool("x", _X_ORDER, "general-purpose registers")
    gpr = dict(zip(_Q4_SCALARS, xp.take(len(_Q4_SCALARS))))
    lo = tuple(xp.take(G))
    hi = () if spec.acc_mem else tuple(xp.take(G))
    return Q4NeonRegs(
        mode=mode, mr_reg=mr_reg, lhs_mr=P, groups=G, facc=facc, iacc=iacc, lhs=tuple(lhs),
        rhs=tuple(rhs), mask=mask, scale=tuple(scale), dl=tuple(dl), tmp=tuple(tmp), gpr=gpr,
        lo=lo, hi=hi, streamed=_q4_streamed(mode, P), acc_mem=spec.acc_mem, fa=fa,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        saved_d=tuple(sorted(r for r in vp.used if r in _V_CALLEE_SAVED)),
        needs=needs,
    )


@dataclass(frozen=True)
class F32SveRegs(F32NeonRegs):
    """Registers of the f32 SVE FMLA kernel: Z registers numbered as the NEON ones (acc[row][vec]
    holds one VL of columns), ``pred[j]`` the store predicate of column vector j."""

    pred: tuple[int, ...] = ()


_SVE_MAX_VECS = 8     # st1w/ld1w immediate offsets reach vector 7 of a panel row


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
    needs = VectorNeeds((("accumulators", mr * nv), ("LHS", mr), ("RHS", _RHS_BUFFERS)))
    if needs.total > NUM_VREGS:
        raise SpecError(f"mr={mr}, nr={spec.nr_str} needs {needs.total} vector registers "
                        f"({needs.describe()}), {NUM_VREGS} exist")
    if mr > 8:
        raise SpecError(f"mr={mr} > 8: the indexed FMLA reads its LHS vector from z0-z7, "
                        f"one per row")
    base = _allocate_f32_neon(KernelSpec("f32", "neon", mr, 4 * nv))
    # LHS vectors (the indexed operand) in z0-z7, then the RHS buffers, then accumulators
    vp = _Pool("v", list(range(8)) + [r for r in _V_ORDER if r >= 8], "vector registers")
    lhs = tuple(vp.take(mr))
    rhs = tuple(vp.take(_RHS_BUFFERS))
    flat = vp.take(mr * nv)
    acc = tuple(tuple(flat[r * nv:(r + 1) * nv]) for r in range(mr))
    return F32SveRegs(acc=acc, lhs=lhs, rhs=rhs, gpr=base.gpr, lhs_ptr=base.lhs_ptr,
                      saved_x=base.saved_x,
                      saved_d=tuple(sorted(r for r in vp.used if r in _V_CALLEE_SAVED)),
                      needs=needs, pred=_store_preds(nv))


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
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = tuple(range(8, 16))
    needs: VectorNeeds = VectorNeeds(())
    counter_pred: int = 8                # pn8: SME2 multi-vector loads


_ZA_F32_TILES = 4
_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_ptr", "tmp",
                "lhs_blk_stride", "dst_blk_stride", "vlw", "rows")
# Z registers: two k-steps in flight (sets A and B); SME2 multi-vector loads need each LHS
# and RHS group to start at a multiple of its length, so groups start at multiples of 4.
_SME_SETS = ((0, 4), (24, 28))


def _allocate_f32_sme(spec: KernelSpec) -> SmeF32Regs:
    if not (spec.mr_vl and spec.nr_vl):
        raise SpecError(f"sme f32 outer-product tiles are whole ZA tiles: give mr and nr in VL "
                        f"units (e.g. 2vlx2vl), got {spec.mr_str}x{spec.nr_str}")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    mu, nu = spec.mr, spec.nr
    if mu * nu > _ZA_F32_TILES:
        raise SpecError(f"{spec.mr_str}x{spec.nr_str} needs {mu * nu} ZA f32 tiles, "
                        f"{_ZA_F32_TILES} exist (za0.s-za3.s)")
    if spec.isa == "sme2" and (mu == 3 or nu == 3):
        raise SpecError(f"sme2 multi-vector loads take 1, 2 or 4 vectors: {spec.mr_str}x"
                        f"{spec.nr_str} has a group of 3")
    lhs = tuple(tuple(range(a, a + mu)) for a, _ in _SME_SETS)
    rhs = tuple(tuple(range(b, b + nu)) for _, b in _SME_SETS)
    xp = _Pool("x", _SME_X_ORDER, "general-purpose registers")
    gpr = dict(zip(_SME_SCALARS, xp.take(len(_SME_SCALARS))))
    needs = VectorNeeds((("LHS", 2 * mu), ("RHS", 2 * nu), ("clamp", 2), ("store", nu)))
    return SmeF32Regs(
        tile=tuple(tuple(i * nu + j for j in range(nu)) for i in range(mu)),
        lhs=lhs, rhs=rhs, row_pred=tuple(range(1, mu + 1)),
        col_pred=tuple(range(mu + 1, mu + nu + 1)), clamp=(16, 17),
        tmp=tuple(range(20, 20 + nu)), gpr=gpr,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)), needs=needs)


@dataclass(frozen=True)
class Sme2GemvRegs(_Frame):
    """Registers of the f32 SME2 gemv (1 x nu VL): ZA-array FMLA over nu vectors (vgx<nu>)."""

    rhs: tuple[tuple[int, ...], ...]     # rhs[set]: nu consecutive vectors, two k steps in flight
    lhs: tuple[int, ...]                 # lhs[set]: broadcast LHS value
    clamp: tuple[int, int]
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = tuple(range(8, 16))
    needs: VectorNeeds = VectorNeeds(())
    counter_pred: int = 8                # pn8: all lanes; pn9: store predicate (vlx<nu>)


_SME2_GEMV_SCALARS = ("n_rem", "rhs_ptr", "dst_ptr", "lhs_ptr", "k_cnt", "tmp", "col")


def _allocate_f32_sme2_gemv(spec: KernelSpec) -> Sme2GemvRegs:
    nu = spec.nr
    if nu not in (2, 4):
        raise SpecError(f"the sme2 gemv accumulates nr in one ZA vector group: nr must be 2vl or "
                        f"4vl (vgx2/vgx4), got {spec.nr_str}")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    xp = _Pool("x", _SME_X_ORDER, "general-purpose registers")
    gpr = dict(zip(_SME2_GEMV_SCALARS, xp.take(len(_SME2_GEMV_SCALARS))))
    # the single-vector operand of multi-vector FMLA must be one of z0-z15
    return Sme2GemvRegs(rhs=(tuple(range(0, nu)), tuple(range(16, 16 + nu))), lhs=(4, 5),
                        clamp=(24, 25), gpr=gpr,
                        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
                        needs=VectorNeeds((("RHS", 2 * nu), ("LHS", 2), ("clamp", 2))))


def _allocate_f32_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_f32_sme2_gemv(spec)
    return _allocate_f32_sme(spec)


@dataclass(frozen=True)
class Q4SveRegs(Q4NeonRegs):
    """Registers of the SVE int4 x int8 kernels (same roles as the NEON ones, Z registers;
    one column vector ``cv`` holds VL/32 columns).  mm: ``iacc[group][row pair][2*cv + h]``,
    dot8 (gemv): ``iacc[2*cv + h]``,
    half h of column vector cv (SMMLA gives 2x2 blocks per 128-bit segment).  ``pred[cv]``
    is the store predicate of column vector cv."""

    pred: tuple[int, ...] = ()


def _q4_sve_needs(spec: KernelSpec, mode: str, mr_reg: int, P: int) -> VectorNeeds:
    G, nv = mr_reg // P, spec.nr
    lhs = {"dot4": 2 * G if P == 4 else 2, "dot8": 2, "mm": 4 * G}[mode]
    iacc = 2 * nv if mode == "dot8" else mr_reg * nv
    parts = [("f32 accumulators", mr_reg * nv), ("int32 accumulators", iacc),
             ("LHS", lhs), ("RHS", 2), ("column scales", nv)]
    if spec.family == "q4_0":
        parts.append(("LHS scales", G))
    parts.append(("scratch", 3))
    return VectorNeeds(tuple(parts))


def _allocate_q4_sve(spec: KernelSpec) -> Q4SveRegs:
    mr, nv, L = spec.mr, spec.nr, spec.L
    if spec.mr_vl:
        raise SpecError(f"sve q4 kernels have a fixed row count: give mr as a number, "
                        f"got mr={spec.mr_str}")
    _check_q4_packing(spec)
    if nv > 7:
        raise SpecError(f"nr={spec.nr_str} exceeds 7vl (per-column-vector offsets and store "
                        f"predicates p1-p7)")
    if spec.isa == "sve_dotprod":
        if L == 8 and mr == 1:
            mode = "dot8"       # gemv reading the i8mm kernels' packed RHS (kr/sr = 8)
        elif L != 4:
            raise SpecError(f"sve_dotprod kernels need kr/sr = 4 (SDOT by 32-bit lane), or "
                            f"kr/sr = 8 for gemv (mr=1); got mr={mr}, kr={spec.kr}, sr={spec.sr}")
        else:
            mode = "dot4"
    else:
        if L != 8 or mr % 4:
            raise SpecError(f"sve_i8mm (SMMLA, 2x8 int8 per 128-bit segment) needs kr/sr = 8 "
                            f"and mr a multiple of 4; got mr={mr}, kr={spec.kr}, sr={spec.sr}")
        mode = "mm"
    P = spec.lhs_mr
    chosen = None
    for mr_reg in [r for r in range(mr, 0, -P) if mr % r == 0 and r % P == 0]:
        needs = _q4_sve_needs(spec, mode, mr_reg, P)
        G = mr_reg // P
        # z0-z7 operands: LHS scales (q4_0), LHS lanes for the indexed SDOT (dot4), and the
        # first two LHS registers (dx epilogue's per-row values)
        low = (G if spec.family == "q4_0" else 0) + (dict(needs.parts)["LHS"] if mode == "dot4" else 2)
        if needs.total <= NUM_VREGS and low <= 8 and \
                len(_Q4_SCALARS) + 2 * G <= len(_X_ORDER):
            chosen = (mr_reg, needs)
            break
    if chosen is None:
        raise _q4_refusal(spec, P, _q4_sve_needs(spec, mode, P, P),
                          " (LHS and LHS scales, indexed operands, in z0-z7)")
    mr_reg, needs = chosen
    G = mr_reg // P
    # indexed operands (LHS lanes, LHS scales, epilogue row values) must live in z0-z7
    vp = _Pool("v", list(range(8)) + [r for r in _V_ORDER if r >= 8], "vector registers")
    dl = vp.take(G) if spec.family == "q4_0" else []
    lhs = vp.take(dict(needs.parts)["LHS"])
    rhs = vp.take(2)
    tmp = vp.take(3)
    scale = vp.take(nv)
    if mode == "dot4":
        flat = vp.take(mr_reg * nv)
        iacc = tuple(tuple(flat[r * nv:(r + 1) * nv]) for r in range(mr_reg))
    elif mode == "dot8":     # [2*cv + h]: half h of column vector cv, 2 lanes per column
        iacc = tuple(vp.take(2 * nv))
    else:
        flat = vp.take(G * 2 * 2 * nv)
        iacc = tuple(tuple(tuple(flat[(g * 2 + rp) * 2 * nv:(g * 2 + rp + 1) * 2 * nv])
                           for rp in range(2)) for g in range(G))
    fl = vp.take(mr_reg * nv)
    facc = tuple(tuple(fl[r * nv:(r + 1) * nv]) for r in range(mr_reg))
    xp = _Pool("x", _X_ORDER, "general-purpose registers")
    gpr = dict(zip(_Q4_SCALARS, xp.take(len(_Q4_SCALARS))))
    lo, hi = tuple(xp.take(G)), tuple(xp.take(G))
    return Q4SveRegs(
        mode=mode, mr_reg=mr_reg, lhs_mr=P, groups=G, facc=facc, iacc=iacc, lhs=tuple(lhs),
        rhs=tuple(rhs), mask=-1, scale=tuple(scale), dl=tuple(dl), tmp=tuple(tmp), gpr=gpr,
        lo=lo, hi=hi,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        saved_d=tuple(sorted(r for r in vp.used if r in _V_CALLEE_SAVED)),
        needs=needs, pred=tuple(range(1, nv + 1)))


@dataclass(frozen=True)
class Q4Sme2Regs(Q4SveRegs):
    """SME2 int4 gemv: int32 sums in one ZA-array vector group (SDOT vgx<nv> by lane); the
    unpacked nibbles of a k step's nv RHS vectors in two aligned multi-vector groups."""

    lo_grp: tuple[int, ...] = ()
    hi_grp: tuple[int, ...] = ()


def _allocate_q4_sme2(spec: KernelSpec) -> Q4Sme2Regs:
    nv = spec.nr
    if not spec.is_gemv:
        raise SpecError(f"sme2 q4 kernels are gemv (ZA-array SDOT): mr must be 1, got "
                        f"mr={spec.mr_str}")
    if nv not in (2, 4):
        raise SpecError(f"sme2 q4 gemv: nr must be 2vl or 4vl (SDOT vgx2/vgx4), got {spec.nr_str}")
    if spec.L != 4:
        raise SpecError(f"sme2 q4 gemv reads 4-byte groups (SDOT by lane): kr/sr must be 4, "
                        f"got kr={spec.kr}, sr={spec.sr}")
    _check_q4_packing(spec)
    xp = _Pool("x", _SME_X_ORDER, "general-purpose registers")
    gpr = dict(zip(_Q4_SCALARS, xp.take(len(_Q4_SCALARS))))
    lo, hi = tuple(xp.take(1)), tuple(xp.take(1))
    facc = (tuple(range(20, 20 + nv)),)
    return Q4Sme2Regs(
        mode="za4", mr_reg=1, lhs_mr=1, groups=1, facc=facc, iacc=(), lhs=(0, 1), rhs=(7, 7),
        mask=-1, scale=tuple(range(16, 16 + nv)), dl=(2,) if spec.family == "q4_0" else (),
        tmp=(3, 5, 6), gpr=gpr, lo=lo, hi=hi,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        saved_d=tuple(range(8, 16)),          # streaming mode clears the vector file
        needs=VectorNeeds((("f32 accumulators", nv), ("LHS", 2), ("unpacked RHS", 2 * nv),
                           ("column scales", nv), ("scratch", 3))),
        pred=tuple(range(1, nv + 1)), lo_grp=tuple(range(8, 8 + nv)),
        hi_grp=tuple(range(12, 12 + nv)))


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
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = tuple(range(8, 16))
    needs: VectorNeeds = VectorNeeds(())


_Q4_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "blk_cnt", "chunk_cnt", "nchunks",
                   "hioff", "lhs_rbs", "dst_blk_stride", "nblocks", "tmp", "lo", "hi", "dlp",
                   "vlw", "rows", "colp")


def _allocate_q4_sme(spec: KernelSpec) -> Q4SmeRegs:
    if not (spec.mr_vl and spec.nr_vl) or spec.mr != 1 or spec.nr not in (1, 2):
        raise SpecError(f"sme q4 outer-product tiles are 1vlx1vl or 1vlx2vl (int32 sums and f32 "
                        f"accumulators share the four ZA tiles), got {spec.mr_str}x{spec.nr_str}")
    if spec.L != 4:
        raise SpecError(f"SMOPA reads 4-byte groups: kr/sr must be 4, got kr={spec.kr}, "
                        f"sr={spec.sr}")
    _check_q4_packing(spec)
    nu = spec.nr
    xp = _Pool("x", _SME_X_ORDER, "general-purpose registers")
    gpr = dict(zip(_Q4_SME_SCALARS, xp.take(len(_Q4_SME_SCALARS))))
    return Q4SmeRegs(
        nu=nu, lhs=(0, 1), rhs=(2, 3), scale=tuple(range(4, 4 + nu)), dl=6, acc=7,
        tmp=(16, 17, 18), clamp=(19, 20), row_vals=(21, 22), col_vals=(23, 24), gpr=gpr,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        needs=VectorNeeds((("LHS", 2), ("RHS", 2), ("column scales", nu), ("row", 2),
                           ("scratch", 3), ("clamp", 2), ("epilogue", 4))))


# allocator name (``IsaImpl.allocator`` of the family records in spec.py) -> function
ALLOCATORS = {"f32_neon": _allocate_f32_neon, "f32_sve": _allocate_f32_sve,
              "f32_sme": _allocate_f32_sme, "f32_sme2": _allocate_f32_sme2,
              "q4_neon": _allocate_q4_neon, "q4_sve": _allocate_q4_sve,
              "q4_sme": _allocate_q4_sme, "q4_sme2": _allocate_q4_sme2}

from .regalloc_q8 import allocate_q8_neon  # noqa: E402 - it builds on the helpers above
ALLOCATORS["q8_neon"] = allocate_q8_neon


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
