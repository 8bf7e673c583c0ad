"""The plan driver's C source (``tilegen_driver.c`` of every library), rendered from
``templates/driver.c.j2`` with the driver's ABI tables of :mod:`tilegen.callconv` (constants,
structs: the runtime's ctypes mirror, :mod:`tilegen.runtime.driver`, checks them at load) and
the calling conventions there (the kernel and packer calls)."""
from __future__ import annotations

from ..callconv import ABIS, C_TYPES, CONSTANTS, PACKER_ABIS, STRUCTS, Abi
from ..generator.render import render_template

__all__ = ["source", "driver_kinds", "TEMPLATE", "WIDTH"]

TEMPLATE = "driver.c.j2"
WIDTH = 95      # columns of a wrapped function-pointer type


def driver_kinds(abis) -> list[Abi]:
    """The first convention of each driver kind; the others of a kind must take the same C
    types and roles (the driver passes them the same values)."""
    first: dict[str, Abi] = {}
    for a in abis:
        f = first.setdefault(a.driver_kind, a)
        if (f.ctypes, f.roles) != (a.ctypes, a.roles):
            raise ValueError(f"calling conventions {f.name} and {a.name} share driver kind "
                             f"{a.driver_kind} but not their argument types and roles")
    return list(first.values())


def _fn_type(abi: Abi) -> str:
    """``typedef void (*<driver_fn>)(size_t, ...);`` in lines of at most WIDTH columns, the
    continuation lines under the first argument type."""
    head = f"typedef void (*{abi.driver_fn})("
    types = [t.replace("*", " *") for t in abi.ctypes]
    lines, line = [], head
    for i, t in enumerate(types):
        item = t + (");" if i == len(types) - 1 else ",")
        if line == head:
            line += item
        elif len(line) + 1 + len(item) > WIDTH:
            lines.append(line)
            line = " " * len(head) + item
        else:
            line += " " + item
    return "\n".join(lines + [line])


def source() -> str:
    """The driver's freestanding C source (no libc, no headers)."""
    return render_template(TEMPLATE, CONSTANTS=CONSTANTS, STRUCTS=STRUCTS, C_TYPES=C_TYPES,
                           KERNEL_KINDS=driver_kinds(ABIS.values()),
                           PACKER_ABIS=driver_kinds(PACKER_ABIS.values()), fn_type=_fn_type)
