"""CPU feature names, what they imply, and what the host CPU has (Linux getauxval; macOS
sysctlbyname), before any run-time override.

A bottom module (standard library and :mod:`tilegen.records`): the build's ``native`` target
(:func:`tilegen.build.targets.native_target`) and the runtime's CPU (:mod:`tilegen.runtime.cpu`,
which applies ``TILEGEN_ISA`` / ``TILEGEN_SME``) both read it.
"""
from __future__ import annotations

import ctypes
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache

from .records import ISAS

__all__ = ["KNOWN_FEATURES", "HostCpu", "host_cpu", "implied"]

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
class HostCpu:
    """What the host CPU has: machine name, feature names, the raw hwcaps (Linux) and the
    SVE / SME vector lengths in bits (None: the CPU has none, or they are not read here)."""

    machine: str
    features: frozenset[str]
    hwcap: int = 0
    hwcap2: int = 0
    sve_vl: int | None = None
    sme_vl: int | None = None


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


@lru_cache(maxsize=None)
def host_cpu() -> HostCpu:
    """The host CPU's features (no override applies here)."""
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
    return HostCpu(machine, frozenset(feats), hw, hw2, sve_vl, sme_vl)
