"""Kernel selection: an ordered table per weight kind, like llama.cpp's kernels.cpp.

Each entry pairs a gemm kernel with the gemv kernel that reads the same packed RHS
(equal layout objects, :func:`tilegen.layout.base.same_rhs`), so weights packed once serve both.  The first entry whose
kernels the CPU can run wins; m <= gemv_threshold uses the gemv kernel.  Order: tuned
kernels (``tilegen tune --write``), then best ISA, pairs with a gemv, the biggest tile.

An entry may also carry a large-m gemm (issue #34): the tile its ISA record names
(``IsaImpl.large_gemm``, e.g. the K-quants' SME2 ``4vlx1vl:i16``), of the same family and ISA and
reading the same packed RHS as the entry's gemm and gemv; it runs instead of the gemm once m
exceeds ``IsaImpl.large_after`` tiles of the gemm's rows (:attr:`KernelPair.large_from`).  A
gemm that serves as some entry's large gemm heads no entry of its own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..layout.base import same_rhs
from ..families import FAMILIES, KIND_FAMILIES, KIND_FAMILY
from ..generator.spec import parse_tile
from ..records import ISAS

__all__ = ["KernelPair", "build_table", "large_gemm_of", "row_op", "KIND_FAMILY", "KIND_FAMILIES", "kind_table",
           "gemv_families"]

# KIND_FAMILY: weight kind -> the family that consumes it; KIND_FAMILIES: the families whose
# kernels serve a kind, in order (f16 weights: the bf16 kernels where the CPU has bf16, as
# llama.cpp does, the f32 kernels elsewhere; q4_0 weights: llama.cpp's SME2 pair first).
# Both come from the family registry (tilegen.families).


@dataclass(frozen=True)
class KernelPair:
    gemm: object          # runtime Kernel
    gemv: object | None   # runtime Kernel with mr == 1 reading the same RHS, if any
    large: object | None = None   # runtime Kernel: the large-m gemm on the same RHS, if any
    large_after: int = 1  # ``large`` runs once m exceeds this many tiles of ``gemm``'s rows

    @property
    def kernels(self) -> tuple:
        """The entry's kernels: gemm, then gemv and large-m gemm where it has them."""
        return tuple(k for k in (self.gemm, self.gemv, self.large) if k is not None)

    @property
    def features(self) -> frozenset[str]:
        return frozenset(f for k in self.kernels for f in k.features)

    @property
    def large_from(self) -> int | None:
        """The fewest rows the large-m gemm runs (``large_after`` x the gemm's mr at this CPU's
        vector length, plus one), None without one."""
        return None if self.large is None else self.large_after * self.gemm.mr + 1

    def op(self, m: int, gemv_threshold: int = 1) -> str:
        """Which kernel m rows run (:func:`row_op`)."""
        return row_op(m, gemv_threshold, self.gemv is not None, self.large_from)

    def pick(self, m: int, gemv_threshold: int = 1):
        return getattr(self, self.op(m, gemv_threshold))

    def __repr__(self) -> str:
        large = f", large={self.large.name} (m >= {self.large_from})" if self.large else ""
        return (f"KernelPair(gemm={self.gemm.name}, "
                f"gemv={self.gemv.name if self.gemv else None}{large})")


def row_op(m: int, gemv_threshold: int, has_gemv: bool, large_from: int | None) -> str:
    """The rule by rows, one place for the table, plans and grouped calls: "gemv" (m <=
    gemv_threshold, when there is a gemv), "large" (m >= large_from, when there is a large-m
    gemm), else "gemm"."""
    if m <= gemv_threshold and has_gemv:
        return "gemv"
    if large_from is not None and m >= large_from:
        return "large"
    return "gemm"


def large_gemm_of(kernels: Iterable, gemm, gemv=None):
    """(the large-m gemm among ``kernels`` for an entry of ``gemm`` and ``gemv``, large_after):
    the tile ``gemm``'s ISA record names (``IsaImpl.large_gemm``), of its family and ISA, that
    reads the same packed RHS as ``gemm`` and ``gemv``; (None, 1) without one."""
    impl = FAMILIES[gemm.family].impls.get(gemm.spec.isa)
    if impl is None or impl.large_gemm is None or gemm.spec.is_gemv:
        return None, 1
    tile, _, variant = impl.large_gemm.partition(":")   # "4vlx1vl" or "4vlx1vl:i16"
    mr, mr_vl, nr, nr_vl = parse_tile(tile)
    for k in kernels:
        s = k.spec
        if (k.family == gemm.family and s.isa == gemm.spec.isa and k is not gemm
                and (s.mr, s.mr_vl, s.nr, s.nr_vl) == (mr, mr_vl, nr, nr_vl)
                and s.lhs_i16 == (variant == "i16")
                and same_rhs(s, gemm.spec) and (gemv is None or same_rhs(s, gemv.spec))):
            return k, impl.large_after
    return None, 1


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
        gemv = gemvs[0] if gemvs else (g if g.spec.is_gemv else None)
        table.append(KernelPair(g, gemv, *large_gemm_of(ks, g, gemv)))
    # a large-m gemm runs inside the entries that carry it, never as an entry's gemm at every m
    larges = {id(p.large) for p in table if p.large is not None}
    table = [p for p in table if id(p.gemm) not in larges]

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
