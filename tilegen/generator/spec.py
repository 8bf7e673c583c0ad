"""Declarative kernel specification: what a micro-kernel computes and on which ISA.

A :class:`KernelSpec` is the first stage of the flow (spec -> layout -> register
allocation -> template -> toolchain -> library).  It carries no layout or register
knowledge itself; :meth:`KernelSpec.validate` asks the later stages whether they can
realise it, so the rules come from the register allocator, not from a shape list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SpecError", "KernelSpec", "TILE_MR_MAX", "TILE_NR_MAX", "TILE_VL_MAX", "KR_MAX", "Isa", "ISAS", "IsaImpl", "FamilyInfo", "FAMILIES", "parse_spec",
           "parse_tile", "as_spec"]


class SpecError(ValueError):
    """A kernel specification that cannot be generated; the message names the rule."""


# Upper bounds on the spec's numbers, checked before any register is counted so that a huge
# tile is refused at once.  No register-resident tile comes near them (the largest accepted:
# mr 20, nr 116, 16 VL units, kr 32); q4/q8 tiles taller than their register block run it in
# passes, so a taller mr only restates the m step (KleidiAI's consumers take m steps <= 64).
TILE_MR_MAX = 64
TILE_NR_MAX = 128
TILE_VL_MAX = 16        # mr or nr in VL units
KR_MAX = 64             # kr and sr
_BOUNDS = (f"mr <= {TILE_MR_MAX}, nr <= {TILE_NR_MAX} (<= {TILE_VL_MAX} in VL units), kr and sr "
           f"<= {KR_MAX}")


def _out_of_range(field: str, value: str, vl: bool = False) -> SpecError:
    shown = value if len(value) <= 24 else f"{value[:12]}...({len(value)} digits)"
    return SpecError(f"{field}={shown}{'vl' if vl else ''} is out of range: tiles have {_BOUNDS} "
                     f"(no register file holds more; taller q4/q8 tiles only repeat their register "
                     f"block)")


@dataclass(frozen=True)
class Isa:
    """Everything tilegen knows about one instruction set: the one record per ISA."""

    name: str
    features: tuple[str, ...]       # CPU features the kernels need (tilegen.runtime.cpu names)
    arch: str                       # assembler ``.arch`` line
    rank: int                       # runtime preference: lower first
    vl_kind: str | None = None      # scalable: which vector length scales tiles ("sve": cntb,
    #                                 "sme": streaming, rdsvl); None: fixed 128-bit vectors
    acc_mem: bool = False           # q4 tiles may keep f32 accumulators in memory (":am")
    mattr: str = ""                 # llvm-mca -mattr features of this ISA's instructions

    @property
    def scalable(self) -> bool:
        return self.vl_kind is not None


_SVE_ARCH = "armv9-a+sve2+i8mm+dotprod"
_SME_ARCH = "armv9-a+sme2+sve2+i8mm"
ISAS: dict[str, Isa] = {i.name: i for i in (
    Isa("sme2", ("sme", "sme2"), _SME_ARCH, 0, "sme"),
    Isa("sme", ("sme",), _SME_ARCH, 1, "sme"),
    Isa("sve2", ("sve", "sve2"), _SVE_ARCH, 2, "sve", mattr="+sve,+sve2"),
    Isa("sve", ("sve",), _SVE_ARCH, 3, "sve", mattr="+sve"),
    # int8 dot product / matrix multiply on Z registers: SVE plus the NEON feature
    Isa("sve_i8mm", ("sve", "i8mm"), _SVE_ARCH, 4, "sve", mattr="+sve,+i8mm"),
    Isa("sve_dotprod", ("sve", "dotprod"), _SVE_ARCH, 5, "sve", mattr="+sve,+dotprod"),
    # FMLAL (FEAT_FHM, in every Armv8.4+ core with FP16, so in every i8mm core): the q4_0
    # kernels' scale products; the runtime reports i8mm only with it (runtime/cpu.py)
    Isa("i8mm", ("neon", "i8mm"), "armv8.6-a+dotprod+i8mm+fp16fml", 6, acc_mem=True,
        mattr="+neon,+i8mm,+fp16fml"),
    Isa("dotprod", ("neon", "dotprod"), "armv8.2-a+dotprod", 7, acc_mem=True,
        mattr="+neon,+dotprod"),
    Isa("neon", ("neon",), "armv8-a", 8, acc_mem=True, mattr="+neon"),
    # Armv8.6 bf16 on NEON registers: BFMMLA (2x4 by 4x2 bf16 products), BFDOT
    Isa("bf16", ("neon", "bf16"), "armv8.6-a+bf16", 9, mattr="+neon,+bf16"),
)}


@dataclass(frozen=True)
class IsaImpl:
    """How one family is realised on one ISA: name suffix, default interleave, template and
    register allocator (``templates/<template>.S.j2``, ``regalloc.ALLOCATORS[allocator]``)."""

    op: str                          # ISA/instruction suffix of the kernel name
    template: str
    allocator: str
    kr: int = 1                      # kr / sr when the spec gives none
    sr: int = 1
    gemv_op: str | None = None       # gemv tiles (mr == 1) with a strategy of their own
    gemv_template: str | None = None
    lhs: str | None = None           # layout formats of this ISA when not the family's
    rhs: str | None = None


@dataclass(frozen=True)
class FamilyInfo:
    """The one record per operation family."""

    name: str
    lhs: str                        # packed-LHS layout format (tilegen.layout.registry stem),
    #                                 for kernels that pack their LHS (KernelSpec.packs_lhs)
    rhs: str                        # packed-RHS layout format (registry stem)
    impls: dict[str, IsaImpl]       # isa -> realisation
    kinds: tuple[str, ...]          # runtime weight kinds the family consumes
    quantized: bool = False
    packs_lhs: bool = False         # unquantized LHS packed by the kernel's own layout (mr rows
    #                                 per row block; bf16: f32 rows rounded to bf16)

    @property
    def isas(self) -> tuple[str, ...]:
        return tuple(self.impls)


def _q4_family(name: str, lhs: str, rhs: str) -> FamilyInfo:
    """The int4 x int8 families share ISAs, templates, allocators and default interleave."""
    def q4(op: str, strategy: str, kr: int, allocator: str | None = None) -> IsaImpl:
        return IsaImpl(op, strategy, allocator or strategy, kr=kr, sr=2)
    return FamilyInfo(
        name=name, lhs=lhs, rhs=rhs, kinds=(name,), quantized=True,
        impls={"neon": q4("neon", "q4_neon", 8), "dotprod": q4("neon_dotprod", "q4_neon", 8),
               "i8mm": q4("neon_i8mm", "q4_neon", 16),
               "sve_dotprod": q4("sve_dotprod", "q4_sve", 8),
               "sve_i8mm": q4("sve_i8mm", "q4_sve", 16),
               "sme": q4("sme_mopa", "q4_sme", 8),
               "sme2": q4("sme2_sdot", "q4_sve", 8, allocator="q4_sme2")},
    )


FAMILIES: dict[str, FamilyInfo] = {
    # f32 GEMM: NEON/SVE FMLA, SME FMOPA outer products (SME2: multi-vector loads and the
    # ZA-array FMLA gemv).
    "f32": FamilyInfo(
        name="f32", lhs="f32p", rhs="f32p", kinds=("f32", "f16"),
        impls={"neon": IsaImpl("neon_mla", "f32_neon", "f32_neon"),
               "sve": IsaImpl("sve_mla", "f32_sve", "f32_sve"),
               "sme": IsaImpl("sme_mopa", "f32_sme", "f32_sme"),
               "sme2": IsaImpl("sme2_mopa", "f32_sme", "f32_sme2", gemv_op="sme2_mla",
                               gemv_template="f32_sme2_gemv")},
    ),
    # llama.cpp's q4_0 path: LHS per-32-block symmetric int8 (f16 scale), RHS int4 from
    # ggml block_q4_0 with f16 scales (KleidiAI matmul_clamp_f32_qsi8d32p_qsi4c32p).
    "q4_0": _q4_family("q4_0", "qsi8d32p", "qsi4c32pscalef16"),
    # q4_0 on KleidiAI's SME2 layouts (llama.cpp's SME2 gemv operands): LHS qsi8d32p with
    # the scales behind the values, RHS qsi4c32ps1s0scalef16 (k-adjacent nibble pairs, zero
    # point 8: the LUTI4 unpack); no runtime weight kind of its own.
    "q4_0_s1s0": FamilyInfo(
        name="q4_0_s1s0", lhs="qsi8d32pscaletail", rhs="qsi4c32ps1s0scalef16", kinds=(),
        quantized=True,
        impls={"sme2": IsaImpl("sme2_mopa", "q4_sme2_luti4_mopa", "q4_sme2_luti4", kr=4, sr=1,
                               gemv_op="sme2_luti4", gemv_template="q4_sme2_luti4")}),
    # LHS per-row asymmetric int8, RHS int4 per 32-block with bf16 scales, row sums and bias
    # (KleidiAI matmul_clamp_f32_qai8dxp_qsi4c32p).
    "q4_0_dx": _q4_family("q4_0_dx", "qai8dxp", "qsi4c32p"),
    # ggml Q8_0 weights requantised per channel: LHS per-row asymmetric int8, RHS int8 with an
    # f32 scale, row sum and bias per column (KleidiAI matmul_clamp_f32_qai8dxp_qsi8cxp).
    "q8_0": FamilyInfo(
        name="q8_0", lhs="qai8dxp", rhs="qsi8cxp", kinds=("q8_0",), quantized=True,
        impls={"neon": IsaImpl("neon", "q8_neon", "q8_neon", kr=8, sr=1),
               "dotprod": IsaImpl("neon_dotprod", "q8_neon", "q8_neon", kr=4, sr=1),
               "i8mm": IsaImpl("neon_i8mm", "q8_neon", "q8_neon", kr=8, sr=1),
               "sve_dotprod": IsaImpl("sve_dotprod", "q8_sve", "q8_sve", kr=4, sr=1),
               "sve_i8mm": IsaImpl("sve_i8mm", "q8_sve", "q8_sve", kr=8, sr=1),
               "sme": IsaImpl("sme_mopa", "q8_sme", "q8_sme", kr=4, sr=1),
               "sme2": IsaImpl("sme2_sdot", "q8_sve", "q8_sme2", kr=4, sr=1)},
    ),
    # f32 activations and weights rounded to bf16, f32 accumulation (KleidiAI
    # matmul_clamp_f32_bf16p<mr>x4_bf16p<nr>x4b): BFMMLA gemm, BFDOT gemv on the same RHS.
    "bf16": FamilyInfo(
        name="bf16", lhs="bf16px4", rhs="bf16px4b", kinds=("bf16",), packs_lhs=True,
        impls={"bf16": IsaImpl("neon_mmla", "bf16_neon", "bf16_neon", kr=4, sr=1,
                               gemv_op="neon_dot"),
               # BFMOPA into ZA f32 tiles on KleidiAI's bf16p<vl>x2 / bf16p<vl>x2b layouts
               "sme2": IsaImpl("sme2_mopa", "bf16_sme", "bf16_sme2", kr=2, sr=1,
                               lhs="bf16px2", rhs="bf16px2b")},
    ),
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
    mr_vl: bool = False     # mr is a multiple of the vector length (``"2vl"``: 2 x VL/32 bits)
    nr_vl: bool = False     # nr likewise (one VL unit = as many 32-bit lanes as a vector has)
    # q4 multi-row tiles: the f32 accumulators live in the stack frame between blocks (one load
    # and one store per output vector and k-block), so that more rows fit the registers at once
    # (spec suffix ``:am``, name suffix ``_am``).  Default off: the KleidiAI register tiles.
    acc_mem: bool = False

    def __post_init__(self) -> None:
        fam = FAMILIES.get(self.family)
        if fam is None:
            raise SpecError(f"unknown family {self.family!r}; known: {', '.join(sorted(FAMILIES))}")
        if self.isa not in ISAS:
            raise SpecError(f"unknown isa {self.isa!r}; known: {', '.join(ISAS)}")
        if self.isa not in fam.isas:
            raise SpecError(
                f"family {self.family!r} has no template for isa {self.isa!r}; "
                f"available: {', '.join(fam.isas)}")
        if self.kr is None:
            object.__setattr__(self, "kr", fam.impls[self.isa].kr)
        if self.sr is None:
            object.__setattr__(self, "sr", fam.impls[self.isa].sr)
        for field in ("mr", "nr", "kr", "sr"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"{field} must be an int, got {v!r}")
            if v < 1:
                raise SpecError(f"{field} must be >= 1, got {field}={v}")
        for field in ("mr_vl", "nr_vl", "acc_mem"):
            if not isinstance(getattr(self, field), bool):
                raise SpecError(f"{field} must be a bool, got {getattr(self, field)!r}")
        for field, vl in (("mr", self.mr_vl), ("nr", self.nr_vl), ("kr", False), ("sr", False)):
            v = getattr(self, field)
            if v > (TILE_VL_MAX if vl else TILE_MR_MAX if field == "mr" else
                    TILE_NR_MAX if field == "nr" else KR_MAX):
                raise _out_of_range(field, str(v), vl)
        isa = ISAS[self.isa]
        if isa.scalable and not self.nr_vl:
            raise SpecError(f"{self.isa} kernels are vector-length agnostic: give nr in VL units "
                            f"(e.g. {self.mr}x4vl), got nr={self.nr}")
        if self.acc_mem and not isa.acc_mem:
            raise SpecError(f"acc_mem (f32 accumulators in memory) is a NEON q4 option; "
                            f"isa {self.isa!r} has none")
        if self.acc_mem and not self.info.quantized:
            raise SpecError(f"acc_mem (f32 accumulators in memory) exists for the q4 families, "
                            f"not {self.family!r}")
        if not isa.scalable and (self.mr_vl or self.nr_vl):
            raise SpecError(f"{self.isa} vectors have a fixed length: mr/nr in VL units need "
                            f"sve, sme or sme2")

    # -- derived facts -------------------------------------------------------------
    @property
    def info(self) -> FamilyInfo:
        return FAMILIES[self.family]

    @property
    def isa_info(self) -> Isa:
        return ISAS[self.isa]

    @property
    def impl(self) -> IsaImpl:
        """How the family is realised on this ISA (template, allocator, name suffix)."""
        return self.info.impls[self.isa]

    @property
    def features(self) -> tuple[str, ...]:
        """CPU features required to run the kernel."""
        return ISAS[self.isa].features

    @property
    def is_gemv(self) -> bool:
        """One-row tiles (mr == 1, not in VL units): the kernels for m = 1."""
        return self.mr == 1 and not self.mr_vl

    @property
    def template(self) -> str:
        """Template file name (``templates/``) that renders this kernel."""
        impl = self.impl
        return ((impl.gemv_template if self.is_gemv and impl.gemv_template else impl.template)
                + ".S.j2")

    # -- vector-length scaling ----------------------------------------------------------
    @property
    def vl_scaled(self) -> bool:
        """Whether the tile (and so packed sizes, offsets, steps) depends on the VL."""
        return self.mr_vl or self.nr_vl

    @property
    def vl_kind(self) -> str | None:
        """Which vector length scales the tile: ``"sve"`` (cntb), ``"sme"`` (streaming, rdsvl)."""
        if not self.vl_scaled:
            return None
        return ISAS[self.isa].vl_kind

    def mr_at(self, vl_bytes: int | None = None) -> int:
        """Rows of the tile on a CPU whose (relevant) vector length is ``vl_bytes``."""
        return self.mr * _vl_units(self, vl_bytes) if self.mr_vl else self.mr

    def nr_at(self, vl_bytes: int | None = None) -> int:
        """Columns of the tile on a CPU whose vector length is ``vl_bytes``."""
        return self.nr * _vl_units(self, vl_bytes) if self.nr_vl else self.nr

    @property
    def m_step(self) -> int:
        """Rows per step; VL-scaled tiles need :meth:`mr_at` with the CPU's vector length."""
        return self.mr_at()

    @property
    def n_step(self) -> int:
        return self.nr_at()

    @property
    def mr_str(self) -> str:
        return f"{self.mr}vl" if self.mr_vl else str(self.mr)

    @property
    def nr_str(self) -> str:
        return f"{self.nr}vl" if self.nr_vl else str(self.nr)

    @property
    def packs_f32_lhs(self) -> bool:
        """f32 kernels whose LHS is packed (SME outer products read k-major row blocks)."""
        return self.family == "f32" and ISAS[self.isa].vl_kind == "sme" and self.mr_vl

    @property
    def L(self) -> int:
        """Interleave chunk in elements (KleidiAI's kr/sr)."""
        return self.kr // self.sr

    @property
    def lhs_mr(self) -> int:
        """Rows interleaved in one packed LHS row block (quantized families: 1 for gemv tiles,
        else 4; bf16 and f32 SME: mr; tiles with mr in VL units: mr itself, in VL units -- see
        :meth:`lhs_mr_at`)."""
        if not self.info.quantized:
            return self.mr if self.packs_f32_lhs or self.info.packs_lhs else 1
        if self.mr_vl:
            return self.mr
        return 1 if self.mr == 1 else 4

    def lhs_mr_at(self, vl_bytes: int | None = None) -> int:
        """Rows of one packed LHS row block on a CPU with this vector length."""
        if self.mr_vl:
            return self.mr_at(vl_bytes)
        return self.lhs_mr

    @property
    def lhs_mr_str(self) -> str:
        """:attr:`lhs_mr` as kernel names write it (``"2vl"`` in VL units)."""
        return f"{self.lhs_mr}vl" if self.mr_vl else str(self.lhs_mr)

    @property
    def packs_lhs(self) -> bool:
        """Whether the kernel reads a packed LHS (quantized families and bf16 always, f32 on
        SME outer products) rather than plain f32 rows."""
        return self.info.quantized or self.info.packs_lhs or self.packs_f32_lhs

    @property
    def lhs_layout_class(self):
        """The packed-LHS layout class (the family's ``lhs`` format), None for f32 rows."""
        if not self.packs_lhs:
            return None
        from ..layout.registry import layout_class   # later stage: the layouts own the names
        return layout_class("lhs", self.impl.lhs or self.info.lhs)

    @property
    def rhs_layout_class(self):
        """The packed-RHS layout class (the family's ``rhs`` format)."""
        from ..layout.registry import layout_class
        return layout_class("rhs", self.impl.rhs or self.info.rhs)

    @property
    def lhs_format(self) -> str:
        """Packed LHS label (the layout's, e.g. ``qsi8d32p4x8``); ``f32`` for plain rows."""
        cls = self.lhs_layout_class
        if cls is None:
            return "f32"                 # unpacked rows: the element type, as for dst
        return cls.label_for(self.lhs_mr_str, self.kr, self.sr)

    @property
    def rhs_format(self) -> str:
        """Packed RHS label (the layout's, e.g. ``f32p16x1b`` or ``qsi4c32p4x8``)."""
        return self.rhs_layout_class.label_for(self.nr_str, self.kr, self.sr)

    @property
    def name(self) -> str:
        """Kernel name, KleidiAI grammar:
        ``matmul_clamp_<dst>_<lhs>_<rhs>_<mr>x<nr>_<isa>_<op>``."""
        impl = self.impl
        op = impl.gemv_op if self.is_gemv and impl.gemv_op else impl.op
        return (f"matmul_clamp_f32_{self.lhs_format}_{self.rhs_format}_"
                f"{self.mr_str}x{self.nr_str}_{op}" + ("_am" if self.acc_mem else ""))

    @property
    def spec_string(self) -> str:
        s = f"{self.family}:{self.isa}:{self.mr_str}x{self.nr_str}"
        if self.kr != self.impl.kr or self.sr != self.impl.sr:
            s += f":k{self.kr}:s{self.sr}"
        if self.acc_mem:
            s += ":am"
        return s

    def validate(self) -> "KernelSpec":
        """Raise :class:`SpecError` unless layout and register allocation accept the tile."""
        from .regalloc import allocate  # later stage; imported lazily to keep the flow one-way

        allocate(self)
        return self

    def __str__(self) -> str:
        return self.spec_string


