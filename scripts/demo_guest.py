"""Runs inside the aarch64 Python: load the library, read GGUF weights, matmul, get_rows."""
import numpy as np

import tilegen
from tilegen.gguf import load_tensor


def run_f32(libdir: str, w: np.ndarray, bias: np.ndarray, x: np.ndarray, clamp):
    lib = tilegen.load(libdir)
    packed = lib.pack_weights(w, kind="f32", bias=bias)
    y = lib.matmul(x, packed, clamp=clamp)
    return y, lib.select(packed, x.shape[0]).name, sorted(lib.cpu.features)


def run_gguf(libdir: str, path: str, name: str, x: np.ndarray, rows: np.ndarray, threads: int):
    lib = tilegen.load(libdir)
    packed = load_tensor(path, name, lib=lib)       # Q4_0 / Q4_K / Q6_K blocks repacked once
    packed.save(path + ".packed")                   # ... and reusable across runs
    again = tilegen.PackedWeights.load(path + ".packed")
    y = lib.matmul(x, again, threads=threads)
    y1 = lib.matmul(x[:1], again)
    return (y, y1, lib.get_rows(again, rows), lib.select(again, x.shape[0]).name,
            lib.select(again, 1).name)
