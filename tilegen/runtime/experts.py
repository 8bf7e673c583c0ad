"""Mixture-of-experts matmuls: ``lib.matmul_experts`` and its prepared form
``lib.plan_experts`` -- what ggml's MUL_MAT_ID computes, on an expert stack
(``lib.pack_weights`` of (E, n, k) weights, :class:`~tilegen.runtime.packed.PackedWeights`
with ``experts`` set).

For x of shape (tokens, k) or (tokens, slots, k) and ``ids`` (tokens, n_used) -- the experts
each token picked, distinct within a token -- the result is (tokens, n_used, n): row (t, u) is
x[t, u % slots] @ W[ids[t, u]].T, as ggml broadcasts b over the slots (slots divides n_used;
(tokens, k) is one slot).  With ``weights`` (tokens, n_used) float32 it is (tokens, n): the
sum over u of weights[t, u] * row (t, u), in float32, products first, then added in slot
order (u = 0, 1, ...), as llama.cpp's MoE FFN multiplies then adds the expert views.

How: the (token, slot) rows routed to each expert are gathered (token order), each group's
activations quantised and packed once, the expert's kernel (the gemv for a group of at most
``gemv_threshold`` rows, else the gemm, or its entry's large-m gemm past ``large_from`` rows:
the kernel ``lib.matmul`` picks for that many rows)
run on its slice of the stack, and the rows scattered back.  Work is split over threads as
tasks of experts x chunks of m_step rows (packing) and experts x chunks of n_step columns
(kernels), each expert cut into chunks in proportion to its rows, so one busy expert does not
serialise the call; the tasks are dealt to ``threads`` bundles (longest first) on the library's
worker pool (:mod:`tilegen.runtime.threads`).  Each output element is computed by one kernel
call on the same inputs as ``lib.matmul(x_gathered, stack.expert(e))`` computes it: the
result is bit-identical to that, for every thread count.
"""
from __future__ import annotations

import math

import numpy as np

from .checks import positive_int, thread_count
from .errors import ArgumentError
from .ops import kernel_tasks, lhs_tasks
from .packed import PackedWeights
from .select import row_op
from .threads import default_threads, run_parallel, split

__all__ = ["ExpertsPlan", "matmul_experts"]

_INF = math.inf


def check_stack(experts) -> None:
    """ArgumentError unless ``experts`` is an expert stack."""
    if not isinstance(experts, PackedWeights) or experts.experts is None:
        what = (f"PackedWeights of one matrix ({experts.kind} n={experts.n} k={experts.k})"
                if isinstance(experts, PackedWeights) else type(experts).__name__)
        raise ArgumentError(f"experts must be an expert stack (lib.pack_weights of (E, n, k) "
                            f"weights, or ggml blocks (E, n, row bytes)), got {what}")


