"""Threading: one persistent pool per process, and how the work is partitioned over it.

ctypes releases the GIL during a foreign call, so Python threads run kernels in parallel.
Work is split like llama.cpp's kleidiai.cpp: LHS packing over m in multiples of the kernel's
m_step, the matmul over n in multiples of n_step, with a barrier (the pool's join) between.
Every output element is computed by exactly one call with the same inputs, so results are
bit-identical for every thread count.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

__all__ = ["split", "default_threads", "run_parallel"]

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pool_workers = 0


def default_threads() -> int:
    env = os.environ.get("TILEGEN_THREADS")
    if env:
        try:
            n = int(env)
        except ValueError:
            raise ValueError(f"TILEGEN_THREADS must be a positive int, got {env!r}") from None
        if n < 1:
            raise ValueError(f"TILEGEN_THREADS must be >= 1, got {n}")
        return n
    return max(1, os.cpu_count() or 1)


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


def _get_pool(workers: int) -> ThreadPoolExecutor:
    """The shared pool, with at least ``workers`` threads.

    A smaller pool is replaced, never shut down: other callers may hold it and still submit
    to it.  Its idle threads exit once the last reference to it is dropped (the executor's
    weakref callback wakes them)."""
    global _pool, _pool_workers
    with _lock:
        if _pool is None or _pool_workers < workers:
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tilegen")
            _pool_workers = workers
        return _pool


def run_parallel(tasks: Sequence[Callable[[], None]]) -> None:
    """Run tasks on the persistent pool (the caller runs the first) and wait for all."""
    if not tasks:
        return
    if len(tasks) == 1:
        tasks[0]()
        return
    pool = _get_pool(len(tasks) - 1)
    futures = [pool.submit(t) for t in tasks[1:]]
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
