"""Property test (hypothesis) of the bf16 kernels: random tile, CPU with bf16, shape (any m, n,
k), value ranges (tiny / huge / mixed magnitudes, cancellation, zeros, subnormal inputs flushed
by BFMMLA/BFDOT/BFMOPA) and clamps (also min == max), against the bit-exact reference; one guest
session per CPU model.  TILEGEN_FUZZ_EXAMPLES examples (default 1000) for the NEON kernels and
as many again for the SME2 BFMOPA tiles (drawn with the streaming vector length, 128-2048 bits,
run batched: one guest session per SVL)."""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tilegen
from tilegen.layout.bf16 import BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B
from tilegen.reference.bf16 import matmul_bf16

from conftest import SME_ON, draw_examples, guest
from test_exec_bf16 import ALL_SPECS, BF16_CPUS, FMAX, SENTINEL, _check, bf16_lib  # noqa: F401

EXAMPLES = max(int(os.environ.get("TILEGEN_FUZZ_EXAMPLES", "1000")), 20)


@st.composite
def bf16_cases(draw):
    spec = draw(st.sampled_from(ALL_SPECS))
    return dict(spec=spec, cpu=draw(st.sampled_from(BF16_CPUS)),
                m=draw(st.integers(1, 3 * spec.mr + 2)), n=draw(st.integers(1, 3 * spec.nr + 2)),
                k=draw(st.integers(1, 150)),
                values=draw(st.sampled_from(["normal", "tiny", "huge", "mixed", "cancel", "zero",
                                             "subnormal"])),
                clamp=draw(st.sampled_from(["none", "inner", "point"])),
                seed=draw(st.integers(0, 2**31)))


def _values(kind, rng, shape):
    x = rng.normal(size=shape)
    if kind == "tiny":
        x *= 1e-18
    elif kind == "huge":
        x *= 1e17
    elif kind == "mixed":
        x *= 10.0 ** rng.integers(-20, 20, size=shape)
    elif kind == "cancel":
        x = np.round(x * 4) / 4
    elif kind == "zero":
        x[rng.random(size=shape) < 0.7] = 0
    elif kind == "subnormal":
        x[rng.random(size=shape) < 0.3] *= 1e-39
    return x.astype(np.float32)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(c=bf16_cases())
def test_fuzz_bf16(bf16_lib, c):
    spec, m, n, k = c["spec"], c["m"], c["n"], c["k"]
    rng = np.random.default_rng(c["seed"])
    x = _values(c["values"], rng, (m, k))
    w = _values(c["values"], rng, (n, k))
    bias = rng.normal(size=n).astype(np.float32)
    L, R = BF16PLhs4(spec.mr), BF16PRhs4B(spec.nr)
    lp, rp = L.pack(x), R.pack(w, bias)
    cmin, cmax = {"none": (-FMAX, FMAX), "inner": (-0.5, 0.75), "point": (0.25, 0.25)}[c["clamp"]]
    ref = matmul_bf16(lp, rp, m, n, k, L, R, cmin, cmax)
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lp, rhs_packed=rp, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    out = guest(c["cpu"]).call("guest_calls:run_q4_cases", str(bf16_lib), spec.name, [case])
    if c["clamp"] == "point":
        assert (ref == np.float32(cmax)).all()
    _check([case], [ref], out, spec.spec_string)


# -- SME2 BFMOPA: tiles in VL units, drawn with the streaming vector length ------------------
SME_TILES = ("2vlx2vl", "1vlx4vl", "4vlx1vl", "1vlx1vl", "2vlx1vl")
SME_VLS = (128, 256, 512, 1024, 2048)


@pytest.fixture(scope="module")
def bf16_sme_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16smefuzz")
    tilegen.build_library([f"bf16:sme2:{t}" for t in SME_TILES], target="linux-aarch64-all",
                          out_dir=out)
    return out


@st.composite
def bf16_sme_cases(draw):
    spec = tilegen.parse_spec(f"bf16:sme2:{draw(st.sampled_from(SME_TILES))}")
    svl = draw(st.sampled_from(SME_VLS))
    mr, nr = spec.mr_at(svl // 8), spec.nr_at(svl // 8)
    return dict(spec=spec, svl=svl,
                m=draw(st.integers(1, 3 * mr + 2)), n=draw(st.integers(1, 3 * nr + 2)),
                k=draw(st.one_of(st.integers(1, 150), st.sampled_from([1, 2, 3, 64, 65]))),
                values=draw(st.sampled_from(["normal", "tiny", "huge", "mixed", "cancel", "zero",
                                             "subnormal"])),
                clamp=draw(st.sampled_from(["none", "inner", "point"])),
                seed=draw(st.integers(0, 2**31)))



def test_fuzz_bf16_sme2(bf16_sme_lib):
    """EXAMPLES drawn cases, run batched: one guest session per streaming vector length."""
    drawn = draw_examples(bf16_sme_cases(), EXAMPLES)
    assert len(drawn) >= EXAMPLES
    groups: dict[int, list] = defaultdict(list)
    for c in drawn:
        groups[c["svl"]].append(c)
    assert set(groups) == set(SME_VLS)
    checked = 0
    for svl, cs in sorted(groups.items()):
        made = []
        for c in cs:
            spec, m, n, k = c["spec"], c["m"], c["n"], c["k"]
            rng = np.random.default_rng(c["seed"])
            x = _values(c["values"], rng, (m, k))
            w = _values(c["values"], rng, (n, k))
            bias = rng.normal(size=n).astype(np.float32)
            L, R = BF16PLhs2.for_vl(svl // 8, spec.mr), BF16PRhs2B.for_vl(svl // 8, spec.nr)
            lp, rp = L.pack(x), R.pack(w, bias)
            cmin, cmax = {"none": (-FMAX, FMAX), "inner": (-0.5, 0.75),
                          "point": (0.25, 0.25)}[c["clamp"]]
            ref = matmul_bf16(lp, rp, m, n, k, L, R, cmin, cmax)
            if c["clamp"] == "point":
                assert (ref == np.float32(cmax)).all()
            made.append((dict(name=spec.name, m=m, n=n, k=k, lhs_packed=lp, rhs_packed=rp,
                              clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL), ref))
        g = guest("max", None, svl, dict(SME_ON))
        res = g.call("guest_q8:run_q8_batch", str(bf16_sme_lib), [case for case, _ in made])
        for c, (case, ref), r in zip(cs, made, res):
            m, n, out = c["m"], c["n"], r["out"]
            what = {key: (v.spec_string if key == "spec" else v) for key, v in c.items()}
            assert r["svcr"] == 0, what
            assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
                f"wrote outside dst: {what}"
            got = out[:m, :n]
            assert np.array_equal(got, ref), f"{np.sum(got != ref)} differ: {what}"
            checked += 1
    assert checked == len(drawn)
