"""Q6_K kernels (family q6_K: q8kp x q6kp; i8mm SMMLA gemm and SDOT gemv, dotprod SDOT by
lane, plain NEON SMULL/SADALP) under emulation, bit-exact against tilegen.reference.kquant on
seeded random valid ggml block_q6_K rows, packed by the layout objects (Q8KP.pack,
Q6KP.pack_from_ggml); the reference is computed from the activations and the ggml blocks
(``matmul_blocks``), not from the packed bytes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families.q6_k import Q6KP, matmul_q8kp_q6kp, random_q6_k
from tilegen.layout.kquant import Q8KP
from tilegen.families import rhs_layout_class
from tilegen.reference.kquant import matmul_blocks

from conftest import CPU_FEATURES, guest
from kquant_exec import FMAX, KQ_CPUS, SENTINEL, SWEEP_CPU, check_outputs

Q6_SPECS = ("q6_K:i8mm:8x4", "q6_K:i8mm:4x8", "q6_K:i8mm:4x4", "q6_K:i8mm:12x4",
            # taller than the register block: passes over weights staged in the frame
            "q6_K:i8mm:16x4", "q6_K:i8mm:24x4", "q6_K:i8mm:32x4", "q6_K:i8mm:8x8",
            "q6_K:dotprod:24x4", "q6_K:neon:16x4",
            "q6_K:i8mm:1x4", "q6_K:i8mm:1x8",
            "q6_K:dotprod:8x4", "q6_K:dotprod:4x4", "q6_K:dotprod:12x4", "q6_K:dotprod:1x4",
            "q6_K:dotprod:1x8", "q6_K:dotprod:1x12",  # scale rows in pieces of 8 + 4 columns
            "q6_K:neon:4x4", "q6_K:neon:8x4", "q6_K:neon:1x4", "q6_K:neon:1x8")
SPECS = [tilegen.parse_spec(s) for s in Q6_SPECS]
# (m, n, k): m, n not multiples of the tiles (and some that are); k = 1, 2 and 4 super-blocks
SHAPES = [(1, 1, 256), (3, 5, 512), (5, 13, 256), (13, 7, 1024), (17, 30, 512), (8, 8, 256),
          (2, 33, 1024), (30, 3, 512), (12, 4, 256), (45, 9, 512), (67, 6, 256)]


@pytest.fixture(scope="session")
def q6_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq6lib")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _inputs(spec, m: int, n: int, k: int, seed: int):
    """(lhs_packed, rhs_packed, x, raw): activations of a different magnitude per row (each SB gets its
    own d) and seeded random valid Q6_K rows (every int8 scale and 6-bit value occurs)."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(m, k)) * rng.uniform(0.05, 10.0, size=(m, 1))).astype(np.float32)
    raw = random_q6_k(n, k, seed)
    lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
    rhs = Q6KP(spec.nr, spec.kr).pack_from_ggml(raw, n, k)
    return lhs, rhs, x, raw


def _cases(spec, shapes, seed: int):
    """The guest's cases (every other one clamped to the middle of the free results) and the
    reference results."""
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        lhs, rhs, x, raw = _inputs(spec, m, n, k, seed + i)
        free = matmul_blocks(rhs_layout_class("q6_K"), x, raw, n)
        cmin, cmax = -FMAX, FMAX
        if i % 2 and free.size > 1:
            cmin, cmax = (float(np.float32(v)) for v in np.quantile(free, [0.25, 0.75]))
        refs.append(free if i % 2 == 0 else
                    matmul_blocks(rhs_layout_class("q6_K"), x, raw, n, cmin, cmax))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                          clamp_max=cmax, sentinel=SENTINEL))
    return cases, refs


