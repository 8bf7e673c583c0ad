"""tilegen demo: generate -> build -> call (emulated on x86-64) -> check against numpy."""
import os
import sys
from pathlib import Path

import numpy as np

import tilegen
from tilegen.emulate.remote import GuestSession
from tilegen.reference import matmul_f32, matmul_f64

tile = os.environ.get("TILE", "7x12")
target = os.environ.get("TARGET", "neoverse-n1")
cpu = os.environ.get("CPU", "neoverse-n1")
out = Path(os.environ.get("OUT", "out/demo"))

spec = tilegen.parse_spec(f"f32:neon:{tile}")
asm = tilegen.generate(spec)
print(f"1. generated {spec.name}: {len(asm.splitlines())} lines of assembly")
res = tilegen.build_library([spec], target=target, out_dir=out)
print(f"2. built {res.library} for --target {target} with {res.manifest['toolchain']['version']}")

rng = np.random.default_rng(2026)
m, n, k = 23, 41, 77                      # not multiples of the tile
x = rng.normal(size=(m, k)).astype(np.float32)
w = rng.normal(size=(n, k)).astype(np.float32)
bias = rng.normal(size=n).astype(np.float32)
clamp = (-20.0, 20.0)
with GuestSession(cpu, paths=[str(Path(__file__).resolve().parent)]) as g:
    y, kname, feats = g.call("demo_guest:run", str(out.resolve()), w, bias, x, clamp)
print(f"3. called {kname} on emulated CPU {cpu} (features: {', '.join(feats)})")
exact = matmul_f32(x, w, bias, *clamp)
ref = matmul_f64(x, w, bias, *clamp)
bit_exact = np.array_equal(y.view(np.uint32), exact.view(np.uint32))
rel = float(np.max(np.abs(y - ref)) / np.max(np.abs(ref)))
print(f"4. check: {m}x{n} (k={k}) bit-exact vs the FMA-chain reference: {bit_exact}; "
      f"max relative error vs numpy float64: {rel:.2e}")
ok = bit_exact and rel <= 1e-5 * np.sqrt(k)
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
