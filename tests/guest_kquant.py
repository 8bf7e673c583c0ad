"""Guest-side helpers of test_exec_kquant_runtime (run inside the emulated aarch64 Python): one
K-quant weight matrix through every runtime path (pack_weights(from_ggml=), select, matmul at
several thread counts, plan, get_rows, for_ops, a packed-weights file, adopt, pack_lhs), and
the activation refusals.  Warnings are errors (guest_weights._outcome)."""
from __future__ import annotations

import os
import tempfile

import numpy as np

from guest_calls import _lib
from guest_weights import _outcome


def _run(lib, x, w, clamp) -> dict:
    """matmul of every leading row count of x on weights w (3 threads and 1), the plan, and
    the kernel each m runs with its LHS geometry."""
    out = {}
    for m in sorted({1, 2, 3, x.shape[0]}):
        xm = np.ascontiguousarray(x[:m])
        pw, kern = lib.route(w, m)
        lay = kern.lhs_layout()
        out[m] = {"kernel": kern.name, "mr": lay.mr, "kr": lay.kr, "nr": kern.nr,
                  "data": pw.data, "layout": pw.layout.name,
                  "y": lib.matmul(xm, w, clamp=clamp, threads=3),
                  "y1": lib.matmul(xm, w, clamp=clamp, threads=1),
                  "plan": lib.plan(w, m, clamp=clamp, threads=3)(xm),
                  "lhs": lib.pack_lhs("q8kp", xm, mr=lay.mr, kr=lay.kr, sr=2),
                  "workspace": lib.workspace_size(w.kind, m, w.n, w.k)}
    return out


def scenario(libdir: str, kind: str, raw, n: int, k: int, x, rows, clamp, foreign) -> dict:
    """Every runtime path of one ggml ``kind`` matrix (``raw`` blocks, n x k) with activations
    ``x``; ``foreign``: the same weights packed elsewhere (another nr/kr), to adopt."""
    lib = _lib(libdir)

    def go():
        pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
        out = {"kind": pw.kind, "layout": pw.layout.name, "data": pw.data,
               "rows": lib.get_rows(pw, rows), "runs": _run(lib, x, pw, clamp),
               "bias_y": lib.matmul(x, pw, bias=np.arange(n, dtype=np.float32), clamp=clamp)}
        pl = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k, for_ops=("gemm", "gemv"))
        out["for_ops"] = {"layouts": [pl.for_op(op).layout.name for op in ("gemm", "gemv")],
                          "runs": _run(lib, x, pl, clamp)}
        fd, path = tempfile.mkstemp(suffix=".tgpw")
        os.close(fd)
        try:
            pw.save(path)
            again = type(pw).load(path)
            out["loaded"] = {"layout": again.layout.name, "y": lib.matmul(x, again, clamp=clamp)}
        finally:
            os.unlink(path)
        a = lib.adopt(foreign)
        out["adopt"] = {"layout": a.layout.name, "data": a.data, "kind": a.kind,
                        "y": lib.matmul(x, a, clamp=clamp), "y_foreign": lib.matmul(x, foreign, clamp=clamp)}
        return out
    return _outcome(go)


def gguf_tensor(libdir: str, path: str, name: str) -> dict:
    """tilegen.gguf.load_tensor(path, name, lib): its layout and bytes."""
    from tilegen.gguf import load_tensor
    pw = load_tensor(path, name, lib=_lib(libdir))
    return {"kind": pw.kind, "layout": pw.layout.name, "data": pw.data}


def refusals(libdir: str, kind: str, raw, n: int, k: int, xs: list) -> list:
    """lib.matmul of weights ``raw`` on each activation matrix in ``xs``: the result or the
    error as a string."""
    lib = _lib(libdir)
    pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
    out = []
    for x in xs:
        out.append(_outcome(lambda: lib.matmul(x, pw)))
        out.append(_outcome(lambda: lib.plan(pw, x.shape[0])(x)))
    return out


