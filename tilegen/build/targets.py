"""Build targets: CPU presets with their ISA features, object format and default kernels.

Data only: the CLI, build_library and the tests all read this table (a target's default kernels,
tuned ones first: :func:`tilegen.build.defaults.default_specs`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..families import DEFAULT_KERNELS as FAMILY_DEFAULTS
from ..generator.spec import KernelSpec

__all__ = ["Target", "TARGETS", "DEFAULT_KERNELS", "get_target", "TargetError"]


class TargetError(ValueError):
    """Unknown target or a kernel the target cannot run."""


@dataclass(frozen=True)
class Target:
    name: str
    features: frozenset[str]
    fmt: str = "elf"
    llvm_cpu: str | None = None     # -mcpu for llvm-mca
    aliases: tuple[str, ...] = ()
    description: str = ""

    def supports(self, spec: KernelSpec) -> bool:
        return set(spec.features) <= self.features


def _t(name, feats, fmt="elf", llvm_cpu=None, aliases=(), description=""):
    return Target(name, frozenset(feats.split(",")), fmt, llvm_cpu, tuple(aliases), description)


_PRESETS = [
    _t("generic-armv8", "neon", description="any Armv8-A CPU (NEON only)"),
    _t("cortex-a53", "neon", llvm_cpu="cortex-a53"),
    _t("cortex-a76", "neon,dotprod", llvm_cpu="cortex-a76"),
    _t("neoverse-n1", "neon,dotprod", llvm_cpu="neoverse-n1", aliases=("graviton2",)),
    _t("neoverse-v1", "neon,dotprod,i8mm,bf16,sve", llvm_cpu="neoverse-v1", aliases=("graviton3",)),
    _t("neoverse-n2", "neon,dotprod,i8mm,bf16,sve,sve2", llvm_cpu="neoverse-n2"),
    _t("neoverse-v2", "neon,dotprod,i8mm,bf16,sve,sve2", llvm_cpu="neoverse-v2",
       aliases=("graviton4", "grace")),
    _t("a64fx", "neon,sve", llvm_cpu="a64fx"),
    _t("apple-m1", "neon,dotprod", fmt="macho", llvm_cpu="apple-m1"),
    _t("apple-m2", "neon,dotprod,i8mm,bf16", fmt="macho", llvm_cpu="apple-m2"),
    _t("apple-m3", "neon,dotprod,i8mm,bf16", fmt="macho", llvm_cpu="apple-m3"),
    _t("apple-m4", "neon,dotprod,i8mm,bf16,sme,sme2", fmt="macho", llvm_cpu="apple-m4"),
    _t("linux-aarch64-all", "neon,dotprod,i8mm,bf16,sve,sve2,sme,sme2",
       description="every ISA; the runtime dispatches per CPU"),
]
TARGETS: dict[str, Target] = {}
for _p in _PRESETS:
    TARGETS[_p.name] = _p
    for _a in _p.aliases:
        TARGETS[_a] = _p

# What a default build contains: every family plugin's default kernels, family by family
# (tilegen.families); filtered by each target's features.
DEFAULT_KERNELS: tuple[str, ...] = FAMILY_DEFAULTS


def native_target() -> Target:
    """The build host's own CPU (aarch64 hosts only)."""
    from ..cpufeatures import host_cpu
    cpu = host_cpu()
    if cpu.machine not in ("aarch64", "arm64"):
        raise TargetError(f"--target native needs an aarch64 host; this one is {cpu.machine} "
                          f"(name a preset instead, see `tilegen targets`)")
    import sys
    return Target("native", cpu.features, "macho" if sys.platform == "darwin" else "elf",
                  "native", description="the build host's CPU")


def get_target(name: str) -> Target:
    if name == "native":
        return native_target()
    try:
        return TARGETS[name]
    except KeyError:
        raise TargetError(f"unknown target {name!r}; known: {', '.join(sorted(TARGETS))}, "
                          f"native") from None
