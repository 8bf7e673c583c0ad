"""pack_weights(..., for_ops=("gemm", "gemv")): one packing per layout the best gemm and the
best gemv read (PackedLayouts), matmul / plan on each op's own packing; the default packing
(one layout, the tuned pair) is unchanged."""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.build import get_target
from tilegen.build.tuned import read_tuned
from tilegen.layout.api import layout_for
from tilegen.runtime.errors import ArgumentError
from tilegen.runtime.packing import check_ops
from tilegen.runtime.packed import PackedLayouts, PackedWeights

from conftest import guest

V2 = get_target("neoverse-v2")


def _q4(nr, kr, sr, w):
    lay = layout_for("qsi4c32pscalef16", nr=nr, kr=kr, sr=sr, bl=32)
    return PackedWeights(lay, w.shape[0], w.shape[1], lay.pack_from_float(w), False, "q4_0")


def test_packed_layouts_identity_is_the_layout():
    w = np.random.default_rng(7).normal(size=(24, 64)).astype(np.float32)
    a, b, a2 = _q4(4, 16, 2, w), _q4(24, 8, 2, w), _q4(4, 16, 2, w)
    two = PackedLayouts({"gemm": a, "gemv": b})
    assert two.layouts == (a.layout, b.layout) and two.nbytes == a.nbytes + b.nbytes
    assert two.for_op("gemm") is a and two.for_op("gemv") is b
    one = PackedLayouts({"gemm": a, "gemv": a2})      # equal layouts: stored once
    assert one.layouts == (a.layout,) and one.nbytes == a.nbytes
    assert one.for_op("gemv") is a
    with pytest.raises(ArgumentError, match="a packing for each of gemm, gemv"):
        PackedLayouts({"gemm": a})
    with pytest.raises(ArgumentError, match="must be PackedWeights"):
        PackedLayouts({"gemm": a, "gemv": b.data})
    other = _q4(4, 16, 2, w[:8])
    with pytest.raises(ArgumentError, match="not one weight matrix"):
        PackedLayouts({"gemm": a, "gemv": other})
    with pytest.raises(ArgumentError, match="unknown op"):
        two.for_op("gemx")
    with pytest.raises(ArgumentError, match="cannot be saved as one file"):
        two.save("/nonexistent/x.pw")


@pytest.mark.parametrize("bad, message", [
    ("gemm", "must be a tuple of op names"),
    (None.__class__, "must be a tuple of op names"),
    (("gemm",), "must name both ops"),
    ((), "must name both ops"),
    (("gemv", "gemv"), "names an op twice"),
    (("gemm", "gemv", "gemx"), "unknown op 'gemx'"),
])
def test_bad_for_ops(bad, message):
    with pytest.raises(ArgumentError, match=message):
        check_ops(bad)


def test_good_for_ops():
    assert check_ops(("gemv", "gemm")) == check_ops(["gemm", "gemv"]) == ("gemm", "gemv")


def test_presets_record_best_kernels():
    for name in ("neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2"):
        tf = read_tuned(get_target(name))
        for fam, e in tf.families.items():
            assert e.best_gemm is not None and e.best_gemv is not None, (name, fam)
            assert e.scores["best_gemm"] >= e.scores["gemm"] * 0.99, (name, fam)
            assert e.scores["best_gemv"] >= e.scores["gemv"] * 0.99, (name, fam)
    q4 = read_tuned(V2).families["q4_0"]
    assert q4.best_gemm.spec_string == "q4_0:i8mm:12x4"


@pytest.fixture(scope="module")
def v2_lib(v2_default_lib):
    return v2_default_lib          # conftest's: neoverse-v2's default build, once per session


