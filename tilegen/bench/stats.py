"""Repetitions until the median is known well enough: the stopping rule of ``tilegen bench``.

    measure(call, timer, rule)  -> Sample: warm-up, then timed samples until the 95 %
                                   confidence interval of the median is narrow enough
                                   (half-width / median <= rule.rel_ci, after rule.min_reps
                                   samples), or the time budget or rule.max_reps ends it

The confidence interval is distribution-free (order statistics of the sorted samples: ranks
n/2 -/+ 1.96 sqrt(n)/2), so one slow outlier widens it by one rank, not by its size.  A
sample is ``batch`` calls timed together (``batch`` chosen after the warm-up so that a sample
lasts at least ``rule.min_sample_ns``), divided by ``batch``.

Stdlib only: the guest imports it without numpy, and the tests drive it with a fake timer.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol

__all__ = ["Rule", "Reading", "Timer", "Sample", "median_ci", "measure", "rule_dict"]

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rule:
    rel_ci: float = 0.02            # stop when the CI half-width / median is at most this
    budget_s: float = 2.0           # ... or when this much time has been spent (warm-up included)
    min_reps: int = 5               # samples before the CI may stop the run
    max_reps: int = 1000
    warmup: int = 2                 # untimed calls first
    min_sample_ns: int = 200_000    # a sample lasts at least this long (calls are batched)


@dataclass(frozen=True)
class Reading:
    """One timed interval: nanoseconds, and core cycles when the timer counts them."""
    ns: float
    cycles: float | None = None


class Timer(Protocol):
    """What :func:`measure` needs of a clock (``tilegen.bench.clock`` has the real ones)."""
    counts_cycles: bool

    def now_ns(self) -> int: ...

    def time(self, fn: Callable[[], None], batch: int) -> Reading: ...


@dataclass
class Sample:
    """The per-call figures of one measurement (nanoseconds; cycles when counted)."""
    ns: list[float] = field(default_factory=list)
    cycles: list[float] = field(default_factory=list)
    batch: int = 1
    stop: str = ""                  # "ci" (converged), "budget" or "max_reps"

    @property
    def reps(self) -> int:
        return len(self.ns)

    def summary(self) -> dict:
        med, lo, hi = median_ci(self.ns)
        out = {"reps": self.reps, "batch": self.batch, "stop": self.stop,
               "median_ns": med, "ci95_ns": [lo, hi], "rel_ci": (hi - lo) / 2 / med if med else None,
               "min_ns": min(self.ns), "max_ns": max(self.ns),
               "iqr_ns": [_quantile(self.ns, 0.25), _quantile(self.ns, 0.75)],
               "median_cycles": median_ci(self.cycles)[0] if self.cycles else None}
        return out


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(s) - 1)
    return s[i] + (s[j] - s[i]) * (pos - i)


def median_ci(xs: list[float]) -> tuple[float, float, float]:
    """(median, low, high): the 95 % confidence interval of the median by order statistics
    (normal approximation of the binomial ranks, clipped to the sample)."""
    if not xs:
        raise ValueError("no samples")
    s = sorted(xs)
    n = len(s)
    med = _quantile(s, 0.5)
    half = Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 1)           # 1-based ranks
    hi = min(int(math.ceil(n / 2 + 1 + half)), n)
    return med, s[lo - 1], s[hi - 1]


def _converged(ns: list[float], rule: Rule) -> bool:
    if len(ns) < rule.min_reps:
        return False
    med, lo, hi = median_ci(ns)
    return med > 0 and (hi - lo) / 2 / med <= rule.rel_ci


def measure(call: Callable[[], None], timer: Timer, rule: Rule = Rule()) -> Sample:
    """Warm up, pick the batch, then time samples of ``call`` until :class:`Rule` stops."""
    start = timer.now_ns()
    for _ in range(rule.warmup):
        call()
    first = timer.time(call, 1)
    batch = max(1, math.ceil(rule.min_sample_ns / max(first.ns, 1.0)))
    out = Sample(batch=batch)
    deadline = start + rule.budget_s * 1e9
    while True:
        r = timer.time(call, batch)
        out.ns.append(r.ns / batch)
        if r.cycles is not None:
            out.cycles.append(r.cycles / batch)
        if _converged(out.ns, rule):
            out.stop = "ci"
        elif timer.now_ns() >= deadline and out.reps >= 1:
            out.stop = "budget"
        elif out.reps >= rule.max_reps:
            out.stop = "max_reps"
        if out.stop:
            return out


def rule_dict(rule: Rule) -> dict:
    return asdict(rule)
