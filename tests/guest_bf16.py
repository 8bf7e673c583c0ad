"""Guest-side helpers of the bf16 runtime tests (run inside the emulated aarch64 Python)."""
from __future__ import annotations

import numpy as np

import tilegen


def ops(libdir: str, kind: str, w, x, bias=None, threads=(1, 2, 3), clamp=None, saved=None):
    """pack_weights(kind) once, matmul for several thread counts and for x[:1] (gemv), the
    kernels chosen, the workspace, get_rows, the packed layout; an error as its message."""
    lib = tilegen.load(libdir)
    try:
        pw = lib.pack_weights(w, kind=kind, bias=bias)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return {"error": f"{type(e).__name__}: {e}"}
    m = x.shape[0]
    res = {"outs": [lib.matmul(x, pw, threads=t, clamp=clamp) for t in threads],
           "one": lib.matmul(x[:1], pw, clamp=clamp),
           "gemm": lib.select(pw, m).name, "gemv": lib.select(pw, 1).name,
           "ws": lib.workspace_size(kind, m, pw.n, pw.k), "layout": pw.layout.name,
           "nbytes": pw.nbytes, "rows": lib.get_rows(pw, [0, pw.n - 1])}
    if saved is not None:
        pw.save(saved)
        res["reloaded"] = lib.matmul(x, tilegen.PackedWeights.load(saved), clamp=clamp)
    return res


def packer_refusal(libdir: str, x, m_idx_start: int) -> str:
    lib = tilegen.load(libdir)
    try:
        lib.pack_lhs("bf16px4", x, mr=8, kr=4, sr=1, m_idx_start=m_idx_start)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return ""
