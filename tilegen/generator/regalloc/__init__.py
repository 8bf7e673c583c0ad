"""Register allocation: from a tile shape to named AArch64 registers.

The allocator is where tile-shape rules live: a tile is valid when its accumulators,
operand registers and pointers fit the register file.  :mod:`.pool` holds the register file
(allocation orders, the tally, the stack frame, the first fit over row blocks); each family
module allocates its kernels and lists them in its ``ALLOCATORS``, keyed by the allocator
names the family records give (``IsaImpl.allocator``); the family plugins name the modules
(``ALLOCATOR_MODULES`` in :mod:`tilegen.families`: a plain name is a module of this package, a
dotted one a module of its own, e.g. a K-quant plugin's ``tilegen.families.q4_k.regalloc``,
which sits in this stage), so this registry has no list of its own.
"""
from __future__ import annotations

import importlib
from functools import lru_cache

from ...families import ALLOCATOR_MODULES, FAMILIES
from ...records import SpecError
from ..spec import KernelSpec
from .f32 import F32FmaRegs, Sme2GemvRegs, SmeF32Regs
from .pool import NUM_VREGS, RegisterPool, VectorNeeds
from .q4 import Q4Regs
from .q4_sme import Q4SmeRegs
from .q8 import Q8Regs

__all__ = ["VectorNeeds", "RegisterPool", "F32FmaRegs", "SmeF32Regs", "Sme2GemvRegs",
           "Q4Regs", "Q4SmeRegs", "Q8Regs", "ALLOCATORS", "allocate", "NUM_VREGS"]


def _registry(names) -> dict:
    """The allocators of the modules ``names`` (the family plugins' ``ALLOCATOR_MODULES``: a
    module of this package, or a dotted module path); every allocator a family record names
    must be among them."""
    out: dict = {}
    for name in names:
        m = importlib.import_module(name if "." in name else f"{__name__}.{name}")
        taken = set(out) & set(m.ALLOCATORS)
        if taken:
            raise TypeError(f"{m.__name__} registers allocators another module has: {taken}")
        out.update(m.ALLOCATORS)
    missing = {impl.allocator for fam in FAMILIES.values() for impl in fam.impls.values()} - set(out)
    if missing:
        raise TypeError(f"allocators {sorted(missing)} of the family records are in no module of "
                        f"the plugins' ALLOCATOR_MODULES")
    return out


# allocator name (``IsaImpl.allocator`` of the family records) -> function, from the regalloc
# modules the family plugins name (tilegen.families.ALLOCATOR_MODULES)
ALLOCATORS = _registry(ALLOCATOR_MODULES)


@lru_cache(maxsize=1024)        # specs are immutable; render and validate ask for the same one
def allocate(spec: KernelSpec):
    """The registers of ``spec`` or a :class:`SpecError` naming the violated rule.  The spec
    is one :func:`tilegen.generator.validate.validate` accepts or is checking: the records'
    preconditions (fixed interleave, ``:am``) are the validator's, not repeated here."""
    if not isinstance(spec, KernelSpec):
        raise SpecError(f"expected a KernelSpec (tilegen.parse_spec reads spec strings), "
                        f"got {spec!r}")
    try:
        fn = ALLOCATORS[spec.impl.allocator]
    except KeyError:
        raise SpecError(f"no register allocator {spec.impl.allocator!r} for "
                        f"{spec.family}/{spec.isa}") from None
    return fn(spec)
