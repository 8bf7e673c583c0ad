"""Guest-side helpers of the q8_0 runtime tests (run inside the emulated aarch64 Python)."""
from __future__ import annotations

import numpy as np

import tilegen


def adopt_q8(libdir: str, packed_bytes, n: int, k: int, nr: int, kr: int, x):
    """PackedWeights of qsi8cxp<nr>x<kr> bytes made elsewhere: adopt (repack if no kernel here
    reads them), matmul; returns the adopted geometry, bytes and result."""
    from tilegen.layout.q8 import QSI8CXP
    lib = tilegen.load(libdir)
    pw = tilegen.PackedWeights(QSI8CXP(nr, kr), n, k, packed_bytes, True, "q8_0")
    a = lib.adopt(pw)
    return {"same": a is pw, "geometry": (a.nr, a.kr, a.sr), "data": a.data,
            "out": lib.matmul(x, pw), "kernel": lib.select(a, x.shape[0]).name}
