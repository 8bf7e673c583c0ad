"""tilegen demo: generate -> build -> call (emulated on x86-64) -> check against numpy.

Part 1: an f32 kernel for a tile KleidiAI does not ship.  Part 2: GGUF weights -> repacked
once -> matmul (gemm and gemv) and get_rows: the llama.cpp q4_0 path, then a Q4_K_M-style
file (Q4_K tensors, Q6_K for some: the format most models ship in).
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
from tilegen.families.q4_k import random_q4_k
from tilegen.families.q6_k import random_q6_k
from tilegen.layout.ggml import QK_K
from tilegen.reference.f32 import matmul_f32, matmul_f64

tile = os.environ.get("TILE", "7x12")
target = os.environ.get("TARGET", "neoverse-n1")
cpu = os.environ.get("CPU", "neoverse-n1")
out = Path(os.environ.get("OUT", "out/demo"))
ok = True

spec = tilegen.parse_spec(f"f32:neon:{tile}")
asm = tilegen.generate(spec)
print(f"1. generated {spec.name}: {len(asm.splitlines())} lines of assembly")
quant = [s for s in default_specs(get_target(target)) if s.family in ("q4_0", "q4_K", "q6_K")]
res = tilegen.build_library([spec, *quant], target=target, out_dir=out)
print(f"2. built {res.library} for --target {target}: {len(res.manifest['kernels'])} kernels + "
      f"{len(res.manifest['packers'])} LHS packers ({res.manifest['toolchain']['version']})")

rng = np.random.default_rng(2026)
m, n, k = 23, 41, 77                      # not multiples of the tile
x = rng.normal(size=(m, k)).astype(np.float32)
w = rng.normal(size=(n, k)).astype(np.float32)
bias = rng.normal(size=n).astype(np.float32)
clamp = (-20.0, 20.0)
here = str(Path(__file__).resolve().parent)
T = gguf.GGMLQuantizationType


def write_gguf(path: str, tensors: dict) -> None:
    """A GGUF file of raw ggml blocks, written by the gguf package: name -> (type, uint8 rows)."""
    wr = gguf.GGUFWriter(path, "llama")
    for name, (typ, raw) in tensors.items():
        wr.add_tensor(name, raw, raw_dtype=typ)
    wr.write_header_to_file(); wr.write_kv_data_to_file(); wr.write_tensors_to_file(); wr.close()


def q8k_bound(x: np.ndarray, deq: np.ndarray) -> np.ndarray:
    """Worst-case |error| of each output of x @ deq.T when the kernels round the activations
    to int8 per row per 256-k super-block (Q8_K-style: scale d = max|x|/127, every value moved
    by at most d/2; the weights are exact, a lossless repack) -- plus the f32 arithmetic of the
    scales and sums, < (k/32 + 8) * 2**-24 of |x| @ |W|.T, taken as 1e-5 of it."""
    m, k = x.shape
    ax, aw = np.abs(x.astype(np.float64)), np.abs(deq.astype(np.float64))
    half_step = ax.reshape(m, k // QK_K, QK_K).max(axis=2) / 254          # (m, super-blocks)
    w_sums = aw.reshape(deq.shape[0], k // QK_K, QK_K).sum(axis=2)        # (n, super-blocks)
    return half_step @ w_sums.T * (1 + 1e-6) + 1e-5 * (ax @ aw.T)


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

    # a Q4_K_M-style file: Q4_K tensors, Q6_K for some (here ffn_down); random valid blocks
    n, k, m = 96, 3 * QK_K, 9
    tensors = {"blk.0.ffn_gate.weight": (T.Q4_K, random_q4_k(n, k, 7).reshape(n, -1)),
               "blk.0.ffn_down.weight": (T.Q6_K, random_q6_k(n, k, 8).reshape(n, -1))}
    xk = rng.normal(size=(m, k)).astype(np.float32)
    rows = np.array([0, 41, 95])
    print(f"5. Q4_K_M-style GGUF (n={n}, k={k}): each output within the worst case of the int8 "
          f"activations (half a step of max|x|/127 per value, per 256-k super-block)")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "demo-q4_k_m.gguf")
        write_gguf(path, tensors)
        for name, (typ, raw) in tensors.items():
            y, y1, got_rows, gemm, gemv = g.call("demo_guest:run_gguf", str(out.resolve()),
                                                 path, name, xk, rows, 2)
            deq = gguf.quants.dequantize(raw, typ).reshape(n, k)
            f64 = xk.astype(np.float64) @ deq.astype(np.float64).T
            bound = q8k_bound(xk, deq)
            err = float(np.linalg.norm(y - f64) / np.linalg.norm(f64))
            err1 = float(np.linalg.norm(y1 - f64[:1]) / np.linalg.norm(f64[:1]))
            used = float(max(np.max(np.abs(y - f64) / bound), np.max(np.abs(y1 - f64[:1]) / bound[:1])))
            rows_exact = np.array_equal(got_rows, deq[rows])
            print(f"   {name} {typ.name}: gemm {gemm} (m={m}, 2 threads) rel. Frobenius error "
                  f"vs float64 x @ gguf-dequant(W).T: {err:.2e}; gemv {gemv}: {err1:.2e}; "
                  f"largest error / bound {used:.2f}; get_rows exact: {rows_exact}")
            ok &= used <= 1 and rows_exact
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
