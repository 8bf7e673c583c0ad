"""Guest-side driver of the exported KleidiAI packers (tests/test_export_packers_c.py).

A call is ``(name, args, returns)``: ``args`` a list of ``("u", int)`` (size_t), ``("null",)``,
``("in", uint8 array)`` (a pointer to a copy ending at a PROT_NONE page) or ``("out", nbytes)``
(a buffer ending at a guard page, with MARGIN bytes before it that must stay untouched).
Calls with an out buffer run once per prefill; they return, per prefill, the margin + buffer.
Getters (``returns=True``) return the size_t result.
"""
from __future__ import annotations

import ctypes

import numpy as np

from guest_pack import _Guarded, _lib

PREFILLS = (0x00, 0xFF)
MARGIN = 32


def _fn(so: str, name: str, nargs: int, returns: bool):
    f = getattr(_lib(so), name)
    f.restype = ctypes.c_size_t if returns else None
    f.argtypes = [ctypes.c_size_t] * nargs
    return f


def _run_once(f, args, fill):
    outs, vals = [], []
    for a in args:
        kind = a[0]
        if kind == "u":
            vals.append(int(a[1]))
        elif kind == "null":
            vals.append(0)
        elif kind == "in":
            data = np.ascontiguousarray(a[1]).view(np.uint8).reshape(-1)
            g = _Guarded(max(data.size, 1))
            g.view()[:data.size] = data
            vals.append(g.addr)
        elif kind == "out":
            g = _Guarded(max(int(a[1]), 1), before=MARGIN)
            g.view()[:] = fill
            outs.append(g)
            vals.append(g.addr)
        else:
            raise ValueError(f"unknown argument kind {kind!r}")
    res = f(*vals)
    return res, [g.view().copy() for g in outs]


def run(so: str, calls: list) -> list:
    out = []
    for name, args, returns in calls:
        f = _fn(so, name, len(args), returns)
        if returns:
            out.append(int(_run_once(f, args, 0)[0]))
            continue
        out.append([_run_once(f, args, fill)[1][0] for fill in PREFILLS])
    return out


def svl_bytes() -> int:
    """The streaming vector length the guest runs with (prctl PR_SME_GET_VL), or 0."""
    libc = ctypes.CDLL(None)
    libc.prctl.restype = ctypes.c_int
    v = libc.prctl(64, 0, 0, 0, 0)       # PR_SME_GET_VL
    return v & 0xFFFF if v > 0 else 0


def missing(so: str, names: list[str]) -> list[str]:
    """The names the library does not export."""
    lib = _lib(so)
    out = []
    for n in names:
        try:
            getattr(lib, n)
        except AttributeError:
            out.append(n)
    return out
