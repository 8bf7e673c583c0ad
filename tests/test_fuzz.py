"""Property tests (hypothesis) over tiles, shapes, strides, clamps and CPU models, against the
bit-exact numpy references.  TILEGEN_FUZZ_EXAMPLES sets the examples per family (default 1000)."""
from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings, strategies as st

from tilegen.layout import F32PackedRHS
from tilegen.reference.f32 import matmul_f32

from conftest import F32_EXTRA_TILES, F32_TILES, guest
from test_exec_q4 import ALL_SPECS, CPU_FEATURES, _pack, q4_lib  # noqa: F401
from test_runtime_ops import all_lib  # noqa: F401

EXAMPLES = int(os.environ.get("TILEGEN_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
F32_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "max")
SENT = np.float32(-9.75)


@st.composite
def f32_cases(draw):
    tile = draw(st.sampled_from(F32_TILES + F32_EXTRA_TILES))
    mr, nr = map(int, tile.split("x"))
    m = draw(st.integers(1, 3 * mr + 2))
    n = draw(st.integers(1, 3 * nr + 2))
    k = draw(st.integers(1, 40))
    return dict(tile=tile, m=m, n=n, k=k, lpad=draw(st.integers(0, 3)), dpad=draw(st.integers(0, 3)),
                clamp=draw(st.one_of(st.none(), st.tuples(st.floats(-3, 0, width=32),
                                                          st.floats(0, 3, width=32)))),
                cpu=draw(st.sampled_from(F32_CPUS)), seed=draw(st.integers(0, 2**31)))


@FUZZ
@given(c=f32_cases())
def test_fuzz_f32(f32_lib, c):
    mr, nr = map(int, c["tile"].split("x"))
    case, ref = _f32_case(c, nr)
    name = f"matmul_clamp_f32_f32_f32p{nr}x1b_{mr}x{nr}_neon_mla"
    out = guest(c["cpu"]).call("guest_calls:run_f32_cases", str(f32_lib), name, [case])[0]
    _check_f32(out, c, ref)


def _f32_case(c, nr):
    """The drawn f32 case (rows, packed weights, sentinel dst) and its FMA-chain reference."""
    m, n, k = c["m"], c["n"], c["k"]
    rng = np.random.default_rng(c["seed"])
    lhs_base = rng.normal(size=(m, k + c["lpad"])).astype(np.float32)
    w = rng.normal(size=(n, k)).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    cmin, cmax = c["clamp"] or (-3.4e38, 3.4e38)
    case = dict(m=m, n=n, k=k, lhs_base=lhs_base, packed=F32PackedRHS(nr).pack(w, bias=b),
                dst_base=np.full((m + 1, n + c["dpad"]), SENT, np.float32),
                clamp_min=float(cmin), clamp_max=float(cmax))
    return case, matmul_f32(lhs_base[:, :k], w, b, cmin, cmax)


def _check_f32(out, c, ref):
    m, n = c["m"], c["n"]
    assert np.array_equal(out[:m, :n], ref)
    assert (out[m:] == SENT).all() and (out[:, n:] == SENT).all()


@st.composite
def q4_cases(draw, family):
    specs = [s for s in ALL_SPECS if s.family == family]
    spec = draw(st.sampled_from(specs))
    cpus = [c for c in ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
            if set(spec.features) <= CPU_FEATURES.get(c, {"neon", "dotprod", "i8mm"})]
    bl = draw(st.sampled_from([32, 32, 64]))
    return dict(spec=spec, m=draw(st.integers(1, 2 * spec.mr + 3)),
                n=draw(st.integers(1, 3 * spec.nr + 2)), bl=bl, k=bl * draw(st.integers(1, 4)),
                clamp=draw(st.booleans()), cpu=draw(st.sampled_from(cpus)),
                seed=draw(st.integers(0, 2**31)))


def _q4_case(q4_lib, c):
    spec, m, n, k, bl = c["spec"], c["m"], c["n"], c["k"], c["bl"]
    rng = np.random.default_rng(c["seed"])
    lhs, rhs, ref, _, _, _ = _pack(spec, rng, m, n, k, bl)
    free = ref(-3.4e38, 3.4e38)
    cmin, cmax = (float(np.float32(free.min() * 0.5)), float(np.float32(free.max() * 0.5))) \
        if c["clamp"] else (-3.4e38, 3.4e38)
    case = dict(m=m, n=n, k=k, bl=bl, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENT)
    out = guest(c["cpu"]).call("guest_calls:run_q4_cases", str(q4_lib), spec.name, [case])[0]
    assert np.array_equal(out[:m, :n], ref(cmin, cmax)), (spec.name, m, n, k, bl)
    assert (out[m:] == SENT).all() and (out[:, n:] == SENT).all()


@FUZZ
@given(c=q4_cases("q4_0"))
def test_fuzz_q4_0(q4_lib, c):
    _q4_case(q4_lib, c)


@FUZZ
@given(c=q4_cases("q4_0_dx"))
def test_fuzz_q4_0_dx(q4_lib, c):
    _q4_case(q4_lib, c)


@settings(max_examples=max(50, EXAMPLES // 5), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["f32", "q4_0", "q4_0_dx"]), m=st.integers(1, 40), n=st.integers(1, 70),
       kb=st.integers(1, 4), threads=st.integers(2, 8),
       cpu=st.sampled_from(["cortex-a53", "neoverse-n1", "max"]), seed=st.integers(0, 2**31))
def test_fuzz_thread_counts(all_lib, kind, m, n, kb, threads, cpu, seed):
    """lib.matmul splits over m (LHS packing) and n (kernel calls): every thread count gives
    the single-thread result bit for bit."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n, 32 * kb)).astype(np.float32)
    x = rng.normal(size=(m, 32 * kb)).astype(np.float32)
    one, many = guest(cpu).call("guest_calls:matmul_threads", str(all_lib), w, x, kind, (1, threads))
    assert np.array_equal(one, many)


# -- scalable kernels: random vector length, tile, shape, clamp -----------------------------
SCALABLE_EXAMPLES = max(EXAMPLES // 5, 20)
SCAL_SPECS = ("f32:sve:6x4vl", "f32:sve:1x8vl", "f32:sve:3x1vl", "f32:sme:2vlx2vl",
              "f32:sme2:2vlx2vl", "f32:sme2:1vlx4vl", "f32:sme2:4vlx1vl", "f32:sme2:1x2vl",
              "f32:sme2:1x16vl")
VLS = (128, 256, 512, 1024, 2048)


@st.composite
def scalable_cases(draw):
    import tilegen
    spec = tilegen.parse_spec(draw(st.sampled_from(SCAL_SPECS)))
    vl = draw(st.sampled_from(VLS))
    mr, nr = spec.mr_at(vl // 8), spec.nr_at(vl // 8)
    return dict(spec=spec, vl=vl, m=draw(st.integers(1, 2 * mr + 1)),
                n=draw(st.integers(1, 2 * nr + 1)), k=draw(st.integers(1, 24)),
                lpad=draw(st.integers(0, 3)), dpad=draw(st.integers(0, 3)),
                clamp=draw(st.one_of(st.none(), st.tuples(st.floats(-3, 0, width=32),
                                                          st.floats(0, 3, width=32)))),
                seed=draw(st.integers(0, 2**31)))


def _scalable_fuzz_lib():
    import tempfile
    import tilegen
    global _SCAL_LIB
    if _SCAL_LIB is None:
        _SCAL_LIB = tempfile.mkdtemp(prefix="tilegen-fuzz-scal-")
        tilegen.build_library(list(SCAL_SPECS), target="linux-aarch64-all", out_dir=_SCAL_LIB)
    return _SCAL_LIB


_SCAL_LIB = None


@settings(FUZZ, max_examples=SCALABLE_EXAMPLES)
@given(c=scalable_cases())
def test_fuzz_scalable_f32(c):
    from conftest import SME_ON
    spec, vl = c["spec"], c["vl"]
    case, ref = _f32_case(c, spec.nr_at(vl // 8))
    sme = spec.isa.startswith("sme")
    g = guest("max", None if sme else vl, vl if sme else None, SME_ON if sme else None)
    res = g.call("guest_calls:run_scalable_cases", _scalable_fuzz_lib(), spec.name, [case])
    assert res["svcr"] == [0]
    _check_f32(res["outs"][0], c, ref)
