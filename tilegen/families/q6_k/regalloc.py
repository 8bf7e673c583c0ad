"""Register allocation of the K-quant kernels of family ``q6_K`` (LHS ``q8kp``, RHS ``q6kp``;
the arithmetic of tilegen.reference.kquant) on NEON V registers.

One super-block (SB, 256 k) is one iteration of the kernel's k loop, its 16 sub-blocks of 16 k
unrolled in the order 0, 8, 1, 9, ..., 7, 15 (sub-blocks j and j + 8 share the high-plane
bytes: one load of the high bits serves both).  Weights are unpacked to v = q - 32 as signed
int8 (the high plane's stored h' read as a signed 2-bit number is (q >> 4) - 2: SHL + SSHR
put 16*h' in bits 4-7, BIT / SRI insert the low nibble), so no bsum correction is needed.
Per accumulator unit (one register of int32 sums):

    C   the dot products, cumulative over the SB (zeroed once per SB);
    S1  the scaled sums: after the t-th sub-block sigma(t) of the order above,
        S1 += (sc_sigma(t) - sc_sigma(t+1)) * C  (sc after the last = 0; MUL at t = 0), so
        that S1 = sum_j sc_j * (sum over sub-block j) at the SB's end without zeroing C per
        sub-block (the "telescoping" form).  The differences need int16 (SSUBL); with 4
        columns and registers to spare they are formed just before their MLAs, else once
        per SB into the stack frame (one 16-byte slot per sub-block and column vector, in
        the unit's lane pattern) and loaded by the MLAs;
    the f32 accumulators live in the stack frame (one 16-byte slot per unit, loaded and stored
    once per SB by the float epilogue: x = f32(S1)*f32(d); acc = fma(da, x, acc)).

A tile taller than the largest register block that fits (``first_fit``) runs each SB in
passes of that block over weights unpacked once per SB into the frame (``Q6KRegs.passes``).

Strategies (``Q6KRegs.mode``), by ISA, interleave and row count:

``mm``    i8mm, kr = 16, mr a multiple of 4: SMMLA of (2 rows x 8 k) by (2 columns x 8 k); a
          unit is (row block g, row pair rp, column pair p) in SMMLA's 2x2 order (lanes r0c0,
          r0c1, r1c0, r1c1); scale differences (c0 c1 c0 c1), d and da arranged to match.
``dot4``  dotprod, kr = 8: SDOT by lane; a unit is (row, 4 columns) (gemv: mr = 1, the row's
          16 k of a sub-block in one vector, one lane per 4 k).
``dot8``  i8mm gemv (mr = 1) on the kr = 16 layout: SDOT of the row's 8 k (both halves)
          against 2 columns x 8 k into C per column pair (lanes c0 c0 c1 c1); after each
          sub-block ADDP folds two pairs' C to 4 columns (a scratch register) for the MLA, so
          S1, the differences and the epilogue are dot4's.
``neon``  plain NEON, kr = 8: a row's 4 k duplicated (DUP by lane), SMULL/SMULL2 (int16
          products, |v*a| <= 32*127) and SADALP into two int32 vectors per unit (row, 4
          columns: lanes c0 c0 c1 c1 / c2 c2 c3 c3), scale differences in that pattern,
          folded by ADDP at the SB end, then the dot4 epilogue.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ...generator.spec import KernelSpec
from ...generator.tile_layouts import check_packing
from ...generator.regalloc.kquant import (KQuantSveArea, check_neon_tile, check_sve_mm_rows,
                                          check_sve_tile, kquant_mode)
from ...generator.regalloc.pool import (Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, first_fit,
                                        rows)

__all__ = ["Q6KRegs", "Q6K_SCALARS", "Q6K_CHART", "Q6KSveRegs", "Q6K_SVE_SCALARS",
           "Q6K_SVE_CHART", "ALLOCATORS"]

Q6K_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "sb_cnt", "nsb", "lhs_rbs", "tmp",
               "sc_ptr", "low_ptr", "high_ptr")
_EP = "epilogue beyond the dead registers"
Q6K_CHART = ("int32 cumulative sums", "int32 scaled sums", "nibble mask", "LHS", "RHS high bits",
             "RHS low bits", "unpacked weights", "scale differences", _EP)
_MAX_NR = 32
_HELD_SCALES = 8            # scale preparation: sub-blocks 0-7 held while 8-15 stream


class _RowPasses:
    """A tile of ``mr_reg`` rows computed in passes of ``pass_rows`` (the register block), each
    pass ``pass_groups`` LHS row blocks of ``lhs_mr`` rows (the NEON and SVE q6_K frames)."""

    @property
    def passes(self) -> int:
        return self.mr_reg // self.pass_rows

    @property
    def pass_groups(self) -> int:
        return self.pass_rows // self.lhs_mr


@dataclass(frozen=True)
class Q6KRegs(_RowPasses, Frame):
    """Registers of the q6_K NEON kernels (numbers; templates add the prefix).

    ``c[u]`` / ``s1[u]``: unit u's cumulative and scaled sums; units are ``[g][rp][p]``
    flattened (mm: ``unit(g, rp, p)``) or ``[row][cv]`` (dot4, neon, dot8; dot8's ``c`` per
    column pair ``[p]``, ``dsc``'s last register the fold).  ``w[v]``: the
    unpacked weights of column vector v (mm, dot8: a column pair; dot4: 4 columns) for one
    sub-block (16/kr chunks x low/high nibble); ``h[v]``: its high-plane registers (one per
    chunk of a sub-block), loaded at sub-block j and used again at j + 8.  ``stream_w``: the
    weights of one column vector at a time (all row blocks' LHS held), else every column
    vector's weights held and the LHS streamed per row block.  ``prep``: the scale
    preparation's registers (8 held scale rows, one streamed, the int16 and int32
    differences, one pattern), ``ep`` the SB epilogue's, ``out[row][cv]`` the f32 results'
    of one pass for the store: all of them reuse registers dead by then.

    The k loop computes all ``mr_reg`` (= mr) rows of the tile; ``passes`` > 1: in passes of
    ``pass_rows`` rows (the register block) per super-block, the SB's weights unpacked once
    into frame slots that every pass loads (the unpack and the scale differences amortised
    over all the tile's rows).  ``groups``: the tile's LHS row blocks (``lo``),
    ``pass_groups`` those of one pass."""

    mode: str
    halves: int                          # vectors per unit (neon: 2, lanes c0 c0 c1 c1 / c2 c2 c3 c3)
    mr_reg: int                          # rows of the tile's k loop (mr)
    lhs_mr: int
    groups: int
    pass_rows: int                       # rows of one pass (the register block)
    c: tuple[int, ...]
    s1: tuple[int, ...]
    lhs: tuple[int, ...]
    h: tuple[tuple[int, ...], ...]
    low: int
    w: tuple[tuple[int, ...], ...]
    dsc: int
    srow: tuple[int, ...]                # differences in registers: two scale rows (sub-blocks i,
    #                                      i + 1), the row of i + 8, the differences (int16 then
    #                                      int32, in place), a second pattern; () = frame slots
    fold: int                            # dot8: the 4-column fold of C (ADDP); else -1
    mask: int
    stream_w: bool
    prep: tuple[int, ...]
    ep: dict = field(hash=False)
    out: tuple[tuple[int, ...], ...]
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...]                  # one pointer per LHS row block
    tmp: tuple[int, ...] = ()            # neon: the duplicated LHS lane, two int16 products
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())

    #: the skeleton's sub-block shape (templates/kquant/neon.S.j2): R.w[v], one column vector's
    #: unpacked weights per sub-block, staged in the frame for row passes
    shape = "column_vectors"

    @property
    def n_units(self) -> int:
        """Units of one pass (the accumulators have n_units * passes slots)."""
        return len(self.s1) // self.halves

    @property
    def n_dvec(self) -> int:
        """Scale-difference vectors per sub-block (one stack slot each): one per column vector
        of weights (dot8: per 4 columns), two (the unit's halves) on neon."""
        return len(self.w) * self.halves // (2 if self.mode == "dot8" else 1)

    @property
    def acc_offset(self) -> int:
        """sp offset of the f32 accumulators (16 bytes per unit, above the clamp values)."""
        return (self.clamp_offset + 8 + 15) // 16 * 16

    @property
    def dsc_offset(self) -> int:
        """sp offset of the scale differences: slot (sub-block j, column vector v) at
        dsc_offset + 16*(j*n_dvec + v)."""
        return self.acc_offset + 16 * self.n_units * self.passes

    @property
    def w_offset(self) -> int:
        """sp offset of the staged weights (passes > 1): register u of column vector v,
        sub-block j at w_offset + 16*((j*len(w) + v)*len(w[v]) + u)."""
        return self.dsc_offset + (0 if self.srow else 16 * 16 * self.n_dvec)

    @property
    def frame_bytes(self) -> int:
        staged = 16 * 16 * len(self.w) * len(self.w[0]) if self.passes > 1 else 0
        return self.w_offset + staged


def _block(spec: KernelSpec, mode: str, mr_reg: int, stream_w: bool, jit: bool):
    nr, P = spec.nr, spec.lhs_mr
    G = mr_reg // P
    passes = spec.mr // mr_reg
    nvec = nr // 2 if mode in ("mm", "dot8") else nr // 4       # column vectors
    U = mr_reg * nr // 4                    # units of S1 (4 outputs each)
    halves = 2 if mode == "neon" else 1
    chunks = 16 // spec.kr                  # chunks of one 16-k sub-block
    pool = RegisterPool(Q6K_CHART)
    v = pool.v
    c = tuple(v.take(nr // 2 if mode == "dot8" else U * halves, "int32 cumulative sums"))
    s1 = tuple(v.take(U * halves, "int32 scaled sums"))
    mask = v.take(1, "nibble mask")[0]
    if mode == "mm":
        n_lhs = 4 * G if stream_w else 2 if jit else 4
    else:
        n_lhs = 3 if mode == "dot8" else 4 if P == 4 and mode == "dot4" and not jit else 1
    lhs = tuple(v.take(n_lhs, "LHS"))
    tmp = tuple(v.take(3 if mode == "neon" else 0, "LHS"))
    h = rows(v.take(nvec * chunks, "RHS high bits"), chunks)
    low = v.take(1, "RHS low bits")[0]
    per = 2 * chunks                        # unpacked registers of one column vector
    w_flat = v.take(per if stream_w else per * nvec, "unpacked weights")
    w = tuple(tuple(w_flat) for _ in range(nvec)) if stream_w else rows(w_flat, per)
    dsc_regs = v.take((5 if jit else 1) + (mode == "dot8"), "scale differences")
    dsc = dsc_regs[0]
    dead = (list(c) + list(lhs) + list(tmp) + [r for hh in h for r in hh] + [low] + list(w_flat)
            + dsc_regs)
    prep = tuple(v.reuse(dead, _HELD_SCALES + 4, _EP))
    n_out = mr_reg * (nr // 4)             # the results of one pass at a time
    # epilogue: d per column vector, da of one row block (+ two row-pair patterns), an
    # accumulator; then the output rows, two loads, clamp min and max
    counts = {"d": nr // 2 if mode == "mm" else nr // 4, "da": 3 if mode == "mm" else 1,
              "acc": 1}
    ep, i = {}, 0
    for name, n in counts.items():
        ep[name] = tuple(v.reuse(dead[i:], n, _EP))
        i += n
    # after the k loop every register is dead (the template sets the mask again per tile)
    out_flat = v.reuse(dead + list(s1) + [mask], n_out + 4, _EP)
    out = rows(out_flat[:n_out], nr // 4)
    ep["tmp"] = tuple(out_flat[n_out:])
    gpr = pool.scalars(Q6K_SCALARS)
    lo = tuple(pool.x.take(G * passes, "LHS row pointers"))
    return pool, dict(mode=mode, halves=halves, tmp=tmp, c=c, s1=s1, lhs=lhs, h=h, low=low, w=w,
                      dsc=dsc, srow=tuple(dsc_regs[:5]) if jit else (),
                      fold=dsc_regs[-1] if mode == "dot8" else -1, mask=mask,
                      stream_w=stream_w, prep=prep, ep=ep, out=out, gpr=gpr, lo=lo)


def _attempt(spec: KernelSpec, mode: str, mr_reg: int):
    """The first variant that fits, in the order: scale differences formed in registers (4
    columns: one piece of scale rows), then in the frame; LHS streamed per row block, then
    (mm) weights streamed per column pair.  None fits: the smallest demand (the refusal)."""
    tries = [_block(spec, mode, mr_reg, s, jit)
             for jit in ((True, False) if spec.nr == 4 and mr_reg == spec.mr else (False,))
             for s in ((False, True) if mode == "mm" else (False,))]
    fit = [t for t in tries if t[0].fits]
    return fit[0] if fit else min(tries, key=lambda t: t[0].v.needs.total)


def _allocate_q6k_neon(spec: KernelSpec) -> Q6KRegs:
    check_neon_tile(spec, "q6_K", _MAX_NR)
    mode = kquant_mode(spec, "q6_K", "NEON")
    check_packing(spec)
    fields = first_fit(spec, lambda mr_reg: _attempt(spec, mode, mr_reg))
    # the register block is one pass; the k loop covers the whole tile
    fields.update(pass_rows=fields["mr_reg"], mr_reg=spec.mr, groups=spec.mr // spec.lhs_mr)
    regs = Q6KRegs(**fields)
    if regs.frame_bytes > 4095:     # one sub sp immediate
        raise SpecError(f"tile {spec.mr_str}x{spec.nr_str}: its stack frame ({regs.frame_bytes} "
                        f"bytes of accumulators, scale differences and staged weights) exceeds "
                        f"4095 bytes")
    return regs


# ---------------------------------------------------------------------------------------------
# SVE (vector-length agnostic; templates/q6k_sve.S.j2)
# ---------------------------------------------------------------------------------------------
Q6K_SVE_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "sb_cnt", "lhs_rbs", "tmp",
                   "sc_ptr", "sc8_ptr", "low_ptr", "low8_ptr", "high_ptr")
_SVE_MAX_NV = 4         # a pair of sub-blocks' vectors at [ptr, #0..2nv-1, mul vl] (LD1B reaches 7)
Q6K_SVE_CHART = ("LHS", "RHS high bits", "RHS low bits", "unpacked weights", "scale scratch",
                 "int32 cumulative sums", "int32 scaled sums", _EP)


@dataclass(frozen=True)
class Q6KSveRegs(_RowPasses, KQuantSveArea, Frame):
    """Registers of the q6_K SVE kernels (numbers; templates add the prefix).

    ``c[u]`` / ``s1[u]``: unit u's cumulative and scaled sums (the telescoped form of the NEON
    kernels); units are ``[g][rp][h]`` flattened (mm: h = half of column vector h // 2, VL/64
    column pairs per half), ``[row][cv]`` (dot4) or ``[h]`` (dot8).  The unit's f32
    accumulator is vector u of a VL-sized stack area (``acc_vls`` vectors below the fixed
    frame).  ``h[v][ch]``: the high-plane vector of weight vector v (mm, dot8: half h; dot4:
    column vector cv) and chunk ch of a sub-block, loaded at sub-block j < 8 and used again at
    j + 8; ``low`` the low-plane vector (then a scratch of the unpack); ``w[v]`` the unpacked
    int8 weights (q - 32) of weight vector v (2 per chunk: low, high nibble; ``stream_w``: one
    weight vector at a time, every ``w[v]`` the same registers).  ``lhs``: mm, 4 per row block
    (8-k halves x row pairs); dot4, the 4-k chunks in z0-z7 (4, or 1 loaded per chunk); dot8
    the two 8-k broadcasts.  ``sst``: a scale row, the next one (then the difference's lane
    pattern).  ``ep``: the SB epilogue's operands (``tmp``: the store's, a row at a time).

    The k loop computes all ``mr_reg`` (= mr) rows; ``passes`` > 1: in passes of ``pass_rows``
    rows (the register block) per super-block over weights unpacked once per super-block into
    ``w_vls`` vectors of the stack area (above the ``acc_vls`` accumulators of all passes) and
    scale-difference patterns formed once into ``d_vls`` more."""

    @property
    def acc_vls(self) -> int:
        """Vectors of the f32 accumulators: one per unit of every pass."""
        return self.n_units * self.passes

    @property
    def w_vls(self) -> int:
        """Vectors of the staged weights (passes > 1): 16 sub-blocks x every weight register."""
        return 16 * len(self.w) * len(self.w[0]) if self.passes > 1 else 0

    @property
    def d_vls(self) -> int:
        """Vectors of the staged scale-difference patterns (passes > 1): per sub-block one per
        weight vector (dot4: the column vector's differences; mm: the half's lane pattern)."""
        return 16 * len(self.w) if self.passes > 1 else 0

    @property
    def area_vls(self) -> int:
        return self.acc_vls + self.w_vls + self.d_vls

    mode: str
    stream_w: bool                       # one weight vector's registers at a time
    mr_reg: int                          # rows of the tile's k loop (mr)
    pass_rows: int                       # rows of one pass (the register block)
    lhs_mr: int
    groups: int
    lhs: tuple[int, ...]
    h: tuple[tuple[int, ...], ...]
    low: int
    w: tuple[tuple[int, ...], ...]
    sst: tuple[int, ...]
    c: tuple[int, ...]
    s1: tuple[int, ...]
    ep: dict = field(hash=False)
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...]
    pred: tuple[int, ...] = ()
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())


def _sve_block(spec: KernelSpec, mode: str, mr_reg: int, stream_w: bool, n_lhs4: int):
    nv, P = spec.nr, spec.lhs_mr
    G = mr_reg // P
    passes = spec.mr // mr_reg
    U = {"mm": mr_reg * nv, "dot4": mr_reg * nv, "dot8": 2 * nv}[mode]
    nw = 2 * nv if mode in ("mm", "dot8") else nv         # weight vectors (halves / columns)
    chunks = 16 // spec.kr
    pool = RegisterPool(Q6K_SVE_CHART, v_order=Z_LOW_FIRST)
    v = pool.v
    if mode == "dot4":
        lhs = v.take(n_lhs4 if P == 4 else 1, "LHS", within=8,
                     rule="indexed SDOT operands (the LHS registers) must be z0-z7")
    else:
        lhs = v.take(4 * G if mode == "mm" else 2, "LHS")
    h = rows(v.take(nw * chunks, "RHS high bits"), chunks)
    low = v.take(1, "RHS low bits")[0]
    per = 2 * chunks
    w_flat = v.take(per if stream_w else per * nw, "unpacked weights")
    w = tuple(tuple(w_flat) for _ in range(nw)) if stream_w else rows(w_flat, per)
    sst = v.take(2, "scale scratch")
    c = v.take(U, "int32 cumulative sums")
    s1 = v.take(U, "int32 scaled sums")
    dead = list(lhs) + [r for hh in h for r in hh] + [low] + list(w_flat) + list(sst) + list(c)
    counts = ({"dap": 2, "d": 2 * nv, "f16": 1, "fa": 1} if mode == "mm" else
              {"da": 1, "d": nv, "fa": 1, "fold": 1})
    ep, i = {}, 0
    for name, n in counts.items():
        ep[name] = tuple(v.reuse(dead[i:], n, _EP))
        i += n
    # the store, a row at a time: two loads, the result, clamp min and max (all dead by then)
    ep["tmp"] = tuple(v.reuse(dead + list(s1), 5, _EP))
    gpr = pool.scalars(Q6K_SVE_SCALARS)
    lo = tuple(pool.x.take(G * passes, "LHS row pointers"))
    return pool, dict(mode=mode, c=tuple(c), s1=tuple(s1), lhs=tuple(lhs), h=h, low=low, w=w,
                      stream_w=stream_w, sst=tuple(sst), ep=ep, gpr=gpr, lo=lo,
                      pred=tuple(range(1, nv + 1)))


def _sve_attempt(spec: KernelSpec, mode: str, mr_reg: int):
    """The first variant that fits: mm and dot8 stream the weights one vector at a time (every
    row block's LHS held); dot4 holds every column vector's weights of a sub-block with the
    LHS of a row block in 4 registers, then in 1, then (gemv) streams them."""
    if mode in ("mm", "dot8") or spec.lhs_mr == 1:
        tries = [_sve_block(spec, mode, mr_reg, True, 4)]
    else:
        tries = [_sve_block(spec, mode, mr_reg, False, n) for n in (4, 1)]
    fit = [t for t in tries if t[0].fits]
    return fit[0] if fit else min(tries, key=lambda t: t[0].v.needs.total)


def _allocate_q6k_sve(spec: KernelSpec) -> Q6KSveRegs:
    check_sve_tile(spec, "q6_K", _SVE_MAX_NV, "a sub-block pair's weight vectors at [ptr, #i, mul vl]")
    mode = kquant_mode(spec, "q6_K", "SVE")
    check_sve_mm_rows(spec, "q6_K", mode)
    check_packing(spec)
    fields = first_fit(spec, lambda mr_reg: _sve_attempt(spec, mode, mr_reg),
                       " (indexed SDOT operands in z0-z7)" if mode == "dot4" else "")
    # the register block is one pass; the k loop covers the whole tile
    fields.update(pass_rows=fields["mr_reg"], mr_reg=spec.mr, groups=spec.mr // spec.lhs_mr)
    regs = Q6KSveRegs(**fields)
    if regs.area_vls > 256:         # LDR / STR Z immediates reach 255 vector lengths
        raise SpecError(f"tile {spec.mr_str}x{spec.nr_str}: its stack area ({regs.area_vls} "
                        f"vectors of accumulators and staged weights) exceeds 256 vectors")
    return regs


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q6k_neon": _allocate_q6k_neon, "q6k_sve": _allocate_q6k_sve}
