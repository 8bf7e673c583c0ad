"""The CPU the runtime calls on: what the host has (:mod:`tilegen.cpufeatures`: Linux getauxval;
macOS sysctlbyname), after the run-time overrides.

Features are reported as a set of names: neon, dotprod, i8mm, bf16, sve, sve2, sme, sme2.
``TILEGEN_ISA=dotprod`` restricts the set to the listed features and the ones they imply
(see :func:`implied`); it can only remove features the CPU has.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

from ..cpufeatures import KNOWN_FEATURES, host_cpu, implied

__all__ = ["CpuInfo", "detect", "implied", "KNOWN_FEATURES"]


@dataclass(frozen=True)
class CpuInfo:
    machine: str
    features: frozenset[str]
    hwcap: int = 0
    hwcap2: int = 0
    sve_vl: int | None = None      # SVE vector length in bits (None: no SVE)
    sme_vl: int | None = None      # SME streaming vector length in bits (None: no SME)
    detected: frozenset[str] = frozenset()   # before TILEGEN_ISA / TILEGEN_SME

    @property
    def is_arm64(self) -> bool:
        return self.machine in ("aarch64", "arm64")

    def has(self, *features: str) -> bool:
        return set(features) <= self.features


def _sme_mode() -> str:
    mode = os.environ.get("TILEGEN_SME", "0").strip().lower()
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"TILEGEN_SME must be 0, 1 or auto, got {mode!r}")
    return mode


def _apply_override(feats: set[str]) -> set[str]:
    if _sme_mode() == "0":        # SME kernels are opt-in (TILEGEN_SME=1 or auto)
        feats = feats - {"sme", "sme2"}
    spec = os.environ.get("TILEGEN_ISA")
    if not spec:
        return feats
    wanted = {f.strip() for f in spec.split(",") if f.strip()}
    unknown = wanted - set(KNOWN_FEATURES)
    if unknown:
        raise ValueError(f"TILEGEN_ISA names unknown features {sorted(unknown)}; "
                         f"known: {', '.join(KNOWN_FEATURES)}")
    return feats & implied(wanted)


@lru_cache(maxsize=None)
def _detect_cached(isa_env: str | None, sme_env: str | None) -> CpuInfo:
    h = host_cpu()
    return CpuInfo(h.machine, frozenset(_apply_override(set(h.features))), h.hwcap, h.hwcap2,
                   h.sve_vl, h.sme_vl, h.features)


def detect() -> CpuInfo:
    """Features of the CPU this Python runs on (after the TILEGEN_ISA / TILEGEN_SME overrides)."""
    return _detect_cached(os.environ.get("TILEGEN_ISA"), os.environ.get("TILEGEN_SME"))
