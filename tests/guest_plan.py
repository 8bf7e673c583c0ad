"""Guest-side functions of tests/test_plan.py (prepared matmuls, lib.plan)."""
from __future__ import annotations

import numpy as np

import tilegen

_LIBS: dict[str, object] = {}


def _lib(libdir: str):
    lib = _LIBS.get(libdir)
    if lib is None:
        lib = _LIBS[libdir] = tilegen.load(libdir)
    return lib


def _same(a, b) -> bool:
    """Bit-identical float32 arrays (NaN payloads included)."""
    return a.shape == b.shape and np.array_equal(np.ascontiguousarray(a).view(np.uint32),
                                                 np.ascontiguousarray(b).view(np.uint32))


def _in_child(fn, timeout: float = 60.0, hold=None):
    """fn() in a forked child (forked inside the context manager ``hold`` when given):
    ("ok", its result) or ("error", repr of what it raised), through a pipe; None when the
    child did not end within ``timeout`` seconds (it is killed)."""
    import contextlib
    import os
    import pickle
    import signal
    import time
    rd, wr = os.pipe()
    with hold if hold is not None else contextlib.nullcontext():
        pid = os.fork()
        if pid == 0:
            try:
                os.close(rd)
                msg = pickle.dumps(("ok", fn()))
            except BaseException as e:      # noqa: BLE001 - reported to the parent
                msg = pickle.dumps(("error", repr(e)))
            os.write(wr, msg)
            os._exit(0)
    os.close(wr)
    t0, hung = time.monotonic(), False
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() - t0 > timeout:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hung = True
            break
        time.sleep(0.002)
    data = b""
    while chunk := os.read(rd, 4096):
        data += chunk
    os.close(rd)
    return None if hung else pickle.loads(data)


def _weights(lib, kind, w):
    if kind == "f16":
        return lib.pack_weights(w.astype(np.float16), kind="f16")
    return lib.pack_weights(w, kind=kind)


