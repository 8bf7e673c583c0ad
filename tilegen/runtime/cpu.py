"""CPU feature detection (Linux getauxval; macOS sysctlbyname).

Features are reported as a set of names: neon, dotprod, i8mm, bf16, sve, sve2, sme, sme2.
``TILEGEN_ISA=dotprod`` restricts the set to the listed features and the ones they imply
(see :func:`implied`); it can only remove features the CPU has.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache

from ..records import ISAS

__all__ = ["CpuInfo", "detect", "implied", "KNOWN_FEATURES"]

KNOWN_FEATURES = ("neon", "dotprod", "i8mm", "bf16", "sve", "sve2", "sme", "sme2")
AT_HWCAP, AT_HWCAP2 = 16, 26
_HWCAP = {"dotprod": 1 << 20, "sve": 1 << 22}
_HWCAP2 = {"sve2": 1 << 1, "i8mm": 1 << 13, "bf16": 1 << 14, "sme": 1 << 23, "sme2": 1 << 37}
# The i8mm kernels also multiply f16 scales with FMLAL (FEAT_FHM): i8mm counts only with it
# (every Armv8.4+ core with FP16 has FHM, so every i8mm core does; this keeps the rule honest)
_HWCAP_FHM = 1 << 23
_MACOS_FHM = "hw.optional.arm.FEAT_FHM"
_MACOS_SYSCTL = {"dotprod": "hw.optional.arm.FEAT_DotProd", "i8mm": "hw.optional.arm.FEAT_I8MM",
                 "bf16": "hw.optional.arm.FEAT_BF16", "sme": "hw.optional.arm.FEAT_SME",
                 "sme2": "hw.optional.arm.FEAT_SME2"}


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


def _linux_hwcaps() -> tuple[int, int]:
    libc = ctypes.CDLL(None)
    getauxval = libc.getauxval
    getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(getauxval(AT_HWCAP)), int(getauxval(AT_HWCAP2))


def _macos_features() -> set[str]:
    libc = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    feats = {"neon"}
    for feat, key in {**_MACOS_SYSCTL, "fhm": _MACOS_FHM}.items():
        val, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        if libc.sysctlbyname(key.encode(), ctypes.byref(val), ctypes.byref(size), None, 0) == 0 and val.value:
            feats.add(feat)
    if "fhm" not in feats:
        feats.discard("i8mm")
    return feats - {"fhm"}


PR_SVE_GET_VL, PR_SME_GET_VL = 51, 64


def _linux_vl(option: int) -> int | None:
    libc = ctypes.CDLL(None)
    libc.prctl.restype = ctypes.c_int
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    r = libc.prctl(option, 0, 0, 0, 0)
    return None if r < 0 else 8 * (r & 0xFFFF)


def _sme_mode() -> str:
    mode = os.environ.get("TILEGEN_SME", "0").strip().lower()
    if mode not in ("0", "1", "auto"):
        raise ValueError(f"TILEGEN_SME must be 0, 1 or auto, got {mode!r}")
    return mode


def implied(features) -> set[str]:
    """``features`` plus the features they imply: each implies neon (the base of every Arm64
    CPU tilegen runs on), and a feature that names an ISA implies the features of its
    ``records.ISAS`` record (sve2: sve; sme2: sme), repeatedly."""
    out, todo = set(), list(features)
    while todo:
        f = todo.pop()
        if f not in out:
            out.add(f)
            todo.extend(ISAS[f].features if f in ISAS else ())
    return out | {"neon"} if out else out


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
    machine = platform.machine().lower()
    hw = hw2 = 0
    feats: set[str] = set()
    if machine in ("aarch64", "arm64"):
        if sys.platform.startswith("linux"):
            hw, hw2 = _linux_hwcaps()
            feats = {"neon"} | {f for f, b in _HWCAP.items() if hw & b} | \
                    {f for f, b in _HWCAP2.items() if hw2 & b}
            if not hw & _HWCAP_FHM:
                feats.discard("i8mm")
        elif sys.platform == "darwin":
            feats = _macos_features()
        else:
            feats = {"neon"}
    sve_vl = _linux_vl(PR_SVE_GET_VL) if "sve" in feats and sys.platform.startswith("linux") else None
    sme_vl = _linux_vl(PR_SME_GET_VL) if "sme" in feats and sys.platform.startswith("linux") else None
    return CpuInfo(machine, frozenset(_apply_override(feats)), hw, hw2, sve_vl, sme_vl,
                   frozenset(feats))


def detect() -> CpuInfo:
    """Features of the CPU this Python runs on (after the TILEGEN_ISA / TILEGEN_SME overrides)."""
    return _detect_cached(os.environ.get("TILEGEN_ISA"), os.environ.get("TILEGEN_SME"))
