"""Runtime ops on q8_0 weights: pack_weights (float and ggml Q8_0), selection of the gemm/gemv
pair, matmul (threads, batched), get_rows, save/load -- on the default q8_0 kernels."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.build import default_specs, get_target
from tilegen.layout.ggml import quantize_q8_0
from tilegen.layout.lhs_int8 import QAI8DXP
from tilegen.layout.rhs_int8 import QSI8CXP, quantize_per_channel
from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp

from conftest import guest

FMAX = 3.4028234663852886e38
EXPECTED = {   # (gemm, gemv) the default table picks per CPU
    "cortex-a53": ("qai8dxp4x8_qsi8cxp4x8_4x4_neon", "qai8dxp1x8_qsi8cxp4x8_1x4_neon"),
    "neoverse-n1": ("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod",
                    "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"),
    "neoverse-v1": ("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm",
                    "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod"),
    "max": ("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod"),
}


@pytest.fixture(scope="session")
def q8_default_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q8default")
    # the fixed-width defaults (NEON, dotprod, i8mm); the scalable ones: test_exec_q8_scalable
    specs = [s for s in default_specs(get_target("linux-aarch64-all"))
             if s.family == "q8_0" and not s.isa_info.scalable]
    assert len(specs) == 6
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out


def test_default_targets_carry_q8():
    names = {s.spec_string for s in default_specs(get_target("neoverse-v2")) if s.family == "q8_0"}
    assert {"q8_0:i8mm:16x4", "q8_0:dotprod:1x4:k8:s1", "q8_0:dotprod:16x4"} <= names
    assert {s.isa for s in default_specs(get_target("cortex-a53")) if s.family == "q8_0"} == {"neon"}


def _ref(x, packed, n, k, mr, nr, kr):
    lhs = QAI8DXP(mr, kr, 1).pack(x)
    return matmul_qai8dxp_qsi8cxp(lhs, packed, x.shape[0], n, k, mr, nr, kr, 1, -FMAX, FMAX)


@pytest.mark.parametrize("cpu", list(EXPECTED))
def test_q8_ops(cpu, q8_default_lib, tmp_path):
    rng = np.random.default_rng(len(cpu) + 80)
    n, k = 45, 100
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(19, k)).astype(np.float32)
    g = guest(cpu)
    r = g.call("guest_calls:q4_ops", str(q8_default_lib), "q8_0", w, x, None, (1, 2, 3),
               np.array([0, 44, 7]))
    gemm, gemv = EXPECTED[cpu]
    assert r["kernel"] == "matmul_clamp_f32_" + gemm and r["gemv"] == "matmul_clamp_f32_" + gemv
    assert r["format"] == "qsi8cxp" and r["nr"] == 4 and r["sr"] == 1
    q, s = quantize_per_channel(w)
    lay = QSI8CXP(4, r["kr"])
    assert np.array_equal(r["packed"], lay.pack(q, s))
    exact = _ref(x, r["packed"], n, k, 4, 4, r["kr"])
    for o in r["outs"]:                  # threads: bit-identical, and equal to the reference
        assert np.array_equal(o, exact)
    f64 = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.linalg.norm(r["outs"][0] - f64) / np.linalg.norm(f64) <= 2e-2
    assert np.array_equal(r["rows"], lay.dequantize_rows(r["packed"], n, k, [0, 44, 7]))
    # m = 1: the gemv kernel on the same packed weights; batched x; saved weights
    r1 = g.call("guest_calls:run_ops", str(q8_default_lib), "q8_0", w, x[:1], (1,), None,
                str(tmp_path / "w.tgpw"))
    assert r1["kernel"] == "matmul_clamp_f32_" + gemv and r1["ws"] > 0
    assert np.array_equal(r1["outs"][0], _ref(x[:1], r["packed"], n, k, 1, 4, r["kr"]))
    assert np.array_equal(r1["reloaded"], r1["outs"][0])
    xb = x[:18].reshape(2, 9, k)
    rb = g.call("guest_calls:run_ops", str(q8_default_lib), "q8_0", w, xb, (1, 2))
    assert np.array_equal(rb["outs"][0].reshape(18, n), _ref(x[:18], r["packed"], n, k, 4, 4, r["kr"]))


@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_q8_from_ggml_and_bias(cpu, q8_default_lib):
    """Q8_0 bytes are requantised per channel (llama.cpp's repack); a packed bias is applied
    inside the kernel (bit-exact), a call-time bias and clamp after it."""
    rng = np.random.default_rng(9)
    n, k = 30, 96
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(5, k)).astype(np.float32)
    raw = quantize_q8_0(w)
    r = guest(cpu).call("guest_calls:q4_ops", str(q8_default_lib), "q8_0", w, x, raw, (1,))
    kr = r["kr"]
    assert np.array_equal(r["packed_ggml"], QSI8CXP(4, kr).pack_from_ggml(raw, n, k))
    assert np.array_equal(r["gemv_out"], _ref(x[:1], r["packed_ggml"], n, k, 1, 4, kr))
    b = rng.normal(size=n).astype(np.float32)
    y, nr, name = guest(cpu).call("guest_calls:matmul", str(q8_default_lib), w, x, b, (-1.5, 2.0),
                                  "nk", None, None, "q8_0")
    q, s = quantize_per_channel(w)
    packed = QSI8CXP(nr, kr).pack(q, s, b)
    lhs = QAI8DXP(4, kr, 1).pack(x)
    assert np.array_equal(y, matmul_qai8dxp_qsi8cxp(lhs, packed, 5, n, k, 4, nr, kr, 1, -1.5, 2.0))
    yb = guest(cpu).call("guest_calls:matmul_bias", str(q8_default_lib), "q8_0", w, x, b, (-1.5, 2.0))
    f64 = x.astype(np.float64) @ w.astype(np.float64).T + b
    ref = np.clip(f64, -1.5, 2.0)      # int8 x int8: error relative to the unclamped range
    assert np.max(np.abs(yb - ref)) <= 1e-2 * np.abs(f64).max()
    assert yb.min() >= -1.5 and yb.max() <= 2.0


def test_q8_gguf_tensor(q8_default_lib, tmp_path):
    """A Q8_0 GGUF tensor loads as qsi8cxp weights (requantised) and runs bit-exactly."""
    import gguf
    rng = np.random.default_rng(3)
    n, k = 20, 64
    w = rng.normal(size=(n, k)).astype(np.float32)
    path = tmp_path / "q8.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(q.reshape(-1).view(np.uint8), quantize_q8_0(w).reshape(-1))
    wr.add_tensor("blk.0.q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    x = rng.normal(size=(6, k)).astype(np.float32)
    rows = np.array([0, 19, 4])
    y, got_rows, fmt = guest("neoverse-v1").call("guest_calls:gguf_matmul", str(q8_default_lib),
                                                 str(path), "blk.0.q8", x, rows)
    packed = QSI8CXP(4, 8).pack_from_ggml(quantize_q8_0(w), n, k)
    assert fmt == "qsi8cxp"
    assert np.array_equal(y, _ref(x, packed, n, k, 4, 4, 8))
    assert np.array_equal(got_rows, QSI8CXP(4, 8).dequantize_rows(packed, n, k, rows))
    from tilegen.gguf import load_tensor
    assert np.array_equal(load_tensor(path, "blk.0.q8").data, packed)


@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_q8_adopt_repacks_foreign_layouts(cpu, q8_default_lib):
    """qsi8cxp weights in a layout no kernel of the library reads (nr 8) are repacked without
    loss into the preferred layout; the result is the one of weights packed natively."""
    rng = np.random.default_rng(21)
    n, k = 19, 77
    q = rng.integers(-127, 128, size=(n, k), dtype=np.int8)
    s = rng.uniform(1e-3, 1e-2, size=n).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    x = rng.normal(size=(7, k)).astype(np.float32)
    r = guest(cpu).call("guest_q8:adopt_q8", str(q8_default_lib), QSI8CXP(8, 8).pack(q, s, b),
                        n, k, 8, 8, x)
    kr = 4 if cpu == "neoverse-n1" else 8
    assert not r["same"] and r["geometry"] == (4, kr, 1)
    assert np.array_equal(r["data"], QSI8CXP(4, kr).pack(q, s, b))
    assert np.array_equal(r["out"], _ref(x, r["data"], n, k, 4, 4, kr))
