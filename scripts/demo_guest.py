"""Runs inside the aarch64 Python: load the library, pack weights, call matmul."""
import numpy as np

import tilegen


def run(libdir: str, w: np.ndarray, bias: np.ndarray, x: np.ndarray, clamp):
    lib = tilegen.load(libdir)
    packed = lib.pack_weights(w, kind="f32", bias=bias)
    y = lib.matmul(x, packed, clamp=clamp)
    return y, lib.select(packed, x.shape[0]).name, sorted(lib.cpu.features)
