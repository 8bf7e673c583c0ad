"""Functions the tests run inside the emulated aarch64 Python (via GuestSession.call).

Kept free of pytest so that the guest imports little.
"""
from __future__ import annotations

import numpy as np

import tilegen

_LIBS: dict[str, object] = {}


def _lib(libdir: str):
    lib = _LIBS.get(libdir)
    if lib is None:
        lib = _LIBS[libdir] = tilegen.load(libdir)
    return lib


def machine() -> dict:
    import platform
    from tilegen.runtime.cpu import detect
    cpu = detect()
    return {"machine": platform.machine(), "features": sorted(cpu.features)}


def run_f32_cases(libdir: str, name: str, cases: list[dict]) -> list[np.ndarray]:
    """Call kernel `name` on each case; lhs/dst are views into padded buffers so that row
    strides differ from the row length.  Returns each full dst buffer (padding included)."""
    kern = _lib(libdir).kernel(name)
    outs = []
    for c in cases:
        m, n, k = c["m"], c["n"], c["k"]
        lhs = c["lhs_base"][:m, :k]
        dst_base = c["dst_base"].copy()
        dst = dst_base[:m, :n]
        kern(lhs, c["packed"], dst, c["clamp_min"], c["clamp_max"])
        outs.append(dst_base)
    return outs


def kernel_call(libdir: str, name: str, lhs, packed, dst, *clamp):
    """Raw call with host-made arguments; returns dst."""
    return _lib(libdir).kernel(name)(lhs, packed, dst, *clamp)


def _bad_kernel_args(what: str, nr: int = 8):
    from tilegen.layout import F32PackedRHS
    f = np.float32
    lhs = np.ones((4, 6), f)
    dst = np.zeros((4, 10), f)
    packed = F32PackedRHS(nr).pack(np.ones((10, 6), f))
    ro = np.zeros((4, 10), f)
    ro.flags.writeable = False
    unaligned = np.frombuffer(bytearray(4 * 24 + 1), dtype=np.uint8)[1:].view(f).reshape(4, 6)
    cases = {
        "lhs float64": (lhs.astype(np.float64), packed, dst),
        "lhs 1-D": (np.ones(6, f), packed, dst),
        "lhs list": (lhs.tolist(), packed, dst),
        "lhs columns strided": (np.ones((4, 12), f)[:, ::2], packed, dst),
        "lhs rows reversed": (np.ones((4, 6), f)[::-1], packed, dst),
        "lhs misaligned": (unaligned, packed, dst),
        "dst rows mismatch": (lhs, packed, np.zeros((3, 10), f)),
        "dst int32": (lhs, packed, np.zeros((4, 10), np.int32)),
        "dst read-only": (lhs, packed, ro),
        "dst broadcast": (lhs, packed, np.broadcast_to(np.zeros(10, f), (4, 10))),
        "packed too small": (lhs, packed[:-4], dst),
        "packed float32": (lhs, packed.view(f), dst),
        "packed strided": (lhs, np.repeat(packed, 2)[::2], dst),
        "k mismatch": (np.ones((4, 7), f), packed, dst),
        "empty lhs": (np.ones((0, 6), f), packed, np.zeros((0, 10), f)),
        "clamp not a number": (lhs, packed, dst, "low", 1.0),
        "clamp NaN": (lhs, packed, dst, float("nan"), 1.0),
        "clamp min > max": (lhs, packed, dst, 1.0, -1.0),
    }
    return cases if what == "*" else cases[what]


BAD_KERNEL_CALLS = ["lhs float64", "lhs 1-D", "lhs list", "lhs columns strided",
                    "lhs rows reversed", "lhs misaligned", "dst rows mismatch", "dst int32",
                    "dst read-only", "dst broadcast", "packed too small", "packed float32",
                    "packed strided", "k mismatch", "empty lhs", "clamp not a number", "clamp NaN",
                    "clamp min > max"]


def bad_kernel_call(libdir: str, name: str, what: str):
    return _lib(libdir).kernel(name)(*_bad_kernel_args(what))


def matmul(libdir: str, w, x, bias=None, clamp=None, layout="nk", nr=None, threads=None,
           kind="f32"):
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind, bias=bias, layout=layout, nr=nr)
    return (lib.matmul(x, pw, clamp=clamp, threads=threads), pw.nr,
            lib.select(pw, x.reshape(-1, pw.k).shape[0]).name)


