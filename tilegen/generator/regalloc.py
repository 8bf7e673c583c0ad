"""Register allocation: from a tile shape to named AArch64 registers.

The allocator is where tile-shape rules live: a tile is valid when its accumulators,
operand registers and pointers fit the register file.  Every refusal is a
:class:`SpecError` that names the budget and the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .spec import KernelSpec, SpecError

__all__ = ["VectorNeeds", "F32NeonRegs", "allocate", "NUM_VREGS"]

NUM_VREGS = 32
# Allocation orders: caller-saved registers first so that small tiles save nothing.
_V_ORDER = list(range(0, 8)) + list(range(16, 32)) + list(range(8, 16))
_V_CALLEE_SAVED = frozenset(range(8, 16))          # low 64 bits (d8-d15) are callee-saved
# x0-x7 carry arguments, x18 is the platform register (macOS), x29/x30 frame/link.
_X_ORDER = list(range(8, 18)) + list(range(19, 29))
_X_CALLEE_SAVED = frozenset(range(19, 29))


@dataclass(frozen=True)
class VectorNeeds:
    """Vector-register demand of a tile, by purpose (for messages and reports)."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{n} {what}" for what, n in self.parts)


class _Pool:
    def __init__(self, kind: str, order: list[int], budget_name: str) -> None:
        self.kind, self.free, self.budget_name = kind, list(order), budget_name
        self.used: list[int] = []

    def take(self, n: int) -> list[int]:
        if n > len(self.free):  # callers check budgets first; this is a safety net
            raise SpecError(f"out of {self.budget_name}")
        regs, self.free = self.free[:n], self.free[n:]
        self.used += regs
        return regs


@dataclass(frozen=True)
class F32NeonRegs:
    """Registers of the f32 NEON FMLA kernel (numbers; templates add the prefix)."""

    acc: tuple[tuple[int, ...], ...]     # acc[row][vec] holds dst[row][4*vec : 4*vec+4]
    lhs: tuple[int, ...]                  # one vector per row: 4 consecutive k values
    rhs: tuple[int, ...]                  # streamed RHS vectors (double-buffered)
    gpr: dict[str, int] = field(hash=False)   # named scalar registers
    lhs_ptr: tuple[int, ...] = ()         # one LHS row pointer per tile row
    saved_x: tuple[int, ...] = ()         # callee-saved GPRs the kernel uses
    saved_d: tuple[int, ...] = ()         # callee-saved d-registers the kernel uses
    needs: VectorNeeds = VectorNeeds(())

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])

    @property
    def frame_bytes(self) -> int:
        """Stack frame: saved registers + 16 bytes of clamp values, 16-byte aligned."""
        saved = 8 * (len(self.saved_x) + len(self.saved_d))
        return (saved + 16 + 15) // 16 * 16

    @property
    def clamp_offset(self) -> int:
        """sp offset of the two f32 clamp values (min, max)."""
        return 8 * (len(self.saved_x) + len(self.saved_d))


_F32_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_blk_stride", "dst_blk_stride")
_RHS_BUFFERS = 2


def _allocate_f32_neon(spec: KernelSpec) -> F32NeonRegs:
    mr, nr = spec.mr, spec.nr
    if nr % 4:
        raise SpecError(f"nr={nr} must be a multiple of 4 (one f32x4 vector per 4 columns)")
    if spec.kr != 1 or spec.sr != 1:
        raise SpecError(f"the f32 family reads f32p{nr}x1b panels: kr and sr must be 1 "
                        f"(got kr={spec.kr}, sr={spec.sr})")
    n_vec = nr // 4
    needs = VectorNeeds((("accumulators", mr * n_vec), ("LHS", mr), ("RHS", _RHS_BUFFERS)))
    if needs.total > NUM_VREGS:
        raise SpecError(f"mr={mr}, nr={nr} needs {needs.total} vector registers "
                        f"({needs.describe()}), {NUM_VREGS} exist")
    n_gpr = len(_F32_SCALARS) + mr
    if n_gpr > len(_X_ORDER):
        raise SpecError(f"mr={mr}, nr={nr} needs {n_gpr} general-purpose registers "
                        f"({len(_F32_SCALARS)} scalars + {mr} LHS row pointers), "
                        f"{len(_X_ORDER)} are free besides the arguments")
    vp = _Pool("v", _V_ORDER, "vector registers")
    rhs = vp.take(_RHS_BUFFERS)
    lhs = vp.take(mr)
    flat = vp.take(mr * n_vec)
    acc = tuple(tuple(flat[r * n_vec:(r + 1) * n_vec]) for r in range(mr))
    xp = _Pool("x", _X_ORDER, "general-purpose registers")
    gpr = dict(zip(_F32_SCALARS, xp.take(len(_F32_SCALARS))))
    lhs_ptr = tuple(xp.take(mr))
    return F32NeonRegs(
        acc=acc, lhs=tuple(lhs), rhs=tuple(rhs), gpr=gpr, lhs_ptr=lhs_ptr,
        saved_x=tuple(sorted(r for r in xp.used if r in _X_CALLEE_SAVED)),
        saved_d=tuple(sorted(r for r in vp.used if r in _V_CALLEE_SAVED)),
        needs=needs,
    )


_ALLOCATORS = {("f32", "neon"): _allocate_f32_neon}


def allocate(spec: KernelSpec):
    """Allocate registers for ``spec`` or raise :class:`SpecError` naming the violated rule."""
    try:
        fn = _ALLOCATORS[(spec.family, spec.isa)]
    except KeyError:
        raise SpecError(f"no register allocator for {spec.family}/{spec.isa}") from None
    return fn(spec)
