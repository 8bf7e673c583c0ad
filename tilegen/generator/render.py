"""Rendering: spec + layout + registers -> assembly text through a Jinja2 template.

One template per family x ISA (``templates/<family>_<isa>.S.j2``) serves every tile;
object-format differences (symbol prefix, ``.type``/``.size``, local-label prefix) are
handled by the shared macros in ``common.S.j2``.  The C and CMake text of the KleidiAI export
(``templates/export/``) is rendered by the same environment (:func:`render_template`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ..records import ISAS, VL_GRANULE, SpecError, __version__
from .regalloc import allocate
from .spec import KernelSpec
from .tile_layouts import template_layouts
from .validate import as_spec

__all__ = ["FORMATS", "TEMPLATE_DIR", "Rendered", "symbol_for", "check_format", "template_env",
           "render", "template_context", "generate", "template_layouts", "render_template"]

FORMATS = ("elf", "macho")
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


def symbol_for(name: str, fmt: str) -> str:
    """Assembler-level symbol of a C function name in an object format."""
    check_format(fmt)
    return "_" + name if fmt == "macho" else name


def check_format(fmt: str) -> None:
    """Refuse an object format tilegen does not write."""
    if fmt not in FORMATS:
        raise SpecError(f"unknown object format {fmt!r}; use one of {', '.join(FORMATS)}")


@lru_cache(maxsize=1)
def template_env() -> "jinja2.Environment":
    """The Jinja2 environment of every template (kernels, packers, probes): its globals and
    filters are what templates may call."""
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


def render_template(path: str, /, **context) -> str:
    """Render the template ``path`` (relative under ``templates/``, e.g. the C and CMake text of
    ``tilegen export kleidiai`` under ``templates/export/``) in the kernels' environment: the
    same whitespace rules, StrictUndefined, globals and filters."""
    return template_env().get_template(path).render(**context)


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
    context = template_context(spec, fmt)
    text = template_env().get_template(spec.template).render(**context)
    return Rendered(spec=spec, fmt=fmt, symbol=context["sym"], text=text)


def template_context(spec: KernelSpec | str, fmt: str = "elf") -> dict:
    """What a kernel's template reads (spec, registers ``R``, layouts ``RHS``/``LHS``, object
    format, symbol, callee-saved plan, label prefix, version): :func:`render` passes it to the
    family's template; a template extending it (tests/data/templates/) renders with the same."""
    spec = as_spec(spec)
    check_format(fmt)
    regs = allocate(spec)
    # Every byte offset and stride of the packed operands comes from their layout objects
    # (block-length dependent ones as the layout's per-block facts, combined with bl at run
    # time); templates hold no format literals.
    rhs, lhs = template_layouts(spec)
    return dict(spec=spec, R=regs, RHS=rhs, LHS=lhs, fmt=fmt, sym=symbol_for(spec.name, fmt),
                saves=save_plan(regs), lp=".L" if fmt == "elf" else "L", version=__version__)


ABI_PROBE = "tilegen_abi_call"


def render_abi_probe(fmt: str = "elf") -> str:
    """The ABI probe trampoline every library carries (see templates/abi_probe.S.j2)."""
    check_format(fmt)
    return template_env().get_template("abi_probe.S.j2").render(
        fmt=fmt, sym=symbol_for(ABI_PROBE, fmt), lp=".L" if fmt == "elf" else "L",
        version=__version__)


VL_QUERIES = ("tilegen_sve_vl_bytes", "tilegen_sme_svl_bytes", "tilegen_svcr")


def render_vl_query(fmt: str = "elf") -> str:
    """The vector-length and streaming-state queries every library carries."""
    check_format(fmt)
    return template_env().get_template("vl_query.S.j2").render(
        fmt=fmt, prefix="_" if fmt == "macho" else "", lp=".L" if fmt == "elf" else "L",
        version=__version__)


def generate(spec: KernelSpec | str, format: str = "elf") -> str:  # noqa: A002 - public API name
    """Assembly source of ``spec`` (a KernelSpec or a spec string such as ``f32:neon:6x16``) for object format ``format`` (``elf`` or ``macho``)."""
    return render(spec, format).text
