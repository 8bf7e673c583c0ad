"""Kernel generator: specs, validation, register allocation, rendering."""
from .spec import KernelSpec, SpecError, parse_spec, FAMILIES, ISAS
from .regalloc import allocate
from .render import generate, render, symbol_for, FORMATS

__all__ = ["KernelSpec", "SpecError", "parse_spec", "FAMILIES", "ISAS", "allocate",
           "generate", "render", "symbol_for", "FORMATS"]