def _vl_units(spec: KernelSpec, vl_bytes: int | None) -> int:
    if vl_bytes is None:
        raise SpecError(f"{spec.name}: the tile is in vector-length units; its size needs the "
                        f"CPU's {spec.vl_kind} vector length (mr_at/nr_at with vl_bytes)")
    if isinstance(vl_bytes, bool) or not isinstance(vl_bytes, int) or vl_bytes < 16 \
            or vl_bytes > 256 or vl_bytes % 16:
        raise SpecError(f"vector length must be 16..256 bytes in steps of 16, got {vl_bytes!r}")
    return vl_bytes // 4


_TILE = r"(?P<mr>\d+)(?P<mrvl>vl)?x(?P<nr>\d+)(?P<nrvl>vl)?"
_TILE_RE = re.compile(f"^{_TILE}$")
_SPEC_RE = re.compile(
    rf"^(?P<family>[a-z0-9_]+):(?P<isa>[a-z0-9_]+):{_TILE}"
    r"(?::k(?P<kr>\d+))?(?::s(?P<sr>\d+))?(?P<am>:am)?$")


def _num(m: re.Match, field: str, vl: bool = False) -> int:
    """The number of a spec string's field; refused before conversion when it has more digits
    than any bound (int() of thousands of digits is slow, and refused past 4300)."""
    text = m[field]
    if len(text.lstrip("0")) > 6:
        raise _out_of_range(field, text, vl)
    return int(text)


