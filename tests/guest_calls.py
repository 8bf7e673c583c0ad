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
    """Raw call with host-made arguments (for bad-argument tests); returns dst."""
    return _lib(libdir).kernel(name)(lhs, packed, dst, *clamp)


def matmul(libdir: str, w, x, bias=None, clamp=None, layout="nk", nr=None):
    lib = _lib(libdir)
    pw = lib.pack_weights(w, kind="f32", bias=bias, layout=layout, nr=nr)
    return lib.matmul(x, pw, clamp=clamp), pw.nr, lib.select(pw, x.reshape(-1, pw.k).shape[0]).name


def load_error(libdir: str) -> str:
    try:
        tilegen.load(libdir)
    except tilegen.runtime.LoadError as e:
        return str(e)
    return ""
