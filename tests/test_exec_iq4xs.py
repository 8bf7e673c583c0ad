"""IQ4_XS NEON and SVE kernels (family iq4_xs: q8kp x iq4xsp; i8mm SMMLA, dotprod SDOT, plain
NEON on q4_K's NEON template; sve_i8mm / sve_dotprod on the K-quant SVE skeleton: q4_K's
nibbles, TBL through the kvalues table, signed scales, no min term) under emulation on every
qemu CPU model (those without the ISA refuse the kernel; SVE also on max at VL 128 / 512 / 2048),
bit-exact against tilegen.reference.kquant's ``matmul_blocks`` (from the float activations and
the ggml blocks, not from the packed bytes) on random valid blocks, m, n and k off the tile,
clamped and free, sentinels around dst untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families.iq4_xs import IQ4XSP, random_iq4_xs
from tilegen.layout.kquant import Q8KP
from tilegen.reference.kquant import matmul_blocks

from conftest import guest, refused_for_missing_features

KQ_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
# the CPU each ISA gets the full shape sweep on (the other CPUs run a shorter random set)
SWEEP_CPU = {"neon": "cortex-a53", "dotprod": "neoverse-n1", "i8mm": "neoverse-v1"}
SPECS = ("iq4_xs:i8mm:8x4", "iq4_xs:i8mm:4x8", "iq4_xs:i8mm:12x4", "iq4_xs:i8mm:1x4",
         "iq4_xs:i8mm:1x8", "iq4_xs:i8mm:1x12",
         "iq4_xs:dotprod:8x4", "iq4_xs:dotprod:4x8", "iq4_xs:dotprod:1x4",
         "iq4_xs:neon:4x4", "iq4_xs:neon:1x8")
SVE_SPECS = ("iq4_xs:sve_i8mm:8x1vl", "iq4_xs:sve_i8mm:4x2vl", "iq4_xs:sve_i8mm:12x1vl",
             "iq4_xs:sve_i8mm:1x2vl", "iq4_xs:sve_dotprod:8x1vl", "iq4_xs:sve_dotprod:1x1vl")
ALL_SPECS = [tilegen.parse_spec(s) for s in SPECS]
ALL_SVE = [tilegen.parse_spec(s) for s in SVE_SPECS]
# (cpu, SVE VL bits): the SVE models, and max at three VLs
SVE_RUNS = (("neoverse-v1", None), ("neoverse-n2", None), ("max", 128), ("max", 512), ("max", 2048))
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
SWEEP = [(1, 1, 256), (3, 5, 512), (5, 13, 256), (13, 7, 1024), (17, 30, 512), (8, 8, 256),
         (2, 33, 256), (30, 3, 512)]


@pytest.fixture(scope="module")
def iq_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iq4xslib")
    tilegen.build_library(ALL_SPECS + ALL_SVE, target="linux-aarch64-all", out_dir=out)
    return out


def _case(spec, rng, m, n, k, clamped, seed, nr=None):
    x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 8.0, size=(m, 1))).astype(np.float32)
    raw = random_iq4_xs(n, k, seed)
    lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
    rhs = IQ4XSP(nr or spec.nr, spec.kr).pack_from_ggml(raw, n, k)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = matmul_blocks(IQ4XSP, x, raw, n)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, matmul_blocks(IQ4XSP, x, raw, n, cmin, cmax)


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_iq4xs_neon_kernel(spec, cpu, iq_lib):
    g = guest(cpu)
    if refused_for_missing_features(cpu, iq_lib, spec):
        return
    seed = sum(map(ord, spec.name + cpu))
    rng = np.random.default_rng(seed)
    if SWEEP_CPU[spec.isa] == cpu:
        shapes = SWEEP
    else:
        shapes = [(int(rng.integers(1, 3 * spec.mr + 2)), int(rng.integers(1, 4 * spec.nr)),
                   256 * int(rng.choice([1, 2, 4]))) for _ in range(3)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2), seed=seed + i)
        cases.append(c)
        refs.append(r)
    outs = g.call("guest_calls:run_q4_cases", str(iq_lib), spec.name, cases)
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        where = f"{spec.name} {cpu} m={m} n={n} k={k}"
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), f"{where}: wrote outside dst"
        np.testing.assert_array_equal(out[:m, :n].view(np.uint32), exact.view(np.uint32), err_msg=where)


@pytest.mark.parametrize("run", SVE_RUNS, ids=lambda r: f"{r[0]}-{r[1]}")
@pytest.mark.parametrize("spec", ALL_SVE, ids=lambda s: s.spec_string)
def test_iq4xs_sve_kernel(spec, run, iq_lib):
    cpu, vl = run
    g = guest(cpu, vl)
    info = g.call("guest_calls:vl_info", str(iq_lib), spec.name)
    assert info["runnable"], info
    nr = info["nr"]
    seed = sum(map(ord, spec.name + cpu)) + (vl or 0)
    rng = np.random.default_rng(seed)
    shapes = [(1, 1, 256), (spec.mr + 1, nr + 3, 512), (2 * spec.mr + 3, 2 * nr - 1, 256),
              (max(spec.mr - 1, 1), nr, 768)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2), seed=seed + i, nr=nr)
        cases.append(c)
        refs.append(r)
    outs = g.call("guest_calls:run_q4_cases", str(iq_lib), spec.name, cases)
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        where = f"{spec.name} {cpu} vl={vl} m={m} n={n} k={k}"
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), f"{where}: wrote outside dst"
        np.testing.assert_array_equal(out[:m, :n].view(np.uint32), exact.view(np.uint32), err_msg=where)
