"""Prepared matmuls: ``plan = lib.plan(weights, m, ...)``, then ``plan(x, out)``.

A plan does once what :func:`tilegen.runtime.ops.matmul` does per call: argument checks,
``adopt``, kernel and packer selection, the split over threads, workspace allocation and every
offset.  It fills the descriptors of the library's native driver (:mod:`tilegen.driver`), so a
call is one ctypes call (``tilegen_plan_call``) that checks the two numpy arrays itself and
runs the LHS packing and the kernels, one native call per thread:

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
import math
import os
import threading
import time
import weakref

import numpy as np

from .. import driver as D
from .checks import check_bytes, clamp_pair, positive_int, thread_count
from .errors import ArgumentError
from .packed import PackedLayouts, PackedWeights
from .threads import default_threads, split

__all__ = ["Plan", "make_plan", "spin_count", "MAX_BYTES"]

INF = math.inf
_F32 = np.dtype(np.float32)
_empty = np.empty
# iterations an idle worker (or a waiting thread) spins before it sleeps on a futex
DEFAULT_SPIN = 20000
MAX_SPIN = 1 << 32
# no array of a plan (x, out, workspace) can be larger than AArch64's 48-bit virtual address
# space: a plan for more rows than that is refused when it is made
MAX_BYTES = 1 << 48


def spin_count() -> int:
    """``TILEGEN_PLAN_SPIN`` (spin iterations before a futex sleep), default 20000."""
    env = os.environ.get("TILEGEN_PLAN_SPIN")
    if env is None or env.strip() == "":
        return DEFAULT_SPIN
    try:
        v = int(env.strip(), 10)
    except ValueError:
        v = None
    if v is None or not 0 <= v <= MAX_SPIN:
        raise ArgumentError(f"TILEGEN_PLAN_SPIN must be an integer from 0 to {MAX_SPIN} "
                            f"(spin iterations before an idle thread sleeps), got {env!r}")
    return v
_CT = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "f32": ctypes.c_float,
       "f64": ctypes.c_double, "ptr": ctypes.c_void_p}


def _structure(name: str, fields) -> type:
    return type(name, (ctypes.Structure,), {"_fields_": [(n, _CT[t]) for n, t in fields]})


PlanStruct = _structure("PlanStruct", D.PLAN_FIELDS)
PoolStruct = _structure("PoolStruct", D.POOL_FIELDS)
PackTask = _structure("PackTask", D.PACK_FIELDS)
MmTask = _structure("MmTask", D.MM_FIELDS)

# kernel and packer parameter lists the driver calls (tilegen.generator.abi, generator.packers)
_KERNEL_ARGS = {
    ("m", "n", "k", "lhs", "lhs_stride", "rhs_packed", "dst", "dst_stride_row",
     "dst_stride_col", "clamp_min", "clamp_max"): D.K_F32,
    ("m", "n", "k", "bl", "lhs_packed", "rhs_packed", "dst", "dst_stride_row",
     "dst_stride_col", "scalar_min", "scalar_max"): D.K_Q4,
    ("m", "n", "k", "lhs_packed", "rhs_packed", "dst", "dst_stride_row", "dst_stride_col",
     "scalar_min", "scalar_max"): D.K_Q8,
    ("m", "n", "k", "lhs_packed", "rhs_packed", "dst", "dst_stride_row", "dst_stride_col",
     "clamp_min", "clamp_max"): D.K_Q8,
}


def _names(entry: dict) -> tuple:
    return tuple(p["name"] for p in entry["params"])


_PACKER_ARGS = {
    ("m", "k", "bl", "mr", "kr", "sr", "m_idx_start", "lhs", "lhs_stride", "lhs_packed"):
        D.P_QSI8D32P,
    ("m", "k", "mr", "kr", "sr", "m_idx_start", "lhs", "lhs_stride", "lhs_packed"): D.P_ROWS,
}


def _ndarray_offsets() -> dict | None:
    """Byte offsets of numpy's array-object fields (type, data, nd, dimensions, descr, flags),
    checked on live arrays; None when the layout is not the expected one (no fast call)."""
    try:
        head = object.__basicsize__            # PyObject_HEAD; ob_type is its last pointer
        off = {"type": head - 8, "data": head, "nd": head + 8, "dims": head + 16,
               "descr": head + 40, "flags": head + 48}

        def rd(a, name, ct=ctypes.c_void_p):
            return ct.from_address(id(a) + off[name]).value

        a = np.zeros((3, 5), np.float32)
        ro = a[1:]
        ro.flags.writeable = False
        for arr, flags in ((a, 0x501), (ro, 0x101), (a[:, ::2], 0x500)):
            dims = (ctypes.c_ssize_t * 2).from_address(rd(arr, "dims"))
            if (rd(arr, "type") != id(np.ndarray) or rd(arr, "data") != arr.ctypes.data
                    or rd(arr, "nd", ctypes.c_int) != 2 or tuple(dims) != arr.shape
                    or rd(arr, "descr") != id(_F32) or id(arr.dtype) != id(_F32)
                    or (rd(arr, "flags", ctypes.c_int) & 0x501) != flags):
                return None
        return off
    except Exception:      # noqa: BLE001 - any surprise: no fast call, the checked path works
        return None


_OFFSETS = _ndarray_offsets()


class _Driver:
    """The driver functions of one loaded library, and its worker pool."""

    def __init__(self, dll) -> None:
        f = lambda name, res, *args: self._fn(dll, name, res, args)   # noqa: E731
        self.call = f("tilegen_plan_call", ctypes.c_uint32, ctypes.c_void_p, ctypes.py_object,
                      ctypes.py_object)
        self.run = f("tilegen_plan_run", ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                     ctypes.c_void_p)
        self.worker = f("tilegen_pool_worker", None, ctypes.c_void_p)
        self.wake = f("tilegen_pool_wake", None, ctypes.c_void_p)
        self.futex = bool(f("tilegen_driver_futex", ctypes.c_uint64)())
        self.pool = _Pool(self) if self.futex else None

    def close(self) -> None:
        """End the worker pool (see :meth:`_Pool.close`)."""
        if self.pool is not None:
            self.pool.close()

    @staticmethod
    def _fn(dll, name, res, args):
        fn = getattr(dll, name)
        fn.restype, fn.argtypes = res, list(args)
        return fn

    @classmethod
    def load(cls, dll) -> "_Driver | None":
        """The library's driver, or None (built before it existed, or another ABI)."""
        abi = getattr(dll, "tilegen_driver_abi", None)
        sizes = getattr(dll, "tilegen_driver_sizes", None)
        if abi is None or sizes is None:
            return None
        abi.restype = sizes.restype = ctypes.c_uint64
        abi.argtypes = sizes.argtypes = []
        want = (ctypes.sizeof(PlanStruct) | ctypes.sizeof(PoolStruct) << 16
                | ctypes.sizeof(PackTask) << 32 | ctypes.sizeof(MmTask) << 48)
        if abi() != D.ABI or sizes() != want:
            return None
        return cls(dll)


