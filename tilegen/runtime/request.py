"""One matmul request, checked: the arguments ``lib.matmul`` and ``lib.plan`` share.

:class:`Request` checks the weights, bias, clamp and thread count once (``matmul``: per call,
``plan``: when the plan is made), then each x and out against them, and applies what follows
the kernels (a bias given here, then the clamp).  The activation limit of quantised LHS
formats (:func:`check_activations`) is one rule for ``ops`` and the plan's checked path, and
:func:`activation_error` the one message, the native driver's refusals included."""
from __future__ import annotations

import math

import numpy as np

from .checks import clamp_pair, thread_count
from .errors import ArgumentError
from .packed import PackedLayouts, PackedWeights
from .threads import default_threads

__all__ = ["Request", "check_weights", "check_activations", "activation_error"]

INF = math.inf


def check_weights(weights) -> None:
    if not isinstance(weights, (PackedWeights, PackedLayouts)):
        raise ArgumentError(f"weights must be PackedWeights or PackedLayouts (see lib.pack_weights), "
                            f"got {type(weights).__name__}")
    if isinstance(weights, PackedWeights) and weights.experts is not None:
        raise ArgumentError(f"weights are an expert stack ({weights.experts} experts): use "
                            f"lib.matmul_experts, or one expert, weights.expert(e)")


class Request:
    """``matmul(x, weights, bias, clamp, threads)`` without x: its arguments, checked.

    ``bias`` (float32 of shape (n,)) is added after the kernels, then the clamp applied
    (:meth:`finish`); the kernels then run unclamped (``kcmin``, ``kcmax``).  ``copy_bias``:
    keep a copy of the bias (a plan outlives the caller's array)."""

    def __init__(self, weights, bias=None, clamp=None, threads: int | None = None, *,
                 copy_bias: bool = False) -> None:
        check_weights(weights)
        self.weights = weights
        self.n, self.k = weights.n, weights.k
        if bias is not None:
            b = np.asarray(bias)
            if b.dtype != np.float32 or b.shape != (self.n,):
                raise ArgumentError(f"bias must be float32 of shape ({self.n},), "
                                    f"got {b.dtype} {b.shape}")
            bias = np.array(b, dtype=np.float32, copy=True, order="C") if copy_bias else b
        self.bias = bias
        self.threads = default_threads() if threads is None else thread_count(threads)
        self.clamp = clamp_pair(clamp)
        # no clamp: Inf and NaN pass
        self.cmin, self.cmax = (-INF, INF) if self.clamp is None else self.clamp
        # the kernels' clamp (a bias given here is added after the kernels, then clamped)
        self.kcmin, self.kcmax = (self.cmin, self.cmax) if bias is None else (-INF, INF)

    @property
    def datas(self) -> tuple:
        """The weights' byte arrays (one per packing)."""
        w = self.weights
        return w.datas if isinstance(w, PackedLayouts) else (w.data,)

    def rows(self, x, whose: str = "packed weights") -> tuple[tuple, int]:
        """(leading shape, rows) of ``x``: float32 of shape (..., rows, k), at least one row."""
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise ArgumentError(f"x must be a float32 numpy array, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim < 2:
            raise ArgumentError(f"x must have shape (m, k) or (..., m, k), got {x.shape}")
        if x.shape[-1] != self.k:
            raise ArgumentError(f"x has k={x.shape[-1]}, {whose} have k={self.k}")
        lead = x.shape[:-1]
        rows = math.prod(lead)
        if rows == 0:
            raise ArgumentError(f"x has no rows (shape {x.shape})")
        return lead, rows

    def output(self, out, lead: tuple, x) -> np.ndarray | None:
        """The result array for x of leading shape ``lead``: ``out`` checked (a new array when
        None), or None when ``out`` shares memory with x, the bias or the weights (the kernels
        read those while they write out: compute apart, then copy)."""
        shape = (*lead, self.n)
        if out is None:
            return np.empty(shape, dtype=np.float32)
        if not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.float32 \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ArgumentError(f"out must be a writeable C-contiguous float32 array of shape "
                                f"{shape}")
        if any(a is not None and np.shares_memory(out, a) for a in (x, self.bias, *self.datas)):
            return None
        return out

    def finish(self, dst: np.ndarray) -> None:
        """What follows the kernels: ``dst += bias``, then the clamp (only with a bias: without
        one the kernels clamp)."""
        if self.bias is not None:
            dst += self.bias
            if self.clamp is not None:
                np.minimum(np.maximum(dst, np.float32(self.cmin), out=dst),
                           np.float32(self.cmax), out=dst)


def check_activations(kind: str, limit, x2: np.ndarray) -> None:
    """ArgumentError unless every |x| <= the LHS format's activation limit (``(bound, why)``;
    None: no limit)."""
    if limit is not None:
        amax = float(np.abs(x2).max())      # NaN when x has a NaN
        if not amax <= limit[0]:
            raise activation_error(kind, limit, x2)


def activation_error(kind: str, limit, x2: np.ndarray) -> ArgumentError:
    amax = float(np.abs(x2).max())
    return ArgumentError(f"{kind} activations must be finite with |x| <= {limit[0]:g} "
                         f"({limit[1]}); got max |x| = {amax:g}")