def plan_vs_matmul(libdir: str, kinds, shapes, thread_counts=(1, 2), seed=0,
                   no_driver=False) -> dict:
    """For each kind, (m, n, k) and thread count, with and without bias / clamp: plan(x),
    plan(x, out), fewer rows and a batched x against lib.matmul; returns the mismatches and
    what ran (kernels, native fast path or not)."""
    lib = _lib(libdir)
    if no_driver:
        lib = tilegen.load(libdir)
        lib.driver = None
    rng = np.random.default_rng(seed)
    bad, ran = [], set()
    for kind in kinds:
        for m, n, k in shapes:
            w = rng.normal(size=(n, k)).astype(np.float32)
            pw = _weights(lib, kind, w)
            bias = rng.normal(size=n).astype(np.float32)
            for threads in thread_counts:
                for b, clamp in ((None, None), (None, (-0.25, 0.5)), (bias, None),
                                 (bias, (-0.5, 0.25)), (bias, (0.0, np.inf))):
                    x = rng.normal(size=(m, k)).astype(np.float32)
                    p = lib.plan(pw, m, bias=b, clamp=clamp, threads=threads)
                    ran.add((kind, p.kernel.name, p.native))
                    ref = lib.matmul(x, pw, bias=b, clamp=clamp, threads=threads)
                    out = np.full((m, n), np.nan, np.float32)
                    tag = (kind, m, n, k, threads, b is not None, clamp)
                    if not _same(p(x), ref) or p(x, out) is not out or not _same(out, ref):
                        bad.append(tag)
                    for rows in {1, m // 2 or 1, m - 1 or 1}:
                        r = lib.matmul(x[:rows], pw, bias=b, clamp=clamp, threads=threads)
                        if not _same(p(x[:rows]), r):
                            bad.append(tag + (f"rows={rows}",))
                    if m % 2 == 0:        # batched (2, m/2, k)
                        xb = x.reshape(2, m // 2, k)
                        if not _same(p(xb), ref.reshape(2, m // 2, n)):
                            bad.append(tag + ("batched",))
    return {"bad": bad, "ran": sorted(ran)}


def plan_errors(libdir: str, kind: str = "q4_0") -> dict:
    """Every misuse of lib.plan and of a plan call: (type name, message) per case; then the
    plan still gives the right result."""
    lib = _lib(libdir)
    rng = np.random.default_rng(3)
    n, k, m = 12, 64, 4
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind=kind)
    x = rng.normal(size=(m, k)).astype(np.float32)
    res = {}

    def rec(name, fn):
        try:
            fn()
            res[name] = None
        except Exception as e:      # noqa: BLE001 - the error is the result
            res[name] = (type(e).__name__, str(e))

    rec("weights not packed", lambda: lib.plan(np.ones((n, k), np.float32), m))
    rec("m 0", lambda: lib.plan(pw, 0))
    rec("m float", lambda: lib.plan(pw, 2.0))
    rec("bias shape", lambda: lib.plan(pw, m, bias=np.ones(n + 1, np.float32)))
    rec("bias dtype", lambda: lib.plan(pw, m, bias=np.ones(n)))
    rec("clamp", lambda: lib.plan(pw, m, clamp=(1, 0)))
    rec("threads 0", lambda: lib.plan(pw, m, threads=0))
    rec("threads bool", lambda: lib.plan(pw, m, threads=True))
    p = lib.plan(pw, m, threads=2)
    out = np.zeros((m, n), np.float32)
    ro = np.zeros((m, n), np.float32)
    ro.flags.writeable = False
    big = np.full((m, k), 1e7, np.float32)
    nan = x.copy()
    nan[1, 3] = np.nan
    rec("x float64", lambda: p(x.astype(np.float64)))
    rec("x list", lambda: p(x.tolist()))
    rec("x 1-D", lambda: p(x[0]))
    rec("x wrong k", lambda: p(np.ones((m, k + 32), np.float32)))
    rec("x too many rows", lambda: p(np.ones((m + 1, k), np.float32)))
    rec("x batched too many rows", lambda: p(np.ones((2, m, k), np.float32)))
    rec("x no rows", lambda: p(np.ones((0, k), np.float32)))
    rec("out wrong shape", lambda: p(x, np.zeros((m, n + 1), np.float32)))
    rec("out float64", lambda: p(x, np.zeros((m, n))))
    rec("out read-only", lambda: p(x, ro))
    rec("out strided", lambda: p(x, np.zeros((m, 2 * n), np.float32)[:, ::2]))
    rec("out list", lambda: p(x, [[0.0] * n] * m))
    rec("x nan", lambda: p(nan, out))
    rec("x too big", lambda: p(big, out))
    res["out after failed calls"] = out.copy()
    res["matmul x nan"] = None
    try:
        lib.matmul(nan, pw)
    except Exception as e:      # noqa: BLE001
        res["matmul x nan"] = (type(e).__name__, str(e))
    try:
        lib.matmul(big[:1], pw)
    except Exception as e:      # noqa: BLE001
        res["matmul x too big"] = (type(e).__name__, str(e))
    rec("x too big 1 row", lambda: p(big[:1]))
    # LHS packed over threads (rows > m_step): the refused rows are the last ones
    mbig = 40
    pb = lib.plan(pw, mbig, threads=2)
    xb = rng.normal(size=(mbig, k)).astype(np.float32)
    xb[-1, -1] = np.inf
    outb = np.zeros((mbig, n), np.float32)
    rec("x inf, shared pack", lambda: pb(xb, outb))
    res["shared pack tasks"] = int(pb._variants[mbig].s.npack)
    res["out after failed shared call"] = outb.copy()
    res["still right"] = _same(p(x), lib.matmul(x, pw, threads=2))
    return res


def plan_reuse(libdir: str, kind: str = "q4_0", calls: int = 300, threads: int = 2) -> dict:
    """One plan called many times with fresh x (rows varying), out given or not, out aliasing
    x (n == k), non-contiguous x; every result against lib.matmul."""
    lib = _lib(libdir)
    rng = np.random.default_rng(5)
    n = k = 64
    m = 6
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind=kind)
    p = lib.plan(pw, m, threads=threads)
    out = np.empty((m, n), np.float32)
    bad = []
    for i in range(calls):
        rows = m if i % 3 else int(rng.integers(1, m + 1))
        x = rng.normal(size=(rows, k)).astype(np.float32)
        ref = lib.matmul(x, pw, threads=threads)
        if i % 5 == 1 and rows == m:
            got = p(x, out)
        elif i % 7 == 2:             # out is x
            xx = x.copy()
            got = p(xx, xx)
            if got is not xx:
                bad.append((i, "not out"))
        elif i % 11 == 3:            # non-contiguous x
            xs = np.zeros((rows, 2 * k), np.float32)
            xs[:, ::2] = x
            got = p(xs[:, ::2])
        else:
            got = p(x)
        if not _same(got, ref):
            bad.append((i, rows))
    return {"bad": bad, "variants": sorted(p._variants), "native": p.native}


def plan_threads(libdir: str, kind: str = "q4_0", thread_counts=(1, 2, 3, 5, 8)) -> dict:
    """Plans of several thread counts, alternated on one x, then used concurrently from
    Python threads (each its own plan, and all on one shared plan)."""
    import threading
    lib = _lib(libdir)
    rng = np.random.default_rng(7)
    n, k = 75, 128
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind=kind)
    res = {}
    for m in (1, 9):
        xs = [rng.normal(size=(m, k)).astype(np.float32) for _ in range(8)]
        refs = [lib.matmul(x, pw, threads=1) for x in xs]
        plans = {t: lib.plan(pw, m, threads=t) for t in thread_counts}
        alt = all(_same(plans[t](x), r) for _ in range(3) for t in thread_counts
                  for x, r in zip(xs, refs))
        shared = lib.plan(pw, m, threads=2)
        errors, bad = [], []

        def worker(i, p):
            try:
                for rep in range(20):
                    j = (i + rep) % len(xs)
                    if not _same(p(xs[j]), refs[j]):
                        bad.append((i, rep))
            except Exception as e:      # noqa: BLE001
                errors.append(repr(e))
        ths = [threading.Thread(target=worker, args=(i, plans[thread_counts[i % len(thread_counts)]]))
               for i in range(4)]
        ths += [threading.Thread(target=worker, args=(4 + i, shared)) for i in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        res[m] = {"alternating": alt, "concurrent_bad": bad, "errors": errors}
    pool = lib.driver.pool
    res["pool_workers"] = len(pool.threads) if pool is not None else None
    return res


def plan_after_fork(libdir: str, kind: str = "q4_0") -> dict:
    """A 2-thread plan used before fork, then in the child (its pool started again)."""
    lib = _lib(libdir)
    rng = np.random.default_rng(9)
    n, k = 40, 64
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind=kind)
    x = rng.normal(size=(1, k)).astype(np.float32)
    p = lib.plan(pw, 1, threads=2)
    ref = lib.matmul(x, pw, threads=1)
    before = _same(p(x), ref)
    child = _in_child(lambda: (all(_same(p(x), ref) for _ in range(5)),
                               len(lib.driver.pool.threads)))
    child = child[1] if child and child[0] == "ok" else child
    return {"before": before, "child": child, "after": _same(p(x), ref)}


# -- hardening: fork, thread lifetime, table snapshot, allocation, environment -----------------
def _tasks() -> int:
    """OS threads of this process (qemu's own included: compare with a baseline)."""
    import os
    return len(os.listdir("/proc/self/task"))


def fork_while_preparing(libdir: str, forks: int = 200, kind: str = "q4_0",
                         timeout: float = 60.0) -> dict:
    """A thread prepares row counts of one plan (each a first call of that row count, which
    takes the plan's build lock) while this thread forks ``forks`` children; each child calls
    the plan with a row count nobody prepared and reports its result.  Hung children are
    killed after ``timeout`` seconds."""
    import threading
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(21)
    n, k = 8, 32
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind=kind)
    top = 3000
    m = top + forks + 4000
    x = rng.normal(size=(m, k)).astype(np.float32)
    p = lib.plan(pw, m, threads=2)
    child_rows = [top + 1 + i for i in range(forks)]
    refs = {r: lib.matmul(x[:r], pw, threads=1) for r in child_rows}
    stop = threading.Event()
    prepared = [0]

    def prepare():
        rows = [r for r in range(1, m + 1) if r not in refs]
        for r in rows:
            if stop.is_set():
                break
            p(x[:r])
            prepared[0] += 1
    th = threading.Thread(target=prepare)
    th.start()
    hangs, bad, errors = [], [], []
    for r in child_rows:
        got = _in_child(lambda r=r: _same(p(x[:r]), refs[r]), timeout)
        if got is None:
            hangs.append(r)
            continue
        status, value = got
        if status != "ok":
            errors.append((r, value))
        elif not value:
            bad.append(r)
    stop.set()
    th.join()
    lib.close()
    return {"forks": forks, "hangs": hangs, "bad": bad, "errors": errors,
            "prepared_during": prepared[0]}