def _tile(m: re.Match) -> tuple[int, bool, int, bool]:
    return (_num(m, "mr", bool(m["mrvl"])), bool(m["mrvl"]), _num(m, "nr", bool(m["nrvl"])),
            bool(m["nrvl"]))


def parse_tile(text: str) -> tuple[int, bool, int, bool]:
    """Parse the tile of a spec string, ``MRxNR`` with ``vl`` after mr or nr for VL units
    (``6x16``, ``4x4vl``, ``1vlx4vl``), into ``(mr, mr_vl, nr, nr_vl)``."""
    m = _TILE_RE.match(text)
    if not m:
        raise SpecError(f"cannot parse tile {text!r}; expected MRxNR with optional vl units, "
                        f"e.g. 6x16, 4x4vl, 1vlx4vl")
    return _tile(m)


def parse_spec(text: str) -> KernelSpec:
    """Parse ``FAMILY:ISA:MRxNR[:kKR][:sSR][:am]`` (e.g. ``f32:neon:6x16``, ``f32:sve:6x4vl``,
    ``q4_0:i8mm:24x4:am``) into a validated spec; ``vl`` after mr or nr counts in vector-length
    units, ``:am`` keeps a q4 tile's f32 accumulators in memory (KernelSpec.acc_mem)."""
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise SpecError(
            f"cannot parse kernel spec {text!r}; expected FAMILY:ISA:MRxNR[:kKR][:sSR][:am], "
            f"e.g. f32:neon:6x16")
    kr = _num(m, "kr") if m["kr"] else None
    sr = _num(m, "sr") if m["sr"] else None
    mr, mr_vl, nr, nr_vl = _tile(m)
    return KernelSpec(m["family"], m["isa"], mr, nr, kr=kr, sr=sr, mr_vl=mr_vl, nr_vl=nr_vl,
                      acc_mem=bool(m["am"])).validate()


def as_spec(spec: "KernelSpec | str") -> KernelSpec:
    """``spec`` itself, or the parsed and validated spec of a spec string."""
    if isinstance(spec, str):
        return parse_spec(spec)
    if not isinstance(spec, KernelSpec):
        raise SpecError(f"expected a KernelSpec or a spec string (e.g. 'f32:neon:6x16'), "
                        f"got {spec!r}")
    return spec
