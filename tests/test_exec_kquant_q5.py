"""Q5_K kernels (family q5_K: q8kp x q5kp; i8mm SMMLA and its gemv, dotprod SDOT by lane,
plain NEON; sve_i8mm / sve_dotprod at several vector lengths) under emulation, bit-exact
against tilegen.reference.kquant on seeded random valid block_q5_K rows.  The reference is
computed from the float activations and the ggml blocks (``matmul_blocks``), not from the
packed buffers, so a packer and a kernel that disagree on a byte's (or a fifth bit's) place
fail here."""
from __future__ import annotations

from pathlib import Path

import pytest

import tilegen
from tilegen.families.q5_k import Q5KP, random_q5_k

from conftest import guest
from kquant_exec import KQ_CPUS, run_neon_kernel
from test_exec_kquant_q4_sve import (NATIVE_VL, RUNS, assert_gemv_pairs_share_the_packed_rhs,
                                     assert_refused_without_the_isa, run_sve_cases, sve_refusals)

KQ5_NEON = ("q5_K:i8mm:8x4", "q5_K:i8mm:4x4", "q5_K:i8mm:12x4",
            "q5_K:i8mm:1x4", "q5_K:i8mm:1x8",
            "q5_K:dotprod:8x4", "q5_K:dotprod:4x8", "q5_K:dotprod:4x4", "q5_K:dotprod:1x4",
            "q5_K:dotprod:1x16",
            "q5_K:neon:4x4", "q5_K:neon:8x4", "q5_K:neon:1x8")
KQ5_SVE = ("q5_K:sve_i8mm:8x1vl", "q5_K:sve_i8mm:4x2vl", "q5_K:sve_i8mm:12x1vl",
           "q5_K:sve_i8mm:1x1vl", "q5_K:sve_i8mm:1x3vl", "q5_K:sve_i8mm:1x4vl",
           "q5_K:sve_dotprod:8x1vl", "q5_K:sve_dotprod:4x2vl", "q5_K:sve_dotprod:1x1vl",
           "q5_K:sve_dotprod:1x4vl", "q5_K:sve_dotprod:12x1vl", "q5_K:sve_dotprod:1x3vl")
NEON_SPECS = [tilegen.parse_spec(s) for s in KQ5_NEON]
SVE_SPECS = [tilegen.parse_spec(s) for s in KQ5_SVE]


@pytest.fixture(scope="module")
def kq5_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq5lib")
    tilegen.build_library(NEON_SPECS + SVE_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", NEON_SPECS, ids=lambda s: s.spec_string)
def test_q5k_kernel(spec, cpu, kq5_lib):
    run_neon_kernel(spec, cpu, kq5_lib)


@pytest.mark.parametrize("cpu,vl", RUNS, ids=[f"{c}-{v or 'native'}" for c, v in RUNS])
def test_q5k_sve_every_vl(cpu, vl, kq5_lib):
    sess = guest(cpu, sve_vl=vl)
    for spec in SVE_SPECS:
        run_sve_cases(sess, kq5_lib, spec, vl or NATIVE_VL[cpu], "q5kp",
                      lambda nr, kr, raw, n, k: Q5KP(nr, kr).pack_from_ggml(raw, n, k),
                      random_q5_k)


def test_q5k_sve_refused_without_the_isa(kq5_lib):
    assert_refused_without_the_isa(kq5_lib, SVE_SPECS)


@pytest.mark.parametrize("text,words", sve_refusals("q5_K") + [
    ("q5_K:i8mm:8x4:k8:s2", "kr=16"), ("q5_K:dotprod:4x4:k16:s2", "kr=8"),
    ("q5_K:i8mm:4x6", "multiple of 4"), ("q5_K:dotprod:4x4:k8:s1", "sr must be 2"),
    ("q5_K:i8mm:4x8", "vector registers"), ("q5_K:sme2:1vlx4vl", "1vlx1vl or 1vlx2vl")])
def test_q5k_refusals(text, words):
    """Tiles the strategies cannot serve are refused with the rule (SME2: tests/test_exec_kquant_sme.py
    has the rest)."""
    with pytest.raises(tilegen.SpecError, match=words):
        tilegen.parse_spec(text)


def test_q5k_sve_gemv_pairs_share_the_packed_rhs():
    assert_gemv_pairs_share_the_packed_rhs("q5_K")