def matmul_threads(libdir: str, w, x, kind="f32", thread_counts=(1, 2, 3, 5)):
    """The same matmul with several thread counts (results must be bit-identical)."""
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    return [lib.matmul(x, pw, threads=t) for t in thread_counts]


def load_error(libdir: str) -> str:
    try:
        tilegen.load(libdir)
    except tilegen.runtime.LoadError as e:
        return str(e)
    return ""


def run_q4_cases(libdir: str, name: str, cases: list[dict]) -> list[np.ndarray]:
    """Call q4 kernel `name` on packed inputs; dst is a view into a sentinel-filled buffer."""
    kern = _lib(libdir).kernel(name)
    outs = []
    for c in cases:
        m, n = c["m"], c["n"]
        dst_base = np.full((m + 2, n + 3), c["sentinel"], np.float32)
        kern(c["lhs_packed"], c["rhs_packed"], dst_base[:m, :n], c["clamp_min"], c["clamp_max"],
             k=c["k"], bl=c["bl"])
        outs.append(dst_base)
    return outs


def kernel_refused(libdir: str, name: str) -> str:
    """The error the runtime gives for a kernel this CPU cannot run ('' if it is allowed)."""
    try:
        _lib(libdir).kernel(name)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return ""


def lib_pack_lhs(libdir: str, fmt: str, x, mr: int, kr: int, sr: int, bl: int, m_idx_start: int,
                 row_pad: int = 0):
    """The library's NEON packer on rows x (given a padded row stride in the guest)."""
    if row_pad:
        base = np.zeros((x.shape[0], x.shape[1] + row_pad), np.float32)
        base[:, :x.shape[1]] = x
        x = base[:, :x.shape[1]]
    return _lib(libdir).pack_lhs(fmt, x, mr=mr, kr=kr, sr=sr, bl=bl, m_idx_start=m_idx_start)


def q4_ops(libdir: str, kind: str, w, x, raw=None, threads=(1, 2, 3), rows=None):
    """pack_weights (from float, and from ggml bytes if given) + matmul + get_rows."""
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    outs = [lib.matmul(x, pw, threads=t) for t in threads]
    res = {"outs": outs, "kernel": lib.select(pw, x.reshape(-1, pw.k).shape[0]).name,
           "gemv": lib.select(pw, 1).name, "format": pw.format, "nr": pw.nr, "kr": pw.kr,
           "sr": pw.sr, "packed": pw.data}
    if raw is not None:
        pg = lib.pack_weights(kind=kind, from_ggml=raw, n=w.shape[0], k=w.shape[1])
        res["packed_ggml"] = pg.data
        res["gemv_out"] = lib.matmul(x[:1], pg)
    if rows is not None:
        res["rows"] = lib.get_rows(pw, rows)
    return res


def picks(libdir: str, kinds=None) -> dict:
    """Which gemm/gemv kernel each weight kind selects on this CPU (tilegen info's view);
    ``kinds``: these kinds (default: f32, f16, q4_0, q4_0_dx and the K-quants q4_K / q6_K the
    library has)."""
    lib = _lib(libdir)
    out = {}
    families = {k.family for k in lib.kernels.values()}
    if kinds is not None:
        for kind in kinds:
            p = lib.kernel_table.pairs(kind)[0]
            out[kind] = (p.gemm.name, (p.gemv or p.gemm).name)
        return out
    for kind in ("f32", "f16", "q4_0", "q4_0_dx", "q4_K", "q6_K"):
        if kind in ("q4_K", "q6_K") and kind not in families:     # libraries without K-quants
            continue
        p = lib.kernel_table.pairs(kind)[0]
        out[kind] = (p.gemm.name, (p.gemv or p.gemm).name)
    return out


def run_ops(libdir: str, kind: str, w, x, thread_counts=(1, 2, 3, 8), rows=None, saved=None):
    """pack once, matmul with several thread counts (batched x allowed), get_rows, and
    optionally save/load the packed weights in the guest."""
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    res = {"outs": [lib.matmul(x, pw, threads=t) for t in thread_counts],
           "kernel": lib.select(pw, x.reshape(-1, pw.k).shape[0]).name,
           "ws": lib.workspace_size(kind, x.reshape(-1, pw.k).shape[0], pw.n, pw.k)}
    if rows is not None:
        res["rows"] = lib.get_rows(pw, rows)
    if saved is not None:
        pw.save(saved)
        again = tilegen.PackedWeights.load(saved)
        res["reloaded"] = lib.matmul(x, again)
    return res


