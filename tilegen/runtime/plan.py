"""Prepared matmuls: ``plan = lib.plan(weights, m, ...)``, then ``plan(x, out)``.

A plan does once what :func:`tilegen.runtime.ops.matmul` does per call: argument checks (the
same :class:`~tilegen.runtime.request.Request`), ``adopt``, kernel and packer selection, the
split over threads and every offset.  It fills the descriptors of the library's native driver
(:mod:`tilegen.runtime.driver`), so a call is one ctypes call (``tilegen_plan_call``) that
checks the two numpy arrays itself and runs the LHS packing and the kernels, one native call
per thread.  The packed-LHS workspace of a row count is allocated by the first call with that
many rows (so a plan for a huge m allocates nothing for m rows until a call has them); the fast
path of the planned m opens after it, and allocates no array from then on:

- threads: a persistent pool per library of ``threads - 1`` worker threads (Python threads,
  each blocked for its lifetime in one native call, ``tilegen_pool_worker``, without the GIL)
  plus the calling thread.  A call publishes the plan to the pool; workers spin a while after
  each run, then sleep on a futex.  Work is split as ``ops`` splits it: LHS rows over threads in
  multiples of m_step, then (once all are packed) columns in multiples of n_step; when the LHS
  is one row block (m <= m_step, e.g. m = 1), every thread packs it itself and computes its
  columns, with no wait between.  A pool busy with another call is not waited for: the call
  then runs all its tasks on the calling thread.  Without futexes (not Linux) no pool is
  started and a plan runs on the calling thread.
- results are bit-identical to ``lib.matmul`` with the same arguments, for every thread count.

Anything the fast call does not take (other shapes with at most the planned m rows, batched
x, non-contiguous x, ``out`` overlapping x or the weights, numpy subclasses) goes through the
checked Python path of the plan, which prepares (and caches) the descriptors for that row
count; errors are :class:`ArgumentError` as in ``matmul``.
"""
from __future__ import annotations

import ctypes
import threading
import time

import numpy as np

from . import driver as D
from .checks import check_bytes, positive_int
from .errors import ArgumentError
from .ops import run as run_rows
from .request import Request, activation_error, check_activations
from .select import row_op
from .threads import reset_after_fork, split

__all__ = ["Plan", "make_plan", "MAX_BYTES"]

_F32 = np.dtype(np.float32)
_empty = np.empty
# no array of a plan (x, out, workspace) can be larger than AArch64's 48-bit virtual address
# space: a plan for more rows than that is refused when it is made
MAX_BYTES = 1 << 48

