"""Rendering: spec + layout + registers -> assembly text through a Jinja2 template.

One template per family x ISA (``templates/<family>_<isa>.S.j2``) serves every tile;
object-format differences (symbol prefix, ``.type``/``.size``, local-label prefix) are
handled by the shared macros in ``common.S.j2``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .. import __version__
from ..layout import lhs_layout_for, rhs_layout_for
from .regalloc import allocate
from .spec import ISAS, KernelSpec, SpecError, as_spec

__all__ = ["FORMATS", "Rendered", "symbol_for", "render", "generate", "template_layouts",
           "render_template"]

FORMATS = ("elf", "macho")
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"

# Bytes of one 128-bit granule: SVE and SME vector lengths are multiples of it.
VL_GRANULE = 16


def symbol_for(name: str, fmt: str) -> str:
    """Assembler-level symbol of a C function name in an object format."""
    _check_format(fmt)
    return "_" + name if fmt == "macho" else name


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SpecError(f"unknown object format {fmt!r}; use one of {', '.join(FORMATS)}")


@lru_cache(maxsize=1)
def _env() -> "jinja2.Environment":
    import jinja2       # here, not at import: the runtime (and the emulated guest) never renders
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False,
    )
    env.globals["ISAS"] = ISAS     # common.S.j2's arch macro reads the .arch line from the record
    env.globals["require"] = _require
    env.filters["ilog2"] = _ilog2
    env.filters["vl"] = _vl_units
    env.filters["pl"] = _pl_units
    env.filters["cntw"] = _cntw_units
    return env


def render_template(name: str, **context) -> str:
    """Render ``templates/<name>`` through the kernels' environment (the C sources beside the
    kernel templates: the plan driver, ...)."""
    return _env().get_template(name).render(**context)


def _require(cond, what: str) -> str:
    """Template guard: a layout fact the instruction sequence relies on (e.g. two fields
    adjacent for one ldp) must hold, else the template refuses instead of emitting wrong code."""
    if not cond:
        raise SpecError(f"template assumption does not hold for this layout: {what}")
    return ""


def _ilog2(v: int) -> int:
    """Shift amount of a power-of-two layout quantity (lsl/lsr operands)."""
    if v < 1 or v & (v - 1):
        raise SpecError(f"layout quantity {v} is not a power of two (used as a shift)")
    return v.bit_length() - 1


def _vl_units(nbytes: int) -> int:
    """Bytes of a granule layout (see template_layouts) in vector lengths (addvl, mul vl)."""
    if nbytes % VL_GRANULE:
        raise SpecError(f"{nbytes} bytes per {VL_GRANULE}-byte granule is not a whole number "
                        f"of vector lengths")
    return nbytes // VL_GRANULE


def _pl_units(nbytes: int) -> int:
    """Bytes of a granule layout in predicate lengths, VL/8 (addpl)."""
    if nbytes % (VL_GRANULE // 8):
        raise SpecError(f"{nbytes} bytes per {VL_GRANULE}-byte granule is not a whole number "
                        f"of predicate lengths")
    return nbytes // (VL_GRANULE // 8)


def _cntw_units(nbytes: int) -> int:
    """Bytes of a granule layout as a multiplier of cntw (words per vector; ``cntw x, all,
    mul #n`` is n * VL/4 bytes)."""
    if nbytes % (VL_GRANULE // 4):
        raise SpecError(f"{nbytes} bytes per {VL_GRANULE}-byte granule is not a whole number "
                        f"of VL/4")
    return nbytes // (VL_GRANULE // 4)


def template_layouts(spec: KernelSpec):
    """(RHS, LHS) layout objects a kernel template takes its offsets from (LHS None: unpacked
    f32 rows).  Fixed-width tiles get their concrete layouts.  VL-scaled tiles get the layouts
    at one 128-bit granule (vl = VL_GRANULE bytes): every size and offset of those layouts is
    proportional to the vector length, so the granule layout's byte count divided by 16 (filter
    ``vl``) or 2 (``pl``) is the same quantity in units the addvl/addpl/``mul vl`` operands take
    at every vector length."""
    vl = VL_GRANULE if spec.vl_scaled else None
    return rhs_layout_for(spec, 32, vl), lhs_layout_for(spec, 32, vl)


@dataclass(frozen=True)
class Rendered:
    spec: KernelSpec
    fmt: str
    symbol: str
    text: str


def save_plan(regs) -> list[tuple[tuple[str, ...], int]]:
    """Pair callee-saved registers (same kind) for stp/ldp; (names, sp offset) per store."""
    plan, off = [], 0
    for prefix, nums in (("x", regs.saved_x), ("d", regs.saved_d)):
        names = [f"{prefix}{r}" for r in nums]
        for i in range(0, len(names), 2):
            chunk = tuple(names[i:i + 2])
            plan.append((chunk, off))
            off += 8 * len(chunk)
    return plan


def render(spec: KernelSpec | str, fmt: str = "elf") -> Rendered:
    """Render ``spec`` (a KernelSpec or a spec string) for object format ``fmt``."""
    spec = as_spec(spec)
    _check_format(fmt)
    regs = allocate(spec)
    # Every byte offset and stride of the packed operands comes from their layout objects
    # (block-length dependent ones as the layout's per-block facts, combined with bl at run
    # time); templates hold no format literals.
    rhs, lhs = template_layouts(spec)
    template = _env().get_template(spec.template)
    sym = symbol_for(spec.name, fmt)
    text = template.render(
        spec=spec, R=regs, RHS=rhs, LHS=lhs, fmt=fmt, sym=sym, saves=save_plan(regs),
        lp=".L" if fmt == "elf" else "L", version=__version__,
    )
    return Rendered(spec=spec, fmt=fmt, symbol=sym, text=text)


ABI_PROBE = "tilegen_abi_call"


def render_abi_probe(fmt: str = "elf") -> str:
    """The ABI probe trampoline every library carries (see templates/abi_probe.S.j2)."""
    _check_format(fmt)
    return _env().get_template("abi_probe.S.j2").render(
        fmt=fmt, sym=symbol_for(ABI_PROBE, fmt), lp=".L" if fmt == "elf" else "L",
        version=__version__)


VL_QUERIES = ("tilegen_sve_vl_bytes", "tilegen_sme_svl_bytes", "tilegen_svcr")


def render_vl_query(fmt: str = "elf") -> str:
    """The vector-length and streaming-state queries every library carries."""
    _check_format(fmt)
    return _env().get_template("vl_query.S.j2").render(
        fmt=fmt, prefix="_" if fmt == "macho" else "", lp=".L" if fmt == "elf" else "L",
        version=__version__)


def generate(spec: KernelSpec | str, format: str = "elf") -> str:  # noqa: A002 - public API name
    """Assembly source of ``spec`` (a KernelSpec or a spec string such as ``f32:neon:6x16``) for object format ``format`` (``elf`` or ``macho``)."""
    return render(spec, format).text