class _Pool:
    """Worker threads of one library's driver (``threads - 1`` of the biggest plan).

    The pool lives as long as its driver: the library and every plan of it hold that.  When
    the last of them is gone (or ``lib.close()`` ends it) its workers are stopped and joined
    (:func:`_stop_workers`); they do not outlive the library."""

    def __init__(self, drv: _Driver) -> None:
        self.worker = drv.worker         # not the driver itself: no cycle, freed by refcount
        self.s = PoolStruct()
        self.s.spin = spin_count()
        self.addr = ctypes.addressof(self.s)
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.closed = False
        # holds the struct and the thread list, not the pool: runs when the pool is collected
        self._stop = weakref.finalize(self, _stop_workers, self.s, self.threads, drv.wake)
        _POOLS.add(self)

    def ensure(self, workers: int) -> None:
        with self.lock:
            if self.closed:
                return
            while len(self.threads) < workers:
                t = threading.Thread(target=self.worker, args=(self.addr,), daemon=True,
                                     name=f"tilegen-plan-{len(self.threads)}")
                t.start()
                self.threads.append(t)
                self.s.nworkers = len(self.threads)

    def close(self) -> None:
        """Stop and join the workers for good (runs then take place on the calling thread)."""
        with self.lock:
            self.closed = True
            self._stop()

    def after_fork(self) -> None:
        """In a forked child: the workers are gone (plans start them again when next used)."""
        self.lock = threading.Lock()
        for name in ("sleepers", "busy", "active", "stop", "nworkers"):
            setattr(self.s, name, 0)
        self.s.plan = None
        self.threads.clear()