def threads_after_cycles(libdir: str, cycles: int = 30, kind: str = "q4_0") -> dict:
    """Thread counts: baseline; after ``cycles`` x (load, plan(threads=4), call, matmul
    (threads=4), del, gc.collect()); during and after an explicitly closed library and a
    ``with`` block; and what a closed library's plan and matmul do."""
    import gc
    import threading
    import time
    rng = np.random.default_rng(5)
    n, k = 64, 64
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(9, k)).astype(np.float32)

    def settle(target, limit=10.0):
        t0 = time.monotonic()
        while (threading.active_count(), _tasks()) != target and time.monotonic() - t0 < limit:
            gc.collect()
            time.sleep(0.01)
        return threading.active_count(), _tasks()

    gc.collect()
    base = (threading.active_count(), _tasks())
    peak = base
    for _ in range(cycles):
        lib = tilegen.load(libdir)
        pw = lib.pack_weights(w, kind=kind)
        p = lib.plan(pw, 9, threads=4)
        p(x)
        lib.matmul(x, pw, threads=4)
        peak = max(peak, (threading.active_count(), _tasks()))
        del lib, pw, p
        gc.collect()
    after_cycles = settle(base)
    # a plan alone keeps the pool alive; dropping it ends the pool
    lib = tilegen.load(libdir)
    pw = lib.pack_weights(w, kind=kind)
    p = lib.plan(pw, 9, threads=4)
    ref = lib.matmul(x, pw, threads=1)
    del lib
    gc.collect()
    plan_alone_ok = _same(p(x), ref)
    plan_alone_threads = threading.active_count() - base[0]
    del p, pw
    after_plan_dropped = settle(base)
    # close(): joined at once, no gc needed; the plan and matmul refuse afterwards
    lib = tilegen.load(libdir)
    pw = lib.pack_weights(w, kind=kind)
    p = lib.plan(pw, 9, threads=4)
    p(x)
    lib.matmul(x, pw, threads=4)
    open_threads = threading.active_count() - base[0]
    lib.close()
    closed_threads = threading.active_count() - base[0]
    refused = []
    for name, f in (("plan call", lambda: p(x)), ("plan call, other rows", lambda: p(x[:3])),
                    ("matmul", lambda: lib.matmul(x, pw)), ("plan", lambda: lib.plan(pw, 9))):
        try:
            f()
            refused.append((name, "no error"))
        except tilegen.runtime.errors.ArgumentError as e:
            refused.append((name, "closed" in str(e)))
    rows_after_close = lib.get_rows(pw, [0, 3]).shape
    lib.close()            # twice: a no-op
    del lib, pw, p
    with tilegen.load(libdir) as lib:
        pw = lib.pack_weights(w, kind=kind)
        lib.plan(pw, 9, threads=3)(x)
        with_open = threading.active_count() - base[0]
    with_closed = threading.active_count() - base[0]
    del lib, pw
    gc.collect()
    return {"base": base, "peak": peak, "after_cycles": after_cycles,
            "plan_alone_ok": plan_alone_ok, "plan_alone_threads": plan_alone_threads,
            "after_plan_dropped": after_plan_dropped, "open_threads": open_threads,
            "closed_threads": closed_threads, "refused": refused,
            "rows_after_close": rows_after_close, "with_open": with_open,
            "with_closed": with_closed, "end": settle(base)}


