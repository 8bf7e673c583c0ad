"""Q4_K kernels (family q4_K: q8kp x q4kp; i8mm SMMLA, dotprod SDOT, plain NEON) under
emulation, bit-exact against tilegen.reference.kquant on random valid ggml blocks.  The
reference is computed from the float activations and the ggml blocks (``matmul_blocks``), not
from the packed buffers the kernel reads, so a packer and a kernel that disagree on a byte's
place fail here (issue #30 item 8)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families.q4_k import Q4KP, matmul_q8kp_q4kp, random_q4_k
from tilegen.layout.kquant import Q8KP
from tilegen.families import rhs_layout_class
from tilegen.reference.kquant import matmul_blocks

from conftest import (  # noqa: F401 (CPU_FEATURES: the fuzz / q6_K tests import it here)
    CPU_FEATURES, guest, refused_for_missing_features)

KQ_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
# the CPU each ISA gets the full shape sweep on (the other CPUs run a shorter random set)
SWEEP_CPU = {"neon": "cortex-a53", "dotprod": "neoverse-n1", "i8mm": "neoverse-v1"}
KQ_SPECS = ("q4_K:i8mm:8x4", "q4_K:i8mm:4x8", "q4_K:i8mm:4x4", "q4_K:i8mm:12x4",
            "q4_K:i8mm:1x4", "q4_K:i8mm:1x8",
            "q4_K:dotprod:8x4", "q4_K:dotprod:4x8", "q4_K:dotprod:4x4", "q4_K:dotprod:1x4",
            "q4_K:dotprod:1x16",
            "q4_K:neon:4x4", "q4_K:neon:8x4", "q4_K:neon:1x8")
ALL_SPECS = [tilegen.parse_spec(s) for s in KQ_SPECS]
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
# m, n not multiples of the tiles; k = 1, 2 and 4 super-blocks
SWEEP = [(1, 1, 256), (3, 5, 512), (5, 13, 256), (13, 7, 1024), (17, 30, 512), (8, 8, 256),
         (2, 33, 256), (30, 3, 512)]


@pytest.fixture(scope="session")
def kq_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq4lib")
    tilegen.build_library(ALL_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _case(spec, rng, m, n, k, clamped, seed):
    # activations of mixed magnitudes per row (each SB has its own d)
    x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 8.0, size=(m, 1))).astype(np.float32)
    raw = random_q4_k(n, k, seed)
    lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
    rhs = Q4KP(spec.nr, spec.kr).pack_from_ggml(raw, n, k)

    def ref(cmin, cmax):
        return matmul_blocks(rhs_layout_class("q4_K"), x, raw, n, cmin, cmax)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = ref(-FMAX, FMAX)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, ref(cmin, cmax)


def _check(name, cases, refs, outs):
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        where = f"{name} m={m} n={n} k={k}"
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
            f"{where}: wrote outside dst"
        np.testing.assert_array_equal(out[:m, :n].view(np.uint32), exact.view(np.uint32),
                                      err_msg=where)


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_q4k_kernel(spec, cpu, kq_lib):
    g = guest(cpu)
    if refused_for_missing_features(cpu, kq_lib, spec):
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
    outs = g.call("guest_calls:run_q4_cases", str(kq_lib), spec.name, cases)
    _check(spec.name, cases, refs, outs)


def test_q4k_refusals():
    """Tiles the strategies cannot serve are refused with the rule."""
    for text, words in (("q4_K:i8mm:8x4:k8:s2", "kr=16"), ("q4_K:dotprod:4x4:k16:s2", "kr=8"),
                        ("q4_K:i8mm:4x6", "multiple of 4"), ("q4_K:i8mm:6x4", "multiple of 4"),
                        ("q4_K:dotprod:4x4:k8:s1", "sr must be 2")):
        with pytest.raises(tilegen.SpecError, match=words):
            tilegen.parse_spec(text)
