"""Rendering: spec + layout + registers -> assembly text through a Jinja2 template.

One template per family x ISA (``templates/<family>_<isa>.S.j2``) serves every tile;
object-format differences (symbol prefix, ``.type``/``.size``, local-label prefix) are
handled by the shared macros in ``common.S.j2``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from .. import __version__
from ..layout import lhs_layout_for, rhs_layout_for
from .regalloc import allocate
from .spec import ISAS, KernelSpec, SpecError, as_spec

__all__ = ["FORMATS", "Rendered", "symbol_for", "render", "generate"]

FORMATS = ("elf", "macho")
TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"


def symbol_for(name: str, fmt: str) -> str:
    """Assembler-level symbol of a C function name in an object format."""
    _check_format(fmt)
    return "_" + name if fmt == "macho" else name


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise SpecError(f"unknown object format {fmt!r}; use one of {', '.join(FORMATS)}")


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined, autoescape=False,
    )
    env.globals["ISAS"] = ISAS     # common.S.j2's arch macro reads the .arch line from the record
    return env


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
    # q4 templates walk their (block-length dependent) layouts sequentially and take no
    # constants from the layout object; the f32 template reads its panel geometry from it.
    # VL-scaled kernels compute their strides at run time (addvl, cntw); none from a layout.
    layout = rhs_layout_for(spec) if spec.family == "f32" and not spec.vl_scaled else None
    lhs_layout = None
    if spec.family == "q8_0":    # every offset and stride of the q8 template comes from these
        layout, lhs_layout = rhs_layout_for(spec), lhs_layout_for(spec)
    template = _env().get_template(spec.template)
    sym = symbol_for(spec.name, fmt)
    text = template.render(
        spec=spec, R=regs, L=layout, LL=lhs_layout, fmt=fmt, sym=sym, saves=save_plan(regs),
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
