"""Register allocation of the q6_K SME2 gemm (family ``q6_K``, LHS ``q8kp``, RHS ``q6kp`` at
kr = 4, sr = 2; arithmetic of tilegen.families.q6_k.matmul_q8kp_q6kp), streaming mode.

Tile 1vl x nu vl (nu = 1, 2 or 4; template q6k_sme2.S.j2): one iteration of the hot loop takes
sub-blocks q (k 16q..16q+15, "half A") and q + 8 (k 128 + 16q.., "half B") of a super-block, whose
low-plane bytes share the high-plane bytes.  Per byte vector the signed 6-bit values v = q - 32
are built in int8 (the high field shifted to bits 6-7, ASR #2, then BSL / SRI insert the low
nibble), widened to int16 (SUNPK) and multiplied by the column's sub-block scale (|sc*v| <=
4096); a 2-way int16 SMOPA adds them into ZA tile ``za<cv>.s``, which so holds S1 of the whole
super-block.  The f32 fold reads one ZA row of the nu tiles per row; the f32 sums live in dst.
Tile 4vl x 1vl: four row groups in the four tiles, the weights decoded once for all four (the
shared row-group allocation, :func:`tilegen.generator.regalloc.kquant.allocate_kquant_sme2_rows`,
with the decode's vectors and pointers below).

Gemv 1 x nu vl (nu = 2 or 4; template q6k_sme2_gemv.S.j2), on the gemm's weights: the same int8
values, ZIP of the k pairs into each column's 4-k word, one ZA-array SDOT (vgx<nu>, by lane of
the row's quad) per 4-k chunk, halves A and B at ZA offsets 0 / 1; per iteration both sums are
read back (MOVA), ZA zeroed and S1 += sc * T (MLA) with each half's sub-block scales.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...records import SpecError
from ...generator.spec import KernelSpec
from ...generator.regalloc.pool import SME_X_ORDER, RegisterPool
from ...generator.regalloc.kquant import (KQuantSme2Frame, allocate_kquant_sme2_rows,
                                          check_sme2_gemv_tile, check_sme2_interleave)

__all__ = ["Q6KSme2Regs", "Q6KSme2GemvRegs", "ALLOCATORS"]


@dataclass(frozen=True, kw_only=True)
class Q6KSme2Regs(KQuantSme2Frame):
    """``lhs_b``: the k pairs of two 4-k chunks (bytes); ``lhs[h]``: widened (low pair, high
    pair of each chunk) of half h (A, B); ``low[h]``: two low-plane vectors of half h; ``high``:
    the two high-plane vectors both halves share; ``v8``: the int8 values of one vector (low
    nibbles' k pairs, high nibbles' k pairs), ``wide``: widened; ``sc[h]``: per column vector
    each column's sub-block scale twice; ``mask``: 0xf0 in every byte.  Fold: ``sums`` (a ZA
    row of the nu tiles), ``d``, ``da``, ``acc`` (dst row), ``clamp``."""

    nu: int
    lhs_b: tuple[int, int]
    lhs: tuple[tuple[int, ...], ...]
    low: tuple[tuple[int, ...], ...]
    high: tuple[int, int]
    v8: tuple[int, int]
    wide: tuple[int, ...]
    sc: tuple[tuple[int, ...], ...]
    mask: int
    sums: tuple[int, ...]
    d: tuple[int, ...]
    da: int
    acc: tuple[int, ...]
    clamp: tuple[int, int]


@dataclass(frozen=True, kw_only=True)
class Q6KSme2GemvRegs(KQuantSme2Frame):
    """``lhs``: the row's quads of halves A and B; ``low[h]``, ``high``, ``v8``, ``mask`` as the
    gemm; ``zz``: two nu-vector groups of 4-k words (ZIP); ``t[h]``: the sums of half h read
    back; ``sc``: one column vector's scales; ``s1``, ``acc``: scaled int32 / f32 sums.  SB
    end: ``d``, ``da``, ``clamp``."""

    nu: int
    lhs: tuple[int, int]
    low: tuple[tuple[int, ...], ...]
    high: tuple[int, int]
    v8: tuple[int, int]
    mask: int
    zz: tuple[tuple[int, ...], ...]
    t: tuple[tuple[int, ...], ...]
    sc: int
    s1: tuple[int, ...]
    acc: tuple[int, ...]
    d: int
    da: int
    clamp: tuple[int, int]


_CHART = ("LHS", "RHS", "column scales", "nibble mask", "f32 epilogue")
_GEMV_SCALARS = ("n_rem", "rec", "rpa", "rpb", "hp", "sca", "scb", "lpa", "lpb", "lhs_row",
                 "lhs_rs", "dst_ptr", "sb_cnt", "nsb", "it_cnt", "tmp")


def _allocate_gemv(spec: KernelSpec) -> Q6KSme2GemvRegs:
    nu = spec.nr
    check_sme2_gemv_tile(spec, "q6_K")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = v.claim((0, 1), "LHS")                # by-lane operands: z0-z15
    mask, sc = v.claim((2, 3), "nibble mask")
    low = (v.claim((4, 5), "RHS"), v.claim((6, 7), "RHS"))
    high = v.claim((8, 9), "RHS")
    v8 = v.claim((10, 11), "RHS")
    zz = (v.claim(range(12, 16), "RHS"), v.claim(range(16, 20), "RHS"))
    s1 = v.claim(range(20, 20 + nu), "f32 epilogue")
    acc = v.claim(range(24, 24 + nu), "f32 epilogue")
    gpr = pool.scalars(_GEMV_SCALARS)
    pool.settle(f"q6_K sme2 gemv 1x{spec.nr_str}")
    # the sums read back and the SB-end operands reuse the dead hot-loop registers
    return Q6KSme2GemvRegs(nu=nu, lhs=lhs, low=low, high=high, v8=v8, mask=mask,
                           zz=(zz[0][:nu], zz[1][:nu]), t=(zz[0][:nu], zz[1][:nu]), sc=sc,
                           s1=s1, acc=acc, d=low[0][0], da=low[0][1], clamp=low[1], gpr=gpr,
                           **pool.frame())

# the 4vl x 1vl gemm (the shared row-group allocation, templates/kquant/sme2_gemm_rows.S.j2):
# its decode's vectors (R.extra: ``wide`` LUTI2's four byte vectors of a high-plane vector's
# fields, then the widened values of one low-plane vector; ``hs0`` / ``hs1`` the 16*(signed h')
# bytes of the trip's two high-plane vectors after UZP: half A's low / high nibbles', half B's;
# ``hl`` one high- or low-plane vector; ``mask`` 0xf0) and pointers, second names of scalars
# it leaves free: half B's low plane ``rpb`` (hot loop only), the high plane ``hp`` (the next
# record after the fold) and half B's LHS ``lpb`` (the rows' d at the fold, the next SB's LHS
# after it)
_ROWS_EXTRA = (("wide", 4), ("hs0", 4), ("hs1", 4), ("hl", 1), ("mask", 1))
_ROWS_X = (("rpb", "rpt"), ("hp", "pt"), ("lpb", "tmp"))

_SCALARS = ("n_rem", "rec", "rpa", "rpb", "hp", "sca", "scb", "lpa", "lpb", "lhs_rb", "lhs_rbs",
            "dst_tile", "dst_row", "sb_cnt", "nsb", "it_cnt", "rows", "tmp")


def _allocate_q6k_sme2(spec: KernelSpec) -> Q6KSme2Regs | Q6KSme2GemvRegs:
    nu = spec.nr
    check_sme2_interleave(spec, "q6_K")
    if spec.is_gemv:
        return _allocate_gemv(spec)
    if spec.mr_vl and (spec.mr, nu) == (4, 1):
        return allocate_kquant_sme2_rows(spec, "q6_K", extra=_ROWS_EXTRA, extra_x=_ROWS_X)
    if not spec.mr_vl or spec.mr != 1 or nu not in (1, 2, 4):
        raise SpecError(f"q6_K sme2 gemm tiles are 1vlx1vl, 1vlx2vl or 1vlx4vl (one int32 ZA "
                        f"tile per column vector) or 4vlx1vl (S1 of four row groups), got "
                        f"{spec.mr_str}x{spec.nr_str}")
    pool = RegisterPool(_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs_b = v.claim((0, 1), "LHS")
    mask = v.claim((2,), "nibble mask")[0]
    lhs = (v.claim(range(4, 8), "LHS"), v.claim(range(8, 12), "LHS"))
    low = (v.claim((12, 13), "RHS"), v.claim((14, 15), "RHS"))
    high = v.claim((16, 17), "RHS")
    v8 = v.claim((18, 19), "RHS")
    wide = v.claim(range(20, 24), "RHS")
    sc = (v.claim(range(24, 24 + nu), "column scales"), v.claim(range(28, 28 + nu), "column scales"))
    gpr = pool.scalars(_SCALARS)
    pool.settle(f"q6_K sme2 gemm {spec.mr_str}x{spec.nr_str}")
    # the fold reuses the dead hot-loop registers (groups aligned to their length)
    return Q6KSme2Regs(nu=nu, lhs_b=lhs_b, lhs=lhs, low=low, high=high, v8=v8, wide=wide, sc=sc,
                       mask=mask, sums=tuple(range(16, 16 + max(2, nu))), d=tuple(range(24, 24 + nu)),
                       da=lhs_b[0], acc=wide[:nu], clamp=(lhs_b[1], 3), gpr=gpr,
                       **pool.frame())


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q6k_sme2": _allocate_q6k_sme2}
