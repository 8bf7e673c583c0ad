"""Declarative kernel specification: what a micro-kernel computes and on which ISA.

A :class:`KernelSpec` is the first stage of the flow (spec -> layout -> register
allocation -> template -> toolchain -> library).  It carries no layout or register
knowledge itself; :meth:`KernelSpec.validate` asks the later stages whether they can
realise it, so the rules come from the register allocator, not from a shape list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SpecError", "KernelSpec", "FamilyInfo", "FAMILIES", "ISA_FEATURES", "parse_spec"]


class SpecError(ValueError):
    """A kernel specification that cannot be generated; the message names the rule."""


@dataclass(frozen=True)
class FamilyInfo:
    """Static facts about an operation family."""

    name: str
    isas: tuple[str, ...]          # ISAs a template exists for
    lhs: str                        # LHS format stem (KleidiAI naming)
    rhs: str                        # RHS packed format stem
    op_suffix: dict[str, str]       # isa -> ISA/instruction suffix used in the name
    default_kr: dict[str, int]      # isa -> kr when the spec gives none
    default_sr: dict[str, int]
    quantized: bool = False


def _q4_family(name: str, lhs: str) -> FamilyInfo:
    """The int4 x int8 families share ISAs, suffixes and default interleave (kr, sr)."""
    return FamilyInfo(
        name=name, isas=("neon", "dotprod", "i8mm"), lhs=lhs, rhs="qsi4c32p",
        op_suffix={"neon": "neon", "dotprod": "neon_dotprod", "i8mm": "neon_i8mm"},
        default_kr={"neon": 8, "dotprod": 8, "i8mm": 16},
        default_sr={"neon": 2, "dotprod": 2, "i8mm": 2},
        quantized=True,
    )


FAMILIES: dict[str, FamilyInfo] = {
    "f32": FamilyInfo(
        name="f32", isas=("neon",), lhs="f32", rhs="f32p", op_suffix={"neon": "neon_mla"},
        default_kr={"neon": 1}, default_sr={"neon": 1},
    ),
    # llama.cpp's q4_0 path: LHS per-32-block symmetric int8 (f16 scale), RHS int4 from
    # ggml block_q4_0 with f16 scales (KleidiAI matmul_clamp_f32_qsi8d32p_qsi4c32p).
    "q4_0": _q4_family("q4_0", "qsi8d32p"),
    # LHS per-row asymmetric int8, RHS int4 per 32-block with bf16 scales, row sums and bias
    # (KleidiAI matmul_clamp_f32_qai8dxp_qsi4c32p).
    "q4_0_dx": _q4_family("q4_0_dx", "qai8dxp"),
}

# CPU features each ISA needs (names as reported by tilegen.runtime.cpu).
ISA_FEATURES: dict[str, tuple[str, ...]] = {
    "neon": ("neon",),
    "dotprod": ("neon", "dotprod"),
    "i8mm": ("neon", "i8mm"),
    "sve": ("sve",),
    "sve2": ("sve", "sve2"),
    "sme": ("sme",),
    "sme2": ("sme", "sme2"),
}


@dataclass(frozen=True)
class KernelSpec:
    """One micro-kernel: family, ISA and tile shape ``mr x nr`` with ``kr``/``sr`` interleave."""

    family: str
    isa: str
    mr: int
    nr: int
    kr: int | None = None
    sr: int | None = None

    def __post_init__(self) -> None:
        fam = FAMILIES.get(self.family)
        if fam is None:
            raise SpecError(f"unknown family {self.family!r}; known: {', '.join(sorted(FAMILIES))}")
        if self.isa not in ISA_FEATURES:
            raise SpecError(f"unknown isa {self.isa!r}; known: {', '.join(ISA_FEATURES)}")
        if self.isa not in fam.isas:
            raise SpecError(
                f"family {self.family!r} has no template for isa {self.isa!r}; "
                f"available: {', '.join(fam.isas)}")
        if self.kr is None:
            object.__setattr__(self, "kr", fam.default_kr[self.isa])
        if self.sr is None:
            object.__setattr__(self, "sr", fam.default_sr[self.isa])
        for field in ("mr", "nr", "kr", "sr"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"{field} must be an int, got {v!r}")
            if v < 1:
                raise SpecError(f"{field} must be >= 1, got {field}={v}")

    # -- derived facts -------------------------------------------------------------
    @property
    def info(self) -> FamilyInfo:
        return FAMILIES[self.family]

    @property
    def features(self) -> tuple[str, ...]:
        """CPU features required to run the kernel."""
        return ISA_FEATURES[self.isa]

    @property
    def m_step(self) -> int:
        return self.mr

    @property
    def n_step(self) -> int:
        return self.nr

    @property
    def L(self) -> int:
        """Interleave chunk in elements (KleidiAI's kr/sr)."""
        return self.kr // self.sr

    @property
    def lhs_mr(self) -> int:
        """Rows interleaved in one packed LHS row block (1 for gemv tiles, else 4)."""
        if not self.info.quantized:
            return 1
        return 1 if self.mr == 1 else 4

    @property
    def lhs_format(self) -> str:
        """Packed LHS format name, e.g. ``qsi8d32p4x8`` (``f32`` when unpacked)."""
        if not self.info.quantized:
            return self.info.lhs
        return f"{self.info.lhs}{self.lhs_mr}x{self.L}"

    @property
    def rhs_format(self) -> str:
        """Packed RHS format name, e.g. ``f32p16x1b`` or ``qsi4c32p4x8``."""
        if self.family == "f32":
            return f"{self.info.rhs}{self.nr}x{self.kr}b"
        return f"{self.info.rhs}{self.nr}x{self.L}"

    @property
    def name(self) -> str:
        """Kernel name, KleidiAI grammar:
        ``matmul_clamp_<dst>_<lhs>_<rhs>_<mr>x<nr>_<isa>_<op>``."""
        return (f"matmul_clamp_f32_{self.lhs_format}_{self.rhs_format}_"
                f"{self.mr}x{self.nr}_{self.info.op_suffix[self.isa]}")

    @property
    def spec_string(self) -> str:
        s = f"{self.family}:{self.isa}:{self.mr}x{self.nr}"
        if self.kr != self.info.default_kr[self.isa] or self.sr != self.info.default_sr[self.isa]:
            s += f":k{self.kr}:s{self.sr}"
        return s

    def validate(self) -> "KernelSpec":
        """Raise :class:`SpecError` unless layout and register allocation accept the tile."""
        from .regalloc import allocate  # later stage; imported lazily to keep the flow one-way

        allocate(self)
        return self

    def __str__(self) -> str:
        return self.spec_string


_SPEC_RE = re.compile(
    r"^(?P<family>[a-z0-9_]+):(?P<isa>[a-z0-9]+):(?P<mr>\d+)x(?P<nr>\d+)"
    r"(?::k(?P<kr>\d+))?(?::s(?P<sr>\d+))?$")


def parse_spec(text: str) -> KernelSpec:
    """Parse ``FAMILY:ISA:MRxNR[:kKR][:sSR]`` (e.g. ``f32:neon:6x16``) into a validated spec."""
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise SpecError(
            f"cannot parse kernel spec {text!r}; expected FAMILY:ISA:MRxNR[:kKR][:sSR], "
            f"e.g. f32:neon:6x16")
    kr = int(m["kr"]) if m["kr"] else None
    sr = int(m["sr"]) if m["sr"] else None
    return KernelSpec(m["family"], m["isa"], int(m["mr"]), int(m["nr"]), kr=kr, sr=sr).validate()
