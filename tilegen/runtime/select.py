"""Kernel selection: an ordered table per weight kind, like llama.cpp's kernels.cpp.

Each entry pairs a gemm kernel with the gemv kernel that reads the same packed RHS
(same family, nr, kr, sr), so weights packed once serve both.  The first entry whose
kernels the CPU can run wins; m <= gemv_threshold uses the gemv kernel.  Order: tuned
kernels (``tilegen tune --write``), then best ISA, pairs with a gemv, the biggest tile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["KernelPair", "build_table", "KIND_FAMILY", "ISA_PREFERENCE"]

# weight kind -> kernel family that consumes it
KIND_FAMILY = {"f32": "f32", "f16": "f32", "q4_0": "q4_0", "q4_0_dx": "q4_0_dx"}
# preferred ISAs first: SME > SVE > i8mm > dotprod > NEON
ISA_PREFERENCE = ("sme2", "sme", "sve2", "sve", "sve_i8mm", "sve_dotprod", "i8mm", "dotprod", "neon")


@dataclass(frozen=True)
class KernelPair:
    gemm: object          # runtime Kernel
    gemv: object | None   # runtime Kernel with mr == 1 reading the same RHS, if any

    @property
    def features(self) -> frozenset[str]:
        f = set(self.gemm.features)
        if self.gemv is not None:
            f |= self.gemv.features
        return frozenset(f)

    def pick(self, m: int, gemv_threshold: int = 1):
        return self.gemv if (m <= gemv_threshold and self.gemv is not None) else self.gemm

    def __repr__(self) -> str:
        return f"KernelPair(gemm={self.gemm.name}, gemv={self.gemv.name if self.gemv else None})"


def build_table(kernels: Iterable, family: str) -> list[KernelPair]:
    """Default ordered table for ``family`` from a library's kernels."""
    ks = [k for k in kernels if k.family == family]
    # tiles compared as specs (VL units stay symbolic: 6x4vl pairs with 1x4vl at every VL)
    gemms = [k for k in ks if k.spec.mr > 1 or k.spec.mr_vl] or ks

    def rhs_key(k):
        s = k.spec
        return (s.nr, s.nr_vl, s.vl_kind, s.kr, s.sr)

    def gemv(k):
        return k.spec.mr == 1 and not k.spec.mr_vl

    table = []
    for g in gemms:
        gemvs = [v for v in ks if gemv(v) and rhs_key(v) == rhs_key(g)]
        # prefer a gemv of the gemm's own ISA, then any the CPU may run
        gemvs.sort(key=lambda v: (v.spec.isa != g.spec.isa, ISA_PREFERENCE.index(v.spec.isa)))
        table.append(KernelPair(g, gemvs[0] if gemvs else (g if gemv(g) else None)))

    def size(k):   # lanes of a 128-bit vector per VL unit, to compare fixed and scaled tiles
        s = k.spec
        return s.mr * (4 if s.mr_vl else 1), s.nr * (4 if s.nr_vl else 1)
    # best ISA first; within it, gemm kernels that have a gemv partner, then the biggest tile
    # tuned kernels (manifest "preferred", from `tilegen tune --write`) come first: the
    # tuner compared them with every ISA of the target
    table.sort(key=lambda p: (not p.gemm.entry.get("preferred", False),
                              ISA_PREFERENCE.index(p.gemm.spec.isa), p.gemv is None,
                              -size(p.gemm)[0] * size(p.gemm)[1],
                              -size(p.gemm)[1], p.gemm.name))
    return table
