"""The register file of one kernel: allocation orders, the pool with its tally, the shared
stack frame, and the first-fit search over row blocks every multi-row allocator runs.

Allocators take their registers from a :class:`RegisterPool`, which keeps the tally of what
was taken for what; a tile that does not fit is refused with that tally (a
:class:`~tilegen.records.SpecError` naming the budget and the numbers).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...records import SpecError
from ..spec import KernelSpec

__all__ = ["NUM_VREGS", "V_ORDER", "Z_LOW_FIRST", "X_ORDER", "SME_X_ORDER", "VectorNeeds",
           "RegisterPool", "Frame", "rows", "flatten", "row_blocks", "first_fit"]

NUM_VREGS = 32
# Allocation orders: caller-saved registers first so that small tiles save nothing.
V_ORDER = list(range(0, 8)) + list(range(16, 32)) + list(range(8, 16))
_V_CALLEE_SAVED = frozenset(range(8, 16))          # low 64 bits (d8-d15) are callee-saved
# Indexed (by-element) SVE operands must be z0-z7: that order hands them out first.
Z_LOW_FIRST = list(range(8)) + [r for r in V_ORDER if r >= 8]
# x0-x7 carry arguments, x18 is the platform register (macOS), x29/x30 frame/link.
X_ORDER = list(range(8, 18)) + list(range(19, 29))
_X_CALLEE_SAVED = frozenset(range(19, 29))
# SME templates index ZA with w8 (ZA-array vector select) and w12 (tile slice select): the
# allocator keeps those two out of the pool.
SME_X_ORDER = [r for r in X_ORDER if r not in (8, 12)]
_GPR_CHART = ("scalars", "LHS row pointers")


@dataclass(frozen=True)
class VectorNeeds:
    """Register demand of a tile, by purpose (for messages and reports): a bank's tally."""

    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)

    def describe(self) -> str:
        return " + ".join(f"{n} {what}" for what, n in self.parts)


class _Bank:
    """One register bank: hands registers out in its allocation order and keeps the tally of
    what each was taken for.  A take past the end still counts (the demand is what a refusal
    reports) and hands out numbers past the bank, which ``RegisterPool.refusal`` never lets
    reach a kernel."""

    def __init__(self, name: str, order: list[int], callee_saved: frozenset, chart: tuple[str, ...],
                 budget: str) -> None:
        self.name, self.order, self.callee_saved, self.budget = name, order, callee_saved, budget
        self.tally = dict.fromkeys(chart, 0)        # the chart fixes the order of the report
        self.used: list[int] = []
        self.misplaced: list[str | None] = []      # rules of operands taken outside their range
        self._next = 0

    def take(self, n: int, role: str, within: int | None = None, rule: str | None = None) -> list[int]:
        """``n`` fresh registers for ``role``; ``within``: they must be numbered below it (an
        indexed operand), ``rule`` the refusal if not (default: the vector tally's)."""
        idx = range(self._next, self._next + n)
        self._next += n
        regs = [self.order[i] if i < len(self.order) else 100 + i for i in idx]
        if within is not None and any(r >= within for r in regs):
            self.misplaced.append(rule)
        self._count(role, regs)
        return regs

    def reuse(self, held: list[int], n: int, role: str) -> list[int]:
        """``n`` registers for ``role`` in a later phase: the (dead by then) ``held`` ones
        first, fresh ones for the rest; only the fresh ones count."""
        return held[:n] + self.take(max(0, n - len(held)), role)

    def claim(self, regs, role: str, counted: bool = True) -> tuple[int, ...]:
        """Fixed registers a template's instruction forms dictate (ZA-array groups, z0-z15
        operands); ``counted=False`` keeps them out of the reported demand."""
        regs = tuple(regs)
        if set(regs) & set(self.used):
            raise AssertionError(f"{self.name}: {role} claims taken registers {regs}")
        if counted:
            self._count(role, regs)
        else:
            self.used += regs
        return regs

    def _count(self, role: str, regs) -> None:
        if role not in self.tally:
            raise AssertionError(f"{self.name}: {role!r} is not an account of this kernel")
        self.tally[role] += len(regs)
        self.used += regs

    @property
    def needs(self) -> VectorNeeds:
        return VectorNeeds(tuple((role, n) for role, n in self.tally.items() if n))

    @property
    def overdrawn(self) -> bool:
        return self._next > len(self.order)

    @property
    def saved(self) -> tuple[int, ...]:
        return tuple(sorted(set(r for r in self.used if r in self.callee_saved)))


