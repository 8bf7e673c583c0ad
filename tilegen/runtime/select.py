"""Kernel selection: an ordered table per weight kind, like llama.cpp's kernels.cpp.

Each entry pairs a gemm kernel with the gemv kernel that reads the same packed RHS
(equal layout objects, :func:`tilegen.layout.base.same_rhs`), so weights packed once serve both.  The first entry whose
kernels the CPU can run wins; m <= gemv_threshold uses the gemv kernel.  Order: tuned
kernels (``tilegen tune --write``), then best ISA, pairs with a gemv, the biggest tile.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..layout.base import same_rhs
from ..families import FAMILIES, KIND_FAMILIES, KIND_FAMILY
from ..records import ISAS

__all__ = ["KernelPair", "build_table", "KIND_FAMILY", "KIND_FAMILIES", "kind_table",
           "gemv_families"]

# KIND_FAMILY: weight kind -> the family that consumes it; KIND_FAMILIES: the families whose
# kernels serve a kind, in order (f16 weights: the bf16 kernels where the CPU has bf16, as
# llama.cpp does, the f32 kernels elsewhere; q4_0 weights: llama.cpp's SME2 pair first).
# Both come from the family registry (tilegen.families).


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


def gemv_families(family: str) -> tuple[str, ...]:
    """The families whose gemv kernels may pair with ``family``'s gemms: its own and its
    record's ``gemv_family``."""
    other = FAMILIES[family].gemv_family
    return (family,) + ((other,) if other else ())


def build_table(kernels: Iterable, family: str) -> list[KernelPair]:
    """Default ordered table for ``family`` from a library's kernels."""
    kernels = list(kernels)
    ks = [k for k in kernels if k.family == family]
    # tiles compared as specs (VL units stay symbolic: 6x4vl pairs with 1x4vl at every VL)
    gemms = [k for k in ks if not k.spec.is_gemv] or ks
    partners = [k for k in kernels if k.family in gemv_families(family)]

    table = []
    for g in gemms:
        gemvs = [v for v in partners if v.spec.is_gemv and same_rhs(v.spec, g.spec)]
        # prefer a gemv of the gemm's own ISA, then any the CPU may run
        gemvs.sort(key=lambda v: (v.spec.isa != g.spec.isa, ISAS[v.spec.isa].rank))
        table.append(KernelPair(g, gemvs[0] if gemvs else (g if g.spec.is_gemv else None)))

    def size(k):   # lanes of a 128-bit vector per VL unit, to compare fixed and scaled tiles
        s = k.spec
        return s.mr * (4 if s.mr_vl else 1), s.nr * (4 if s.nr_vl else 1)
    # best ISA first; within it, gemm kernels that have a gemv partner, then the biggest tile
    # tuned kernels (manifest "preferred", from `tilegen tune --write`) come first: the
    # tuner compared them with every ISA of the target
    table.sort(key=lambda p: (not p.gemm.entry.get("preferred", False),
                              ISAS[p.gemm.spec.isa].rank, p.gemv is None,
                              -size(p.gemm)[0] * size(p.gemm)[1],
                              -size(p.gemm)[1], p.gemm.name))
    return table


def kind_table(kernels: Iterable, kind: str) -> list[KernelPair]:
    """Default ordered table for weight ``kind``: :func:`build_table` of each of its families
    (:data:`KIND_FAMILIES`) in turn."""
    kernels = list(kernels)
    return [p for fam in KIND_FAMILIES[kind] for p in build_table(kernels, fam)]
