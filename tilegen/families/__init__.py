"""The weight families: one plugin module per family, and the one registry every client reads.

A plugin is a module of this package (``f32``, ``q4_0``, ``q8_0``, ``q4_k``, ``q6_k``,
``bf16``); the registry finds every module here (a new family is one new module, no list to
edit) and orders them by their ``ORDER``.  What a plugin holds (module attributes):

=====================  ===================================================================
``ORDER``              its place in the registry (the order of :data:`FAMILIES`, the CLI
                       help, the tuner's families and the default kernels)
``RECORDS``            its :class:`~tilegen.records.FamilyInfo` records (formats, ISA
                       realisations with template and allocator names, kinds, ABI)
``LAYOUTS``            the packed layout classes it brings (on the shared bases of
                       :mod:`tilegen.layout`), registered in :mod:`tilegen.layout.registry`
``ALLOCATOR_MODULES``  the modules that define the allocators its records name: a module
                       of :mod:`tilegen.generator.regalloc` by name, or by dotted path the
                       plugin's own (a plugin package's ``regalloc`` submodules, in the
                       regalloc stage: K-quant families)
``DEFAULT_KERNELS``    its default kernels (spec strings; a target keeps those its
                       features run, :func:`tilegen.build.defaults.default_specs`)
``pack``               the one packing protocol the runtime calls:
                       ``pack(layout, kind, w, from_ggml, n, k, bias, order)`` -> packed
                       bytes, refusing (LayoutError) what the family cannot take
``SERVES_FIRST``       optional: kind -> its families whose kernels serve that kind before
                       the kind's own family (where the CPU runs them)
``GGML_TYPES``         optional: GGUF tensor type name -> runtime kind
``LLAMA_KERNELS``      optional: (isa, gemm tile, gemv tile) the llama.cpp patch wires
``C_PACKERS``          optional: the export's C packers of the family (name -> builder)
``LLAMA_QUANTIZE``     optional: llama-quantize types (ftype, lower case) whose files the
                       llama.cpp check runs on the patched build, -> their logit tolerance
                       (max|d| / rms, docs/llama_cpp_check.md), e.g. ``{"q4_k_m": 0.08}``
``LLAMA_QUANTIZE_ARGS`` optional: how llama-quantize makes a type of ``LLAMA_QUANTIZE`` that
                       is no ftype of its own: type -> (ftype, options before the file names),
                       e.g. ``{"mxfp4": ("Q8_0", ("--tensor-type", "weight=mxfp4"))}``
                       (default: the type upper-cased, no options)
``LLAMA_MOE``          optional: the types whose variant of the mixture-of-experts model the
                       llama.cpp check runs (``moe_<type>``: the synthetic model's own
                       q4_0/q8_0, else llama-quantize's ftype ``<type>`` upper-cased) -> their
                       tolerance, None: that of the dense type (``LLAMA_QUANTIZE``, or the
                       check's own for q4_0/q8_0), e.g. ``{"q4_k_m": None}``
=====================  ===================================================================

Stage order: the plugins import the shared bases (records, callconv, layout bases,
reference/f32); this registry is imported by the dispatchers above them (layout registry,
the allocator registry, the generator, runtime, export, gguf, analysis).
"""
from __future__ import annotations

import importlib
import pkgutil

from ..callconv import Abi
from ..records import FamilyInfo

__all__ = ["PLUGINS", "FAMILIES", "KIND_FAMILY", "KIND_FAMILIES", "FLOAT_KINDS", "GGML_KINDS", "GGML_BLOCKS",
           "GGML_TYPES", "KQUANT_FAMILIES", "DEFAULT_KERNELS", "LAYOUTS", "ALLOCATOR_MODULES", "LLAMA_KERNELS",
           "C_PACKERS", "LLAMA_QUANTIZE", "LLAMA_QUANTIZE_ARGS", "LLAMA_MOE", "plugin", "rhs_layout_class", "abi_for", "pack"]