def gguf_matmul(libdir: str, path: str, name: str, x, rows):
    from tilegen.gguf import load_tensor
    lib = _lib(libdir)
    pw = load_tensor(path, name, lib=lib)
    return lib.matmul(x, pw), lib.get_rows(pw, rows), pw.format


def concurrent_matmuls(libdir: str, w, xs, kind="q4_0", pool_threads=2):
    """8 Python threads share one PackedWeights (each call also uses the pool)."""
    import threading
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    serial = [lib.matmul(x, pw, threads=1) for x in xs]
    got = [None] * len(xs)

    def worker(i):
        got[i] = lib.matmul(xs[i], pw, threads=pool_threads)
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return serial, got


def matmul_bias(libdir: str, kind: str, w, x, bias, clamp):
    lib = _lib(libdir)
    return lib.matmul(x, lib.pack_weights(w, kind=kind), bias=bias, clamp=clamp)


def check_abi(libdir: str) -> dict:
    return tilegen.load(libdir).check_abi()


def vl_info(libdir: str, name: str) -> dict:
    """The library's vector lengths and the concrete tile of kernel `name` on this CPU."""
    lib = _lib(libdir)
    k = lib.kernels[name]
    out = {"vl_bytes": dict(lib.vl_bytes), "runnable": lib.runnable(k)}
    if out["runnable"]:
        out.update(mr=k.mr, nr=k.nr, rhs_format=k.rhs_layout().name,
                   lhs_format=None if k.lhs_layout() is None else k.lhs_layout().name)
    return out


def run_scalable_cases(libdir: str, name: str, cases: list[dict]) -> dict:
    """Like run_f32_cases, plus SVCR read after every call (SME CPUs) and the ABI probe."""
    lib = _lib(libdir)
    kern = lib.kernel(name)
    sme = "sme" in lib.cpu.features
    outs, svcr = [], []
    for c in cases:
        m, n, k = c["m"], c["n"], c["k"]
        dst_base = c["dst_base"].copy()
        kern(c["lhs_base"][:m, :k], c["packed"], dst_base[:m, :n], c["clamp_min"], c["clamp_max"])
        outs.append(dst_base)
        svcr.append(lib.svcr() if sme else 0)
    return {"outs": outs, "svcr": svcr}


def check_abi_of(libdir: str, names: list[str]) -> dict:
    res = _lib(libdir).check_abi()
    return {n: res.get(n) for n in names}


def run_batch(libdir: str, jobs: list[tuple[str, str, list[dict]]]) -> list:
    """Several kernels in one guest call: per job (``"f32"`` or ``"q4"``, kernel name, cases)
    what run_f32_cases / run_q4_cases return."""
    runs = {"f32": run_f32_cases, "q4": run_q4_cases}
    return [runs[kind](libdir, name, cases) for kind, name, cases in jobs]


def kernel_infos(libdir: str, names: list[str]) -> dict:
    """Per kernel name: '' and its vl_info if it runs on this CPU, else the error a call raises
    (refused)."""
    out = {}
    for name in names:
        err = refused(libdir, name)
        out[name] = (err, None if err else vl_info(libdir, name))
    return out


def refused(libdir: str, name: str) -> str:
    """The error a call of kernel `name` raises on this CPU ('' if it would run)."""
    lib = _lib(libdir)
    try:
        lib.kernel(name)
    except Exception as e:      # noqa: BLE001 - the message is the result
        return f"{type(e).__name__}: {e}"
    return ""


def svcr_now(libdir: str) -> int:
    return _lib(libdir).svcr()


def mixed_threads_race(libdir: str, w, xs, kind="f32", rounds=100):
    """Each round: a fresh pool (the library's ``workers``), then len(xs) Python threads released together, thread i
    calling matmul(xs[i], threads=i + 1).  Returns (errors, rounds with a result that differs
    from the threads=1 result, threads left over besides the main one and the current pool)."""
    import gc
    import sys
    import threading
    import time
    lib = _lib(libdir)
    pool_mod = lib.workers
    pw = lib.pack_weights(w, kind=kind)
    serial = [lib.matmul(x, pw, threads=1) for x in xs]
    errors: list[str] = []
    bad_rounds = 0

    def worker(i, start, got):
        start.wait()
        try:
            got[i] = lib.matmul(xs[i], pw, threads=i + 1)
        except Exception as e:      # noqa: BLE001 - reported to the host
            errors.append(f"{type(e).__name__}: {e}")
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)         # switch threads often: more interleavings per round
    try:
        for _ in range(rounds):
            with pool_mod._lock:
                pool_mod._pool, pool_mod._size = None, 0   # every round grows the pool from nothing
            start, got = threading.Barrier(len(xs)), [None] * len(xs)
            ts = [threading.Thread(target=worker, args=(i, start, got)) for i in range(len(xs))]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            if not all(g is not None and np.array_equal(g, s) for g, s in zip(got, serial)):
                bad_rounds += 1
    finally:
        sys.setswitchinterval(interval)
    gc.collect()
    for _ in range(500):            # the replaced pools' threads exit
        if threading.active_count() <= 1 + len(pool_mod.threads()):
            break
        time.sleep(0.02)
    return sorted(set(errors)), bad_rounds, threading.active_count() - 1 - len(pool_mod.threads())


