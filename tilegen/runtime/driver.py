"""The plan driver's Python side: the struct tables and constants its C source is rendered from
(``templates/driver.c.j2``, by :mod:`tilegen.build.driver`, built into every library as
``tilegen_driver.c``), their ctypes mirror, checked at load, and the worker pool.

The driver is freestanding C that runs a prepared matmul (:mod:`tilegen.runtime.plan`) with
one native call per thread.

A *plan* (``struct tg_plan``) holds everything a matmul of one shape needs, filled once by the
Python runtime: kernel and packer function pointers, m/n/k/bl, the packed weights, the
workspace, the per-thread tasks (LHS rows to pack, columns to compute, their byte offsets),
the clamp, an optional bias added after the kernel, the activation limit of quantised formats.
Per call only the x and out pointers change.

Work, as :func:`tilegen.runtime.ops.run` splits it: *pack* tasks (LHS rows in multiples of
m_step into the shared workspace), then, once every pack task is done, *mm* tasks (columns in
multiples of n_step, all rows).  When the LHS is one row block (m <= m_step) each mm task packs
the whole LHS into its own workspace instead (``private_pack``): no wait between the phases.
Tasks are claimed with an atomic counter by whoever takes part in the run, so a run finishes
with any number of participants (the caller alone included) and every output element is
computed by exactly one kernel call with the same inputs: results do not depend on threads.

Threads: ``tg_pool`` is a persistent pool of worker threads.  They are Python threads started
by the runtime, each blocked in one native call (``tilegen_pool_worker``) for its lifetime,
without the GIL.  A run publishes the plan (a generation counter; idle workers spin for
``spin`` iterations, then sleep on a futex, Linux only), the caller takes part itself, then
waits until every mm task is done and no worker still looks at the plan.  A pool in use by
another run is not waited for: the caller then runs every task itself.

The struct layouts and constants are defined once, in :mod:`tilegen.callconv` (the driver's
ABI: :data:`PLAN_FIELDS` ..., re-exported here), for both the C source (rendered by the build,
which imports nothing of the runtime) and the ctypes mirror here, and checked at load
(``tilegen_driver_abi`` returns :data:`ABI`,
``tilegen_driver_sizes`` the struct sizes).  The kernel and packer calls are rendered from the
calling conventions (:mod:`tilegen.callconv`): one argument kind per ``driver_kind``.
"""
from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from ..callconv import (C_FLAGS, C_TYPES, CONSTANTS, DRIVER_ABI, KERNEL_KINDS, MM_FIELDS,
                        P_GIVEN, P_NONE, PACK_FIELDS, PACK_KINDS, PLAN_FIELDS, POOL_FIELDS,
                        ST_BUSY, ST_LIMIT, ST_OK, ST_SLOW, STRUCTS)
from .checks import env_int
from .threads import reset_after_fork

ABI = DRIVER_ABI

__all__ = ["ABI", "PLAN_FIELDS", "POOL_FIELDS", "PACK_FIELDS", "MM_FIELDS", "STRUCTS", "C_TYPES",
           "CONSTANTS", "ST_OK", "ST_LIMIT", "ST_SLOW", "ST_BUSY", "KERNEL_KINDS", "PACK_KINDS",
           "P_NONE", "P_GIVEN", "C_FLAGS", "PlanStruct", "PoolStruct", "PackTask", "MmTask",
           "ARRAY_OFFSETS", "Driver", "Pool", "spin_count", "DEFAULT_SPIN", "MAX_SPIN"]

# iterations an idle worker (or a waiting thread) spins before it sleeps on a futex
DEFAULT_SPIN = 20000
MAX_SPIN = 1 << 32


def spin_count() -> int:
    """``TILEGEN_PLAN_SPIN`` (spin iterations before a futex sleep), default 20000."""
    v = env_int("TILEGEN_PLAN_SPIN", 0, MAX_SPIN,
                " (spin iterations before an idle thread sleeps)")
    return DEFAULT_SPIN if v is None else v


_CT = {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "f32": ctypes.c_float,
       "f64": ctypes.c_double, "ptr": ctypes.c_void_p}


def _structure(name: str, fields) -> type:
    return type(name, (ctypes.Structure,), {"_fields_": [(n, _CT[t]) for n, t in fields]})


PlanStruct = _structure("PlanStruct", PLAN_FIELDS)
PoolStruct = _structure("PoolStruct", POOL_FIELDS)
PackTask = _structure("PackTask", PACK_FIELDS)
MmTask = _structure("MmTask", MM_FIELDS)
_F32 = np.dtype(np.float32)


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


# numpy's array-object field offsets for the fast call (None: no fast call)
ARRAY_OFFSETS = _ndarray_offsets()


class Driver:
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
        self.pool = Pool(self) if self.futex else None

    def close(self) -> None:
        """End the worker pool (see :meth:`Pool.close`)."""
        if self.pool is not None:
            self.pool.close()

    @staticmethod
    def _fn(dll, name, res, args):
        fn = getattr(dll, name)
        fn.restype, fn.argtypes = res, list(args)
        return fn

    @classmethod
    def load(cls, dll) -> "Driver | None":
        """The library's driver, or None (built before it existed, or another ABI)."""
        abi = getattr(dll, "tilegen_driver_abi", None)
        sizes = getattr(dll, "tilegen_driver_sizes", None)
        if abi is None or sizes is None:
            return None
        abi.restype = sizes.restype = ctypes.c_uint64
        abi.argtypes = sizes.argtypes = []
        want = (ctypes.sizeof(PlanStruct) | ctypes.sizeof(PoolStruct) << 16
                | ctypes.sizeof(PackTask) << 32 | ctypes.sizeof(MmTask) << 48)
        if abi() != ABI or sizes() != want:
            return None
        return cls(dll)


class Pool:
    """Worker threads of one library's driver (``threads - 1`` of the biggest plan).

    The pool lives as long as its driver: the library and every plan of it hold that.  When
    the last of them is gone (or ``lib.close()`` ends it) its workers are stopped and joined
    (:func:`_stop_workers`); they do not outlive the library."""

    def __init__(self, drv: Driver) -> None:
        self.worker = drv.worker         # not the driver itself: no cycle, freed by refcount
        self.s = PoolStruct()
        self.s.spin = spin_count()
        self.addr = ctypes.addressof(self.s)
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.closed = False
        # holds the struct and the thread list, not the pool: runs when the pool is collected
        self._stop = weakref.finalize(self, _stop_workers, self.s, self.threads, drv.wake)
        reset_after_fork(self)

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