@pytest.mark.parametrize("kind", ["q4_0", "q4_0_dx", "f32"])
def test_for_ops_weights(kind, v2_lib, tmp_path):
    tf = read_tuned(V2).families[kind]
    rng = np.random.default_rng(1500 + len(kind))
    n, k, m = 52, 96, 7
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32) if kind == "f32" else None   # q4: no packed bias
    x1 = rng.uniform(-2, 2, size=(1, k)).astype(np.float32)
    xm = rng.uniform(-2, 2, size=(m, k)).astype(np.float32)
    assert np.count_nonzero(w) == w.size and np.count_nonzero(xm) == xm.size
    r = guest("max", sve_vl=256).call("guest_calls:for_ops_check", str(v2_lib), kind, w, x1, xm,
                                      bias, str(tmp_path))
    best = r["best"]
    assert (best["gemm"], best["gemv"]) == (tf.top_gemm.name, tf.top_gemv.name)
    # m = 1 runs the gemv on its layout, m > 1 the gemm on its own
    assert r["route"] == {1: best["gemv"], 2: best["gemm"], m: best["gemm"]}
    assert r["plan_kernel"] == {1: best["gemv"], m: best["gemm"]}
    assert r["rhs_match"] == {"gemm": True, "gemv": True}
    two = tf.top_gemm.name != tf.gemm.name or tf.top_gemv.name != tf.gemv.name
    from tilegen.layout.base import same_rhs
    distinct = not same_rhs(tf.top_gemm, tf.top_gemv)
    assert r["n_layouts"] == (2 if distinct else 1)
    assert r["nbytes"] == (sum(r["op_nbytes"].values()) if distinct else r["op_nbytes"]["gemm"])
    # bit-identical to packing for each kernel alone
    for op, out in (("gemm", r["outm"]), ("gemv", r["out1"])):
        s = r["separate"][op]
        assert s["bytes_equal"] and s["layout_equal"] and s["kernel"] == best[op], (op, s["kernel"])
        assert np.array_equal(out, s["out"]), op
    assert np.array_equal(r["outm_t3"], r["outm"]) and np.array_equal(r["out1_t3"], r["out1"])
    assert np.array_equal(r["planm"], r["outm"]) and np.array_equal(r["plan1"], r["out1"])
    assert np.abs(r["outm"]).max() > 0
    # default packing: one layout for the tuned pair, as before
    d = r["default"]
    assert d["type"] == "PackedWeights" and d["layout_is_pair"]
    assert d["pair"] == (tf.gemm.name, tf.gemv.name) == d["kernels"]
    if two:
        assert r["separate"]["gemm"]["kernel"] != d["kernels"][0] or \
            r["separate"]["gemv"]["kernel"] != d["kernels"][1]
    # save: refused as one file; per-packing files round-trip to the same results
    assert "cannot be saved as one file" in r["save_error"]
    assert np.array_equal(r["loaded"]["out1"], r["out1"])
    assert np.array_equal(r["loaded"]["outm"], r["outm"])
    assert r["loaded"]["route"] == {1: best["gemv"], m: best["gemm"]}
    e = r["errors"]
    assert "must name both ops" in e["('gemm',)"] and "names an op twice" in e["('gemv', 'gemv')"]
    assert "unknown op 'gemx'" in e["('gemm', 'gemv', 'gemx')"]
    assert "must be a tuple" in e["'gemm'"] and "must name both ops" in e["()"]
    assert "nr= and for_ops= do not combine" in e["nr"]


def test_for_ops_falls_back_to_the_pair(v2_lib):
    """Marked best kernels the CPU may not run (here: TILEGEN_ISA without i8mm): each op uses
    the default pair's kernel, so for_ops weights are the default packing."""
    rng = np.random.default_rng(77)
    w = rng.normal(size=(20, 64)).astype(np.float32)
    x1 = rng.uniform(-1, 1, size=(1, 64)).astype(np.float32)
    xm = rng.uniform(-1, 1, size=(5, 64)).astype(np.float32)
    r = guest("max", sve_vl=256, env={"TILEGEN_ISA": "neon,dotprod"}).call(
        "guest_calls:for_ops_fallback", str(v2_lib), "q4_0", w, x1, xm)
    assert r["best"] == r["pair"] and "i8mm" not in r["best"]["gemm"]
    assert r["n_layouts"] == 1 and r["same_bytes"] and r["same_out"]
