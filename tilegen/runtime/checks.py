"""Argument checks shared by the kernel bindings and the ops: one function per rule."""
from __future__ import annotations

import math
import numbers
import operator
import os

import numpy as np

from .cpu import CpuInfo, detect
from .errors import ArgumentError

__all__ = ["check_matrix", "row_stride", "check_bytes", "positive_int", "thread_count",
           "clamp_bounds", "clamp_pair", "require_features", "env_int"]


def check_matrix(name: str, a, rows: int | None = None, cols: int | None = None,
                 writeable: bool = False) -> np.ndarray:
    """``a`` as a kernel reads it: 2-D float32, non-empty, contiguous rows, 4-byte aligned."""
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise ArgumentError(f"{name} must be float32, got {a.dtype}")
    if a.ndim != 2:
        raise ArgumentError(f"{name} must be 2-D, got shape {a.shape}")
    if rows is not None and a.shape[0] != rows:
        raise ArgumentError(f"{name} has {a.shape[0]} rows, expected {rows}")
    if cols is not None and a.shape[1] != cols:
        raise ArgumentError(f"{name} has {a.shape[1]} columns, expected {cols}")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ArgumentError(f"{name} must not be empty, got shape {a.shape}")
    if a.shape[1] > 1 and a.strides[1] != 4:
        raise ArgumentError(f"{name} rows must be contiguous (column stride 4 bytes), "
                            f"got strides {a.strides}")
    if a.shape[0] > 1 and (a.strides[0] < 4 * a.shape[1] or a.strides[0] % 4):
        raise ArgumentError(f"{name} row stride {a.strides[0]} must be a positive multiple of 4 "
                            f">= {4 * a.shape[1]} bytes")
    if not a.flags.aligned:
        raise ArgumentError(f"{name} is not 4-byte aligned")
    if writeable and not a.flags.writeable:
        raise ArgumentError(f"{name} is read-only")
    return a


def row_stride(a: np.ndarray) -> int:
    """Bytes between rows of a checked matrix (a single row: its own length)."""
    return int(a.strides[0]) if a.shape[0] > 1 else 4 * a.shape[1]


def check_bytes(name: str, buf, need: int) -> np.ndarray:
    """``buf`` as packed bytes: a contiguous 1-D uint8 array of at least ``need`` bytes."""
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
            or not buf.flags.c_contiguous:
        raise ArgumentError(f"{name} must be a contiguous 1-D uint8 array (or PackedWeights)")
    if buf.nbytes < need:
        raise ArgumentError(f"{name} has {buf.nbytes} bytes, the call needs {need}")
    return buf


def _integral(v) -> int | None:
    """``v`` as an int if it is integral (int, numpy integer, ``__index__``), not bool."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def positive_int(name: str, v, minimum: int = 1) -> int:
    """An integral argument >= ``minimum`` (bool and floats refused)."""
    n = _integral(v)
    if n is None or n < minimum:
        what = {0: "a non-negative int", 1: "a positive int"}.get(minimum, f"an int >= {minimum}")
        raise ArgumentError(f"{name} must be {what}, got {v!r}")
    return n


# more threads than this is a mistake (a typo in threads= or TILEGEN_THREADS), not a request
MAX_THREADS = 4096


def thread_count(threads) -> int:
    """threads=: an integral from 1 to MAX_THREADS."""
    n = positive_int("threads", threads)
    if n > MAX_THREADS:
        raise ArgumentError(f"threads must be at most {MAX_THREADS}, got {n}")
    return n


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))


def clamp_bounds(clamp_min, clamp_max) -> tuple[float, float]:
    """Kernel clamp bounds as floats: numbers, not NaN, min <= max (infinities allowed)."""
    if not (_is_number(clamp_min) and _is_number(clamp_max)):
        raise ArgumentError(f"clamp values must be numbers, got {clamp_min!r}, {clamp_max!r}")
    cmin, cmax = float(clamp_min), float(clamp_max)
    if math.isnan(cmin) or math.isnan(cmax):
        raise ArgumentError("clamp values must not be NaN")
    if cmin > cmax:
        raise ArgumentError(f"clamp min {cmin} > max {cmax}")
    return cmin, cmax


def clamp_pair(clamp) -> tuple[float, float] | None:
    """matmul's clamp=: None (no clamp) or a (min, max) pair of numbers."""
    if clamp is None:
        return None
    form = "clamp must be a (min, max) pair of numbers or None"
    try:
        lo, hi = clamp
    except (TypeError, ValueError):
        raise ArgumentError(f"{form}, got {clamp!r}") from None
    if not (_is_number(lo) and _is_number(hi)):
        raise ArgumentError(f"{form}, got {clamp!r}")
    return clamp_bounds(lo, hi)


def require_features(what: str, name: str, features: frozenset, cpu: CpuInfo | None) -> None:
    """ArgumentError unless the CPU (after TILEGEN_ISA / TILEGEN_SME) has ``features``."""
    have = (cpu or detect()).features
    missing = sorted(features - have)
    if missing:
        raise ArgumentError(f"{what} {name} needs {', '.join(missing)}, which this CPU lacks "
                            f"(features: {', '.join(sorted(have)) or 'none'}; TILEGEN_ISA and "
                            f"TILEGEN_SME restrict them)")


def env_int(name: str, lo: int, hi: int, what: str = "") -> int | None:
    """Environment variable ``name`` as an integer from lo to hi (None: unset or blank);
    anything else is ArgumentError (``what``: what the number is, for the message)."""
    env = os.environ.get(name)
    if env is None or env.strip() == "":
        return None
    try:
        v = int(env.strip(), 10)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise ArgumentError(f"{name} must be an integer from {lo} to {hi}{what}, got {env!r}")
    return v
