"""Register allocation of the q5_K SME2 gemm (family ``q5_K``, LHS ``q8kp``, RHS ``q5kp`` at
kr = 4, sr = 2; arithmetic of tilegen.reference.kquant), streaming mode, VL = SVL.

``gemm`` (tile 1vl x nu vl, nu = 1 or 2; template q5k_sme2.S.j2, an override of q4_K's
q4k_sme2.S.j2): one hot-loop trip per quarter of the super-block (two sub-blocks, whose fifth
bits share one bit pair of the qh plane).  Per two vectors of packed nibbles and the two qh
vectors at the same offsets (the qh bytes shifted right by the quarter's bit pair, LSR by the
vector ``sh``), the five-bit values are built in bytes: the low values ``(nib & 0x0f) | bit0 << 4``
and the high ones ``(nib >> 4) | bit1 << 4`` (AND / LSR, LSL, BSL under the 0x10 mask), widened
to int16 (UUNPK), multiplied by the column's sub-block scale (sc*q <= 63*31 = 1953, int16) and
added by a 2-way int16 SMOPA per k pair into ``za<cv>.s`` (S1).  q4_K's trick u = lo + 16*hi
does not fit int16 with a fifth bit (63*(31 + 16*31) > 32767), so the LHS pairs stay as they
are (no MLS).  The min term, the fold and the clamp pass are q4_K's, on the same registers.

``gemv`` (tile 1 x nu vl, nu = 2 or 4; template q5k_sme2_gemv.S.j2, an override of q4_K's
q4k_sme2_gemv.S.j2): the same five-bit bytes per vector of nibbles (no LUTI4), ZIP'd by
halfwords into each column's word of k (0, 1, 2, 3), so the row's LHS quads need no
permutation; one ZA-array SDOT (vgx2 / vgx4, by lane) per 4-k chunk as q4_K's.  Per sub-block j
the qh vectors sit at the plane's start + (j % 2) sub-blocks (GPR ``qp``, stepped by ``qd``,
negated each trip) and are shifted by 2*(j // 2) (``sh``, from the GPR ``shv``, which
``sinc`` (0, 2, 0, ...) advances).  The scale step, the min term and the epilogue are q4_K's.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...records import SpecError
from ...generator.spec import KernelSpec
from ...generator.regalloc.kquant import (allocate_kquant_sme2_rows, check_sme2_gemv_tile,
                                          check_sme2_interleave)
from ...generator.regalloc.pool import SME_X_ORDER, RegisterPool
from ..q4_k.regalloc_sme2 import Q4KSme2GemvRegs, Q4KSme2Regs

__all__ = ["Q5KSme2Regs", "Q5KSme2GemvRegs", "ALLOCATORS"]


@dataclass(frozen=True, kw_only=True)
class Q5KSme2Regs(Q4KSme2Regs):
    """q4_K's gemm registers (:class:`~tilegen.families.q4_k.regalloc_sme2.Q4KSme2Regs`: the
    LHS, scales, SB end, fold and clamp alike) with the hot loop's own: ``raw`` / ``hi`` the
    widened low / high five-bit values (four vectors each: one per column vector and chunk;
    then scaled), ``c16`` 0x10 in every byte (BSL's mask); and ``qh`` (the two qh vectors at
    the nibbles' offsets, then shifted by ``sh``), ``lres`` / ``hres`` (the low / high values,
    bytes), ``tmp`` (scratch), ``c0f`` (0x0f in every byte), ``sh`` (the quarter's bit pair 2s
    in every byte)."""

    qh: tuple[int, ...]
    lres: tuple[int, ...]
    hres: tuple[int, ...]
    tmp: int
    c0f: int
    sh: int


@dataclass(frozen=True, kw_only=True)
class Q5KSme2GemvRegs(Q4KSme2GemvRegs):
    """q4_K's gemv registers (:class:`~tilegen.families.q4_k.regalloc_sme2.Q4KSme2GemvRegs`;
    ``perm`` and ``table`` unused) and the decode's: ``qh`` (four qh vectors, q4_K's second
    nibble group), ``sh`` (the sub-block's bit pair in every byte), ``tmp``, ``lres`` /
    ``hres`` (the five-bit bytes, on the scale and row-d registers, dead in the hot body),
    ``c0f`` / ``c10`` (masks, set each trip on the clamp registers, dead until the clamp);
    1 x 1vl: ``unp`` two 4-vector groups (four chunks each), ``bq`` the four LHS quads of a
    SDOT broadcast by LD1RW (straight from the row: no TBL, no stack), ``t`` four vectors (ZA's
    four slices)."""

    qh: tuple[int, ...]
    sh: int
    tmp: int
    lres: int
    hres: int
    c0f: int
    c10: int
    bq: tuple[int, ...] = ()


_CHART = ("LHS", "RHS", "high-bit plane", "column scales", "constants", "f32 epilogue")
_GEMM_SCALARS = ("n_rem", "rec", "rp", "qp", "scp", "lp", "lhs_rb", "lhs_rbs", "dst_tile",
                 "dst_row", "dap", "sb_cnt", "nsb", "sub_cnt", "rows", "tmp")


def _allocate_gemm(spec: KernelSpec) -> Q5KSme2Regs:
    nu = spec.nr
    if spec.mr != 1 or nu not in (1, 2):
        raise SpecError(f"q5_K sme2 gemm tiles are 1vlx1vl or 1vlx2vl (S1 and the min term S2 "
                        f"of each column vector take two of the four int32 ZA tiles), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    check_sme2_interleave(spec, "q5_K")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    # the hot loop's registers (multi-vector groups start at a multiple of their length)
    r = {name: v.claim(regs, role) for name, regs, role in (
        ("lhs_b", (0, 1), "LHS"), ("rhs_b", (2, 3), "RHS"), ("lhs", range(4, 8), "LHS"),
        ("raw", range(8, 12), "RHS"), ("hi", range(12, 16), "RHS"),
        ("sc", (16, 17)[:nu], "column scales"), ("sc_raw", (18,), "column scales"),
        ("qh", (20, 21), "high-bit plane"), ("lres", (22, 23), "RHS"), ("hres", (24, 25), "RHS"),
        ("tmp", (26,), "RHS"), ("c0f", (27,), "constants"), ("c16", (28,), "constants"),
        ("sh", (29,), "constants"))}
    r.update({k: r[k][0] for k in ("sc_raw", "tmp", "c0f", "c16", "sh")})
    gpr = pool.scalars(_GEMM_SCALARS)
    pool.settle(f"q5_K sme2 gemm {spec.mr_str}x{spec.nr_str}")
    # the SB end, the fold and the clamp pass: q4_K's registers, all dead in the hot loop
    bsb, lob = (16, 17), (18, 19)
    wide, wlo, bs = tuple(range(20, 24)), tuple(range(24, 28)), tuple(range(28, 32))
    return Q5KSme2Regs(nu=nu, **r, bsb=bsb, lob=lob, wide=wide, wlo=wlo, bs=bs, mins_b=bsb,
                       mins=wlo, sums=wide[:2 * nu], d=bsb[:nu], dm=lob[:nu], da=r["lhs_b"][0],
                       acc=wlo[2:2 + nu], clamp=r["rhs_b"], gpr=gpr, **pool.frame())


_GEMV_SCALARS = ("n_rem", "rec", "rp", "qp", "qd", "shv", "sinc", "scp", "lp", "lhs_row",
                 "lhs_rs", "dst_ptr", "sb_cnt", "nsb", "sub_cnt", "tmp")


def _allocate_gemv(spec: KernelSpec) -> Q5KSme2GemvRegs:
    nu = spec.nr
    check_sme2_gemv_tile(spec, "q5_K", one_vl=True)
    check_sme2_interleave(spec, "q5_K")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = v.claim((0, 1), "LHS")           # by-lane operands: z0-z15
    clamp = v.claim((2, 3), "constants")
    raw = v.claim(range(4, 8), "RHS")
    qh = v.claim(range(8, 12), "high-bit plane")
    sh, tmp = v.claim((12, 13), "high-bit plane")
    sc, da = v.claim((14, 15), "column scales")
    if nu == 1:
        unp = (v.claim(range(16, 20), "RHS"), v.claim(range(20, 24), "RHS"))
        bq = v.claim(range(24, 28), "LHS")
        s1, acc = v.claim((28,), "f32 epilogue"), v.claim((29,), "f32 epilogue")
    else:
        bq = ()
        unp = (v.claim(range(16, 16 + nu), "RHS"), v.claim(range(20, 20 + nu), "RHS"))
        s1 = v.claim(range(24, 24 + nu), "f32 epilogue")
        acc = v.claim(range(28, 28 + nu), "f32 epilogue")
    gpr = pool.scalars(_GEMV_SCALARS)
    pool.settle(f"q5_K sme2 gemv 1x{spec.nr_str}")
    # the sums read back and the SB-end operands reuse the dead hot-loop registers (q4_K's)
    return Q5KSme2GemvRegs(nu=nu, lhs=lhs, raw=(raw, qh), perm=tmp, table=tmp, unp=unp,
                           t=unp[1], s1=s1, acc=acc, sc=sc, d=raw[0], dm=raw[1],
                           mins_b=qh[:2], mins=qh[2:], s2=sc, da=da, bsum=lhs[0], clamp=clamp,
                           qh=qh, sh=sh, tmp=tmp, lres=sc, hres=da, c0f=clamp[0],
                           c10=clamp[1], bq=bq, gpr=gpr, **pool.frame())


#: the 4vl x 1vl gemm's own hot-loop vectors (q4_K's row groups otherwise): the widened five-bit
#: values (low, high pairs of two chunks), a vector of nibbles, its qh vector, a temporary,
#: the five-bit bytes, the masks 0x0f / 0x10 and the qh shift
_ROWS_EXTRA = (("raw", 2), ("hi", 2), ("rhs_b", 1), ("qh", 1), ("tmp", 1), ("lres", 1),
               ("hres", 1), ("c0f", 1), ("c16", 1), ("sh", 1))


def _allocate_q5k_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_gemv(spec)
    if not spec.mr_vl:
        raise SpecError(f"q5_K sme2 tiles are 1 x nu vl (gemv) or 1vl x nu vl (gemm), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    if (spec.mr, spec.nr) == (4, 1):
        R = allocate_kquant_sme2_rows(spec, "q5_K", _ROWS_EXTRA)
        R.gpr["qp"] = R.gpr["pt"]      # the qh plane's pointer: hot loop only, pt: fold only
        return R
    return _allocate_gemm(spec)


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q5k_sme2": _allocate_q5k_sme2}
