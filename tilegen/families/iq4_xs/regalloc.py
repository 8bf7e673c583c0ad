"""Register allocation of the iq4_xs NEON and SVE kernels (templates iq4xs_neon.S.j2, on
q4_K's NEON template, and iq4xs_sve.S.j2, on the K-quant SVE skeleton): q4_K's allocation
(the shared :func:`tilegen.generator.regalloc.kquant.allocate_kquant_neon` and
``allocate_kquant_sve``: the same strategies, units and tile rules)
plus the one register the table decode needs: ``table`` (NEON, ``R.extra``) / ``kv`` (SVE,
``R.xv``), the 16 int8 kvalues TBL reads, loaded once per call.
"""
from __future__ import annotations

from functools import partial

from ...generator.regalloc.kquant import allocate_kquant_neon, allocate_kquant_sve

__all__ = ["IQ4XS_NEON_EXTRA", "IQ4XS_SVE_EXTRA", "ALLOCATORS"]

IQ4XS_NEON_EXTRA = (("table", 1),)               # R.extra["table"]: the kvalues register
IQ4XS_SVE_EXTRA = (("kv", "kvalues table"),)     # R.xv["kv"]

ALLOCATORS = {"iq4xs_neon": partial(allocate_kquant_neon, family="iq4_xs", extra_v=IQ4XS_NEON_EXTRA),
              "iq4xs_sve": partial(allocate_kquant_sve, family="iq4_xs", extra=IQ4XS_SVE_EXTRA)}