def matmul_out_alias(libdir: str, kind: str, w, x, bias=None, alias="x", threads=1):
    """matmul with out= sharing memory with x ("x") or with the call-time bias ("bias":
    bias is row 0 of out).  Returns (result, result is out)."""
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    x = x.copy()
    if alias == "x":
        out = x
    else:
        out = np.zeros(x.shape[:-1] + (pw.n,), np.float32)
        out.reshape(-1, pw.n)[0] = bias
        bias = out.reshape(-1, pw.n)[0]
    y = lib.matmul(x, pw, bias=bias, out=out, threads=threads)
    return y.copy(), y is out


def matmul_try(libdir: str, kind: str, w, x, **kw):
    """matmul, or the error it raises as (type name, message)."""
    lib = _lib(libdir)
    try:
        return lib.matmul(x, lib.pack_weights(w, kind=kind), **kw)
    except Exception as e:      # noqa: BLE001 - the error is the result
        return type(e).__name__, str(e)


def ggml_bytes_and_empty_rows(libdir: str, raw, n: int, k: int) -> dict:
    """pack_weights(from_ggml=) given bytes-like objects; get_rows of no rows."""
    lib = _lib(libdir)
    out = {}
    for kind in ("q4_0", "q4_0_dx"):
        ref = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
        out[kind] = [np.array_equal(lib.pack_weights(kind=kind, from_ggml=wrap(raw.tobytes()),
                                                     n=n, k=k).data, ref.data)
                     for wrap in (bytes, bytearray, memoryview)]
        out[kind + " rows"] = lib.get_rows(ref, [])
    out["f32 rows"] = lib.get_rows(lib.pack_weights(np.ones((n, k), np.float32)), [])
    return out


def adopt_weights(libdir: str, w, x, bias, raw, gguf_path: str, name: str) -> dict:
    """Weights packed for other layouts of their format: adopt, matmul, load_tensor(nr=)."""
    from tilegen.gguf import load_tensor
    from tilegen.layout.f32 import F32PackedRHS
    from tilegen.layout.rhs_int4 import QSI4C32P
    lib = _lib(libdir)
    n, k = w.shape
    out = {}
    # q4_0 in llama.cpp's default layout (nr 4, kr 16, sr 2), read without a library
    foreign = load_tensor(gguf_path, name)
    native = lib.pack_weights(kind="q4_0", from_ggml=raw, n=n, k=k)
    out["q4_0 geometry"] = [(p.nr, p.kr, p.sr) for p in (foreign, native)]
    out["q4_0 readable"] = any(p.gemm.rhs_matches(foreign) for p in lib.kernel_table.pairs("q4_0"))
    a = lib.adopt(foreign)
    out["q4_0 adopted"] = ((a.format, a.nr, a.kr, a.sr) == (native.format, native.nr, native.kr,
                                                             native.sr)
                           and np.array_equal(a.data, native.data))
    out["q4_0 foreign kept"] = a is foreign
    out["q4_0 native kept"] = lib.adopt(native) is native
    out["q4_0 y"] = [lib.matmul(x, foreign), lib.matmul(x, native)]
    out["q4_0 y1"] = [lib.matmul(x[:1], foreign), lib.matmul(x[:1], native)]
    # q4_0_dx in a qsi4c32p geometry no kernel reads
    lay = QSI4C32P(12, 4, 2)
    odd = tilegen.PackedWeights(lay, n, k, lay.pack_from_float(w, bias), True, "q4_0_dx")
    ref = lib.pack_weights(w, kind="q4_0_dx", bias=bias)
    a = lib.adopt(odd)
    out["q4_0_dx adopted"] = ((a.nr, a.kr, a.sr) == (ref.nr, ref.kr, ref.sr)
                              and np.array_equal(a.data, ref.data))
    out["q4_0_dx y"] = [lib.matmul(x, odd), lib.matmul(x, ref)]
    # f32 with a panel width no kernel reads
    lay = F32PackedRHS(20)
    odd = tilegen.PackedWeights(lay, n, k, lay.pack(w, bias=bias), True, "f32")
    ref = lib.pack_weights(w, bias=bias)
    a = lib.adopt(odd)
    out["f32 adopted"] = (a.format == ref.format and a.has_bias and np.array_equal(a.data, ref.data))
    out["f32 y"] = [lib.matmul(x, odd), lib.matmul(x, ref)]
    # another format of the same kind cannot be repacked without loss
    wrong = tilegen.PackedWeights(QSI4C32P(12, 4, 2), n, k, lay.pack(w), False, "q4_0")
    try:
        lib.adopt(wrong)
        out["cross"] = ""
    except tilegen.runtime.ArgumentError as e:
        out["cross"] = str(e)
    # load_tensor(nr=) with a library: an nr other than the preferred kernel's
    pairs = lib.kernel_table.pairs("q4_0")
    alt = next((p.gemm.nr for p in pairs if p.gemm.nr != pairs[0].gemm.nr), None)
    if alt is not None:
        t = load_tensor(gguf_path, name, lib=lib, nr=alt)
        out["gguf nr"] = (alt, t.nr, lib.select(t, 5).nr)
    out["gguf nr 8"] = load_tensor(gguf_path, name, nr=8).nr
    return out


