"""Declarative kernel specification: what a micro-kernel computes and on which ISA.

A :class:`KernelSpec` is the first stage of the flow (spec -> layout -> register
allocation -> template -> toolchain -> library): a plain record of the tile, with the facts
derived from it and from the ISA and family records (:mod:`tilegen.records`).  Whether the
later stages can realise it is :func:`tilegen.generator.validate.validate`'s question: the
rules come from the records, the layouts and the register allocator, not from a shape list.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..families import FAMILIES
from ..layout.registry import layout_class
from ..records import (ISAS, KR_MAX, TILE_MR_MAX, TILE_NR_MAX, TILE_VL_MAX,
                       FamilyInfo, Isa, IsaImpl, SpecError)

__all__ = ["KernelSpec", "parse_unchecked", "parse_tile"]


_BOUNDS = (f"mr <= {TILE_MR_MAX}, nr <= {TILE_NR_MAX} (<= {TILE_VL_MAX} in VL units), kr and sr "
           f"<= {KR_MAX}")


def _out_of_range(field: str, value: str, vl: bool = False) -> SpecError:
    shown = value if len(value) <= 24 else f"{value[:12]}...({len(value)} digits)"
    return SpecError(f"{field}={shown}{'vl' if vl else ''} is out of range: tiles have {_BOUNDS} "
                     f"(no register file holds more; taller q4/q8 tiles only repeat their register "
                     f"block)")


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
    # the LHS variant widened to int16 at pack time (spec suffix ``:i16``; the family's
    # ``IsaImpl.lhs_i16`` format, on the tiles of ``IsaImpl.lhs_i16_tiles``)
    lhs_i16: bool = False

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
        for field in ("mr_vl", "nr_vl", "acc_mem", "lhs_i16"):
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
    def lhs_stem(self) -> str:
        """The packed-LHS format (registry stem): the ``:i16`` variant's, the ISA's or the
        family's ``lhs``."""
        if self.lhs_i16:
            return self.impl.lhs_i16
        return self.impl.lhs or self.info.lhs

    @property
    def lhs_layout_class(self):
        """The packed-LHS layout class (:attr:`lhs_stem`), None for f32 rows."""
        if not self.packs_lhs:
            return None
        return layout_class("lhs", self.lhs_stem)

    @property
    def rhs_layout_class(self):
        """The packed-RHS layout class (the family's ``rhs`` format; the ISA's, or the tile's
        where its record names one: ``IsaImpl.rhs_tiles``)."""
        tile = dict(self.impl.rhs_tiles).get(f"{self.mr_str}x{self.nr_str}")
        return layout_class("rhs", tile or self.impl.rhs or self.info.rhs)

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
        if self.lhs_i16:
            s += ":i16"
        if self.acc_mem:
            s += ":am"
        return s

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
    rf"^(?P<family>[A-Za-z0-9_]+):(?P<isa>[a-z0-9_]+):{_TILE}"
    r"(?::k(?P<kr>\d+))?(?::s(?P<sr>\d+))?(?P<i16>:i16)?(?P<am>:am)?$")


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


def parse_unchecked(text: str) -> KernelSpec:
    """Parse ``FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am]`` (e.g. ``f32:neon:6x16``,
    ``f32:sve:6x4vl``, ``q4_0:i8mm:24x4:am``, ``q4_K:sme2:4vlx1vl:i16``) into a spec record, not
    yet validated (``tilegen.parse_spec`` is this followed by
    :func:`tilegen.generator.validate.validate`); ``vl`` after mr or nr counts in vector-length
    units, ``:i16`` reads the LHS widened to int16 (KernelSpec.lhs_i16), ``:am`` keeps a q4
    tile's f32 accumulators in memory (KernelSpec.acc_mem)."""
    m = _SPEC_RE.match(text.strip())
    if not m:
        raise SpecError(
            f"cannot parse kernel spec {text!r}; expected FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am], "
            f"e.g. f32:neon:6x16")
    kr = _num(m, "kr") if m["kr"] else None
    sr = _num(m, "sr") if m["sr"] else None
    mr, mr_vl, nr, nr_vl = _tile(m)
    return KernelSpec(m["family"], m["isa"], mr, nr, kr=kr, sr=sr, mr_vl=mr_vl, nr_vl=nr_vl,
                      acc_mem=bool(m["am"]), lhs_i16=bool(m["i16"]))
