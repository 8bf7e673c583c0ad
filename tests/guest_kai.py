"""Guest side of tests/test_export_kleidiai.py: call the exported KleidiAI functions of a
shared library (built from the export tree) through ctypes, inside the emulated aarch64 Python."""
from __future__ import annotations

import ctypes as C

import numpy as np

_LIBS: dict[str, C.CDLL] = {}
SZ, VP, F = C.c_size_t, C.c_void_p, C.c_float


def _lib(path: str) -> C.CDLL:
    if path not in _LIBS:
        _LIBS[path] = C.CDLL(path)
    return _LIBS[path]


def getters(path: str, name: str, lhs_getter: str, lhs_args: list[int], rhs_args: list[int]) -> dict:
    """Every getter of micro-kernel ``name``; the offset getters at the given arguments."""
    lib = _lib(path)
    out = {}
    for g in ("m_step", "n_step", "mr", "nr", "kr", "sr"):
        f = getattr(lib, f"kai_get_{g}_{name}")
        f.restype, f.argtypes = SZ, []
        out[g] = f()
    f = getattr(lib, f"kai_{lhs_getter}_{name}")
    f.restype, f.argtypes = SZ, [SZ] * len(lhs_args)
    out["lhs_offset"] = f(*lhs_args)
    f = getattr(lib, f"kai_get_rhs_packed_offset_{name}")
    f.restype, f.argtypes = SZ, [SZ] * len(rhs_args)
    out["rhs_offset"] = f(*rhs_args)
    f = getattr(lib, f"kai_get_dst_offset_{name}")
    f.restype, f.argtypes = SZ, [SZ, SZ, SZ]
    out["dst_offset"] = f(3, 8, 100)
    f = getattr(lib, f"kai_get_dst_size_{name}")
    f.restype, f.argtypes = SZ, [SZ, SZ]
    out["dst_size"] = f(3, 5)
    return out


def run(path: str, name: str, kind: str, cases: list[dict]) -> list[np.ndarray]:
    """``kai_run_<name>`` on each case; dst is a view into a sentinel-filled buffer.

    kind: "bl" (m, n, k, bl, lhs_packed, rhs_packed, dst, ...), "packed" (no bl) or
    "rows" (m, n, k, lhs, lhs_stride, rhs_packed, dst, ...)."""
    f = getattr(_lib(path), f"kai_run_{name}")
    f.restype = None
    outs = []
    for c in cases:
        m, n, k = c["m"], c["n"], c["k"]
        base = np.full((m + 2, n + 3), c["sentinel"], np.float32)
        lhs = np.ascontiguousarray(c["lhs"])
        rhs = np.ascontiguousarray(c["rhs"])
        tail = [VP(base.ctypes.data), SZ(base.strides[0]), SZ(4), F(c["clamp_min"]),
                F(c["clamp_max"])]
        if kind == "bl":
            f(SZ(m), SZ(n), SZ(k), SZ(c["bl"]), VP(lhs.ctypes.data), VP(rhs.ctypes.data), *tail)
        elif kind == "packed":
            f(SZ(m), SZ(n), SZ(k), VP(lhs.ctypes.data), VP(rhs.ctypes.data), *tail)
        elif kind == "rows":
            f(SZ(m), SZ(n), SZ(k), VP(lhs.ctypes.data), SZ(lhs.strides[0]), VP(rhs.ctypes.data),
              *tail)
        else:
            raise ValueError(kind)
        outs.append(base)
    return outs