def plan_keeps_its_table(libdir: str) -> dict:
    """A plan made before set_table (and a gemv_threshold change) keeps the kernels it was made
    with for row counts it prepares later."""
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(3)
    n, k = 24, 64
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind="q4_0")
    x = rng.normal(size=(8, k)).astype(np.float32)
    refs = {r: lib.matmul(x[:r], pw, threads=1) for r in (1, 2, 3, 8)}
    p = lib.plan(pw, 8, threads=1)
    first = {r: p.route(r)[1].name for r in (1, 3)}
    # a table whose kernels read another layout: new packings need adopt, not this plan
    cur = lib.table("q4_0")[0]
    other = [pr for pr in lib.table("q4_0")
             if lib.runnable(pr.gemm) and not pr.gemm.rhs_matches(pw)
             and (pr.gemv is None or lib.runnable(pr.gemv))]
    lib.set_table("q4_0", [other[0]])
    lib.gemv_threshold = 4
    got = {}
    for r in (3, 2, 1, 8):
        try:
            got[r] = _same(p(x[:r]), refs[r])
        except Exception as e:      # noqa: BLE001
            got[r] = repr(e)
    later = {r: p.route(r)[1].name for r in (1, 3)}
    # a plan made now uses the new table (adopting the weights)
    p2 = lib.plan(pw, 8, threads=1)
    return {"got": got, "first": first, "later": later, "cur": cur.gemm.name,
            "new_table_kernel": p2.route(8)[1].name, "other": other[0].gemm.name,
            "new_plan_ok": bool(np.allclose(p2(x), refs[8], rtol=0.1, atol=0.5))}


