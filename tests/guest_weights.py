"""Guest-side helpers of test_pack_weights (run inside the emulated aarch64 Python): packing
arguments, weights beyond their format, ggml blocks with bad scales, adopt across CPUs.

Every call runs with numpy warnings turned into errors: a packing path that lets a raw
RuntimeWarning through reports it as its result."""
from __future__ import annotations

import warnings

import numpy as np

from guest_calls import _lib


def _outcome(fn):
    """fn() or, when it raises (a numpy warning included), "<type>: <message>"."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - the message is the result
            return f"{type(e).__name__}: {e}"


def pack(libdir: str, args: tuple, kwargs: dict):
    """lib.pack_weights(*args, **kwargs): the PackedWeights, or the error as a string."""
    lib = _lib(libdir)
    return _outcome(lambda: lib.pack_weights(*args, **kwargs))


def packs(libdir: str, calls: list) -> list:
    """:func:`pack` of each (args, kwargs) in ``calls``."""
    return [pack(libdir, a, kw) for a, kw in calls]


def kn_vs_nk(libdir: str, kind: str, w, x) -> dict:
    """The same weights packed as (n, k) and as their (k, n) transpose with layout="kn": both
    packings (bytes, shape) and a matmul and get_rows on each."""
    lib = _lib(libdir)
    out = {}
    for layout, wl in (("nk", w), ("kn", np.ascontiguousarray(w.T))):
        pw = _outcome(lambda: lib.pack_weights(wl, kind=kind, layout=layout))
        if isinstance(pw, str):
            out[layout] = pw
            continue
        out[layout] = {"shape": (pw.n, pw.k), "data": pw.data, "y": lib.matmul(x, pw),
                       "rows": lib.get_rows(pw, np.arange(pw.n))}
    return out


def run(libdir: str, pw, x) -> dict:
    """matmul and get_rows of packed weights (warnings are errors)."""
    lib = _lib(libdir)
    return _outcome(lambda: {"y": lib.matmul(x, pw), "rows": lib.get_rows(pw, np.arange(pw.n))})


def adopt_run(libdir: str, pw, x, native_kind: str, w_native, bias=None) -> dict:
    """adopt ``pw`` here, matmul and get_rows on the result, and the same for the weights
    ``w_native`` (with ``bias``) packed here as ``native_kind`` (what adopt must match)."""
    lib = _lib(libdir)

    def go():
        a = lib.adopt(pw)
        nat = lib.pack_weights(w_native, kind=native_kind, bias=bias)
        return {"layout": a.layout.name, "kind": a.kind, "has_bias": a.has_bias,
                "data": a.data, "y": lib.matmul(x, a), "y1": lib.matmul(x[:1], a),
                "y_pw": lib.matmul(x, pw), "rows": lib.get_rows(a, np.arange(a.n)),
                "native_layout": nat.layout.name, "native_data": nat.data,
                "native_y": lib.matmul(x, nat), "native_y1": lib.matmul(x[:1], nat),
                "kernel": lib.select(a, x.shape[0]).name}
    return _outcome(go)


def load(libdir: str, path: str, name: str = "w"):
    """tilegen.gguf.load_tensor(path, name, lib): the PackedWeights, or the error."""
    from tilegen.gguf import load_tensor
    lib = _lib(libdir)
    return _outcome(lambda: load_tensor(path, name, lib))
