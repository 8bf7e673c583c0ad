"""Register allocation of the q4_K SME2 kernels (family ``q4_K``, LHS ``q8kp``, RHS ``q4kp`` at
kr = 4, sr = 2; arithmetic of tilegen.reference.kquant), streaming mode, VL = SVL.

``gemm`` (tile 1vl x nu vl, nu = 1 or 2; template q4k_sme2.S.j2): per 4-k chunk and column
vector, the RHS bytes widen to int16 (LD1B .h), the low / high nibbles (AND, LSR) are multiplied
by the column's sub-block scale in int16 (sc*q <= 945) and a 2-way int16 SMOPA adds them into
ZA tile ``za<cv>.s``, which so holds S1 = sum_j sc_j * dot_j of the whole super-block (SB).  The
min term S2 = sum_j m_j*bsum_j goes to tile ``za<nu+cv>.s`` by four int16 SMOPA per SB (bsum =
128*hi + lo rebuilt with SLI, mins widened with UUNPK; UZP of four vectors gathers each k pair).
The f32 epilogue reads one ZA row of all four tiles per row (one MOVA), the f32 sums live in dst
between SBs.  ``gemm`` 4vl x 1vl: the shared row-group allocation
(:func:`tilegen.generator.regalloc.kquant.allocate_kquant_sme2_rows`).

``gemv`` (tile 1 x nu vl, nu = 2 or 4; template q4k_sme2_gemv.S.j2): LUTI4 (identity table in
ZT0) expands the nibbles, each column's 4 k values in a word in the order (0, 2, 1, 3); the
row's LHS quads are permuted alike (TBL); one ZA-array SDOT (vgx2 / vgx4, by lane) per 4-k
chunk; once per sub-block the sums are read back
(MOVA), ZA zeroed and S1 += sc_j * T (MLA); the min term by SDOT by lane of the mins.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...records import SpecError
from ...generator.spec import KernelSpec
from ...generator.regalloc.kquant import (KQuantLuti4GemvFrame, KQuantSme2Frame, allocate_kquant_sme2_rows,
                                          check_sme2_gemv_tile, check_sme2_interleave,
                                          claim_luti4_gemv_tail)
from ...generator.regalloc.pool import SME_X_ORDER, RegisterPool

__all__ = ["Q4KSme2Regs", "Q4KSme2GemvRegs", "ALLOCATORS"]


@dataclass(frozen=True, kw_only=True)
class Q4KSme2Regs(KQuantSme2Frame):
    """The 1vl x nu vl int16-SMOPA gemm.  Hot loop: ``lhs_b`` (the k pairs of two 4-k chunks,
    bytes), ``lhs`` (widened: low pair, high pair of each chunk), ``rhs_b`` (two vectors of
    packed nibbles), ``raw`` (widened, one vector per column vector and chunk; then scaled),
    ``hi`` (the high nibbles, scaled), ``sc`` (per column vector the sub-block scale of each
    column, twice), ``sc_raw`` (the scale bytes), ``c16`` (16 in every halfword).  SB end:
    ``bsb`` / ``lob`` (bsum bytes, 2-vector groups),
    ``wide``, ``wlo`` (widened, 4-vector groups), ``bs`` (bsum k pairs, one vector per pair of
    sub-blocks), ``mins_b`` / ``mins`` likewise for the mins.  Fold: ``sums`` (one ZA row of
    the four tiles), ``d`` / ``dm`` (per column vector), ``da`` (the row's d), ``acc``
    (dst row), ``clamp``."""

    nu: int
    lhs_b: tuple[int, ...]
    lhs: tuple[int, ...]
    rhs_b: tuple[int, ...]
    raw: tuple[int, ...]
    hi: tuple[int, ...]
    sc: tuple[int, ...]
    sc_raw: int
    c16: int
    bsb: tuple[int, ...]
    lob: tuple[int, ...]
    wide: tuple[int, ...]
    wlo: tuple[int, ...]
    bs: tuple[int, ...]
    mins_b: tuple[int, ...]
    mins: tuple[int, ...]
    sums: tuple[int, ...]
    d: tuple[int, ...]
    dm: tuple[int, ...]
    da: int
    acc: tuple[int, ...]
    clamp: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Q4KSme2GemvRegs(KQuantLuti4GemvFrame):
    """The 1 x nu vl ZA-array SDOT gemv.  Hot loop: ``lhs`` (the row's two 16-byte quads of a
    sub-block, their k permuted by TBL through ``perm``), ``raw`` (two 4-vector groups of packed
    nibbles), ``unp`` (two nu-vector groups: LUTI4's words of nu column vectors), ``t`` (the
    sums read back), ``sc`` (scales), ``s1`` (scaled sums), ``acc`` (f32 sums); ``table``: the
    LUTI4 table's source at entry.  SB end: ``d``, ``dm``, ``mins_b`` (2-vector group),
    ``mins`` (UZP: sub-blocks 0-3 / 4-7), ``s2``, ``da``, ``bsum`` (the row's bsum_hi and
    bsum_lo, one quad)."""

    nu: int
    lhs: tuple[int, int]
    raw: tuple[tuple[int, ...], ...]
    perm: int
    table: int
    unp: tuple[tuple[int, ...], ...]
    t: tuple[int, ...]
    s1: tuple[int, ...]
    acc: tuple[int, ...]
    sc: int
    d: int
    dm: int
    mins_b: tuple[int, int]
    mins: tuple[int, int]
    s2: int
    da: int
    bsum: int
    clamp: tuple[int, int]


_CHART = ("LHS", "RHS", "column scales", "SB-end operands", "f32 epilogue", "clamp")
_GEMM_SCALARS = ("n_rem", "rec", "rp", "scp", "lp", "lhs_rb", "lhs_rbs", "dst_tile", "dst_row",
                 "dap", "sb_cnt", "nsb", "sub_cnt", "rows", "tmp")
_GEMV_SCALARS = ("n_rem", "rec", "rp", "scp", "lp", "lhs_row", "lhs_rs", "dst_ptr", "sb_cnt",
                 "nsb", "sub_cnt", "tmp")


def _allocate_gemm(spec: KernelSpec) -> Q4KSme2Regs:
    nu = spec.nr
    if spec.mr != 1 or nu not in (1, 2):
        raise SpecError(f"q4_K sme2 gemm tiles are 1vlx1vl or 1vlx2vl (S1 and the min term S2 "
                        f"of each column vector take two of the four int32 ZA tiles) or "
                        f"4vlx1vl (S1 of four row groups, S2 by rows at the fold), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    check_sme2_interleave(spec, "q4_K")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs_b = v.claim((0, 1), "LHS")
    rhs_b = v.claim((2, 3), "RHS")
    lhs = v.claim(range(4, 8), "LHS")
    raw = v.claim(range(8, 12), "RHS")
    hi = v.claim((12, 13), "RHS")
    sc = v.claim((14, 15)[:nu], "column scales")
    sc_raw, c16 = v.claim((16, 17), "column scales")
    # SB end (multi-vector groups start at a multiple of their length); the bsum bytes reuse
    # the scale scratch (c16 is set again at each SB's start)
    bsb = (sc_raw, c16)
    lob = v.claim((18, 19), "SB-end operands")
    wide = v.claim(range(20, 24), "SB-end operands")
    wlo = v.claim(range(24, 28), "SB-end operands")
    bs = v.claim(range(28, 32), "SB-end operands")
    # the fold and the clamp pass reuse the dead registers
    gpr = pool.scalars(_GEMM_SCALARS)
    pool.settle(f"q4_K sme2 gemm {spec.mr_str}x{spec.nr_str}")
    return Q4KSme2Regs(nu=nu, lhs_b=lhs_b, lhs=lhs, rhs_b=rhs_b, raw=raw, hi=hi, sc=sc,
                       sc_raw=sc_raw, c16=c16, bsb=bsb, lob=lob,
                       wide=wide, wlo=wlo, bs=bs, mins_b=bsb, mins=wlo, sums=wide[:2 * nu],
                       d=bsb[:nu], dm=lob[:nu], da=lhs_b[0], acc=wlo[2:2 + nu],
                       clamp=rhs_b, gpr=gpr,
                       **pool.frame())


def _allocate_gemv(spec: KernelSpec) -> Q4KSme2GemvRegs:
    nu = spec.nr
    check_sme2_gemv_tile(spec, "q4_K", one_vl=True)
    check_sme2_interleave(spec, "q4_K")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = v.claim((0, 1), "LHS")           # by-lane operands: z0-z15
    clamp = v.claim((2, 3), "clamp")
    raw = (v.claim(range(4, 8), "RHS"), v.claim(range(8, 12), "RHS"))
    perm, table = v.claim((12, 13), "LHS")
    sc, da = v.claim((14, 15), "column scales")
    unp, bc, s1, acc = claim_luti4_gemv_tail(v, nu, raw)
    gpr = pool.scalars(_GEMV_SCALARS)
    pool.settle(f"q4_K sme2 gemv 1x{spec.nr_str}")
    # the sums read back and the SB-end operands reuse the dead hot-loop registers
    return Q4KSme2GemvRegs(nu=nu, lhs=lhs, raw=raw, perm=perm, table=table, bc=bc, unp=unp,
                           t=unp[1],
                           s1=s1, acc=acc, sc=sc, d=raw[0][0], dm=raw[0][1], mins_b=raw[1][:2],
                           mins=raw[1][2:], s2=sc, da=da, bsum=lhs[0], clamp=clamp, gpr=gpr,
                           **pool.frame())


def _allocate_q4k_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_gemv(spec)
    if not spec.mr_vl:
        raise SpecError(f"q4_K sme2 tiles are 1 x nu vl (gemv) or 1vl x nu vl (gemm), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    if (spec.mr, spec.nr) == (4, 1):
        return allocate_kquant_sme2_rows(spec, "q4_K")
    return _allocate_gemm(spec)


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4k_sme2": _allocate_q4k_sme2}
