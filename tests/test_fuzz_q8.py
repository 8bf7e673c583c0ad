"""Property test (hypothesis) of the q8_0 kernels: random kernel, CPU (and vector length for the
scalable kernels), shape (any k), value ranges (constant / zero / one-signed rows, int8
extremes, constant RHS rows) and clamps (also min == max), against the bit-exact reference.

Hypothesis draws TILEGEN_FUZZ_EXAMPLES cases (default 1000); they run batched, one guest call
per emulated CPU configuration, so the examples cost one emulator session each, not one call
each.  A failure names the drawn case."""
from __future__ import annotations

import os
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import strategies as st

import tilegen
from tilegen.layout.lhs_int8 import QAI8DXP
from tilegen.layout.rhs_int8 import QSI8CXP
from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp

from conftest import SME_ON, draw_examples, guest
from test_exec_q8 import ALL_SPECS, CPU_FEATURES, SENTINEL

EXAMPLES = int(os.environ.get("TILEGEN_FUZZ_EXAMPLES", "1000"))
NEON_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "max")
# scalable q8_0 kernels and the (cpu, sve VL, sme SVL) runs they take; VL in bits
SCALABLE_SPECS: tuple[str, ...] = (
    "q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1", "q8_0:sve_i8mm:8x2vl",
    "q8_0:sve_dotprod:8x1vl", "q8_0:sve_dotprod:1x1vl", "q8_0:sve_dotprod:4x4vl",
    "q8_0:sme:1vlx4vl", "q8_0:sme:1vlx1vl", "q8_0:sme2:1x4vl", "q8_0:sme2:1x2vl",
    "q8_0:sme2:1vlx4vl", "q8_0:sme2:1vlx3vl")
SVE_RUNS = (("max", 128, None), ("max", 256, None), ("max", 512, None), ("max", 2048, None),
            ("neoverse-v1", None, None), ("neoverse-n2", None, None))
SME_RUNS = tuple(("max", None, v) for v in (128, 256, 512, 1024, 2048))
NATIVE_VL = {"neoverse-v1": 256, "neoverse-n2": 128}


def _specs():
    return list(ALL_SPECS) + [tilegen.parse_spec(s) for s in SCALABLE_SPECS]


@pytest.fixture(scope="module")
def fuzz_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8fuzz")
    tilegen.build_library(_specs(), target="linux-aarch64-all", out_dir=out)
    return out


def _runs(spec):
    if spec.isa.startswith("sme"):
        return SME_RUNS
    if spec.isa.startswith("sve"):
        return SVE_RUNS
    return tuple((c, None, None) for c in NEON_CPUS
                 if set(spec.features) <= CPU_FEATURES.get(c, {"neon", "dotprod", "i8mm"}))


@st.composite
def q8_cases(draw):
    spec = draw(st.sampled_from(_specs()))
    cpu, sve_vl, sme_vl = draw(st.sampled_from(_runs(spec)))
    vl_bits = sme_vl or sve_vl or NATIVE_VL.get(cpu)
    vlb = vl_bits // 8 if spec.vl_scaled else None
    mr, nr = spec.mr_at(vlb), spec.nr_at(vlb)
    return dict(spec=spec, cpu=cpu, sve_vl=sve_vl, sme_vl=sme_vl, vlb=vlb,
                m=draw(st.integers(1, 3 * mr + 2)), n=draw(st.integers(1, 3 * nr + 2)),
                k=draw(st.one_of(st.integers(1, 200), st.sampled_from([31, 32, 33, 64, 65]))),
                lhs=draw(st.sampled_from(["normal", "const", "zero", "positive", "negative",
                                          "wide"])),
                rhs=draw(st.sampled_from(["uniform", "extreme", "zero", "const_rows", "minmax"])),
                clamp=draw(st.sampled_from(["none", "inner", "point", "outer"])),
                seed=draw(st.integers(0, 2**31)))


def _make(c):
    """Packed operands and the reference dst of drawn case ``c``."""
    spec, m, n, k, vlb = c["spec"], c["m"], c["n"], c["k"], c["vlb"]
    nr, lhs_mr = spec.nr_at(vlb), spec.lhs_mr_at(vlb)
    rng = np.random.default_rng(c["seed"])
    x = (rng.normal(size=(m, k)) * 4).astype(np.float32)
    x = {"normal": x, "const": np.full_like(x, 1.75), "zero": np.zeros_like(x),
         "positive": np.abs(x), "negative": -np.abs(x),
         "wide": (x * np.float32(1e4)).astype(np.float32)}[c["lhs"]]
    q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    if c["rhs"] == "extreme":
        q = rng.choice(np.array([-128, -127, 127], np.int8), size=(n, k))
    elif c["rhs"] == "zero":
        q[:] = 0
    elif c["rhs"] == "const_rows":
        q[:] = rng.integers(-128, 128, size=(n, 1), dtype=np.int8)
    elif c["rhs"] == "minmax":
        q[:] = np.where(np.arange(n)[:, None] % 2, np.int8(-128), np.int8(127))
    scale = rng.uniform(1e-3, 1e-1, size=n).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    lhs = QAI8DXP(lhs_mr, spec.kr, spec.sr).pack(x)
    rhs = QSI8CXP(nr, spec.kr).pack(q, scale, bias)
    cmin, cmax = {"none": (-np.inf, np.inf), "inner": (-0.5, 0.75), "point": (0.25, 0.25),
                  "outer": (-1e30, 1e30)}[c["clamp"]]
    ref = matmul_qai8dxp_qsi8cxp(lhs, rhs, m, n, k, lhs_mr, nr, spec.kr, spec.sr, cmin, cmax)
    if c["clamp"] == "point":
        assert (ref == np.float32(cmax)).all()
    case = dict(name=spec.name, m=m, n=n, k=k, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, ref



def test_fuzz_q8(fuzz_lib):
    drawn = draw_examples(q8_cases(), EXAMPLES)
    assert len(drawn) >= EXAMPLES
    groups: dict[tuple, list] = defaultdict(list)
    for c in drawn:
        groups[(c["cpu"], c["sve_vl"], c["sme_vl"])].append(c)
    checked = 0
    for (cpu, sve_vl, sme_vl), cs in sorted(groups.items(), key=str):
        made = [_make(c) for c in cs]
        g = guest(cpu, sve_vl, sme_vl, SME_ON if sme_vl else None)
        res = g.call("guest_q8:run_q8_batch", str(fuzz_lib), [case for case, _ in made])
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