def plan_allocations(libdir: str) -> dict:
    """What a plan allocates per call (tracemalloc sees numpy's buffers), and the m refused."""
    import tracemalloc
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(4)
    n, k = 1024, 32
    pw = lib.pack_weights(rng.normal(size=(n, k)).astype(np.float32), kind="f32")
    res = {}
    for m in (2**40, 2**62):
        try:
            lib.plan(pw, m)
            res[m] = "accepted"
        except tilegen.runtime.errors.ArgumentError as e:
            res[m] = str(e)
    p = lib.plan(pw, 2**20, threads=1)        # 4 GiB of out for all rows
    x = rng.normal(size=(1, k)).astype(np.float32)
    ref = lib.matmul(x, pw, threads=1)
    p(x)
    tracemalloc.start()
    same = _same(p(x), ref)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    res["one_row_same"] = same
    res["one_row_peak_bytes"] = peak
    return res


def bad_env(libdir: str) -> dict:
    """lib.plan / matmul with TILEGEN_PLAN_SPIN and TILEGEN_THREADS set to bad values."""
    import os
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(6)
    pw = lib.pack_weights(rng.normal(size=(8, 32)).astype(np.float32), kind="f32")
    x = rng.normal(size=(2, 32)).astype(np.float32)
    out = {}
    for var, vals in (("TILEGEN_PLAN_SPIN", ("-1", "abc", "1e3", str(2**64 - 1), "0", "500")),
                      ("TILEGEN_THREADS", ("0", "-3", "abc", "2.5", "99999", "3"))):
        for v in vals:
            os.environ[var] = v
            try:
                if var == "TILEGEN_PLAN_SPIN":
                    lib.plan(pw, 2, threads=2)(x)
                else:
                    lib.matmul(x, pw)
                out[(var, v)] = "ok"
            except tilegen.runtime.errors.ArgumentError as e:
                out[(var, v)] = ("ArgumentError", var in str(e))
            except Exception as e:      # noqa: BLE001
                out[(var, v)] = repr(e)
            finally:
                del os.environ[var]
    lib.close()
    return out


def plan_made_while_closing(libdir: str) -> dict:
    """lib.plan in one thread while this thread closes the library, the interleaving forced:
    the plan's maker is held (in adopt, after the open check) until close() has returned.
    Per case (the library's first plan, so no driver yet; a library that already has a plan
    driver and pool): what lib.plan gave, the threads left over the baseline, and what the
    plan (if any) does when called."""
    import gc
    import threading
    import time
    rng = np.random.default_rng(13)
    n, k, m = 64, 32, 4
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(m, k)).astype(np.float32)
    gc.collect()
    base = threading.active_count()
    res = {}
    for case in ("first plan", "driver exists"):
        lib = tilegen.load(libdir)
        pw = lib.pack_weights(w, kind="f32")
        if case == "driver exists":
            lib.plan(pw, m, threads=2)(x)
        inside, closed = threading.Event(), threading.Event()
        adopt = lib.adopt

        def held_adopt(weights, *a, **kw):
            inside.set()
            closed.wait(30)
            return adopt(weights, *a, **kw)
        lib.adopt = held_adopt
        got = {}

        def make():
            try:
                got["plan"] = lib.plan(pw, m, threads=3)
            except Exception as e:      # noqa: BLE001 - the error is the result
                got["error"] = (type(e).__name__, str(e))
        th = threading.Thread(target=make)
        th.start()
        inside.wait(30)
        lib.close()
        closed.set()
        th.join(30)
        t0 = time.monotonic()
        while threading.active_count() > base + 1 and time.monotonic() - t0 < 5:
            time.sleep(0.01)         # + 1: the maker thread, ending
        th.join()
        out = {"error": got.get("error"), "plan": "plan" in got,
               "threads": threading.active_count() - base}
        if "plan" in got:
            try:
                got["plan"](x)
                out["call"] = "computed"
            except Exception as e:      # noqa: BLE001
                out["call"] = (type(e).__name__, str(e))
        res[case] = out
        del lib, pw, got
        gc.collect()
    return res


