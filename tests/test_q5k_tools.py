"""q5_K in the tools that read the registry (no family list to edit): `tilegen tune`'s
candidates, `tilegen analyze` / per_k (llvm-mca over one 256-k super-block, the figure
bench/vs_ggml.py compares with ggml's repack), the default kernels of the presets, and the
CLI's family help."""
from __future__ import annotations

import pytest

import tilegen
from tilegen.analysis.mca import per_k
from tilegen.analysis.tune import candidates
from tilegen.build import default_specs, get_target


def test_tune_candidates_cover_every_q5k_isa():
    """The tuner's grid for q5_K on neoverse-v2: gemm and gemv tiles of each NEON / SVE ISA,
    none SME2 (the family has no SME2 kernels), the refused 4x8 absent."""
    t = get_target("neoverse-v2")
    gemm = [c.spec for c in candidates(t, "q5_K", "gemm")]
    gemv = [c.spec for c in candidates(t, "q5_K", "gemv")]
    assert {s.isa for s in gemm} == {s.isa for s in gemv} == {"i8mm", "dotprod", "neon",
                                                              "sve_i8mm", "sve_dotprod"}
    assert "q5_K:i8mm:8x4" in {s.spec_string for s in gemm}
    assert "q5_K:i8mm:4x8" not in {s.spec_string for s in gemm}


@pytest.mark.parametrize("spec", ["q5_K:i8mm:8x4", "q5_K:dotprod:1x4"])
def test_per_k_models_one_super_block(spec):
    """One super-block of the whole tile: every SMMLA/SDOT MAC of it, and (q5_K adds the
    high-bit decode to q4_K's kernel) more cycles than q4_K's kernel of the same tile."""
    r5 = per_k(spec, "neoverse-v2", 256)
    r4 = per_k(spec.replace("q5_K", "q4_K"), "neoverse-v2", 256)
    s = tilegen.parse_spec(spec)
    assert r5.unit_k == 256 and r5.macs == s.mr * s.nr * 256
    assert r5.cycles > r4.cycles and r5.insns > r4.insns


def test_presets_carry_q5k_pairs():
    for target, isa in (("neoverse-v2", "i8mm"), ("neoverse-n1", "dotprod"), ("cortex-a53", "neon")):
        mine = [s for s in default_specs(get_target(target)) if s.family == "q5_K"]
        assert any(s.isa == isa and s.is_gemv for s in mine) and \
            any(s.isa == isa and not s.is_gemv for s in mine), (target, mine)


def test_cli_names_q5k():
    from tilegen.cli import main
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert "q5_K" in out.getvalue()
