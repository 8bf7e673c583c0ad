"""Register allocation of the int4 x int8 kernels (families q4_0, q4_0_dx) on NEON and SVE:
row blocks of ``mr_reg`` rows, the largest that fits the register file, in one of the
strategies of :data:`Q4_STRATEGY_MACROS` (SDOT by lane or on column pairs, SMMLA, SMULL)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing, template_layouts
from .pool import Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, first_fit, flatten, rows

__all__ = ["Q4Regs", "Q4_STRATEGY_MACROS", "Q4_SCALARS", "Q4_CHART", "ALLOCATORS"]


@dataclass(frozen=True)
class Q4Regs(Frame):
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
    table: tuple[int, ...] = ()            # NEON: a table-decoded RHS's lookup table
    #                                        (the layout's ``table_vectors``; iq4_nl's TBL);
    #                                        SME2 gemv (table in ZT0): LUTI4's aligned pair
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
    # a table-decoded layout whose block sums fit 22 bits (:func:`_magic_sums`): the int32
    # accumulators start at the bits of M = 1.5 * 2^23 (NEON: loads of the frame's magic
    # bytes, dot8 (pairs added by ADDP) at (M, 0); SVE: moves from M in the third scratch
    # vector), so that M + S read as f32 is exact and one FSUB of M gives f32(S) (SCVTF: two
    # vector-pipe uops on the Neoverse models)
    magic: bool = False
    # a table-decoded NEON gemv whose layout asks for it (``gpr_split_every`` > 0,
    # :func:`_gpr_split`): every ``split_every``-th RHS vector has its nibbles split on the
    # integer pipes (LDP of the 16 index bytes into two GPRs, AND with 0x0f.. and AND of the
    # value >> 4 with the mask GPR, STP of both planes to a frame slot, two LDR q back), not
    # by USHR/AND on the vector pipes; ``split`` = the GPRs (a, b, c, d, mask), () = off
    split: tuple[int, ...] = ()
    split_every: int = 0

    #: frame slots (32 bytes: the low-nibble plane, then the high one) the split rotates over
    SPLIT_SLOTS = 4

    @property
    def n_vec(self) -> int:
        return len(self.facc[0])

    @property
    def macros(self) -> str:
        """The template file of the strategy's phases (zero, chunk, convert)."""
        return f"{Q4_STRATEGY_MACROS[self.mode]}.S.j2"

    @property
    def pat_gpr(self) -> tuple[int, int]:
        """q4_0_dx interleaved: the two GPRs that build a column pair's scale pattern (its two
        bf16 scales as f32 bits, for one DUP) after the chunk loop: ``tmp`` and ``blk_base``,
        which the dx block does not otherwise use (its scales follow the data, at the chunk
        loop's end pointer; ``blk_base`` serves q4_0 only)."""
        return self.gpr["tmp"], self.gpr["blk_base"]

    @property
    def iacc_regs(self) -> list[int]:
        """Every int32 accumulator, in the order of ``iacc``'s nesting."""
        return flatten(self.iacc)

    @property
    def ifacc(self) -> tuple:
        """interleaved: the f32 accumulators as [group][row pair][col pair] (SMMLA's order)."""
        np_ = 2 * self.n_vec
        return rows(rows(flatten(self.facc), np_), 2)

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
    def magic_offset(self) -> int:
        """magic: sp offset of the 32 bytes the int32 accumulators start from (M, or (M, 0)
        pairs for dot8), after the zero bytes."""
        return self.zero_offset + 32

    @property
    def split_offset(self) -> int:
        """split: sp offset of the :attr:`SPLIT_SLOTS` 32-byte slots the integer-pipe nibble
        split stores its two planes to (after the zero and magic bytes)."""
        return self.zero_offset + (64 if self.magic else 32)

    @property
    def frame_bytes(self) -> int:
        if self.zero_loads:
            return self.split_offset + (32 * self.SPLIT_SLOTS if self.split else 0)
        if not self.acc_mem:
            return super().frame_bytes
        return self.acc_offset + self.acc_bytes