def _runs(spec, cpu: str) -> bool:
    return set(spec.features) <= CPU_FEATURES.get(cpu, {"neon", "dotprod", "i8mm"})


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.spec_string)
def test_q6k_kernel(spec, cpu, q6_lib):
    g = guest(cpu)
    if not _runs(spec, cpu):        # the runtime refuses a kernel whose ISA the CPU lacks
        msg = g.call("guest_calls:kernel_refused", str(q6_lib), spec.name)
        missing = set(spec.features) - CPU_FEATURES[cpu]
        assert msg.startswith("ArgumentError") and all(f in msg for f in missing), msg
        return
    seed = sum(map(ord, spec.name + cpu))
    if SWEEP_CPU[spec.isa] == cpu:
        shapes = SHAPES
    else:                           # a shorter random set on the other CPUs
        rng = np.random.default_rng(seed)
        shapes = [(int(rng.integers(1, 3 * spec.mr + 2)), int(rng.integers(1, 4 * spec.nr)),
                   int(rng.choice([256, 512, 1024]))) for _ in range(3)]
    cases, refs = _cases(spec, shapes, seed)
    check_outputs(spec.name, cases, refs, g.call("guest_calls:run_q4_cases", str(q6_lib), spec.name,
                                          cases))


@pytest.mark.parametrize("cpu", ["cortex-a53", "neoverse-n1", "max"])
def test_q6k_kernels_preserve_callee_saved_state(cpu, q6_lib):
    """Every q6_K kernel the CPU runs, through the ABI probe (the 8-row tiles use d8-d15)."""
    res = guest(cpu).call("guest_calls:check_abi", str(q6_lib))
    assert all(v == [] for v in res.values()), {k: v for k, v in res.items() if v}
    assert {k for k in res if "q6kp" in k} == {s.name for s in SPECS if _runs(s, cpu)}


def test_q6k_refusals():
    """Tiles no q6_K strategy serves are refused with the rule."""
    for text, words in (("q6_K:i8mm:8x4:k8:s2", "kr=16"), ("q6_K:dotprod:4x4:k16:s2", "kr=8"),
                        ("q6_K:i8mm:4x6", "multiple of 4"), ("q6_K:i8mm:6x4", "multiple of 4"),
                        ("q6_K:dotprod:4x4:k8:s1", "sr must be 2"),
                        ("q6_K:dotprod:1x16", "vector registers"),
                        ("q6_K:i8mm:4x16", "vector registers")):
        with pytest.raises(tilegen.SpecError, match=words):
            tilegen.parse_spec(text)


GUARD_SPECS = ("q6_K:i8mm:8x4", "q6_K:i8mm:24x4", "q6_K:i8mm:1x8", "q6_K:dotprod:4x4", "q6_K:dotprod:1x4",
               "q6_K:neon:4x4", "q6_K:neon:1x4")


@pytest.mark.parametrize("text", GUARD_SPECS)
def test_q6k_guard_pages(text, q6_lib):
    """Packed LHS, packed RHS and a strided dst flush against PROT_NONE pages (both ends, see
    tests/test_guard_pages.py): no access outside, nothing outside m x n written, bit-exact."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    spec = tilegen.parse_spec(text)
    mr, nr = spec.mr, spec.nr
    shapes = [(1, 1, 256), (mr, nr, 512), (mr + 1, nr + 1, 256), (2 * mr + 3, 3 * nr - 1, 1024)]
    cases, refs = _cases(spec, shapes, sum(map(ord, "guard" + text)))
    for i, c in enumerate(cases):
        c.update(dst_stride=c["n"] + i % 4, sentinel=GUARD_SENTINEL)
    outs = guest("max").call("guest_pack:guarded_q4_cases", str(q6_lib), spec.name, cases,
                             PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


@pytest.mark.parametrize("text", ("q6_K:i8mm:8x4", "q6_K:i8mm:32x4", "q6_K:dotprod:8x4",
                                  "q6_K:neon:4x4"))
def test_q6k_large_shapes(text, q6_lib):
    """Long k (many super-blocks), many column groups and row tiles."""
    spec = tilegen.parse_spec(text)
    cpu = {"neon": "cortex-a53", "dotprod": "neoverse-n1"}.get(spec.isa, "neoverse-v1")
    cases, refs = _cases(spec, [(37, 45, 4096), (2, 129, 2560), (21, 7, 6144)],
                         sum(map(ord, "large" + text)))
    check_outputs(spec.name, cases, refs, guest(cpu).call("guest_calls:run_q4_cases", str(q6_lib),
                                                   spec.name, cases))
