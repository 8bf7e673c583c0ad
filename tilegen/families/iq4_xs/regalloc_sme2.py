"""Register allocation of the iq4_xs SME2 kernels (family ``iq4_xs``, LHS ``q8kp``, RHS
``iq4xsp`` at kr = 4, sr = 2; arithmetic of tilegen.reference.kquant), streaming mode, VL = SVL.

``gemm`` (tile 1vl x nu vl, nu = 1, 2 or 4; template iq4xs_sme2.S.j2): per 4-k chunk and column
vector, LUTI4 (the int16 kvalues in ZT0) turns one half vector of indices into two int16
vectors in nibble order (each column's k (0, 2) then (1, 3)), UZP gathers each column's two k
pairs into one lane of two vectors, MUL by the column's signed sub-block scale (|sc*kv| <=
4064) and two 2-way int16 SMOPA into ZA tile ``za<cv>.s`` (S1 of the whole super-block); the
LHS k pairs are transposed alike (TRN1 / TRN2) once per chunk.  No min term: the fold reads
one ZA row of the nu tiles per row.  ``gemm`` 4vl x 1vl: q4_K's row groups
(:func:`tilegen.generator.regalloc.kquant.allocate_kquant_sme2_rows`).

``gemv`` (tile 1 x nu vl, nu = 2 or 4; template iq4xs_sme2_gemv.S.j2): LUTI4 (the int8
kvalues) expands the indices, each column's 4 k values in a word in the order (0, 2, 1, 3);
the row's LHS quads are permuted alike (TBL); one ZA-array SDOT (vgx2 / vgx4, by lane) per 4-k
chunk; once per sub-block the sums are read back (MOVA), ZA zeroed and S1 += sc_j * T (MLA).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...records import SpecError
from ...generator.spec import KernelSpec
from ...generator.regalloc.kquant import (KQuantLuti4GemvFrame, KQuantSme2Frame, allocate_kquant_sme2_rows,
                                          check_sme2_gemv_tile, check_sme2_interleave,
                                          claim_luti4_gemv_tail)
from ...generator.regalloc.pool import SME_X_ORDER, RegisterPool

__all__ = ["IQ4XSSme2Regs", "IQ4XSSme2GemvRegs", "ALLOCATORS"]


@dataclass(frozen=True, kw_only=True)
class IQ4XSSme2Regs(KQuantSme2Frame):
    """The 1vl x nu vl int16-SMOPA gemm.  Hot loop: ``lhs_b`` (the k pairs of two 4-k chunks,
    bytes), ``lhs`` (widened: pairs (0, 1), (2, 3) of each chunk), ``lhsq`` (transposed: pairs
    (0, 2), (1, 3) of each chunk), ``rhs_b`` (two vectors of indices), ``w`` (two LUTI4
    pairs), ``p`` (two UZP pairs, then scaled), ``sc`` (per column vector each column's scale
    twice), ``sc_raw`` (the scale bytes widened).  Fold: ``sums``, ``d``, ``da``, ``acc``,
    ``clamp``."""

    nu: int
    lhs_b: tuple[int, ...]
    lhs: tuple[int, ...]
    lhsq: tuple[int, ...]
    rhs_b: tuple[int, ...]
    w: tuple[tuple[int, ...], ...]
    p: tuple[tuple[int, ...], ...]
    sc: tuple[int, ...]
    sc_raw: tuple[int, ...]
    sums: tuple[int, ...]
    d: tuple[int, ...]
    da: int
    acc: tuple[int, ...]
    clamp: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class IQ4XSSme2GemvRegs(KQuantLuti4GemvFrame):
    """The 1 x nu vl ZA-array SDOT gemv.  Hot loop: ``lhs`` (the row's two 16-byte quads of a
    sub-block, their k permuted by TBL through ``perm``), ``raw`` (two 4-vector groups of
    indices), ``unp`` (two nu-vector groups: LUTI4's words of nu column vectors), ``t`` (the
    sums read back), ``sc`` (scales), ``s1`` (scaled sums), ``acc`` (f32 sums).  SB end:
    ``d``, ``da``, ``clamp``.  1 x 1vl (nu = 1): ``bc`` the broadcast LHS quads, ``t`` four
    vectors (ZA's four slices; :func:`claim_luti4_gemv_tail`)."""

    nu: int
    lhs: tuple[int, int]
    raw: tuple[tuple[int, ...], ...]
    perm: int
    unp: tuple[tuple[int, ...], ...]
    t: tuple[int, ...]
    s1: tuple[int, ...]
    acc: tuple[int, ...]
    sc: int
    d: int
    da: int
    clamp: tuple[int, int]


_CHART = ("LHS", "RHS", "column scales", "f32 epilogue", "clamp")
_GEMM_SCALARS = ("n_rem", "rec", "rp", "scp", "lp", "lhs_rb", "lhs_rbs", "dst_tile", "dst_row",
                 "dap", "sb_cnt", "nsb", "sub_cnt", "rows", "tmp")
_GEMV_SCALARS = ("n_rem", "rec", "rp", "scp", "lp", "lhs_row", "lhs_rs", "dst_ptr", "sb_cnt",
                 "nsb", "sub_cnt", "tmp")


def _allocate_gemm(spec: KernelSpec) -> IQ4XSSme2Regs:
    nu = spec.nr
    if spec.mr != 1 or nu not in (1, 2, 4):
        raise SpecError(f"iq4_xs sme2 gemm tiles are 1vlx1vl, 1vlx2vl or 1vlx4vl (one int32 ZA "
                        f"tile per column vector), got {spec.mr_str}x{spec.nr_str}")
    check_sme2_interleave(spec, "iq4_xs")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs_b = v.claim((0, 1), "LHS")
    rhs_b = v.claim((2, 3), "RHS")
    lhs = v.claim(range(4, 8), "LHS")
    lhsq = v.claim(range(8, 12), "LHS")
    w = (v.claim((12, 13), "RHS"), v.claim((16, 17), "RHS"))
    p = (v.claim((14, 15), "RHS"), v.claim((18, 19), "RHS"))
    sc = v.claim(range(20, 20 + nu), "column scales")
    sc_raw = v.claim((24, 25)[:(nu + 1) // 2], "column scales")
    gpr = pool.scalars(_GEMM_SCALARS)
    pool.settle(f"iq4_xs sme2 gemm {spec.mr_str}x{spec.nr_str}")
    # the fold and the clamp pass reuse the dead hot-loop registers (groups aligned)
    return IQ4XSSme2Regs(nu=nu, lhs_b=lhs_b, lhs=lhs, lhsq=lhsq, rhs_b=rhs_b, w=w, p=p, sc=sc,
                         sc_raw=sc_raw, sums=tuple(range(16, 16 + max(2, nu))),
                         d=tuple(range(8, 8 + nu)), da=lhs_b[0], acc=tuple(range(4, 4 + nu)),
                         clamp=rhs_b, gpr=gpr, **pool.frame())


def _allocate_gemv(spec: KernelSpec) -> IQ4XSSme2GemvRegs:
    nu = spec.nr
    check_sme2_gemv_tile(spec, "iq4_xs", one_vl=True)
    check_sme2_interleave(spec, "iq4_xs")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = v.claim((0, 1), "LHS")           # by-lane operands: z0-z15
    clamp = v.claim((2, 3), "clamp")
    raw = (v.claim(range(4, 8), "RHS"), v.claim(range(8, 12), "RHS"))
    perm, sc = v.claim((12, 13), "LHS")
    da = v.claim((14,), "column scales")[0]
    unp, bc, s1, acc = claim_luti4_gemv_tail(v, nu, raw)
    gpr = pool.scalars(_GEMV_SCALARS)
    pool.settle(f"iq4_xs sme2 gemv 1x{spec.nr_str}")
    return IQ4XSSme2GemvRegs(nu=nu, lhs=lhs, raw=raw, perm=perm, bc=bc, unp=unp, t=unp[1], s1=s1,
                             acc=acc, sc=sc, d=raw[0][0], da=da, clamp=clamp, gpr=gpr,
                             **pool.frame())


def _allocate_iq4xs_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_gemv(spec)
    if not spec.mr_vl:
        raise SpecError(f"iq4_xs sme2 tiles are 1 x nu vl (gemv) or 1vl x nu vl (gemm), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    if (spec.mr, spec.nr) == (4, 1):
        return allocate_kquant_sme2_rows(spec, "iq4_xs")
    return _allocate_gemm(spec)


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"iq4xs_sme2": _allocate_iq4xs_sme2}