def _discover() -> tuple:
    mods = [importlib.import_module(f"{__name__}.{m.name}")
            for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")]
    return tuple(sorted(mods, key=lambda m: (m.ORDER, m.__name__)))


#: the plugin modules, in registry order
PLUGINS: tuple = _discover()

FAMILIES: dict[str, FamilyInfo] = {}
_PLUGIN_OF: dict[str, object] = {}
for _p in PLUGINS:
    for _rec in _p.RECORDS:
        if _rec.name in FAMILIES:
            raise TypeError(f"family {_rec.name!r} of {_p.__name__} is taken by "
                            f"{_PLUGIN_OF[_rec.name].__name__}")
        FAMILIES[_rec.name] = _rec
        _PLUGIN_OF[_rec.name] = _p

#: weight kind -> the family that consumes it (FamilyInfo.kinds)
KIND_FAMILY: dict[str, str] = {kind: fam.name for fam in FAMILIES.values() for kind in fam.kinds}
#: the families whose kernels serve a kind, in order: a kind's table lists the pairs of each
#: family in turn, so the first family whose kernels the CPU runs wins (a plugin's
#: ``SERVES_FIRST`` puts its families before the kind's own, e.g. bf16 kernels for f16 weights)
KIND_FAMILIES: dict[str, tuple[str, ...]] = {
    kind: tuple(f for p in PLUGINS for f in getattr(p, "SERVES_FIRST", {}).get(kind, ())) + (fam,)
    for kind, fam in KIND_FAMILY.items()}
#: kinds of the float families (the quantised ones take ggml blocks: GGML_BLOCKS below)
FLOAT_KINDS = tuple(k for f in FAMILIES.values() if not f.quantized for k in f.kinds)
#: GGUF tensor type name -> runtime weight kind
GGML_TYPES: dict[str, str] = {t: kind for p in PLUGINS for t, kind in getattr(p, "GGML_TYPES", {}).items()}
#: every family's default kernels, family by family
DEFAULT_KERNELS: tuple[str, ...] = tuple(s for p in PLUGINS for s in p.DEFAULT_KERNELS)
#: the layout classes the families bring
LAYOUTS: tuple[type, ...] = tuple(c for p in PLUGINS for c in p.LAYOUTS)
#: the register-allocator modules (tilegen.generator.regalloc.<name>) the records name
ALLOCATOR_MODULES: tuple[str, ...] = tuple(dict.fromkeys(m for p in PLUGINS for m in p.ALLOCATOR_MODULES))
#: family -> (isa, gemm tile, gemv tile) of the llama.cpp patch
LLAMA_KERNELS: dict[str, tuple] = {p.RECORDS[0].name: p.LLAMA_KERNELS for p in PLUGINS
                                   if hasattr(p, "LLAMA_KERNELS")}
#: llama-quantize type (lower case) -> tolerance of the llama.cpp check, family by family
LLAMA_QUANTIZE: dict[str, float] = {t: tol for p in PLUGINS
                                    for t, tol in getattr(p, "LLAMA_QUANTIZE", {}).items()}
#: llama-quantize type -> (ftype, options) for the types that are no ftype of their own
LLAMA_QUANTIZE_ARGS: dict[str, tuple[str, tuple[str, ...]]] = {
    t: args for p in PLUGINS for t, args in getattr(p, "LLAMA_QUANTIZE_ARGS", {}).items()}
#: type -> tolerance (None: the dense type's) of the mixture-of-experts variants the llama.cpp
#: check runs ("moe_<type>"), family by family
LLAMA_MOE: dict[str, float | None] = {t: tol for p in PLUGINS
                                      for t, tol in getattr(p, "LLAMA_MOE", {}).items()}
#: export C packer name -> builder, family by family
C_PACKERS: dict[str, object] = {n: b for p in PLUGINS for n, b in getattr(p, "C_PACKERS", {}).items()}


def plugin(family: str):
    """The plugin module of ``family`` (a family name of :data:`FAMILIES`)."""
    return _PLUGIN_OF[family]


def rhs_layout_class(family: str) -> type:
    """The packed-RHS layout class of ``family``'s record (its ``rhs`` format), from the
    classes the plugins bring (the K-quant references take it: tilegen.reference.kquant)."""
    fmt = FAMILIES[family].rhs
    return next(c for c in LAYOUTS if c.role == "rhs" and c.format == fmt)


#: the kinds with a ggml block form (from_ggml=) -> (ggml block type, k values per block): the
#: blocks the ``pack_from_ggml`` of the family's RHS layout reads (its class's ``ggml_block``)
GGML_BLOCKS: dict[str, tuple[str, int]] = {
    kind: rhs_layout_class(f.name).ggml_block for f in FAMILIES.values() for kind in f.kinds
    if rhs_layout_class(f.name).ggml_block is not None}
GGML_KINDS = tuple(GGML_BLOCKS)
#: the K-quant families: those whose kernels read Q8_K-style activations (``q8kp``) by 256-k
#: super-blocks (benches and reports that treat them apart read this, not a list of names)
KQUANT_FAMILIES: tuple[str, ...] = tuple(f.name for f in FAMILIES.values() if f.lhs == "q8kp")


def abi_for(family: str) -> Abi:
    """The calling convention of ``family``'s kernels (its record's ``abi``)."""
    return FAMILIES[family].abi


def pack(family: str, lay, kind: str, w, from_ggml, n: int, k: int, bias, order: str):
    """Packed bytes of weights of ``kind`` in layout object ``lay`` (of a ``family`` kernel):
    the family plugin's packing protocol.  ``w``: weights in ``order`` ("nk"/"kn"; the
    quantised families take them as (n, k)), or ggml blocks ``from_ggml`` of n rows of k."""
    return _PLUGIN_OF[family].pack(lay, kind, w, from_ggml, n, k, bias, order)
