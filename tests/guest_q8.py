"""Guest-side helpers of the q8_0 runtime tests (run inside the emulated aarch64 Python)."""
from __future__ import annotations

import numpy as np

import tilegen


def adopt_q8(libdir: str, packed_bytes, n: int, k: int, nr: int, kr: int, x):
    """PackedWeights of qsi8cxp<nr>x<kr> bytes made elsewhere: adopt (repack if no kernel here
    reads them), matmul; returns the adopted geometry, bytes and result."""
    from tilegen.layout.rhs_int8 import QSI8CXP
    lib = tilegen.load(libdir)
    pw = tilegen.PackedWeights(QSI8CXP(nr, kr), n, k, packed_bytes, True, "q8_0")
    a = lib.adopt(pw)
    return {"same": a is pw, "geometry": (a.nr, a.kr, a.sr), "data": a.data,
            "out": lib.matmul(x, pw), "kernel": lib.select(a, x.shape[0]).name}


def run_q8_batch(libdir: str, cases: list[dict]) -> list[dict]:
    """Every case through kernel case["name"] (dst a view into a sentinel-filled buffer);
    per case the dst buffer and SVCR after the call (0 on CPUs without SME)."""
    lib = tilegen.load(libdir)
    sme = "sme" in lib.cpu.features
    kernels: dict = {}
    res = []
    for c in cases:
        kern = kernels.get(c["name"]) or kernels.setdefault(c["name"], lib.kernel(c["name"]))
        m, n = c["m"], c["n"]
        dst_base = np.full((m + 2, n + 3), c["sentinel"], np.float32)
        kern(c["lhs_packed"], c["rhs_packed"], dst_base[:m, :n], c["clamp_min"], c["clamp_max"],
             k=c["k"])
        res.append({"out": dst_base, "svcr": lib.svcr() if sme else 0})
    return res
