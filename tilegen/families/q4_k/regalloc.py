"""Register allocation of the K-quant kernels of family ``q4_K`` (LHS ``q8kp``, RHS ``q4kp``;
the arithmetic of docs/specs.md#q4_k and tilegen.reference.kquant) on NEON V registers.

One super-block (SB, 256 k) is one iteration of the kernel's k loop, its 8 sub-blocks of 32 k
unrolled.  Per accumulator unit (a register of int32 sums):

    T   the sub-block dot products, cumulative over the SB (zeroed once per SB);
    S1  the scaled sums: after sub-block j, S1 += (sc_j - sc_{j+1}) * T  (sc_8 = 0), so that
        S1 = sum_j sc_j * (sum over sub-block j) at the SB's end without zeroing T per
        sub-block (the "telescoping" form; MUL at j = 0, MLA after);
    the f32 accumulators live in the stack frame (one 16-byte slot per unit, loaded and stored
    once per SB by the float epilogue: x = f32(S1)*d; x -= dmin*f32(S2); acc += da*x).

Strategies (``Q4KRegs.mode``), by ISA and interleave (the allocations are the shared
:func:`tilegen.generator.regalloc.kquant.allocate_kquant_neon` and ``allocate_kquant_sve``,
``Q4KRegs`` / ``Q4KSveRegs`` their records):

``mm``    i8mm, kr = 16, mr a multiple of 4: SMMLA of (2 rows x 8 k) by (2 columns x 8 k); a
          unit is (row block g, row pair rp, column pair p) in SMMLA's 2x2 order; the
          sub-block scale differences and the SB's d / dmin / da are arranged to match.  The
          min term: two SMMLA of the hi/lo bsums by the mins of a column pair.
``dot4``  dotprod, kr = 8: SDOT by lane; a unit is (row, 4 columns) (gemv: mr = 1, the
          row's 32 k of a sub-block in two vectors).  The min term: SDOT by lane of the
          bsums against UZP1/UZP2 of the mins of 4 columns.
``dot8``  i8mm gemv (mr = 1) on the kr = 16 layout: SDOT of the row's 8 k (both halves)
          against 2 columns x 8 k; a unit is a column pair (lanes c0 c0 c1 c1), folded by ADDP
          to 4 columns at the SB end, then the dot4 epilogue.
``neon``  plain NEON, kr = 8: SMULL/SMULL2 (int16 products) + SADALP into two int32 vectors
          per unit (columns 0-1 and 2-3 of the unit), ADDP per sub-block; then as dot4.

The SVE kernels (``sve_i8mm``, ``sve_dotprod``; ``Q4KSveRegs``, templates/q4k_sve.S.j2)
are vector-length agnostic: nr = nv VL units of VL/32 columns, every 128-bit segment of a Z
register laid out as the NEON register of the same strategy (mm: SMMLA per segment, a unit is
(row block g, row pair rp, half h of column vector h // 2); dot4: SDOT by lane, a unit is
(row, column vector); dot8: the sve_i8mm gemv, a unit is a half h).  Indexed operands (the
SDOT LHS and the bsums of its min term) are z0-z7.  The f32 accumulators live in a VL-sized
stack area (``addvl sp``), one vector per unit.
"""
from __future__ import annotations

from functools import partial

from ...generator.spec import KernelSpec
from ...generator.regalloc.kquant import (KQUANT_NEON_SCALARS, KQUANT_SVE_SCALARS, KQuantNeonRegs,
                                          KQuantSveRegs, allocate_kquant_neon,
                                          allocate_kquant_sve)

__all__ = ["Q4KRegs", "Q4KSveRegs", "Q4K_SCALARS", "Q4K_SVE_SCALARS", "ALLOCATORS"]

Q4K_SCALARS = KQUANT_NEON_SCALARS
Q4K_SVE_SCALARS = KQUANT_SVE_SCALARS
#: the NEON and SVE register records of q4_K (the shared 32-k sub-block ones)
Q4KRegs = KQuantNeonRegs
Q4KSveRegs = KQuantSveRegs


def _allocate_q4k_neon(spec: KernelSpec) -> Q4KRegs:
    return allocate_kquant_neon(spec, "q4_K")


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4k_neon": _allocate_q4k_neon,
              "q4k_sve": partial(allocate_kquant_sve, family="q4_K")}