def choose_kernel(libdir: str, w, x, suffix: str) -> dict:
    """Force the q4_0 kernel with set_table; bad tables are refused."""
    from tilegen.layout.base import same_rhs
    from tilegen.runtime.select import KernelPair
    lib = _lib(libdir)
    table = lib.table("q4_0")
    default = lib.matmul(x, lib.pack_weights(w, kind="q4_0"))
    out = {}
    try:
        want = next(p for p in table if p.gemm.name.endswith(suffix))
        lib.set_table("q4_0", [want])
        pw = lib.pack_weights(w, kind="q4_0")
        out["picked"] = [lib.select(pw, 5).name, lib.select(pw, 1).name]
        out["want"] = [want.gemm.name, want.gemv.name]
        out["y"] = [lib.matmul(x, pw), default]
        errs = []
        f32 = lib.table("f32")[0]
        other = next(p.gemv for p in table       # a gemv of the gemm's own family
                     if p.gemv is not None and p.gemv.family == want.gemm.family
                     and not same_rhs(p.gemv.spec, want.gemm.spec))
        for bad in ([], [f32], [KernelPair(want.gemm, other)], ["not a pair"]):
            try:
                lib.set_table("q4_0", bad)
                errs.append("")
            except tilegen.runtime.ArgumentError as e:
                errs.append(str(e))
        out["errors"] = errs
    finally:
        lib.set_table("q4_0", table)
    return out


