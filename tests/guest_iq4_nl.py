"""Guest-side helper of test_runtime_table32 (inside the emulated
aarch64 Python): one IQ4_NL (or MXFP4: ``kind``) weight matrix through every runtime path
(pack_weights(from_ggml=), the kernel pick per m, matmul at 1 and 3 threads, plan, bias, get_rows, for_ops, a packed-weights file, adopt, the
generated LHS packer, load_tensor from a GGUF file) and the refusals.  Warnings are errors."""
from __future__ import annotations

import os
import tempfile

import numpy as np

from guest_calls import _lib
from guest_weights import _outcome


def _runs(lib, x, w, clamp) -> dict:
    out = {}
    for m in sorted({1, 2, 3, x.shape[0]}):
        xm = np.ascontiguousarray(x[:m])
        pw, kern = lib.route(w, m)
        lay = kern.lhs_layout()
        out[m] = {"kernel": kern.name, "mr": lay.mr, "kr": lay.kr, "sr": lay.sr, "nr": kern.nr,
                  "rhs_kr": pw.layout.kr, "data": pw.data,
                  "y": lib.matmul(xm, w, clamp=clamp, threads=3),
                  "y1": lib.matmul(xm, w, clamp=clamp, threads=1),
                  "plan": lib.plan(w, m, clamp=clamp, threads=3)(xm),
                  "lhs": lib.pack_lhs("qsi8d32p", xm, mr=lay.mr, kr=lay.kr, sr=lay.sr)}
    return out


def scenario(libdir: str, raw, n: int, k: int, x, rows, clamp, foreign, gguf_path: str,
             tensor: str, kind: str = "iq4_nl") -> dict:
    lib = _lib(libdir)

    def go():
        from tilegen.gguf import load_tensor
        pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
        out = {"kind": pw.kind, "layout": pw.layout.name, "data": pw.data,
               "rows": lib.get_rows(pw, rows), "runs": _runs(lib, x, pw, clamp),
               "bias_y": lib.matmul(x, pw, bias=np.arange(n, dtype=np.float32), clamp=clamp)}
        pl = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k, for_ops=("gemm", "gemv"))
        out["for_ops"] = _runs(lib, x, pl, clamp)
        fd, path = tempfile.mkstemp(suffix=".tgpw")
        os.close(fd)
        try:
            pw.save(path)
            again = type(pw).load(path)
            out["loaded"] = {"layout": again.layout.name, "y": lib.matmul(x, again, clamp=clamp)}
        finally:
            os.unlink(path)
        a = lib.adopt(foreign)
        out["adopt"] = {"layout": a.layout.name, "kind": a.kind, "data": a.data,
                        "y": lib.matmul(x, a, clamp=clamp),
                        "y_foreign": lib.matmul(x, foreign, clamp=clamp)}
        t = load_tensor(gguf_path, tensor, lib=lib)
        t0 = load_tensor(gguf_path, tensor)
        out["gguf"] = {"kind": t.kind, "layout": t.layout.name, "data": t.data,
                       "y": lib.matmul(x, t, clamp=clamp),
                       "nolib": (t0.kind, t0.layout.name, t0.data)}
        return out
    return _outcome(go)


def sme2_pick(libdir: str, raw, n: int, k: int, x, clamp, kind: str = "iq4_nl") -> dict:
    """pack_weights(from_ggml=) where the CPU runs the SME2 kernels: the gemm and gemv picked
    per m (their LHS layouts), matmul at 1 and 3 threads and plan (test_exec_iq4_nl)."""
    lib = _lib(libdir)
    pw = lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
    return {"layout": pw.layout.name, "runs": _runs(lib, x, pw, clamp)}