class RegisterPool:
    """The register file of one kernel: a GPR bank ``x`` and a vector (V/Z) bank ``v``, each
    with its accounts (``chart``: the vector purposes, in report order).  Allocators take
    registers from the banks; ``refusal``/``settle``/``fits`` judge the tally, ``frame()`` gives
    the record's saved_x/saved_d (the callee-saved registers taken) and needs (the vector
    tally).  ``streaming``: SME kernels, which save all of d8-d15."""

    def __init__(self, chart: tuple[str, ...], *, v_order: list[int] = V_ORDER,
                 x_order: list[int] = X_ORDER, streaming: bool = False) -> None:
        self.v = _Bank("vector registers", v_order, _V_CALLEE_SAVED, chart,
                       f"{NUM_VREGS} exist")
        self.x = _Bank("general-purpose registers", x_order, _X_CALLEE_SAVED, _GPR_CHART,
                       f"{len(x_order)} are free besides the arguments")
        self.streaming = streaming

    def scalars(self, names: tuple[str, ...]) -> dict[str, int]:
        return dict(zip(names, self.x.take(len(names), "scalars")))

    def refusal(self, subject: str, note: str = "") -> SpecError | None:
        """None if the tally fits the register file, else the refusal: vector total, then the
        placement of indexed operands, then the GPR total."""
        v = self.v.needs
        rule = self.v.misplaced[0] if self.v.misplaced else None
        if self.v.overdrawn or (self.v.misplaced and rule is None):
            return SpecError(f"{subject} needs {v.total} vector registers ({v.describe()}), "
                             f"{self.v.budget}{note}")
        if rule is not None:
            return SpecError(rule)
        if self.x.overdrawn:
            x = self.x.needs
            return SpecError(f"{subject} needs {x.total} general-purpose registers "
                             f"({x.describe()}), {self.x.budget}")
        return None

    def settle(self, subject: str, note: str = "") -> None:
        err = self.refusal(subject, note)
        if err is not None:
            raise err

    @property
    def fits(self) -> bool:
        return not (self.v.overdrawn or self.v.misplaced or self.x.overdrawn)

    def frame(self) -> dict:
        """The fields every register record carries: callee-saved registers and the demand.
        Streaming mode clears the whole vector file: SME kernels save all of d8-d15."""
        return dict(saved_x=self.x.saved,
                    saved_d=tuple(range(8, 16)) if self.streaming else self.v.saved,
                    needs=self.v.needs)


class Frame:
    """Stack frame shared by the kernels' register records: saved registers + 16 bytes of
    clamp values."""

    @property
    def frame_bytes(self) -> int:
        """Bytes below the entry sp, 16-byte aligned (AAPCS64)."""
        saved = 8 * (len(self.saved_x) + len(self.saved_d))
        return (saved + 16 + 15) // 16 * 16

    @property
    def clamp_offset(self) -> int:
        """sp offset of the two f32 clamp values (min, max)."""
        return 8 * (len(self.saved_x) + len(self.saved_d))


def rows(flat: list[int], n: int) -> tuple[tuple[int, ...], ...]:
    """Consecutive runs of ``n`` registers: [row][vec] of a flat take."""
    return tuple(tuple(flat[i:i + n]) for i in range(0, len(flat), n))


def flatten(t) -> list[int]:
    """The register numbers of a nested tuple, in nesting order."""
    return [t] if isinstance(t, int) else [v for x in t for v in flatten(x)]


def row_blocks(spec: KernelSpec) -> list[int]:
    """Row counts a tile may compute at once, largest first: divisors of mr that are whole
    packed LHS row blocks (``spec.lhs_mr`` rows)."""
    P = spec.lhs_mr
    return [r for r in range(spec.mr, 0, -P) if spec.mr % r == 0 and r % P == 0]


def first_fit(spec: KernelSpec, attempt, note: str = "", sets: int = 1) -> dict:
    """The fields of a row-blocked register record: row blocks from the whole tile down to one
    packed LHS block (``P`` rows), the first whose pool fits; ``attempt(mr_reg)`` (and
    ``attempt(mr_reg, n)`` for ``n`` accumulator sets) gives ``(pool, fields)``.  Else the
    refusal from the smallest block's tally, naming the tile asked for and the block tried.

    ``sets`` > 1 (gemv, one-row LHS blocks): the most independent accumulator sets, ``sets``
    down to 2, that still fit (one set if none does)."""
    P = spec.lhs_mr
    for mr_reg in row_blocks(spec):
        pool, fields = attempt(mr_reg)
        if pool.fits:
            break
    else:
        block = (f"mr={P}," if spec.mr == P else
                 f"a block of {P} of its {spec.mr} rows (the smallest block tried) with")
        raise pool.refusal(f"tile {spec.mr_str}x{spec.nr_str}: {block} nr={spec.nr_str}", note)
    if P == 1:
        for n in range(sets, 1, -1):
            more, more_fields = attempt(mr_reg, n)
            if more.fits:
                pool, fields = more, more_fields
                break
    return dict(mr_reg=mr_reg, lhs_mr=P, groups=mr_reg // P, **fields, **pool.frame())
