"""Q4_K kernels on SVE (sve_i8mm SMMLA and its SDOT gemv, sve_dotprod SDOT by lane; tiles in VL
units) at several vector lengths under emulation: bit-exact against tilegen.reference.kquant on
random valid ggml blocks, packed with the concrete tile the guest library reports; the
reference from the activations and the ggml blocks (``matmul_blocks``), not the packed bytes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families.q4_k import Q4KP, matmul_q8kp_q4kp, random_q4_k
from tilegen.layout.kquant import Q8KP
from tilegen.families import rhs_layout_class
from tilegen.reference.kquant import matmul_blocks

from conftest import guest
from kquant_exec import FMAX, SENTINEL, check_outputs

KQ_SVE = ("q4_K:sve_i8mm:8x1vl", "q4_K:sve_i8mm:4x2vl", "q4_K:sve_i8mm:12x1vl",
          "q4_K:sve_i8mm:1x1vl", "q4_K:sve_i8mm:1x3vl", "q4_K:sve_i8mm:1x4vl",
          "q4_K:sve_dotprod:8x1vl", "q4_K:sve_dotprod:4x2vl", "q4_K:sve_dotprod:1x1vl",
          "q4_K:sve_dotprod:1x4vl", "q4_K:sve_dotprod:12x1vl", "q4_K:sve_dotprod:1x3vl")
SPECS = [tilegen.parse_spec(s) for s in KQ_SVE]
# (cpu, VL in bits): qemu's max CPU at 128/256/512/2048 and two SVE cores at their own VL
RUNS = [("max", 128), ("max", 256), ("max", 512), ("max", 2048), ("neoverse-v1", None),
        ("neoverse-n2", None)]
NATIVE_VL = {"neoverse-v1": 256, "neoverse-n2": 128}


@pytest.fixture(scope="module")
def kq_sve_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq4sve")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _shapes(mr, nr, rng):
    """m and n not multiples of the tile (and whole tiles); k = 1 and 2 super-blocks."""
    fixed = [(1, 1, 256), (mr, nr, 512), (mr + 1, nr + 3, 256), (2 * mr + 3, 2 * nr - 1, 512)]
    return fixed + [(int(rng.integers(1, 2 * mr + 2)), int(rng.integers(1, 2 * nr + 2)),
                     256 * int(rng.choice([1, 2])))]


def run_sve_cases(sess, lib, spec, vl_bits, rhs_format, pack_rhs, random_blocks):
    """One guest run of an SVE K-quant kernel at vl_bits: shapes off the tile (every other one
    clamped to the middle of the free results), bit-exact against ``matmul_blocks`` of the
    spec's family; the RHS packed for the concrete nr the guest library reports."""
    info = sess.call("guest_calls:vl_info", str(lib), spec.name)
    vlb = vl_bits // 8
    mr, nr = spec.mr_at(vlb), spec.nr_at(vlb)
    assert info["runnable"] and (info["mr"], info["nr"]) == (mr, nr), (spec.name, info)
    assert info["rhs_format"] == f"{rhs_format}{nr}x{spec.kr // 2}", info
    seed = vl_bits + sum(map(ord, spec.name))
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k) in enumerate(_shapes(mr, nr, rng)):
        x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 8.0, size=(m, 1))).astype(np.float32)
        raw = random_blocks(n, k, seed + i)
        lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
        rhs = pack_rhs(nr, spec.kr, raw, n, k)

        def ref(cmin, cmax):
            return matmul_blocks(rhs_layout_class(spec.family), x, raw, n, cmin, cmax)
        cmin, cmax = -FMAX, FMAX
        free = ref(cmin, cmax)
        if i % 2 and free.size > 1:
            cmin, cmax = (float(np.float32(v)) for v in np.quantile(free, [0.2, 0.8]))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs,
                          clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL))
        refs.append(ref(cmin, cmax))
    outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    check_outputs(f"{spec.name} VL={vl_bits}", cases, refs, outs)


def _run(sess, lib, spec, vl_bits):
    run_sve_cases(sess, lib, spec, vl_bits, "q4kp",
                  lambda nr, kr, raw, n, k: Q4KP(nr, kr).pack_from_ggml(raw, n, k),
                  random_q4_k)


@pytest.mark.parametrize("cpu,vl", RUNS, ids=[f"{c}-{v or 'native'}" for c, v in RUNS])
def test_q4k_sve_every_vl(cpu, vl, kq_sve_lib):
    sess = guest(cpu, sve_vl=vl)
    for spec in SPECS:
        _run(sess, kq_sve_lib, spec, vl or NATIVE_VL[cpu])


def assert_refused_without_the_isa(lib, specs):
    """a64fx (SVE without dotprod / i8mm) and neoverse-n1 (no SVE) refuse every kernel."""
    for cpu in ("a64fx", "neoverse-n1"):
        for spec in specs:
            msg = guest(cpu).call("guest_calls:kernel_refused", str(lib), spec.name)
            assert "ArgumentError" in msg, (cpu, spec.name, msg)


def sve_refusals(family: str) -> list[tuple[str, str]]:
    """(tile, words of the refusal) every K-quant SVE family shares."""
    return [(f"{family}:{tile}", words) for tile, words in (
        ("sve_i8mm:8x1vl:k8:s2", "kr=16"), ("sve_dotprod:4x1vl:k16:s2", "kr=8"),
        ("sve_i8mm:6x1vl", "multiple of 4"), ("sve_i8mm:8x4", "nr in VL units"),
        ("sve_dotprod:4x5vl", "4vl"), ("sve_i8mm:2vlx1vl", "fixed row count"),
        ("sve_dotprod:4x4vl", "vector registers"))]


def assert_gemv_pairs_share_the_packed_rhs(family: str):
    """The gemv kernels read their gemm partners' packed RHS at every vector length."""
    from tilegen.layout.base import same_rhs
    p = tilegen.parse_spec
    assert same_rhs(p(f"{family}:sve_i8mm:8x1vl"), p(f"{family}:sve_i8mm:1x1vl"))
    assert same_rhs(p(f"{family}:sve_dotprod:8x1vl"), p(f"{family}:sve_dotprod:1x1vl"))


def test_q4k_sve_refused_without_the_isa(kq_sve_lib):
    assert_refused_without_the_isa(kq_sve_lib, SPECS)


@pytest.mark.parametrize("text,words", sve_refusals("q4_K"))
def test_q4k_sve_refusals(text, words):
    """Tiles the SVE strategies cannot serve are refused with the rule."""
    with pytest.raises(tilegen.SpecError, match=words):
        tilegen.parse_spec(text)


def test_q4k_sve_gemv_pairs_share_the_packed_rhs():
    assert_gemv_pairs_share_the_packed_rhs("q4_K")