class _Variant:
    """The driver descriptors for one row count."""

    def __init__(self, plan: "Plan", rows: int) -> None:
        lib, T, req = plan.lib, plan.threads, plan.request
        packed, kern = plan.route(rows)     # the kernel table as it was when the plan was made
        kern.require_cpu()
        n, k, bl = packed.n, packed.k, packed.bl or 32
        self.kernel = kern
        self.native = plan.drv is not None
        self.lay = lay = kern.lhs_layout(bl)
        self.limit = getattr(lay, "activation_limit", None) if lay is not None else None
        self.rows = rows
        self.lock = threading.Lock()
        if not self.native:
            return
        s = self.s = D.PlanStruct()
        s.abi, s.m, s.n, s.k, s.bl = D.ABI, rows, n, k, bl
        s.kern_args = D.KERNEL_KINDS[kern.abi.driver_kind]     # its calling convention
        s.kernel = kern.address
        rhs = check_bytes("weights", packed.data, kern.rhs_packed_size(n, k, bl))
        s.rhs, s.rhs_size = rhs.ctypes.data, rhs.nbytes
        if lay is None:
            s.pack_args = D.P_NONE
        else:
            pk = lib.lhs_packer(kern, bl)      # the one ops.run uses (VL packers bound)
            if pk is not None:
                pk.require_cpu()
                s.pack_args = D.PACK_KINDS[pk.spec.abi.driver_kind]
                s.packer = pk.address
                s.pmr, s.pkr, s.psr = pk.mr, pk.spec.kr, pk.spec.sr
            else:
                s.pack_args = D.P_GIVEN      # packed in Python (the layout object), as ops does
            if self.limit is not None and s.pack_args != D.P_GIVEN:
                s.check, s.limit = 1, self.limit[0]
        pack_parts = split(rows, kern.m_step, T) if lay is not None else []
        mm_parts = split(n, kern.n_step, T)
        lsize = lay.packed_size(rows, k) if lay is not None else 0
        private = s.pack_args not in (D.P_NONE, D.P_GIVEN) and len(pack_parts) == 1 \
            and len(mm_parts) > 1
        if private:
            stride = -(-lsize // 64) * 64
            pack_parts = []
        else:
            stride = 0
            if s.pack_args in (D.P_NONE, D.P_GIVEN):
                pack_parts = []
        s.private_pack = int(private)
        # the packed-LHS workspace: allocated by the first run with these rows (workspace()),
        # so a plan for a huge m allocates nothing for it until a call has m rows
        self.ws_size = stride * len(mm_parts) if private else lsize
        self.ws = None
        s.ws = None
        self.pack = (D.PackTask * max(1, len(pack_parts)))(
            *[D.PackTask(a, b, lay.packed_offset(a, k)) for a, b in pack_parts])
        self.mm = (D.MmTask * len(mm_parts))(
            *[D.MmTask(a, b, kern.rhs_packed_offset(a, k, bl), i * stride)
              for i, (a, b) in enumerate(mm_parts)])
        s.npack, s.nmm = len(pack_parts), len(mm_parts)
        s.pack, s.mm = ctypes.addressof(self.pack), ctypes.addressof(self.mm)
        s.cmin, s.cmax = req.kcmin, req.kcmax
        if req.bias is not None:
            s.bias = req.bias.ctypes.data
            if req.clamp is not None:
                s.post_clamp, s.post_min, s.post_max = 1, req.cmin, req.cmax
        pool = plan.drv.pool
        if pool is not None and max(s.npack, s.nmm) > 1:
            pool.ensure(min(T, max(s.npack, s.nmm)) - 1)
            s.pool = pool.addr
        s.spin = plan.spin
        if D.ARRAY_OFFSETS is not None and rows == plan.m and s.pack_args != D.P_GIVEN:
            s.fast = 1
            s.nd_type, s.f32_descr = id(np.ndarray), id(_F32)
            for name, v in D.ARRAY_OFFSETS.items():
                setattr(s, "off_" + name, v)
        self.addr = ctypes.addressof(s)
        reset_after_fork(self)

    def after_fork(self) -> None:
        """In a forked child (:func:`tilegen.runtime.threads.reset_after_fork`): a new lock,
        the run flag cleared."""
        self.lock = threading.Lock()
        self.s.busy = 0

    @property
    def ready(self) -> bool:
        """Whether the descriptors are complete: the workspace is allocated or not needed."""
        return self.ws is not None or not self.ws_size

    def workspace(self) -> None:
        """Allocate the workspace (once; it then stays at its address for the variant's
        lifetime, which the native descriptors point at)."""
        with self.lock:
            if self.ws is None and self.ws_size:
                self.ws = np.zeros(self.ws_size, np.uint8)
                self.s.ws = self.ws.ctypes.data

    def run(self, plan: "Plan", x2: np.ndarray, dst: np.ndarray) -> None:
        """dst = the matmul of contiguous rows x2 (rows, k) into contiguous dst (rows, n)."""
        req = plan.request
        if not self.native:
            run_rows(plan.lib, x2, plan.weights, dst, req.kcmin, req.kcmax, req.threads)
            req.finish(dst)
            return
        if not self.ready:
            self.workspace()
        if self.s.pack_args == D.P_GIVEN:
            with self.lock:
                check_activations(plan.weights.kind, self.limit, x2)
                self.ws[:self.lay.region_size(self.rows, plan.k)] = self.lay.pack(x2)
                st = self._native(plan, x2, dst)
        else:
            st = self._native(plan, x2, dst)
        if st == D.ST_LIMIT:
            raise activation_error(plan.weights.kind, self.limit, x2)

    def _native(self, plan: "Plan", x2, dst) -> int:
        run, xa, oa = plan.drv.run, x2.ctypes.data, dst.ctypes.data
        while (st := run(self.addr, xa, oa)) == D.ST_BUSY:
            time.sleep(0)         # another thread runs this plan: wait for it
        return st


class Plan:
    """A prepared ``matmul(x, weights, bias, clamp, threads)`` for x with up to m rows.

    ``plan(x)`` / ``plan(x, out)``: x float32 of shape (rows, k) or (..., rows, k) with at most
    m rows in all; returns ``out`` (a new float32 array of shape (..., n) when not given).
    The result is bit-identical to ``lib.matmul(x, weights, bias, clamp, threads, out)``.
    The bias is copied when the plan is made; the weights are used in place (do not change
    them).  The kernel table and ``gemv_threshold`` are taken when the plan is made: a later
    ``lib.set_table`` does not change the kernels of any row count of this plan.  One plan
    runs one call at a time (concurrent calls of one plan wait for each other); different
    plans run concurrently.  After ``lib.close()`` a call raises ArgumentError."""

    def __init__(self, lib, weights, m: int, bias=None, clamp=None,
                 threads: int | None = None) -> None:
        req = Request(weights, bias, clamp, threads, copy_bias=True)
        self.m = positive_int("m", m)
        for what, cols in (("x", req.k), ("out", req.n)):
            if 4 * self.m * cols > MAX_BYTES:
                raise ArgumentError(f"m={self.m} rows of {what} ({cols} float32 each) would take "
                                    f"{4 * self.m * cols / 2**40:.1f} TiB, more than a 48-bit "
                                    f"address space holds; plan for fewer rows")
        self.spin = D.spin_count()
        lib.ensure_open()
        self.lib = lib
        self.request = req
        self.bias, self.threads, self.clamp = req.bias, req.threads, req.clamp
        # once: a repack when no kernel reads them
        self.weights = req.weights = lib.adopt(weights)
        self.n, self.k = self.weights.n, self.weights.k
        # the routes (packing, kernel) of every row class up to m (gemv, gemm, the large-m
        # gemm: tilegen.runtime.select.KernelPair.op), from the tables as they are now
        self.gemv_threshold = lib.gemv_threshold
        table = lib.kernel_table
        self._classes = {rows: table.row_class(self.weights, rows)
                         for rows in {1, self.gemv_threshold + 1, table.large_from(self.weights)}
                         if rows is not None and 0 < rows <= self.m}
        self.large_from = table.large_from(self.weights)
        self._routes = {op: lib.route(self.weights, rows) for rows, op in self._classes.items()}
        self.drv = lib.driver
        self._variants: dict[int, _Variant] = {}
        self._build = threading.Lock()
        self._closed = False
        self._revive = False
        v = self._variant(self.m)
        self.kernel = v.kernel
        self._out_shape = (self.m, self.n)
        self._x_shape = (self.m, self.k)
        self._call = self.drv.call if self.drv is not None else None
        self._planned = v if v.native and v.s.fast else None
        self._fast = self._ctx = None
        self._publish()
        reset_after_fork(self)

    def __repr__(self) -> str:
        return (f"<tilegen.Plan m<={self.m} n={self.n} k={self.k} {self.weights.kind} "
                f"threads={self.threads} kernel={self.kernel.name}>")

    @property
    def native(self) -> bool:
        """Whether calls of the planned shape take the native fast path (from the first call
        with m rows on, when the plan's workspace is allocated)."""
        return self._planned is not None

    def _publish(self) -> None:
        """Open the fast path once the planned variant is ready: at once when it needs no
        workspace, else after the first call with m rows (which allocates it).  Ordered so
        that a concurrent close() or fork leaves no fast path behind."""
        v = self._planned
        if v is None or self._fast is not None or not v.ready:
            return
        self._fast = v.addr
        if not self._revive:
            self._ctx = self._fast
        if self._closed:
            self._ctx = None

    def route(self, rows: int):
        """(packing, kernel) for ``rows`` rows, as the library's tables chose them when the
        plan was made."""
        return self._routes[row_op(rows, self.gemv_threshold, "gemv" in self._routes,
                                   self.large_from)]

    def _variant(self, rows: int) -> _Variant:
        v = self._variants.get(rows)
        if v is None:
            with self._build:
                v = self._variants.get(rows)
                if v is None:
                    v = self._variants[rows] = _Variant(self, rows)
        return v

    def close(self) -> None:
        """End this plan: later calls raise ArgumentError (``lib.close()`` closes every plan)."""
        self._closed = True
        self._ctx = None
        self._revive = False

    def after_fork(self) -> None:
        """In a forked child (:func:`tilegen.runtime.threads.reset_after_fork`): a new build
        lock; the next call takes the checked path, which starts the pool's workers again, then
        the fast path is back."""
        self._build = threading.Lock()
        if not self._closed:
            self._ctx, self._revive = None, True

    def __call__(self, x, out=None):
        ctx = self._ctx
        if ctx is not None:
            if out is None:
                if x.__class__ is np.ndarray and x.shape == self._x_shape:
                    o = _empty(self._out_shape, _F32)
                    if not self._call(ctx, x, o):
                        return o
            elif not self._call(ctx, x, out):
                return out
        return self._checked(x, out)

    # -- the checked path ------------------------------------------------------------------
    def _checked(self, x, out):
        if self._closed:
            raise ArgumentError(f"this plan's library ({self.lib.path.name}) is closed")
        if self._revive:          # first call in a forked child
            pool = self.drv.pool if self.drv is not None else None
            if pool is not None:
                pool.ensure(max((min(self.threads, max(v.s.npack, v.s.nmm)) - 1
                                 for v in self._variants.values() if v.native), default=0))
            self._revive, self._ctx = False, self._fast
        req = self.request
        lead, rows = req.rows(x, "the plan's weights")
        if rows > self.m:
            raise ArgumentError(f"x has {rows} rows (shape {x.shape}); the plan was made for "
                                f"at most m={self.m}")
        given = out
        out = req.output(out, lead, x)
        if out is None:
            given[...] = self._checked(x, None)    # the kernels read x while they write out
            return given
        x2 = np.ascontiguousarray(x.reshape(rows, self.k))
        self._variant(rows).run(self, x2, out.reshape(rows, self.n))
        if self._fast is None and rows == self.m:
            self._publish()
        return out


def make_plan(lib, weights, m, bias=None, clamp=None, threads=None) -> Plan:
    """See :meth:`tilegen.runtime.library.Library.plan`."""
    return Plan(lib, weights, m, bias, clamp, threads)
