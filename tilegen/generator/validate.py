"""Checking a kernel spec: whether the later stages can realise it.

:func:`validate` is the one check every caller that needs a checked spec runs (``parse_spec``,
``generate``, ``build_library``, the tuner, the CLI): first the preconditions the ISA and
family records state (:func:`check_records`: fixed interleave, ``:am`` support), then the
layouts' rules and the register file (the family's allocator).  A :class:`KernelSpec`
itself is a plain record; constructing one checks only its own fields.
"""
from __future__ import annotations

from ..records import SpecError
from .regalloc import allocate
from .spec import KernelSpec, parse_unchecked

__all__ = ["check_records", "validate", "parse_spec", "as_spec"]


def check_records(spec: KernelSpec) -> None:
    """Raise :class:`SpecError` unless the ISA and family records allow the spec's options:
    ``:am`` (``Isa.acc_mem`` and ``FamilyInfo.acc_mem``), ``:i16`` (``IsaImpl.lhs_i16_tiles``)
    and the interleave the instructions
    fix (``IsaImpl.fixed_kr``: kr and sr; ``IsaImpl.fixed_L``: kr/sr)."""
    impl = spec.impl
    if spec.acc_mem and not spec.isa_info.acc_mem:
        raise SpecError(f"acc_mem (f32 accumulators in memory) is a NEON q4 option; "
                        f"isa {spec.isa!r} has none")
    if spec.acc_mem and not spec.info.acc_mem:
        raise SpecError(f"acc_mem (f32 accumulators in memory) exists for the q4 families, "
                        f"not {spec.family!r}")
    if spec.lhs_i16 and f"{spec.mr_str}x{spec.nr_str}" not in impl.lhs_i16_tiles:
        have = ", ".join(impl.lhs_i16_tiles)
        raise SpecError(f":i16 (the LHS widened to int16) exists for {spec.family} {spec.isa} "
                        f"tiles {have}, not {spec.mr_str}x{spec.nr_str}" if have else
                        f":i16 (the LHS widened to int16) exists for no {spec.family} "
                        f"{spec.isa} kernel")
    if impl.fixed_kr and (spec.kr, spec.sr) != (impl.kr, impl.sr):
        need = (f"kr and sr must be {impl.kr}" if impl.kr == impl.sr else
                f"kr must be {impl.kr} and sr {impl.sr}")
        raise SpecError(f"{impl.fixed_kr}: {need} (got kr={spec.kr}, sr={spec.sr})")
    L = impl.kr // impl.sr
    if impl.fixed_L and spec.kr != L * spec.sr:
        raise SpecError(f"{impl.fixed_L}: kr/sr must be {L} (got kr={spec.kr}, sr={spec.sr})")


def validate(spec: KernelSpec) -> KernelSpec:
    """``spec`` if the records, the layouts and the register allocator accept it, else the
    :class:`SpecError` of the first rule it breaks."""
    if not isinstance(spec, KernelSpec):
        raise SpecError(f"expected a KernelSpec, got {spec!r}")
    check_records(spec)
    allocate(spec)
    return spec


def parse_spec(text: str) -> KernelSpec:
    """Parse ``FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am]`` (e.g. ``f32:neon:6x16``, ``f32:sve:6x4vl``,
    ``q4_0:i8mm:24x4:am``) into a validated spec; ``vl`` after mr or nr counts in vector-length
    units, ``:am`` keeps a q4 tile's f32 accumulators in memory (KernelSpec.acc_mem)."""
    return validate(parse_unchecked(text))


def as_spec(spec: KernelSpec | str) -> KernelSpec:
    """The validated spec of ``spec``: a KernelSpec, or a spec string (e.g. 'f32:neon:6x16')."""
    if isinstance(spec, str):
        return parse_spec(spec)
    if not isinstance(spec, KernelSpec):
        raise SpecError(f"expected a KernelSpec or a spec string (e.g. 'f32:neon:6x16'), "
                        f"got {spec!r}")
    return validate(spec)