def _stop_workers(s, threads: list, wake) -> None:
    """Stop the workers of pool struct ``s`` and wait for them (not for the calling thread)."""
    s.nworkers = 0
    s.stop = 1
    wake(ctypes.addressof(s))
    me = threading.current_thread()
    for t in threads:
        if t is not me:
            t.join(timeout=5.0)
    threads.clear()


# live pools, plans and variants: a forked child resets their locks and run flags
_POOLS: weakref.WeakSet = weakref.WeakSet()
_PLANS: weakref.WeakSet = weakref.WeakSet()
_VARIANTS: weakref.WeakSet = weakref.WeakSet()


def _after_fork() -> None:
    """In a forked child: only the forking thread exists, so a lock another thread held at
    the fork stays held forever, and a run flag stays set.  Reset every lock and flag the plan
    runtime owns; plans take the checked path once and start their pool's workers again."""
    for v in list(_VARIANTS):
        v.lock = threading.Lock()
        if v.native:
            v.s.busy = 0
    for p in list(_POOLS):
        p.after_fork()
    for pl in list(_PLANS):
        pl._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def driver(lib):
    """The driver of ``lib`` (cached on it), or None.  Made under the library's lifetime lock:
    a library that closed (lib.close()) before it was made gets none started (ArgumentError);
    one made before is closed by close()."""
    drv = lib.__dict__.get("_plan_driver", False)
    if drv is False:
        with lib._lifetime:
            drv = lib.__dict__.get("_plan_driver", False)
            if drv is False:
                lib.ensure_open()
                drv = lib._plan_driver = _Driver.load(lib._dll)
    return drv


