"""Build targets: CPU presets with their ISA features, object format and default kernels.

Data only: the CLI, build_library and the tests all read this table (a target's default kernels,
tuned ones first: :func:`tilegen.build.defaults.default_specs`).
"""
from __future__ import annotations

from dataclasses import dataclass

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

# What a default build contains, per family; filtered by each target's features.
# q4 gemm kernels come with the gemv partner that reads the same packed weights (llama.cpp's
# pairs: i8mm 16x4 kr16 + dotprod 1x4 kr16; dotprod 16x4 kr8 + 1x4 kr8), NEON fallback last.
DEFAULT_KERNELS: tuple[str, ...] = (
    "f32:neon:6x16", "f32:neon:4x16", "f32:neon:8x8", "f32:neon:4x24",
    "f32:neon:5x12", "f32:neon:1x16", "f32:neon:1x4",
    # scalable f32: SVE FMLA gemm + gemv pairs (panel width in VL units), SME2/SME outer products
    "f32:sve:3x8vl", "f32:sve:1x8vl", "f32:sve:6x4vl", "f32:sve:1x4vl",
    "f32:sme2:1vlx4vl", "f32:sme2:1x4vl", "f32:sme2:2vlx2vl", "f32:sme:2vlx2vl",
    # SVE (VL units; at 256 bits these are llama.cpp's 16x8 sve_i8mm + 1x8 sve_dotprod)
    "q4_0:sve_i8mm:16x1vl", "q4_0:sve_dotprod:1x1vl:k16:s2",
    "q4_0:sve_dotprod:8x1vl", "q4_0:sve_dotprod:1x1vl",
    "q4_0_dx:sve_i8mm:8x1vl", "q4_0_dx:sve_dotprod:1x1vl:k16:s2",
    # SME: SMOPA gemm + SME2 ZA-array SDOT gemv on one packed RHS (opt-in at run time)
    "q4_0:sme:1vlx2vl", "q4_0:sme2:1x2vl", "q4_0_dx:sme:1vlx2vl", "q4_0_dx:sme2:1x2vl",
    # SME2, llama.cpp's Q4_0 pair (q4_0 weights take it first): the f16-activation FMOPA gemm
    # (ZA accumulates over all of k) + the int8 LUTI4 gemv, one qsi4c32ps1s0scalef16 packing
    "q4_0_f16:sme2:1vlx4vl", "q4_0_s1s0:sme2:1x4vl",
    "q4_0:i8mm:16x4", "q4_0:dotprod:1x4:k16:s2",
    "q4_0:dotprod:16x4", "q4_0:dotprod:1x4",
    "q4_0:neon:4x4", "q4_0:neon:1x4",
    "q4_0_dx:i8mm:4x8", "q4_0_dx:dotprod:1x8:k16:s2",
    "q4_0_dx:dotprod:16x4", "q4_0_dx:dotprod:1x4",
    "q4_0_dx:neon:4x4", "q4_0_dx:neon:1x4",
    # q8_0 on SVE (VL units; at 128 bits the layouts of KleidiAI's 16x4 i8mm / dotprod pairs)
    "q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1",
    "q8_0:sve_dotprod:16x1vl", "q8_0:sve_dotprod:1x1vl",
    # q8_0 on SME: SMOPA gemm (int32 sums in the four ZA tiles) + SME2 ZA-array SDOT gemv on
    # one packed RHS (opt-in at run time)
    "q8_0:sme:1vlx4vl", "q8_0:sme2:1x4vl",
    # q8_0 (qai8dxp x qsi8cxp): KleidiAI's pairs, i8mm 16x4 kr8 + dotprod 1x4 kr8 and
    # dotprod 16x4 kr4 + 1x4 kr4; plain NEON 4x4 + 1x4 (kr8) last
    "q8_0:i8mm:16x4", "q8_0:dotprod:1x4:k8:s1",
    "q8_0:dotprod:16x4", "q8_0:dotprod:1x4",
    "q8_0:neon:4x4", "q8_0:neon:1x4",
    # K-quants (q8kp x q4kp / q6kp, issue #24): per ISA a gemm and the gemv on its packed RHS,
    # i8mm (SMMLA gemm, kr16) first, then dotprod (SDOT by lane, kr8), plain NEON (SMULL) last;
    # the tiles are `tilegen tune`'s best on neoverse-v2 / -n1 (llvm-mca)
    "q4_K:i8mm:8x4", "q4_K:i8mm:1x4",
    "q4_K:dotprod:8x4", "q4_K:dotprod:1x4",
    "q4_K:neon:4x4", "q4_K:neon:1x4",
    "q6_K:i8mm:8x4", "q6_K:i8mm:1x4",
    "q6_K:dotprod:8x4", "q6_K:dotprod:1x4",
    "q6_K:neon:4x4", "q6_K:neon:1x4",
    # ... and on SME2 (int16 SMOPA gemm, ZA-array SDOT gemv on the same q4kp / q6kp 2vlx2)
    "q4_K:sme2:1vlx2vl", "q4_K:sme2:1x2vl",
    "q6_K:sme2:1vlx2vl", "q6_K:sme2:1x2vl",
    # bf16 (bf16p8x4 x bf16p12x4b): KleidiAI's BFMMLA 8x12 and a BFDOT gemv on the same RHS
    "bf16:bf16:8x12", "bf16:bf16:1x12",
    # bf16 on SME2 (bf16p2vlx2 x bf16p2vlx2b): KleidiAI's BFMOPA 2vlx2vl, which also serves m = 1
    # (no gemv reads that RHS; opt-in at run time)
    "bf16:sme2:2vlx2vl",
)


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
