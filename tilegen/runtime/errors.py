"""The runtime's two error types: one for calls, one for loading."""
from __future__ import annotations

__all__ = ["ArgumentError", "LoadError"]


class ArgumentError(TypeError, ValueError):
    """A kernel or op was called with an argument it cannot take (dtype, shape, size, ...),
    or on a CPU without the kernel's features."""


class LoadError(RuntimeError):
    """A library directory or packed-weights file is missing, does not match its manifest or
    checksum, or cannot run here."""