def fork_while_closing_lock_held(libdir: str, timeout: float = 60.0) -> dict:
    """fork while the library's lifetime lock (close(), plan registration, the driver) is
    held: the child makes and calls a plan and closes the library without blocking."""
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(14)
    pw = lib.pack_weights(rng.normal(size=(64, 32)).astype(np.float32), kind="q4_0")
    x = rng.normal(size=(3, 32)).astype(np.float32)
    ref = lib.matmul(x, pw, threads=1)

    def child():
        ok = _same(lib.plan(pw, 3, threads=2)(x), ref)
        lib.close()
        return ok, lib.closed
    got = _in_child(child, timeout, hold=lib._lifetime)
    lib.close()
    return {"hung": got is None,
            "child": None if got is None else (got[0], *got[1]) if got[0] == "ok" else got}


def _kind_weights(lib, kind, n, k, rng):
    """Weights of any kind: random valid ggml blocks for the kinds whose layout takes only
    those (the K-quants: ``ggml_only``), floats else."""
    from tilegen.families import KIND_FAMILY, rhs_layout_class
    lay = rhs_layout_class(KIND_FAMILY[kind])
    if lay.ggml_only:
        blocks = lay.random_ggml(n, k, int(rng.integers(1 << 30)))
        return lib.pack_weights(kind=kind, from_ggml=blocks, n=n, k=k)
    return _weights(lib, kind, rng.normal(size=(n, k)).astype(np.float32))


def plan_lazy_workspace(libdir: str, kinds, huge: int = 2**30, n: int = 9, k: int = 4096,
                        m: int = 5) -> dict:
    """Per kind: what lib.plan(w, m=huge) allocates (tracemalloc sees numpy's buffers) or
    raises, and calls of 1 and 3 rows of it against lib.matmul; then a plan for m rows: its
    first calls, and what a later fast-path call of m rows allocates."""
    import tracemalloc
    lib = _lib(libdir)
    rng = np.random.default_rng(11)
    res = {}
    for kind in kinds:
        pw = _kind_weights(lib, kind, n, k, rng)
        r = res[kind] = {}
        tracemalloc.start()
        try:
            p = lib.plan(pw, huge, threads=2)
            r["huge"] = "ok"
        except BaseException as e:      # noqa: BLE001 - reported to the host
            p, r["huge"] = None, f"{type(e).__name__}: {e}"
        r["huge_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if p is not None:
            for rows in (1, 3):
                x = rng.normal(size=(rows, k)).astype(np.float32)
                r[f"huge_rows_{rows}_same"] = _same(p(x), lib.matmul(x, pw, threads=2))
        q = lib.plan(pw, m, threads=2)
        r["native"] = q.native
        xs = [rng.normal(size=(m, k)).astype(np.float32) for _ in range(3)]
        out = np.empty((m, n), np.float32)
        r["calls_same"] = [_same(q(xs[0]), lib.matmul(xs[0], pw, threads=2)),
                           _same(q(xs[1], out), lib.matmul(xs[1], pw, threads=2))]
        ref = lib.matmul(xs[2], pw, threads=2)
        tracemalloc.start()
        q(xs[2], out)
        r["fast_call_peak_bytes"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        r["calls_same"].append(_same(out, ref))
        r["kernel"] = q.kernel.name
    return res