def runtime_only(libdir: str, kind: str, raw, n: int, k: int, x, clamp) -> dict:
    """A library whose one ``kind`` kernel is a gemm (no gemv): the kernel every m routes to,
    its LHS layout, and lib.matmul (1 and 3 threads) and a plan of each leading row count
    (the runtime packs the LHS through the kernel's layout object)."""
    lib = _lib(libdir)
    pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
    out = {}
    for m in sorted({1, 2, x.shape[0] // 2, x.shape[0]}):
        xm = np.ascontiguousarray(x[:m])
        kern = lib.select(pw, m)
        out[m] = {"kernel": kern.name, "lhs": kern.lhs_layout().name,
                  "y": lib.matmul(xm, pw, clamp=clamp, threads=3),
                  "y1": lib.matmul(xm, pw, clamp=clamp, threads=1),
                  "plan": _outcome(lambda: lib.plan(pw, m, clamp=clamp, threads=2)(xm))}
    return out


def lib_pack_lhs_cases(libdir: str, fmt: str, x, cases: list) -> list:
    """lib.pack_lhs(fmt, x[:m], **kw) for each (m, kw) of ``cases``: the packed bytes, or the
    error as "<type>: <message>"."""
    lib = _lib(libdir)
    return [_outcome(lambda m=m, kw=kw: lib.pack_lhs(fmt, np.ascontiguousarray(x[:m]), **kw))
            for m, kw in cases]


def large_m(libdir: str, kind: str, raw, n: int, k: int, x, ms, clamp, nr: int) -> dict:
    """The large-m gemm rule on ``kind`` weights (issue #34): the default packing's entry, then
    the weights packed for the entry of gemm nr ``nr`` (the large-m gemm's packing); per m of
    ``ms``: the kernel picked, matmul at 3 threads and 1, a plan for max(ms) rows called with
    m rows (one plan, every row class), matmul_experts with every token on one expert; and
    set_table's refusal of a large-m gemm on another packing."""
    from tilegen.runtime.select import KernelPair
    lib = _lib(libdir)

    def go():
        dflt = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
        e0 = lib.kernel_table.entry(dflt)
        out = {"default": {"layout": dflt.layout.name, "gemm": e0.gemm.name,
                           "gemv": e0.gemv.name if e0.gemv else None,
                           "large": e0.large.name if e0.large else None,
                           "big": lib.select(dflt, max(ms)).name}}
        pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k, nr=nr)
        e = lib.kernel_table.entry(pw)
        out["entry"] = {"layout": pw.layout.name, "gemm": e.gemm.name, "gemm_mr": e.gemm.mr,
                        "gemv": e.gemv.name if e.gemv else None,
                        "large": e.large.name if e.large else None,
                        "large_from": e.large_from, "large_after": e.large_after,
                        "table": [repr(p) for p in lib.kernel_table.table(kind)]}
        plan = lib.plan(pw, max(ms), clamp=clamp, threads=3)
        stack = type(pw).stack([pw, pw])
        runs = {}
        for m in ms:
            xm = np.ascontiguousarray(x[:m])
            ids = np.ones((m, 1), np.int32)     # every token on expert 1
            runs[m] = {"kernel": lib.select(pw, m).name, "row_class": lib.kernel_table.row_class(pw, m),
                       "plan_kernel": plan.route(m)[1].name,
                       "y": lib.matmul(xm, pw, clamp=clamp, threads=3),
                       "y1": lib.matmul(xm, pw, clamp=clamp, threads=1),
                       "plan": plan(xm),
                       "experts": lib.matmul_experts(xm, stack, ids, threads=2)[:, 0]}
        out["runs"] = runs
        try:
            lib.set_table(kind, [KernelPair(e0.gemm, e0.gemv, e.large)])
            out["mixed"] = "accepted"
            lib.kernel_table._tables.pop(kind)    # back to the default table
        except Exception as err:  # noqa: BLE001 - the message is the result
            out["mixed"] = f"{type(err).__name__}: {err}"
        return out
    return _outcome(go)
