"""Calling the ops: concurrent callers, out= aliasing, clamp, Inf/NaN, threads=, TILEGEN_ISA."""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.reference.f32 import matmul_f32

from conftest import guest
from test_runtime_ops import all_lib  # noqa: F401 - shared session fixture


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
def test_mixed_threads_race(kind, all_lib):
    """8 Python threads, thread i with threads=i + 1, 100 rounds, the pool rebuilt each round."""
    rng = np.random.default_rng(21)
    n, k = 128, 32                  # n splits into 8 parts for the 16- and 4-column kernels
    w = rng.normal(size=(n, k)).astype(np.float32)
    xs = [rng.normal(size=(int(rng.integers(2, 9)), k)).astype(np.float32) for _ in range(8)]
    errors, bad_rounds, stray = guest("cortex-a53").call("guest_calls:mixed_threads_race",
                                                         str(all_lib), w, xs, kind, 100)
    assert errors == [] and bad_rounds == 0
    assert stray <= 0           # replaced pools do not leave threads behind


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
@pytest.mark.parametrize("alias", ["x", "bias"])
def test_out_aliasing_inputs(kind, alias, all_lib):
    """out= sharing memory with x (n == k) or with the call-time bias gives the same result as
    a separate out."""
    rng = np.random.default_rng(22)
    k = 64
    w = rng.normal(size=(k, k)).astype(np.float32)
    x = rng.normal(size=(2, 7, k)).astype(np.float32)
    b = rng.normal(size=k).astype(np.float32) if alias == "bias" else None
    g = guest("cortex-a53")
    for threads in (1, 3):
        want = g.call("guest_calls:matmul_try", str(all_lib), kind, w, x, bias=b, threads=threads)
        y, same = g.call("guest_calls:matmul_out_alias", str(all_lib), kind, w, x, b, alias, threads)
        assert same and np.array_equal(y, want)
    if kind == "f32":
        ref = matmul_f32(x.reshape(-1, k), w, None, -np.inf, np.inf)
        assert np.array_equal(want.reshape(-1, k), ref if b is None else ref + b)


def _with_non_finite(rng, m, k):
    x = rng.normal(size=(m, k)).astype(np.float32)
    x[0, 3] = np.inf
    x[1, 5] = -np.inf
    x[2, 7] = np.nan
    x[3, 1], x[3, 2] = np.inf, -np.inf        # inf - inf: NaN
    x[4, :] = 3e38                            # the sums overflow float32 to +-inf
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # the references overflow
@pytest.mark.parametrize("cpu", ["cortex-a53", "max", "max-sme"])
def test_f32_inf_nan_propagate(cpu, all_lib):
    """No clamp by default: Inf and NaN come out as numpy's float32 arithmetic gives them."""
    from conftest import SME_ON
    g = guest(cpu.removesuffix("-sme"), env=SME_ON if cpu.endswith("-sme") else None)
    rng = np.random.default_rng(23)
    n, k = 40, 48
    w = rng.normal(size=(n, k)).astype(np.float16)
    x = _with_non_finite(rng, 9, k)
    ref = matmul_f32(x, w.astype(np.float32), None, -np.inf, np.inf)
    assert np.isinf(ref[4]).any() and np.isnan(ref).any()
    f64 = x.astype(np.float64) @ w.astype(np.float64).T
    # rows 0-3 do not overflow: the same Inf / NaN positions as float64 numpy
    assert np.array_equal(np.isnan(ref[:4]), np.isnan(f64[:4]))
    assert np.array_equal(np.isposinf(ref[:4]), np.isposinf(f64[:4]))
    assert np.array_equal(np.isneginf(ref[:4]), np.isneginf(f64[:4]))
    # f16 weights run the f32 kernels on the converted weights: the same result; on CPUs with
    # bf16 (max) the bf16 kernels: their model's Inf / NaN
    from test_runtime_ops import _bf16_model
    ref16 = _bf16_model(x, w.astype(np.float32)) if cpu.startswith("max") else ref
    for kind, wk, want in (("f32", w.astype(np.float32), ref), ("f16", w, ref16)):
        for threads in (1, 2):
            y = g.call("guest_calls:matmul_try", str(all_lib), kind, wk, x, threads=threads)
            assert np.array_equal(y, want, equal_nan=True), (kind, threads)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_kernel_default_is_no_clamp(all_lib):
    from tilegen.layout import F32PackedRHS
    rng = np.random.default_rng(24)
    w = rng.normal(size=(16, 8)).astype(np.float32)
    x = _with_non_finite(rng, 6, 8)
    dst = np.zeros((6, 16), np.float32)
    y = guest("cortex-a53").call("guest_calls:kernel_call", str(all_lib),
                                 "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla", x,
                                 F32PackedRHS(16).pack(w), dst)
    assert np.array_equal(y, matmul_f32(x, w, None, -np.inf, np.inf), equal_nan=True)


