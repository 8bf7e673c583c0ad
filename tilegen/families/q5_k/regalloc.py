"""Register allocation of the q5_K NEON and SVE kernels (templates q5k_neon.S.j2 /
q5k_sve.S.j2, which extend q4_K's): q4_K's allocation
(the shared :func:`tilegen.generator.regalloc.kquant.allocate_kquant_neon` and
``allocate_kquant_sve``: the same strategies, units and tile rules) with
the registers the high-bit plane's decode adds.

NEON: ``qh`` (16 bytes of the plane), ``qt`` (it shifted to the bit under the mask), ``m10``
(the 0x10 mask of BIT).  SVE: ``qh``, ``qt`` (AND takes the 0x10 mask as an immediate) and
the GPR ``qh_ptr`` (the plane of the SB, rebased by ADDVL as the nibble pointer).
"""
from __future__ import annotations

from functools import partial

from ...generator.regalloc.kquant import allocate_kquant_neon, allocate_kquant_sve

__all__ = ["Q5K_NEON_EXTRA", "Q5K_SVE_EXTRA", "ALLOCATORS"]

Q5K_NEON_EXTRA = (("qh", 1), ("qt", 1), ("m10", 1))     # R.extra[name]: one register each
Q5K_SVE_EXTRA = (("qh", "high-bit plane"), ("qt", "high-bit scratch"))

ALLOCATORS = {"q5k_neon": partial(allocate_kquant_neon, family="q5_K", extra_v=Q5K_NEON_EXTRA),
              "q5k_sve": partial(allocate_kquant_sve, family="q5_K", extra=Q5K_SVE_EXTRA,
                                 extra_x=("qh_ptr",))}
