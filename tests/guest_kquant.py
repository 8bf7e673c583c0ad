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