class ExpertsPlan:
    """A prepared ``matmul_experts(x, experts, ids, weights, threads)`` for one shape: x of
    shape (tokens, k) (``slots=None``) or (tokens, slots, k), ids (tokens, n_used).

    Made once: the checks of the stack and the thread count, ``adopt`` (a stack in a layout
    no runnable kernel reads is repacked here, once), the gemv and gemm kernels and the gemv
    threshold (taken from the library's table now: a later ``set_table`` does not change
    them).  ``plan(x, ids)`` / ``plan(x, ids, weights)``: each call checks x, ids and weights
    against the planned shape and groups the rows by expert (the ids change per call); the
    result is bit-identical to ``lib.matmul_experts`` with the same arguments.  The calls run
    as tasks on the library's worker pool through checked ctypes calls; a group of one row
    (decode) or of every token that is one task runs through a per-expert one-thread
    ``lib.plan`` (one native call) instead.  After ``lib.close()`` a call raises
    ArgumentError."""

    def __init__(self, lib, experts, tokens: int, n_used: int, slots: int | None = None,
                 threads: int | None = None, *, native: bool = True) -> None:
        lib.ensure_open()
        check_stack(experts)
        self.lib = lib
        self.tokens = positive_int("tokens", tokens)
        self.n_used = positive_int("n_used", n_used)
        if slots is not None:
            slots = positive_int("slots", slots)
            if self.n_used % slots:
                raise ArgumentError(f"slots={slots} must divide n_used={self.n_used} (x's slot "
                                    f"of pick u is u % slots, as ggml broadcasts it)")
        self.slots = slots
        if self.n_used > experts.experts:
            raise ArgumentError(f"n_used={self.n_used} picks per token, but the stack has only "
                                f"{experts.experts} experts (picks within a token are distinct)")
        self.threads = default_threads() if threads is None else thread_count(threads)
        self.experts = lib.adopt(experts)
        self.n, self.k, self.count = experts.n, experts.k, experts.experts
        self.gemv_threshold = lib.gemv_threshold
        one = self.experts.expert(0)
        self.gemv = lib.select(one, 1)
        self.gemm = lib.select(one, self.gemv_threshold + 1)
        # the large-m gemm of the entry (issue #34) from its large_from rows on, as lib.matmul
        self.large_from = lib.kernel_table.large_from(one)
        self.large = None if self.large_from is None else lib.select(
            one, max(self.large_from, self.gemv_threshold + 1))
        self.x_shape = ((self.tokens, self.k) if slots is None
                        else (self.tokens, slots, self.k))
        # a group of one row or of ``tokens`` rows (every token picked the expert) that is one
        # task (its share of the threads is one) runs as one prepared matmul of one thread
        # (lib.plan, bit-identical to lib.matmul: one native call that packs and runs), made
        # here with the table of now; only those two row counts, so each per-expert plan
        # prepares (and keeps a workspace for) at most two
        self.plans = ([lib.plan(self.experts.expert(e), self.tokens, threads=1)
                       for e in range(self.count)] if native else None)

    def __repr__(self) -> str:
        return (f"<tilegen.ExpertsPlan {self.count} experts {self.experts.kind} n={self.n} "
                f"k={self.k} x{self.x_shape} n_used={self.n_used} threads={self.threads}>")

    def kernel(self, rows: int):
        """The kernel a group of ``rows`` rows runs: gemv up to the gemv threshold, the
        large-m gemm from its ``large_from`` rows on."""
        op = row_op(rows, self.gemv_threshold, True, self.large_from)
        return {"gemv": self.gemv, "gemm": self.gemm, "large": self.large}[op]

    def __call__(self, x, ids, weights=None) -> np.ndarray:
        self.lib.ensure_open()
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise ArgumentError(f"x must be a float32 numpy array, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.shape != self.x_shape:
            raise ArgumentError(f"x has shape {x.shape}; this plan takes {self.x_shape} "
                                f"(tokens, {'' if self.slots is None else 'slots, '}k)")
        sel = check_ids(ids, self.tokens, self.n_used, self.count)
        w = check_weights(weights, (self.tokens, self.n_used))
        x3 = np.ascontiguousarray(x.reshape(self.tokens, self.slots or 1, self.k))
        y = np.empty((self.tokens, self.n_used, self.n), np.float32)
        self._run(x3, sel, y)
        return y if w is None else weighted_sum(y, w)

    def _run(self, x3: np.ndarray, ids: np.ndarray, y: np.ndarray) -> None:
        """y[t, u] = x3[t, u % slots] @ W[ids[t, u]].T: grouped per expert, packed, run,
        scattered."""
        T, U = ids.shape
        S = x3.shape[1]
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")     # rows per expert, token order within
        counts = np.bincount(flat, minlength=self.count)
        stops = np.cumsum(counts)
        total = T * U
        groups, packs, runs = [], [], []
        for e in np.flatnonzero(counts):
            rows = order[stops[e] - counts[e]:stops[e]]
            m = rows.size
            xg = np.ascontiguousarray(x3[rows // U, (rows % U) % S])
            yg = np.empty((m, self.n), np.float32)
            groups.append((rows, yg))
            # an expert's share of the threads, in proportion to its rows (at least one task)
            share = max(1, round(self.threads * m / total))
            if self.plans is not None and share == 1 and m in (1, self.tokens):
                runs.append((m * self.n, lambda p=self.plans[e], a=xg, b=yg: p(a, b)))
                continue
            kern = self.kernel(m)
            packed = self.experts.expert(int(e))
            bl = packed.bl or 32
            lhs, ptasks = lhs_tasks(self.lib, packed.kind, kern, xg, bl, share)
            packs += [((m1 - m0) * self.k, t) for (m0, m1), t in
                      zip(split(m, kern.m_step, share), ptasks)]
            ktasks = kernel_tasks(kern, lhs, packed, yg, bl, -_INF, _INF, share)
            runs += [(m * (n1 - n0), t) for (n0, n1), t in
                     zip(split(self.n, kern.n_step, share), ktasks)]
        run_parallel(_bundles(packs, self.threads), self.lib.workers)
        run_parallel(_bundles(runs, self.threads), self.lib.workers)
        out = y.reshape(T * U, self.n)
        for rows, yg in groups:
            out[rows] = yg


def _bundles(tasks: list, threads: int) -> list:
    """``(cost, task)`` pairs dealt into at most ``threads`` bundles (longest first, each to
    the least loaded bundle): one callable per bundle, running its tasks in turn."""
    nb = min(threads, len(tasks))
    if nb <= 1:       # on the calling thread, one after another
        return [lambda: [t() for _, t in tasks]] if tasks else []
    bins: list[list] = [[] for _ in range(nb)]
    load = [0] * nb
    for cost, t in sorted(tasks, key=lambda ct: -ct[0]):
        i = load.index(min(load))
        bins[i].append(t)
        load[i] += cost
    return [lambda b=b: [t() for t in b] for b in bins]


def check_ids(ids, tokens: int, n_used: int | None, count: int) -> np.ndarray:
    """``ids`` as int64 (tokens, n_used), checked: an integer numpy array of that shape
    (n_used None: any), every id in 0..count-1, no expert twice within a token."""
    if not isinstance(ids, np.ndarray) or ids.dtype.kind not in "iu":
        raise ArgumentError(f"ids must be an integer numpy array (ggml: int32) of shape (tokens, "
                            f"n_used), got {getattr(ids, 'dtype', type(ids).__name__)}")
    if ids.ndim != 2 or ids.shape[0] != tokens or (n_used is not None and ids.shape[1] != n_used) \
            or ids.shape[1] == 0:
        want = f"({tokens}, {'n_used' if n_used is None else n_used})"
        raise ArgumentError(f"ids must have shape {want} (tokens, n_used), got {ids.shape}")
    if ids.shape[1] > count:
        raise ArgumentError(f"n_used={ids.shape[1]} picks per token, but the stack has only "
                            f"{count} experts (picks within a token are distinct)")
    sel = ids.astype(np.int64)
    bad = (sel < 0) | (sel >= count)
    if bad.any():
        t, u = np.argwhere(bad)[0]
        raise ArgumentError(f"ids out of range 0..{count - 1} (the stack has {count} experts): "
                            f"ids[{t}, {u}] = {int(ids[t, u])}")
    srt = np.sort(sel, axis=1)
    dup = srt[:, 1:] == srt[:, :-1]
    if dup.any():
        t, u = np.argwhere(dup)[0]
        raise ArgumentError(f"token {t} picks expert {int(srt[t, u])} twice (ids[{t}] = "
                            f"{ids[t].tolist()}): the picks of a token must be distinct")
    return sel


def check_weights(weights, shape: tuple) -> np.ndarray | None:
    if weights is None:
        return None
    if not isinstance(weights, np.ndarray) or weights.dtype != np.float32 \
            or weights.shape != shape:
        raise ArgumentError(f"weights must be a float32 numpy array of ids' shape {shape}, got "
                            f"{getattr(weights, 'dtype', type(weights).__name__)} "
                            f"{getattr(weights, 'shape', '')}")
    return weights


def weighted_sum(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(tokens, n): sum over u of w[:, u] * y[:, u], float32, products first, added in slot
    order."""
    out = y[:, 0] * w[:, 0, None]
    for u in range(1, y.shape[1]):
        out += y[:, u] * w[:, u, None]
    return out


def matmul_experts(lib, x, experts, ids, weights=None, threads: int | None = None) -> np.ndarray:
    """See :meth:`tilegen.runtime.library.Library.matmul_experts`."""
    lib.ensure_open()
    check_stack(experts)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise ArgumentError(f"x must be a float32 numpy array, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim not in (2, 3) or x.shape[-1] != experts.k or x.shape[0] == 0 or 0 in x.shape:
        raise ArgumentError(f"x must have shape (tokens, k) or (tokens, slots, k) with k="
                            f"{experts.k} (the experts' k), got {x.shape}")
    tokens = x.shape[0]
    sel_shape = ids.shape if isinstance(ids, np.ndarray) else None
    check_ids(ids, tokens, None, experts.experts)
    slots = x.shape[1] if x.ndim == 3 else None
    if slots is not None and sel_shape[1] % slots:
        raise ArgumentError(f"x has {slots} slots, ids {sel_shape[1]} picks per token: the "
                            f"slots must divide n_used (pick u reads slot u % slots)")
    # one call: no per-expert lib.plan (making E of them costs more than it saves once)
    plan = ExpertsPlan(lib, experts, tokens, sel_shape[1], slots, threads, native=False)
    return plan(x, ids, weights)
