"""tilegen demo: generate -> build -> call (emulated on x86-64) -> check against numpy.

Part 1: an f32 kernel for a tile KleidiAI does not ship.  Part 2: the llama.cpp q4_0 path:
GGUF Q4_0 weights -> repacked once -> matmul (gemm and gemv) and get_rows.
"""
import os
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

import tilegen
from tilegen.build import default_specs, get_target
from tilegen.emulate.remote import GuestSession
from tilegen.reference.f32 import matmul_f32, matmul_f64

tile = os.environ.get("TILE", "7x12")
target = os.environ.get("TARGET", "neoverse-n1")
cpu = os.environ.get("CPU", "neoverse-n1")
out = Path(os.environ.get("OUT", "out/demo"))
ok = True

spec = tilegen.parse_spec(f"f32:neon:{tile}")
asm = tilegen.generate(spec)
print(f"1. generated {spec.name}: {len(asm.splitlines())} lines of assembly")
q4 = [s for s in default_specs(get_target(target)) if s.family == "q4_0"]
res = tilegen.build_library([spec, *q4], target=target, out_dir=out)
print(f"2. built {res.library} for --target {target}: {len(res.manifest['kernels'])} kernels + "
      f"{len(res.manifest['packers'])} LHS packers ({res.manifest['toolchain']['version']})")

rng = np.random.default_rng(2026)
m, n, k = 23, 41, 77                      # not multiples of the tile
x = rng.normal(size=(m, k)).astype(np.float32)
w = rng.normal(size=(n, k)).astype(np.float32)
bias = rng.normal(size=n).astype(np.float32)
clamp = (-20.0, 20.0)
here = str(Path(__file__).resolve().parent)
with GuestSession(cpu, paths=[here]) as g:
    y, kname, feats = g.call("demo_guest:run_f32", str(out.resolve()), w, bias, x, clamp)
    exact = matmul_f32(x, w, bias, *clamp)
    ref = matmul_f64(x, w, bias, *clamp)
    bit_exact = np.array_equal(y.view(np.uint32), exact.view(np.uint32))
    rel = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
    print(f"3. f32: {kname} on emulated {cpu} ({', '.join(feats)}): {m}x{n} (k={k}) "
          f"bit-exact vs the FMA-chain reference: {bit_exact}; max rel. error vs float64 {rel:.2e}")
    ok &= bit_exact and rel <= 1e-5 * np.sqrt(k)

    # q4_0 from a GGUF file written by the gguf package itself
    n, k, m = 96, 512, 9
    wq = rng.normal(size=(n, k)).astype(np.float32)
    raw = gguf.quants.quantize(wq, gguf.GGMLQuantizationType.Q4_0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "demo.gguf")
        wr = gguf.GGUFWriter(path, "llama")
        wr.add_tensor("blk.0.ffn_down.weight", raw, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
        wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()
        xq = rng.normal(size=(m, k)).astype(np.float32)
        rows = np.array([0, 17, 95])
        y, y1, got_rows, gemm, gemv = g.call("demo_guest:run_gguf", str(out.resolve()), path,
                                             "blk.0.ffn_down.weight", xq, rows, 2)
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    f64 = xq.astype(np.float64) @ deq.astype(np.float64).T
    err = float(np.linalg.norm(y - f64) / np.linalg.norm(f64))
    err1 = float(np.linalg.norm(y1 - f64[:1]) / np.linalg.norm(f64[:1]))
    rows_exact = np.array_equal(got_rows, deq[rows])
    print(f"4. q4_0 from GGUF: gemm {gemm} (m={m}, 2 threads) rel. Frobenius error vs float64 "
          f"x @ gguf-dequant(W).T: {err:.2e}; gemv {gemv}: {err1:.2e}; get_rows exact: {rows_exact}")
    ok &= err <= 2e-2 and err1 <= 2e-2 and rows_exact
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
