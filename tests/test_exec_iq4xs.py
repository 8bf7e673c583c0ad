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

from conftest import guest
from kquant_exec import KQ_CPUS, check_outputs, kquant_cases, run_neon_kernel

SPECS = ("iq4_xs:i8mm:8x4", "iq4_xs:i8mm:4x8", "iq4_xs:i8mm:12x4", "iq4_xs:i8mm:1x4",
         "iq4_xs:i8mm:1x8", "iq4_xs:i8mm:1x12",
         "iq4_xs:dotprod:8x4", "iq4_xs:dotprod:4x8", "iq4_xs:dotprod:1x4",
         # tall 4-column tiles (the scale differences two sub-blocks at a time, SCALE_PAIRS)
         "iq4_xs:i8mm:16x4", "iq4_xs:dotprod:20x4",
         "iq4_xs:neon:4x4", "iq4_xs:neon:1x8")
SVE_SPECS = ("iq4_xs:sve_i8mm:8x1vl", "iq4_xs:sve_i8mm:4x2vl", "iq4_xs:sve_i8mm:12x1vl",
             "iq4_xs:sve_i8mm:1x2vl", "iq4_xs:sve_dotprod:8x1vl", "iq4_xs:sve_dotprod:1x1vl")
ALL_SPECS = [tilegen.parse_spec(s) for s in SPECS]
ALL_SVE = [tilegen.parse_spec(s) for s in SVE_SPECS]
# (cpu, SVE VL bits): the SVE models, and max at three VLs
SVE_RUNS = (("neoverse-v1", None), ("neoverse-n2", None), ("max", 128), ("max", 512), ("max", 2048))


@pytest.fixture(scope="module")
def iq_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iq4xslib")
    tilegen.build_library(ALL_SPECS + ALL_SVE, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_iq4xs_neon_kernel(spec, cpu, iq_lib):
    run_neon_kernel(spec, cpu, iq_lib)


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
    cases, refs = kquant_cases(spec, rng, shapes, seed, nr=nr)
    outs = g.call("guest_calls:run_q4_cases", str(iq_lib), spec.name, cases)
    check_outputs(f"{spec.name} {cpu} vl={vl}", cases, refs, outs)
