"""Emulated side-by-side timing: tilegen q4_0 and f32 matmul vs numpy float32 matmul.

EMULATED (qemu-user), NOT HARDWARE: qemu runs every vector lane in software, so these
times say how the two code paths compare under one emulator, not how fast either is on a
real CPU (use the llvm-mca model, `tilegen analyze` / `tilegen tune`, for that).

    python -m tilegen build --target neoverse-v1 -o out/v1
    python -m tilegen emulate --cpu neoverse-v1 -- python bench/side_by_side.py out/v1

In one guest process, for m in (1, 16, 128) and n = k = 2048, with 1 and 2 threads:
  - tilegen q4_0:  lib.matmul(x, W_q4_0)           (W: ggml block_q4_0, activations quantised
                                                     to int8 per 32-block inside the call)
  - tilegen f32:   lib.matmul(x, W_f32)            (W_f32 = the dequantised Q4_0 weights)
  - numpy:         x @ W_f32.T                      (OpenBLAS sgemm, the same thread count when
                                                     numpy's OpenBLAS can be told so)
Ratio = numpy time / tilegen time (> 1: tilegen faster).  Best of --reps timed calls after a
warm-up call.  Writes OUTDIR/side_by_side_<cpu>.json and .md (default OUTDIR bench/results).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's tilegen
import tilegen  # noqa: E402
from tilegen.layout.ggml import dequantize_q4_0, quantize_q4_0  # noqa: E402

LABEL = "emulated (qemu), not hardware"


def _openblas_threads():
    """numpy's OpenBLAS set_num_threads, or None when it cannot be found."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs",
                                  "*openblas*.so*"))
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                     "openblas_set_num_threads"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes = [ctypes.c_int]
                return fn
    return None


def best(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(libdir: str, ms: list[int], n: int, k: int, threads: list[int], reps: int) -> dict:
    lib = tilegen.load(libdir)
    set_blas = _openblas_threads()
    rng = np.random.default_rng(0)
    w = rng.normal(size=(n, k)).astype(np.float32)
    raw = quantize_q4_0(w)
    wdq = dequantize_q4_0(raw, n, k)                     # (n, k) float32
    wt = np.ascontiguousarray(wdq.T)                     # (k, n) for numpy
    pq = lib.pack_weights(kind="q4_0", from_ggml=raw, n=n, k=k)
    pf = lib.pack_weights(wdq, kind="f32")
    rows = []
    for m in ms:
        x = rng.normal(size=(m, k)).astype(np.float32)
        ref = x.astype(np.float64) @ wdq.astype(np.float64).T
        scale = float(np.max(np.abs(ref)))
        for th in threads:
            if set_blas is not None:
                set_blas(th)
            t_np = best(lambda: x @ wt, reps)
            t_q4 = best(lambda: lib.matmul(x, pq, threads=th), reps)
            t_f32 = best(lambda: lib.matmul(x, pf, threads=th), reps)
            err_q4 = float(np.max(np.abs(lib.matmul(x, pq, threads=th) - ref))) / scale
            err_f32 = float(np.max(np.abs(lib.matmul(x, pf, threads=th) - ref))) / scale
            row = {"m": m, "n": n, "k": k, "threads": th,
                   "numpy_threads": th if set_blas is not None else None,
                   "q4_0_kernel": lib.select(pq, m).name, "f32_kernel": lib.select(pf, m).name,
                   "numpy_s": t_np, "tilegen_q4_0_s": t_q4, "tilegen_f32_s": t_f32,
                   "ratio_q4_0": t_np / t_q4, "ratio_f32": t_np / t_f32,
                   "rel_err_q4_0": err_q4, "rel_err_f32": err_f32}
            rows.append(row)
            print(f"m={m:<4} threads={th}  numpy {1e3 * t_np:9.1f} ms  q4_0 {1e3 * t_q4:9.1f} ms "
                  f"(x{row['ratio_q4_0']:5.2f})  f32 {1e3 * t_f32:9.1f} ms (x{row['ratio_f32']:5.2f})"
                  f"   [{LABEL}]", flush=True)
    return {"label": LABEL, "cpu": os.environ.get("TILEGEN_EMULATED_CPU", platform.machine()),
            "machine": platform.machine(), "tilegen_version": tilegen.__version__,
            "numpy_version": np.__version__, "library": str(Path(libdir).resolve()),
            "library_target": lib.manifest.get("target"),
            "reps": reps, "timing": "best of reps after one warm-up call",
            "ratio": "numpy time / tilegen time (> 1: tilegen faster)",
            "numpy_threads_controlled": set_blas is not None, "rows": rows}


def markdown(res: dict) -> str:
    out = [f"# Side by side on {res['cpu']}: {res['label'].upper()}", "",
           f"tilegen {res['tilegen_version']} vs numpy {res['numpy_version']} float32 matmul on "
           f"the dequantised Q4_0 weights, in one guest process under qemu-user "
           f"(`-cpu {res['cpu']}`), library built with `tilegen build --target "
           f"{res['library_target']}`. qemu emulates every vector lane in software: these ratios "
           f"compare code paths under one emulator and are **not** hardware performance. "
           f"Ratio = numpy time / tilegen time (> 1: tilegen faster); {res['timing']}, "
           f"reps = {res['reps']}. numpy's OpenBLAS thread count "
           f"{'is set to the same value' if res['numpy_threads_controlled'] else 'is its default'}.",
           "", "| m | n = k | threads | numpy ms | tilegen q4_0 ms | ratio q4_0 | tilegen f32 ms "
           "| ratio f32 | q4_0 kernel | f32 kernel |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in res["rows"]:
        out.append(f"| {r['m']} | {r['n']} | {r['threads']} | {1e3 * r['numpy_s']:.1f} | "
                   f"{1e3 * r['tilegen_q4_0_s']:.1f} | {r['ratio_q4_0']:.2f} | "
                   f"{1e3 * r['tilegen_f32_s']:.1f} | {r['ratio_f32']:.2f} | "
                   f"`{r['q4_0_kernel']}` | `{r['f32_kernel']}` |")
    worst_q = max(r["rel_err_q4_0"] for r in res["rows"])
    worst_f = max(r["rel_err_f32"] for r in res["rows"])
    out += ["", f"Max error vs float64 on the dequantised weights, relative to max |y|: "
                f"q4_0 {worst_q:.2e} (int8 activations), f32 {worst_f:.2e}."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("libdir")
    p.add_argument("--m", default="1,16,128", help="comma-separated m values")
    p.add_argument("--nk", type=int, default=2048, help="n = k")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("-o", "--outdir", default=str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    if platform.machine() not in ("aarch64", "arm64"):
        print("side_by_side.py runs in the aarch64 guest: tilegen emulate --cpu MODEL -- "
              "python bench/side_by_side.py LIBDIR", file=sys.stderr)
        return 2
    res = run(a.libdir, [int(v) for v in a.m.split(",")], a.nk, a.nk,
              [int(v) for v in a.threads.split(",")], a.reps)
    out = Path(a.outdir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"side_by_side_{res['cpu']}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(res))
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
