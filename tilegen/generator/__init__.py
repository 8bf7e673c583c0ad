"""Kernel generator: specs, validation, register allocation, rendering."""
from ..records import FAMILIES, ISAS, SpecError
from .regalloc import allocate
from .render import FORMATS, generate, render, symbol_for
from .spec import KernelSpec
from .validate import as_spec, parse_spec, validate

__all__ = ["KernelSpec", "SpecError", "parse_spec", "as_spec", "validate", "FAMILIES", "ISAS",
           "allocate", "generate", "render", "symbol_for", "FORMATS"]
