"""Threading: a worker pool per library, and how the work is partitioned over it.

ctypes releases the GIL during a foreign call, so Python threads run kernels in parallel.
Work is split like llama.cpp's kleidiai.cpp: LHS packing over m in multiples of the kernel's
m_step, the matmul over n in multiples of n_step, with a barrier (the pool's join) between.
Every output element is computed by exactly one call with the same inputs, so results are
bit-identical for every thread count.

Each library owns one :class:`Workers` (``lib.matmul``'s threads); its threads end when the
library is collected or closed.  The state of every pool is reset in a forked child (a lock
held by another thread at the fork would stay held there, and the parent's threads do not
exist in the child).
"""
from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from .checks import MAX_THREADS, env_int

__all__ = ["split", "default_threads", "run_parallel", "Workers", "reset_after_fork"]


def default_threads() -> int:
    """``TILEGEN_THREADS`` (1..MAX_THREADS), else the number of CPUs."""
    n = env_int("TILEGEN_THREADS", 1, MAX_THREADS)
    return max(1, os.cpu_count() or 1) if n is None else n


def split(total: int, step: int, parts: int) -> list[tuple[int, int]]:
    """Cut [0, total) into at most ``parts`` ranges whose starts are multiples of ``step``."""
    if total <= 0:
        return []
    units = -(-total // step)
    parts = max(1, min(parts, units))
    base, extra = divmod(units, parts)
    out, start = [], 0
    for i in range(parts):
        u = base + (1 if i < extra else 0)
        end = min(total, start + u * step)
        out.append((start, end))
        start = end
    return out


class Workers:
    """A growable thread pool (a ThreadPoolExecutor, replaced by a bigger one when more
    threads are asked for).  ``close()`` ends it; so does collecting it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._size = 0
        self.closed = False
        reset_after_fork(self)

    def _get(self, workers: int) -> ThreadPoolExecutor | None:
        with self._lock:
            if self.closed:
                return None
            if self._pool is None or self._size < workers:
                old = self._pool
                self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tilegen")
                self._size = workers
                if old is not None:
                    old.shutdown(wait=False)    # its running tasks finish; its threads exit
            return self._pool

    def threads(self) -> list[threading.Thread]:
        """The pool's threads now (diagnostics)."""
        p = self._pool
        return list(getattr(p, "_threads", ())) if p is not None else []

    def close(self) -> None:
        """Stop the threads once their tasks are done (joined); later runs use the caller."""
        with self._lock:
            self.closed = True
            pool, self._pool, self._size = self._pool, None, 0
        if pool is not None:
            pool.shutdown(wait=True)

    def __del__(self) -> None:
        pool = self.__dict__.get("_pool")
        if pool is not None:
            pool.shutdown(wait=False)

    def after_fork(self) -> None:
        # the executor's threads (and any lock they held) are the parent's: forget it
        self._lock = threading.Lock()
        self._pool, self._size = None, 0

    def run(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run tasks on the pool (the caller runs the first) and wait for all."""
        if not tasks:
            return
        pool = self._get(len(tasks) - 1) if len(tasks) > 1 else None
        if pool is None:
            for t in tasks:
                t()
            return
        try:
            futures = [pool.submit(t) for t in tasks[1:]]
        except RuntimeError:        # shut down by a concurrent close() or a bigger pool
            for t in tasks:
                t()
            return
        err = None
        try:
            tasks[0]()
        except BaseException as e:  # still wait for the others (barrier) before raising
            err = e
        for f in futures:
            try:
                f.result()
            except BaseException as e:
                err = err or e
        if err is not None:
            raise err


# objects with locks and run flags of threads a forked child does not have: the worker pools
# here, the plan driver's pools, plans and their row-count variants (tilegen.runtime.plan)
_FORK_RESET: weakref.WeakSet = weakref.WeakSet()


def reset_after_fork(obj) -> None:
    """Call ``obj.after_fork()`` in every forked child while ``obj`` lives: only the forking
    thread exists there, so a lock another thread held at the fork stays held forever, and a
    run flag stays set; ``after_fork`` resets them."""
    _FORK_RESET.add(obj)


def _after_fork() -> None:
    for obj in list(_FORK_RESET):
        obj.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def run_parallel(tasks: Sequence[Callable[[], None]], workers: Workers | None = None) -> None:
    """Run tasks on ``workers`` (None: on the calling thread, one after another)."""
    if workers is None:
        for t in tasks:
            t()
        return
    workers.run(tasks)
