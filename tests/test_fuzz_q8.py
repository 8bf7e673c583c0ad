"""Property test (hypothesis) of the q8_0 kernels: random tile, CPU, shape (any k), value
ranges (constant / zero / one-signed rows, int8 extremes) and clamps (also min == max),
against the bit-exact reference.  TILEGEN_FUZZ_EXAMPLES / 5 examples (default 200)."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from tilegen.layout.q4 import QAI8DXP
from tilegen.layout.q8 import QSI8CXP
from tilegen.reference_q8 import matmul_qai8dxp_qsi8cxp

from conftest import guest
from test_exec_q8 import ALL_SPECS, CPU_FEATURES, SENTINEL, _check, q8_lib  # noqa: F401

EXAMPLES = max(int(os.environ.get("TILEGEN_FUZZ_EXAMPLES", "1000")) // 5, 20)


@st.composite
def q8_cases(draw):
    spec = draw(st.sampled_from(ALL_SPECS))
    cpus = [c for c in ("cortex-a53", "neoverse-n1", "max")
            if set(spec.features) <= CPU_FEATURES.get(c, {"neon", "dotprod", "i8mm"})]
    return dict(spec=spec, cpu=draw(st.sampled_from(cpus)),
                m=draw(st.integers(1, 3 * spec.mr + 2)), n=draw(st.integers(1, 3 * spec.nr + 2)),
                k=draw(st.integers(1, 200)), lhs=draw(st.sampled_from(["normal", "const", "zero",
                                                                        "positive", "negative"])),
                rhs=draw(st.sampled_from(["uniform", "extreme", "zero"])),
                clamp=draw(st.sampled_from(["none", "inner", "point"])),
                seed=draw(st.integers(0, 2**31)))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(c=q8_cases())
def test_fuzz_q8(q8_lib, c):
    spec, m, n, k = c["spec"], c["m"], c["n"], c["k"]
    rng = np.random.default_rng(c["seed"])
    x = (rng.normal(size=(m, k)) * 4).astype(np.float32)
    x = {"normal": x, "const": np.full_like(x, 1.75), "zero": np.zeros_like(x),
         "positive": np.abs(x), "negative": -np.abs(x)}[c["lhs"]]
    q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    if c["rhs"] == "extreme":
        q = rng.choice(np.array([-128, -127, 127], np.int8), size=(n, k))
    elif c["rhs"] == "zero":
        q[:] = 0
    scale = rng.uniform(1e-3, 1e-1, size=n).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    lhs = QAI8DXP(spec.lhs_mr, spec.kr, spec.sr).pack(x)
    rhs = QSI8CXP(spec.nr, spec.kr).pack(q, scale, bias)
    cmin, cmax = {"none": (-np.inf, np.inf), "inner": (-0.5, 0.75), "point": (0.25, 0.25)}[c["clamp"]]
    ref = matmul_qai8dxp_qsi8cxp(lhs, rhs, m, n, k, spec.lhs_mr, spec.nr, spec.kr, spec.sr, cmin, cmax)
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    out = guest(c["cpu"]).call("guest_calls:run_q4_cases", str(q8_lib), spec.name, [case])
    if c["clamp"] == "point":
        assert (ref == np.float32(cmax)).all()
    _check([case], [ref], out)
