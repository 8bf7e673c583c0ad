"""Emulated side-by-side timing (NOT a hardware performance figure: qemu emulates every lane).

    python -m tilegen build --target linux-aarch64-all -o out/all
    python -m tilegen emulate --cpu neoverse-v1 -- python bench/emulated_matmul.py out/all

Times, in one guest process, tilegen's q4_0 matmul against numpy's float32 matmul on the
dequantised weights, for (m x 4096) . (4096 x 4096)^T with 1 and 2 threads, and the per-call
overhead of a 1x32x32 call.
"""
import sys
import time

import numpy as np

import tilegen
from tilegen.layout.ggml import dequantize_q4_0, quantize_q4_0


def best(fn, reps):
    fn()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main(libdir, n=4096, k=4096, ms=(1,)):
    lib = tilegen.load(libdir)
    rng = np.random.default_rng(0)
    w = rng.normal(size=(n, k)).astype(np.float32)
    raw = quantize_q4_0(w)
    pw = lib.pack_weights(kind="q4_0", from_ggml=raw, n=n, k=k)
    wd = np.ascontiguousarray(dequantize_q4_0(raw, n, k).T)
    for m in ms:
        x = rng.normal(size=(m, k)).astype(np.float32)
        print(f"q4_0 {m}x{k} . ({n}x{k})^T  kernel {lib.select(pw, m).name}")
        t_np = best(lambda: x @ wd, 3)
        for th in (1, 2):
            t = best(lambda: lib.matmul(x, pw, threads=th), 3)
            print(f"  tilegen threads={th}: {1e3 * t:9.2f} ms   numpy f32 on dequantised W: "
                  f"{1e3 * t_np:9.2f} ms   ratio tilegen/numpy {t / t_np:6.2f}")
    w32 = rng.normal(size=(32, 32)).astype(np.float32)
    p32 = lib.pack_weights(w32, kind="q4_0")
    x1 = rng.normal(size=(1, 32)).astype(np.float32)
    w32t = np.ascontiguousarray(w32.T)
    t_small = best(lambda: lib.matmul(x1, p32, threads=1), 200)
    t_np_small = best(lambda: x1 @ w32t, 200)
    print(f"per-call 1x32x32: tilegen {1e6 * t_small:8.1f} us   numpy {1e6 * t_np_small:8.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