# q4 strategy (``Q4Regs.mode``) -> its macro file in templates/ (the hot loop and block end
# that q4_neon.S.j2 / q4_sve.S.j2 run)
Q4_STRATEGY_MACROS = {"dot4": "q4_sdot_lane", "dot8": "q4_sdot_pair", "mm": "q4_smmla",
                      "neon4": "q4_smull", "za4": "q4_za_sdot"}
Q4_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "blk_cnt", "chunk_cnt", "nchunks",
              "hioff", "lhs_rbs", "lhs_blk_stride", "dst_blk_stride", "nblocks", "tmp", "blk_base")
_Q4_EXTRA = "block scales and scratch beyond the LHS/RHS registers"
# the q4 kernels' vector accounts, in report order
Q4_CHART = ("f32 accumulators", "int32 accumulators", "LHS", "RHS", "unpacked RHS",
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


def _block_scaled_lhs(spec: KernelSpec) -> bool:
    """Whether the kernel's LHS carries a scale per 32-block (``qsi8d32p``: the q4_0-style
    families, whose block scales are products dr * dl), not per row (``qai8dxp``: q4_0_dx)."""
    return spec.info.lhs == "qsi8d32p"


def _table_vectors(spec: KernelSpec) -> int:
    """Vector registers the RHS layout's decode holds a lookup table in (its class's
    ``table_vectors``: table-decoded families such as iq4_nl; 0 for the offset int4 ones)."""
    return getattr(template_layouts(spec)[0], "table_vectors", 0)


#: 1.5 * 2^23: f32 bits 0x4B400000; M + S as an int32 is f32 M + S exactly for |S| < 2^22
MAGIC_LIMIT = 1 << 22


def _magic_sums(spec: KernelSpec, mode: str, streamed: bool) -> bool:
    """Whether the kernel converts its block sums by the magic number (``Q4Regs.magic``):
    NEON with the f32 accumulators in registers, the SMMLA strategy or a gemv (SDOT by lane,
    column pairs: their third scratch vector holds M); SVE (the third scratch vector holds M
    for the whole kernel) SDOT by lane and SMMLA (no lane pairs added: dot8 keeps SCVTF);
    and a table-decoded layout whose block sums are bounded below 2^22
    (|S| <= max |table| * 128 * bl).  Offset-int4 layouts (q4_0: 16 S) keep SCVTF."""
    lay = template_layouts(spec)[0]
    table = getattr(lay, "table", None)
    if not _table_vectors(spec) or not table or spec.acc_mem:
        return False
    sve = spec.isa.startswith("sve")
    if sve and mode not in ("dot4", "mm"):
        return False
    if not sve and not (mode == "mm" or (mode in ("dot4", "dot8") and not streamed)):
        return False
    return max(abs(int(v)) for v in table) * 128 * lay.bl < MAGIC_LIMIT


def _gpr_split(spec: KernelSpec, mode: str) -> int:
    """Every how many RHS vectors a NEON gemv (mr = 1, SDOT by lane or on column pairs,
    f32 accumulators in registers) splits the index nibbles on the integer pipes instead of
    the vector pipes (``Q4Regs.split_every``; 0: never): the RHS layout's
    ``gpr_split_every`` (table-decoded layouts whose decode template implements the split:
    iq4_nl's, used by mxfp4).  The vector pipes bind these gemvs (USHR, AND, 2 TBL, 2 SDOT
    per 16 index bytes); the split moves USHR and AND to loads, integer ALUs and stores."""
    every = getattr(template_layouts(spec)[0], "gpr_split_every", 0)
    if not every or spec.isa.startswith("sve") or spec.acc_mem or spec.mr != 1:
        return 0
    return every if mode in ("dot4", "dot8") else 0


def _q4_streamed(mode: str, P: int) -> bool:
    """Multi-row tiles (SDOT by lane over 4-row LHS blocks, SMMLA) stream the LHS: a segment's
    RHS registers are unpacked once, then each row block's LHS is loaded into the same few
    registers (renaming keeps the blocks independent).  The block scales, the scratch vectors
    and the conversion reuse the hot loop's LHS/RHS registers once the chunk loop is done."""
    return mode == "mm" or (mode == "dot4" and P == 4)


def _q4_neon_block(spec: KernelSpec, mode: str, mr_reg: int, narrow: bool = False,
                   no_mask: bool = False):
    """Registers of one row block of ``mr_reg`` rows (NEON).  ``narrow`` (SMMLA, f32
    accumulators in registers): one LHS register pair (the low-nibble pair, then the high one,
    renamed) and one row block's LHS scales at a time, so that more rows share an unpack.
    ``no_mask`` (table-decoded layouts only): no nibble-mask register (``mask`` None: the
    decode clears the high nibbles by immediates), so that one more row block fits."""
    P, nv = spec.lhs_mr, spec.nr // 4
    G = mr_reg // P
    n_dl = G if _block_scaled_lhs(spec) else 0
    n_table = _table_vectors(spec)
    dl_regs = 1 if narrow and n_dl else n_dl
    streamed = _q4_streamed(mode, P)
    pool = RegisterPool(Q4_CHART)
    v = pool.v
    fa = None
    col_pat = row_pat = ()
    if spec.acc_mem:
        # LHS: one register pair (SMMLA: the low-nibble pair, then the high one, renamed);
        # block end: 2 scratch + the accumulator in flight + column scales + one row block's
        # LHS scales, in the LHS/RHS registers first
        rhs = v.take(spec.nr if mode == "mm" else 2 * nv, "RHS")
        lhs = v.take(2, "LHS")
        mask = None if no_mask else v.take(1, "nibble mask")[0]
        table = v.take(n_table, "nibble mask")
        epi = v.reuse(rhs + lhs, 3 + nv + (1 if n_dl else 0), _Q4_EXTRA)
        tmp = [epi[0], epi[1], epi[0]]
        fa = epi[2]
        scale = epi[3:3 + nv]
        dl = [epi[3 + nv]] * n_dl if n_dl else []     # one row block at a time
    elif streamed:
        rhs = v.take(spec.nr if mode == "mm" else 2 * nv, "RHS")
        lhs = v.take(4 if mode == "mm" and not narrow else 2, "LHS")
        mask = None if no_mask else v.take(1, "nibble mask")[0]
        table = v.take(n_table, "nibble mask")
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
        mask = None if no_mask else v.take(1, "nibble mask")[0]
        table = v.take(n_table, "nibble mask")
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
                     for r in rows(v.take(2 * mr_reg * nv, "int32 accumulators"), 2 * nv))
    elif mode == "dot4":
        iacc = rows(v.take(mr_reg * nv, "int32 accumulators"), nv)
    else:  # mm: [group][row pair][col pair]
        npair = spec.nr // 2
        iacc = rows(rows(v.take(G * 2 * npair, "int32 accumulators"), npair), 2)
    if spec.acc_mem:    # after the block loop the int32 accumulators receive the results
        fl = flatten(iacc)
    else:
        fl = v.take(mr_reg * nv, "f32 accumulators")
    gpr = pool.scalars(Q4_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    # acc_mem tiles address both LHS halves from one pointer per row block
    hi = () if spec.acc_mem else tuple(pool.x.take(G, "LHS row pointers"))
    split_every = 0 if streamed else _gpr_split(spec, mode)
    split = tuple(pool.x.take(4, "scalars")) if split_every else ()
    return pool, dict(
        mode=mode, facc=rows(fl, nv), iacc=iacc, lhs=tuple(lhs), rhs=tuple(rhs), mask=mask,
        table=tuple(table),
        scale=tuple(scale), dl=tuple(dl), tmp=tuple(tmp), gpr=gpr, lo=lo, hi=hi,
        streamed=streamed, acc_mem=spec.acc_mem, fa=fa,
        interleaved=mode == "mm" and not spec.acc_mem, zero_loads=not spec.acc_mem,
        dl_shared=narrow and bool(n_dl), col_pat=col_pat, row_pat=row_pat,
        magic=_magic_sums(spec, mode, streamed), split=split, split_every=split_every)


def _allocate_q4_neon(spec: KernelSpec) -> Q4Regs:
    if spec.nr % 4:
        raise SpecError(f"nr={spec.nr} must be a multiple of 4 (one int32x4 vector per 4 columns)")
    check_packing(spec)
    mode = _q4_mode(spec)
    if spec.acc_mem and not _q4_streamed(mode, spec.lhs_mr):
        raise SpecError(f"acc_mem (f32 accumulators in memory) needs a multi-row dotprod tile "
                        f"with kr/sr = 4 or an i8mm tile; got {spec.isa} mr={spec.mr} kr/sr={spec.L}")
    def attempt(mr_reg):
        pool, regs = _q4_neon_block(spec, mode, mr_reg)
        if not pool.fits and mode == "mm" and not spec.acc_mem:
            pool, regs = _q4_neon_block(spec, mode, mr_reg, narrow=True)
            if not pool.fits and _table_vectors(spec):
                pool, regs = _q4_neon_block(spec, mode, mr_reg, narrow=True, no_mask=True)
        return pool, regs
    return Q4Regs(**first_fit(spec, attempt))


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
    pool = RegisterPool(Q4_CHART, v_order=Z_LOW_FIRST)
    v = pool.v
    dl = v.take(G if _block_scaled_lhs(spec) else 0, "LHS scales", within=8)
    if mode == "dot4":
        lhs = v.take(2 * G if P == 4 else 2, "LHS", within=8)
    else:
        lhs = v.take(2, "LHS", within=8) + v.take(4 * G - 2 if mode == "mm" else 0, "LHS")
    rhs = v.take(2, "RHS")
    tmp = v.take(3, "scratch")
    scale = v.take(nv, "column scales")
    if mode == "dot4":
        iacc = rows(v.take(mr_reg * nv, "int32 accumulators"), nv)
    elif mode == "dot8":     # [2*cv + h]: half h of column vector cv, 2 lanes per column
        iacc = tuple(v.take(2 * nv, "int32 accumulators"))
    else:                    # mm: [group][row pair][2*cv + h]
        iacc = rows(rows(v.take(G * 2 * 2 * nv, "int32 accumulators"), 2 * nv), 2)
    facc = rows(v.take(mr_reg * nv, "f32 accumulators"), nv)
    table = v.take(_table_vectors(spec), "nibble mask")
    gpr = pool.scalars(Q4_SCALARS)
    lo, hi = tuple(pool.x.take(G, "LHS row pointers")), tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(
        mode=mode, facc=facc, iacc=iacc, lhs=tuple(lhs), rhs=tuple(rhs), scale=tuple(scale),
        dl=tuple(dl), tmp=tuple(tmp), gpr=gpr, lo=lo, hi=hi, pred=tuple(range(1, nv + 1)),
        table=tuple(table), magic=_magic_sums(spec, mode, False))


def _allocate_q4_sve(spec: KernelSpec) -> Q4Regs:
    if spec.mr_vl:
        raise SpecError(f"sve q4 kernels have a fixed row count: give mr as a number, "
                        f"got mr={spec.mr_str}")
    check_packing(spec)
    if spec.nr > 7:
        raise SpecError(f"nr={spec.nr_str} exceeds 7vl (per-column-vector offsets and store "
                        f"predicates p1-p7)")
    mode = _q4_sve_mode(spec)
    return Q4Regs(**first_fit(spec, lambda mr_reg: _q4_sve_block(spec, mode, mr_reg),
                              " (LHS and LHS scales, indexed operands, in z0-z7)"))


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4_neon": _allocate_q4_neon, "q4_sve": _allocate_q4_sve}