class _Variant:
    """The driver descriptors for one row count."""

    def __init__(self, plan: "Plan", rows: int) -> None:
        lib, T = plan.lib, plan.threads
        packed, kern = plan.route(rows)     # the kernel table as it was when the plan was made
        kern._require_cpu()
        n, k, bl = packed.n, packed.k, packed.bl or 32
        self.kernel = kern
        self.native = plan.drv is not None and _names(kern.entry) in _KERNEL_ARGS
        self.lay = lay = kern.lhs_layout(bl)
        self.limit = getattr(lay, "activation_limit", None) if lay is not None else None
        self.rows = rows
        self.lock = threading.Lock()
        if not self.native:
            return
        s = self.s = PlanStruct()
        s.abi, s.m, s.n, s.k, s.bl = D.ABI, rows, n, k, bl
        s.kern_args = _KERNEL_ARGS[_names(kern.entry)]
        s.kernel = ctypes.cast(kern._fn, ctypes.c_void_p).value
        rhs = check_bytes("weights", packed.data, kern.rhs_packed_size(n, k, bl))
        s.rhs, s.rhs_size = rhs.ctypes.data, rhs.nbytes
        if lay is None:
            s.pack_args = D.P_NONE
        else:
            pk = lib.lhs_packer(kern, bl)      # the one ops._run uses (VL packers bound)
            if pk is not None and _names(pk.entry) in _PACKER_ARGS:
                pk._require_cpu()
                s.pack_args = _PACKER_ARGS[_names(pk.entry)]
                s.packer = ctypes.cast(pk._fn, ctypes.c_void_p).value
                s.pmr, s.pkr, s.psr = pk.mr, pk.spec.kr, pk.spec.sr
            else:
                s.pack_args = D.P_GIVEN      # packed in Python (the layout object), as ops does
            if self.limit is not None and s.pack_args != D.P_GIVEN:
                s.check, s.limit = 1, self.limit[0]
        pack_parts = split(rows, kern.m_step, T) if lay is not None else []
        mm_parts = split(n, kern.n_step, T)
        lsize = lay.packed_size(rows, k) if lay is not None else 0
        private = s.pack_args in (D.P_QSI8D32P, D.P_ROWS) and len(pack_parts) == 1 \
            and len(mm_parts) > 1
        if private:
            stride = -(-lsize // 64) * 64
            self.ws = np.zeros(stride * len(mm_parts), np.uint8)
            pack_parts = []
        else:
            stride = 0
            self.ws = np.zeros(lsize, np.uint8) if lay is not None else None
            if s.pack_args in (D.P_NONE, D.P_GIVEN):
                pack_parts = []
        s.private_pack = int(private)
        s.ws = self.ws.ctypes.data if self.ws is not None else None
        self.pack = (PackTask * max(1, len(pack_parts)))(
            *[PackTask(a, b, lay.packed_offset(a, k)) for a, b in pack_parts])
        self.mm = (MmTask * len(mm_parts))(
            *[MmTask(a, b, kern.rhs_packed_offset(a, k, bl), i * stride)
              for i, (a, b) in enumerate(mm_parts)])
        s.npack, s.nmm = len(pack_parts), len(mm_parts)
        s.pack, s.mm = ctypes.addressof(self.pack), ctypes.addressof(self.mm)
        cmin, cmax = plan.cmin, plan.cmax
        if plan.bias is None:
            s.cmin, s.cmax = cmin, cmax
        else:
            s.cmin, s.cmax = -INF, INF
            s.bias = plan.bias.ctypes.data
            if plan.clamp is not None:
                s.post_clamp, s.post_min, s.post_max = 1, cmin, cmax
        pool = plan.drv.pool
        if pool is not None and max(s.npack, s.nmm) > 1:
            pool.ensure(min(T, max(s.npack, s.nmm)) - 1)
            s.pool = pool.addr
        s.spin = plan.spin
        if _OFFSETS is not None and rows == plan.m and s.pack_args != D.P_GIVEN:
            s.fast = 1
            s.nd_type, s.f32_descr = id(np.ndarray), id(_F32)
            for name, v in _OFFSETS.items():
                setattr(s, "off_" + name, v)
        self.addr = ctypes.addressof(s)
        _VARIANTS.add(self)

    def run(self, plan: "Plan", x2: np.ndarray, dst: np.ndarray) -> None:
        """dst = the matmul of contiguous rows x2 (rows, k) into contiguous dst (rows, n)."""
        if not self.native:
            from .ops import _run
            _run(plan.lib, x2, plan.weights, dst, plan.kcmin, plan.kcmax, plan.threads)
            if plan.bias is not None:
                dst += plan.bias
                if plan.clamp is not None:
                    np.minimum(np.maximum(dst, np.float32(plan.cmin), out=dst),
                               np.float32(plan.cmax), out=dst)
            return
        if self.s.pack_args == D.P_GIVEN:
            with self.lock:
                plan._check_limit(self, x2)
                self.ws[:self.lay.region_size(self.rows, plan.k)] = self.lay.pack(x2)
                st = self._native(plan, x2, dst)
        else:
            st = self._native(plan, x2, dst)
        if st == D.ST_LIMIT:
            raise plan._limit_error(self, x2)

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

    def __init__(self, lib, weights: PackedWeights, m: int, bias=None, clamp=None,
                 threads: int | None = None) -> None:
        if not isinstance(weights, (PackedWeights, PackedLayouts)):
            raise ArgumentError(f"weights must be PackedWeights or PackedLayouts (see lib.pack_weights), "
                                f"got {type(weights).__name__}")
        self.m = positive_int("m", m)
        for what, cols in (("x", weights.k), ("out", weights.n)):
            if 4 * self.m * cols > MAX_BYTES:
                raise ArgumentError(f"m={self.m} rows of {what} ({cols} float32 each) would take "
                                    f"{4 * self.m * cols / 2**40:.1f} TiB, more than a 48-bit "
                                    f"address space holds; plan for fewer rows")
        if bias is not None:
            b = np.asarray(bias)
            if b.dtype != np.float32 or b.shape != (weights.n,):
                raise ArgumentError(f"bias must be float32 of shape ({weights.n},), "
                                    f"got {b.dtype} {b.shape}")
            bias = np.array(b, dtype=np.float32, copy=True, order="C")
        self.bias = bias
        self.threads = default_threads() if threads is None else thread_count(threads)
        self.spin = spin_count()
        self.clamp = clamp_pair(clamp)
        self.cmin, self.cmax = (-INF, INF) if self.clamp is None else self.clamp
        # the kernel's clamp (a bias given here is added after the kernel, then clamped)
        self.kcmin, self.kcmax = (self.cmin, self.cmax) if bias is None else (-INF, INF)
        lib.ensure_open()
        self.lib = lib
        self.weights = lib.adopt(weights)       # once: a repack when no kernel reads them
        self.n, self.k = self.weights.n, self.weights.k
        w = self.weights
        self._datas = w.datas if isinstance(w, PackedLayouts) else (w.data,)
        # the routes (packing, kernel) of both row classes, from the tables as they are now
        self.gemv_threshold = lib.gemv_threshold
        self._routes = {}
        for op, rows in (("gemv", 1), ("gemm", self.gemv_threshold + 1)):
            if op == "gemv" and self.gemv_threshold < 1 or op == "gemm" and self.m <= self.gemv_threshold:
                continue
            self._routes[op] = lib.route(self.weights, rows)
        self.drv = driver(lib)
        self._variants: dict[int, _Variant] = {}
        self._build = threading.Lock()
        self._closed = False
        self._revive = False
        v = self._variant(self.m)
        self.kernel = v.kernel
        self._out_shape = (self.m, self.n)
        self._x_shape = (self.m, self.k)
        self._call = self.drv.call if self.drv is not None else None
        self._fast = v.addr if v.native and v.s.fast else None
        self._ctx = self._fast
        _PLANS.add(self)

    def __repr__(self) -> str:
        return (f"<tilegen.Plan m<={self.m} n={self.n} k={self.k} {self.weights.kind} "
                f"threads={self.threads} kernel={self.kernel.name}>")

    @property
    def native(self) -> bool:
        """Whether calls of the planned shape take the native fast path."""
        return self._fast is not None

    def route(self, rows: int):
        """(packing, kernel) for ``rows`` rows, as the library's tables chose them when the
        plan was made."""
        return self._routes["gemv" if rows <= self.gemv_threshold else "gemm"]

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

    def _after_fork(self) -> None:
        """In a forked child (see :func:`_after_fork`): a new build lock; the next call takes the
        checked path, which starts the pool's workers again, then the fast path is back."""
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
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise ArgumentError(f"x must be a float32 numpy array, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim < 2:
            raise ArgumentError(f"x must have shape (m, k) or (..., m, k), got {x.shape}")
        if x.shape[-1] != self.k:
            raise ArgumentError(f"x has k={x.shape[-1]}, the plan's weights have k={self.k}")
        lead = x.shape[:-1]
        rows = math.prod(lead)
        if rows == 0:
            raise ArgumentError(f"x has no rows (shape {x.shape})")
        if rows > self.m:
            raise ArgumentError(f"x has {rows} rows (shape {x.shape}); the plan was made for "
                                f"at most m={self.m}")
        shape = (*lead, self.n)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.float32 \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ArgumentError(f"out must be a writeable C-contiguous float32 array of shape "
                                f"{shape}")
        elif np.shares_memory(out, x) or any(np.shares_memory(out, d) for d in self._datas):
            out[...] = self._checked(x, None)    # the kernels read x while they write out
            return out
        x2 = np.ascontiguousarray(x.reshape(rows, self.k))
        self._variant(rows).run(self, x2, out.reshape(rows, self.n))
        return out

    def _check_limit(self, v: _Variant, x2: np.ndarray) -> None:
        if v.limit is not None:
            amax = float(np.abs(x2).max())      # NaN when x has a NaN
            if not amax <= v.limit[0]:
                raise self._limit_error(v, x2)

    def _limit_error(self, v: _Variant, x2: np.ndarray) -> ArgumentError:
        amax = float(np.abs(x2).max())
        return ArgumentError(f"{self.weights.kind} activations must be finite with |x| <= "
                             f"{v.limit[0]:g} ({v.limit[1]}); got max |x| = {amax:g}")


def make_plan(lib, weights, m, bias=None, clamp=None, threads=None) -> Plan:
    """See :meth:`tilegen.runtime.library.Library.plan`."""
    return Plan(lib, weights, m, bias, clamp, threads)