def for_ops_check(libdir: str, kind: str, w, x1, xm, bias, tmpdir: str) -> dict:
    """Weights packed with for_ops=("gemm", "gemv") against packing for each best kernel
    separately (a fresh Library whose table holds only that kernel), the default packing,
    plans, and the per-layout save / load round trip."""
    from tilegen.runtime.packed import PackedLayouts, PackedWeights
    from tilegen.runtime.select import KernelPair
    lib = _lib(libdir)
    best = lib.best_kernels(kind)
    pl = lib.pack_weights(w, kind=kind, bias=bias, for_ops=("gemv", "gemm"))
    res = {"best": {op: k.name for op, k in best.items()},
           "n_layouts": len(pl.layouts), "nbytes": pl.nbytes,
           "op_nbytes": {op: pl.for_op(op).nbytes for op in ("gemm", "gemv")},
           "route": {m: lib.route(pl, m)[1].name for m in (1, 2, xm.shape[0])},
           "rhs_match": {op: best[op].rhs_matches(pl.for_op(op)) for op in ("gemm", "gemv")},
           "out1": lib.matmul(x1, pl), "outm": lib.matmul(xm, pl),
           "out1_t3": lib.matmul(x1, pl, threads=3), "outm_t3": lib.matmul(xm, pl, threads=3),
           "plan1": lib.plan(pl, 1)(x1), "planm": lib.plan(pl, xm.shape[0], threads=2)(xm),
           "plan_kernel": {1: lib.plan(pl, 1).kernel.name, xm.shape[0]: lib.plan(pl, xm.shape[0]).kernel.name}}
    # each kernel on its own: a library whose table is that kernel alone
    sep = {}
    for op, x in (("gemm", xm), ("gemv", x1)):
        one = tilegen.load(libdir)
        kern = one.kernels[best[op].name]
        one.set_table(kind, [KernelPair(kern, None)])
        pw = one.pack_weights(w, kind=kind, bias=bias)
        sep[op] = {"bytes_equal": bool(np.array_equal(pw.data, pl.for_op(op).data)),
                   "layout_equal": pw.layout == pl.for_op(op).layout,
                   "kernel": one.select(pw, x.shape[0]).name, "out": one.matmul(x, pw)}
    res["separate"] = sep
    # default packing: one layout, the default pair
    pw0 = lib.pack_weights(w, kind=kind, bias=bias)
    pair = lib.kernel_table.pairs(kind)[0]
    res["default"] = {"type": type(pw0).__name__, "pair": (pair.gemm.name, (pair.gemv or pair.gemm).name),
                      "layout_is_pair": pw0.layout == pair.gemm.rhs_layout(),
                      "kernels": (lib.select(pw0, xm.shape[0]).name, lib.select(pw0, 1).name),
                      "nbytes": pw0.nbytes}
    # save / load: refused as one file, per packing round trip
    try:
        pl.save(f"{tmpdir}/set.pw")
        res["save_error"] = ""
    except Exception as e:      # noqa: BLE001 - the message is the result
        res["save_error"] = f"{type(e).__name__}: {e}"
    pl.for_op("gemm").save(f"{tmpdir}/gemm.pw")
    pl.for_op("gemv").save(f"{tmpdir}/gemv.pw")
    back = PackedLayouts({"gemm": PackedWeights.load(f"{tmpdir}/gemm.pw"),
                          "gemv": PackedWeights.load(f"{tmpdir}/gemv.pw")})
    res["loaded"] = {"out1": lib.matmul(x1, back), "outm": lib.matmul(xm, back),
                     "route": {m: lib.route(back, m)[1].name for m in (1, xm.shape[0])}}
    errs = {}
    for bad in (("gemm",), ("gemv", "gemv"), ("gemm", "gemv", "gemx"), "gemm", None.__class__, ()):
        try:
            lib.pack_weights(w, kind=kind, for_ops=bad)
            errs[repr(bad)] = ""
        except Exception as e:      # noqa: BLE001
            errs[repr(bad)] = f"{type(e).__name__}: {e}"
    try:
        lib.pack_weights(w, kind=kind, nr=4, for_ops=("gemm", "gemv"))
        errs["nr"] = ""
    except Exception as e:      # noqa: BLE001
        errs["nr"] = f"{type(e).__name__}: {e}"
    res["errors"] = errs
    return res


def for_ops_fallback(libdir: str, kind: str, w, x1, xm) -> dict:
    """for_ops where the marked best kernels do not run (TILEGEN_ISA): the default pair."""
    lib = _lib(libdir)
    pl = lib.pack_weights(w, kind=kind, for_ops=("gemm", "gemv"))
    pw = lib.pack_weights(w, kind=kind)
    pair = lib.kernel_table.pairs(kind)[0]
    return {"best": {op: k.name for op, k in lib.best_kernels(kind).items()},
            "pair": {"gemm": pair.gemm.name, "gemv": (pair.gemv or pair.gemm).name},
            "n_layouts": len(pl.layouts), "same_bytes": bool(np.array_equal(pl.for_op("gemm").data, pw.data)),
            "same_out": bool(np.array_equal(lib.matmul(x1, pl), lib.matmul(x1, pw))
                             and np.array_equal(lib.matmul(xm, pl), lib.matmul(xm, pw)))}


def activation_limit_outcomes(libdir: str, kind: str, w, xs) -> list:
    """matmul and plan of each x (m > 1) on ``kind`` weights: ("ok", kernel name) or
    ("ArgumentError", message)."""
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind=kind)
    out = []
    for x in xs:
        for how in ("matmul", "plan"):
            try:
                if how == "matmul":
                    lib.matmul(x, pw, threads=2)
                else:
                    lib.plan(pw, x.shape[0], threads=2)(x)
                out.append(("ok", lib.select(pw, x.shape[0]).name))
            except tilegen.runtime.errors.ArgumentError as e:
                out.append(("ArgumentError", str(e)))
    return out
