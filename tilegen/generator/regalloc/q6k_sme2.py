"""Register allocation of the q6_K SME2 gemm (family ``q6_K``, LHS ``q8kp``, RHS ``q6kp`` at
kr = 4, sr = 2; arithmetic of tilegen.reference_kquant.matmul_q8kp_q6kp), streaming mode.

Tile 1vl x nu vl (nu = 1, 2 or 4; template q6k_sme2.S.j2): one iteration of the hot loop takes
sub-blocks q (k 16q..16q+15, "half A") and q + 8 (k 128 + 16q.., "half B") of a super-block, whose
low-plane bytes share the high-plane bytes.  Per byte vector the signed 6-bit values v = q - 32
are built in int8 (the high field shifted to bits 6-7, ASR #2, then BSL / SRI insert the low
nibble), widened to int16 (SUNPK) and multiplied by the column's sub-block scale (|sc*v| <=
4096); a 2-way int16 SMOPA adds them into ZA tile ``za<cv>.s``, which so holds S1 of the whole
super-block.  The f32 fold reads one ZA row of the nu tiles per row; the f32 sums live in dst.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing
from .pool import SME_X_ORDER, Frame, RegisterPool, VectorNeeds

__all__ = ["Q6KSme2Regs", "ALLOCATORS"]


@dataclass(frozen=True)
class Q6KSme2Regs(Frame):
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
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())
    counter_pred: int = 8


_CHART = ("LHS", "RHS", "column scales", "nibble mask")
_SCALARS = ("n_rem", "rec", "rpa", "rpb", "hp", "sca", "scb", "lpa", "lpb", "lhs_rb", "lhs_rbs",
            "dst_tile", "dst_row", "sb_cnt", "nsb", "it_cnt", "rows", "tmp")


def _allocate_q6k_sme2(spec: KernelSpec) -> Q6KSme2Regs:
    nu = spec.nr
    if spec.is_gemv or not spec.mr_vl or spec.mr != 1 or nu not in (1, 2, 4):
        raise SpecError(f"q6_K sme2 tiles are 1vlx1vl, 1vlx2vl or 1vlx4vl (one int32 ZA tile "
                        f"per column vector), got {spec.mr_str}x{spec.nr_str}")
    check_packing(spec)
    if spec.kr != 4 or spec.sr != 2:
        raise SpecError(f"q6_K sme2 kernels read k pairs of 4-k chunks: kr=4, sr=2, got "
                        f"kr={spec.kr}, sr={spec.sr}")
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
