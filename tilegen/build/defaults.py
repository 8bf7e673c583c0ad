"""The default kernels of a build target: its tuned kernels first, then DEFAULT_KERNELS."""
from __future__ import annotations

import os

from ..generator.spec import KernelSpec
from ..generator.validate import parse_spec
from ..records import ISAS
from .targets import DEFAULT_KERNELS, Target, TargetError
from .tuned import tuned_specs

__all__ = ["default_specs"]


def default_specs(target: Target, isas: list[str] | None = None,
                  tuned_dir: str | os.PathLike | None = None) -> list[KernelSpec]:
    """The default kernels the target can run, optionally only those of ``isas``.

    The target's tuned kernels (``tilegen tune --write``, see :mod:`tilegen.build.tuned`; read
    from ``tuned_dir``, else ``$TILEGEN_TUNED_DIR``, else the package) come first, then
    DEFAULT_KERNELS; a kernel name appears once (its first occurrence wins)."""
    for isa in isas or ():
        if isa not in ISAS:
            raise TargetError(f"unknown isa {isa!r}; known: {', '.join(ISAS)}")
    specs = tuned_specs(target, tuned_dir) + [parse_spec(s) for s in DEFAULT_KERNELS]
    seen: set[str] = set()
    out = []
    for s in specs:
        if target.supports(s) and (not isas or s.isa in isas) and s.name not in seen:
            seen.add(s.name)
            out.append(s)
    return out