Q4_LIMITS = {   # largest |x| whose activation scale the LHS format can store
    "q4_0": 127 * float(np.finfo(np.float16).max),     # per-block amax/127 in f16
    "q4_0_dx": float(np.finfo(np.float32).max) / 2,    # per-row f32 range max - min
}


@pytest.mark.parametrize("kind", ["q4_0", "q4_0_dx"])
def test_q4_activations_beyond_the_scale_format(kind, all_lib):
    import gguf
    from tilegen.layout.ggml import quantize_q4_0
    g = guest("cortex-a53")
    rng = np.random.default_rng(25)
    n, k = 12, 64
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(5, k)).astype(np.float32)
    limit = Q4_LIMITS[kind]
    for bad in (np.nextafter(np.float32(limit), np.float32(np.inf)), np.inf, -np.inf, np.nan):
        xb = x.copy()
        xb[2, 9] = bad
        r = g.call("guest_calls:matmul_try", str(all_lib), kind, w, xb)
        assert isinstance(r, tuple) and r[0] == "ArgumentError", (bad, r)
        assert f"{limit:g}" in r[1], r[1]
    # at the limit the result is still right
    big = float(np.float32(limit / 2 if kind == "q4_0" else 1e30))
    xb = x / np.abs(x).max() * np.float32(big)
    xb[2, 9] = -np.float32(limit) if kind == "q4_0" else xb[2, 9]
    y = g.call("guest_calls:matmul_try", str(all_lib), kind, w, xb)
    assert isinstance(y, np.ndarray) and np.isfinite(y).all(), y
    deq = gguf.quants.dequantize(quantize_q4_0(w), gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    f64 = xb.astype(np.float64) @ deq.astype(np.float64).T
    assert np.linalg.norm(y - f64) / np.linalg.norm(f64) <= 2e-2


def test_threads_any_integral(all_lib):
    rng = np.random.default_rng(26)
    w = rng.normal(size=(40, 32)).astype(np.float32)
    x = rng.normal(size=(6, 32)).astype(np.float32)
    g = guest("cortex-a53")
    for kind in ("f32", "q4_0"):
        want = g.call("guest_calls:matmul_try", str(all_lib), kind, w, x, threads=1)
        assert isinstance(want, np.ndarray), want
        for t in (np.int64(2), np.int32(3), np.uint8(8)):
            y = g.call("guest_calls:matmul_try", str(all_lib), kind, w, x, threads=t)
            assert isinstance(y, np.ndarray) and np.array_equal(y, want), (kind, t, y)


@pytest.mark.parametrize("spec,sme,want", [
    ("dotprod", "0", {"neon", "dotprod"}),
    ("i8mm", "0", {"neon", "i8mm"}),
    ("sve2", "0", {"neon", "sve", "sve2"}),
    ("sme2", "1", {"neon", "sme", "sme2"}),
    ("neon,bf16", "0", {"neon", "bf16"}),
])
def test_isa_override_implies_base_features(spec, sme, want, monkeypatch):
    from tilegen.runtime import cpu
    monkeypatch.setenv("TILEGEN_ISA", spec)
    monkeypatch.setenv("TILEGEN_SME", sme)
    assert cpu._apply_override(set(cpu.KNOWN_FEATURES)) == want
    # it still only removes: a CPU without the feature does not get it
    assert cpu._apply_override({"neon"}) == {"neon"}


def test_isa_override_unknown_feature(monkeypatch):
    from tilegen.runtime import cpu
    monkeypatch.setenv("TILEGEN_ISA", "neon,avx2")
    with pytest.raises(ValueError, match=r"unknown features \['avx2'\].*known: neon, dotprod"):
        cpu._apply_override({"neon"})


def test_isa_override_dotprod_alone_keeps_neon(all_lib):
    from pathlib import Path
    from tilegen.emulate.remote import GuestSession
    with GuestSession("max", paths=[str(Path(__file__).parent)], env={"TILEGEN_ISA": "dotprod"}) as g:
        assert g.call("guest_calls:machine")["features"] == ["dotprod", "neon"]
        picks = g.call("guest_calls:picks", str(all_lib))
    assert picks["q4_0"][0].endswith("_16x4_neon_dotprod")
    assert picks["f32"][0].endswith("_neon_mla")
