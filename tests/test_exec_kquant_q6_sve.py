"""Q6_K kernels on SVE (sve_i8mm SMMLA and its SDOT gemv, sve_dotprod SDOT by lane; tiles in VL
units) at several vector lengths under emulation: bit-exact against tilegen.reference.kquant on
seeded random valid ggml block_q6_K rows, packed with the concrete tile the guest library
reports (the shared runner of tests/test_exec_kquant_q4_sve.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

import tilegen
from tilegen.families.q6_k import Q6KP, matmul_q8kp_q6kp, random_q6_k

from conftest import guest
from test_exec_kquant_q4_sve import (NATIVE_VL, RUNS, assert_gemv_pairs_share_the_packed_rhs,
                                     assert_refused_without_the_isa, run_sve_cases, sve_refusals)

KQ6_SVE = ("q6_K:sve_i8mm:8x1vl", "q6_K:sve_i8mm:4x2vl", "q6_K:sve_i8mm:12x1vl",
           "q6_K:sve_i8mm:1x1vl", "q6_K:sve_i8mm:1x3vl", "q6_K:sve_i8mm:1x4vl",
           "q6_K:sve_dotprod:8x1vl", "q6_K:sve_dotprod:4x2vl", "q6_K:sve_dotprod:1x1vl",
           "q6_K:sve_dotprod:1x4vl", "q6_K:sve_dotprod:12x1vl", "q6_K:sve_dotprod:1x3vl",
           # taller than the register block: passes over weights staged in the stack area
           "q6_K:sve_i8mm:24x1vl", "q6_K:sve_i8mm:32x1vl", "q6_K:sve_i8mm:8x2vl",
           "q6_K:sve_dotprod:16x1vl")
SPECS = [tilegen.parse_spec(s) for s in KQ6_SVE]


@pytest.fixture(scope="module")
def kq6_sve_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq6sve")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu,vl", RUNS, ids=[f"{c}-{v or 'native'}" for c, v in RUNS])
def test_q6k_sve_every_vl(cpu, vl, kq6_sve_lib):
    sess = guest(cpu, sve_vl=vl)
    for spec in SPECS:
        run_sve_cases(sess, kq6_sve_lib, spec, vl or NATIVE_VL[cpu], "q6kp",
                      lambda nr, kr, raw, n, k: Q6KP(nr, kr).pack_from_ggml(raw, n, k),
                      random_q6_k)


def test_q6k_sve_refused_without_the_isa(kq6_sve_lib):
    assert_refused_without_the_isa(kq6_sve_lib, SPECS)


@pytest.mark.parametrize("text,words", sve_refusals("q6_K") + [
    ("q6_K:sve_i8mm:40x1vl", "general-purpose registers")])
def test_q6k_sve_refusals(text, words):
    """Tiles the SVE strategies cannot serve are refused with the rule."""
    with pytest.raises(tilegen.SpecError, match=words):
        tilegen.parse_spec(text)


def test_q6k_sve_gemv_pairs_share_the_packed_rhs():
    assert_gemv_pairs_share_the_packed_rhs("q6_K")


@pytest.mark.parametrize("cpu,vl", [("max", 512), ("neoverse-v1", None)])
def test_q6k_sve_kernels_preserve_callee_saved_state(cpu, vl, kq6_sve_lib):
    """Every q6_K SVE kernel through the ABI probe (z8-z15 hold sums and weights)."""
    res = guest(cpu, sve_vl=vl).call("guest_calls:check_abi", str(kq6_sve_lib))
    assert all(v == [] for v in res.values()), {k: v for k, v in res.items() if v}
    assert {k for k in res if "q6kp" in k} == {s.name for s in SPECS}


@pytest.mark.parametrize("text", ("q6_K:sve_i8mm:8x1vl", "q6_K:sve_i8mm:32x1vl",
                                  "q6_K:sve_i8mm:1x3vl", "q6_K:sve_dotprod:8x1vl",
                                  "q6_K:sve_dotprod:1x1vl"))
def test_q6k_sve_guard_pages(text, kq6_sve_lib):
    """Packed LHS, packed RHS and a strided dst flush against PROT_NONE pages (both ends, see
    tests/test_guard_pages.py) at VL 256: no access outside, nothing outside m x n written,
    bit-exact."""
    from types import SimpleNamespace

    from test_exec_kquant_q6 import _cases
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    spec, vl = tilegen.parse_spec(text), 256
    mr, nr = spec.mr_at(vl // 8), spec.nr_at(vl // 8)
    tile = SimpleNamespace(lhs_mr=spec.lhs_mr, nr=nr, kr=spec.kr)
    shapes = [(1, 1, 256), (mr, nr, 512), (mr + 1, nr + 1, 256), (2 * mr + 3, 3 * nr - 1, 512)]
    cases, refs = _cases(tile, shapes, sum(map(ord, "guard" + text)))
    for i, c in enumerate(cases):
        c.update(dst_stride=c["n"] + i % 4, sentinel=GUARD_SENTINEL)
    outs = guest("max", sve_vl=vl).call("guest_pack:guarded_q4_cases", str(kq6_sve_lib),
                                        spec.name, cases, PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


@pytest.mark.parametrize("text", ("q6_K:sve_i8mm:32x1vl", "q6_K:sve_i8mm:1x3vl",
                                  "q6_K:sve_dotprod:8x1vl"))
def test_q6k_sve_large_shapes(text, kq6_sve_lib):
    """Long k (many super-blocks), many column groups and row tiles at VL 512."""
    from types import SimpleNamespace

    from kquant_exec import check_outputs
    from test_exec_kquant_q6 import _cases
    spec, vl = tilegen.parse_spec(text), 512
    tile = SimpleNamespace(lhs_mr=spec.lhs_mr, nr=spec.nr_at(vl // 8), kr=spec.kr)
    cases, refs = _cases(tile, [(37, 45, 4096), (2, 129, 2560), (70, 7, 1536)],
                         sum(map(ord, "large" + text)))
    check_outputs(spec.name, cases, refs, guest("max", sve_vl=vl).call(
        "guest_calls:run_q4_cases", str(kq6_sve_lib), spec.name, cases))
