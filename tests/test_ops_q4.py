"""q4 through the library API: NEON LHS packers, pack_weights, matmul (threads), get_rows."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.layout.ggml import quantize_q4_0
from tilegen.layout.lhs_int8 import QSI8D32P
from tilegen.layout.rhs_int4 import QSI4C32PScaleF16
from tilegen.reference.q4 import matmul_qsi8d32p_qsi4c32pscalef16

from conftest import guest
from test_exec_q4 import ALL_SPECS, q4_lib  # noqa: F401 - shared session fixture

PACKERS = sorted({(s.info.lhs, s.lhs_mr, s.kr, s.sr) for s in ALL_SPECS})


@pytest.mark.parametrize("cpu", ["cortex-a53", "max"])
@pytest.mark.parametrize("fmt,mr,kr,sr", PACKERS)
def test_library_packer_matches_numpy(fmt, mr, kr, sr, cpu, q4_lib):
    rng = np.random.default_rng(mr * 100 + kr)
    for m, k, start, pad in [(1, 64, 0, 0), (7, 96, 0, 5), (mr + 1, 128, mr - 1 if mr > 1 else 0, 1),
                             (13, 256, 2 * mr, 0)]:
        x = (rng.normal(size=(m, k)) * 2).astype(np.float32)
        x[0, : k // 2] = np.round(x[0, : k // 2] * 4) / 4          # exact ties
        got = guest(cpu).call("guest_calls:lib_pack_lhs", str(q4_lib), fmt, x, mr, kr, sr, 32,
                              start, pad)
        ref = tilegen.pack_lhs(fmt, x, mr=mr, kr=kr, sr=sr, bl=32, m_idx_start=start)
        assert np.array_equal(got, ref), (fmt, m, k, start)


@pytest.mark.parametrize("cpu,isa", [("neoverse-n1", "dotprod"), ("neoverse-v1", "i8mm"),
                                     ("max", "i8mm")])
def test_q4_0_matmul_op(cpu, isa, q4_lib):
    rng = np.random.default_rng(17)
    n, k, m = 37, 256, 21
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(m, k)).astype(np.float32)
    raw = quantize_q4_0(w)
    res = guest(cpu).call("guest_calls:q4_ops", str(q4_lib), "q4_0", w, x, raw, (1, 2, 3),
                          np.array([0, 5, 36, 5]))
    assert res["kernel"].removesuffix("_am").endswith(f"_neon_{isa}") and "_1x" in res["gemv"]
    for o in res["outs"][1:]:
        assert np.array_equal(o, res["outs"][0])       # bit-identical for every thread count
    assert np.array_equal(res["packed"], res["packed_ggml"])   # from float == from ggml bytes
    lay = QSI4C32PScaleF16(res["nr"], res["kr"], res["sr"], 32)
    assert np.array_equal(res["packed"], lay.pack(raw))
    # same packed integer math on the host, with the kernel's LHS layout
    kspec = next(s for s in ALL_SPECS if s.name == res["kernel"])
    lhs = QSI8D32P(kspec.lhs_mr, kspec.kr, kspec.sr, 32).pack(x)
    ref = matmul_qsi8d32p_qsi4c32pscalef16(lhs, res["packed"], m, n, k, 32, kspec.lhs_mr,
                                           kspec.nr, kspec.kr, kspec.sr, -3.4e38, 3.4e38)
    assert np.array_equal(res["outs"][0], ref)
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    f64 = x.astype(np.float64) @ deq.astype(np.float64).T
    assert np.linalg.norm(res["outs"][0] - f64) / np.linalg.norm(f64) <= 2e-2
    assert np.array_equal(res["rows"], deq[[0, 5, 36, 5]])  # get_rows: exact dequantisation
    assert np.allclose(res["gemv_out"], res["outs"][0][:1], rtol=1e-5, atol=1e-4)


def test_q4_0_dx_matmul_op(q4_lib):
    rng = np.random.default_rng(3)
    n, k, m = 20, 128, 9
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(m, k)).astype(np.float32)
    res = guest("max").call("guest_calls:q4_ops", str(q4_lib), "q4_0_dx", w, x, None, (1, 2))
    assert np.array_equal(res["outs"][0], res["outs"][1])
    deq = tilegen.dequantize_rows(res["packed"], "qsi4c32p", n, k, res["nr"], res["kr"], res["sr"],
                                  32, np.arange(n))
    f64 = x.astype(np.float64) @ deq.astype(np.float64).T
    assert np.linalg.norm(res["outs"][0] - f64) / np.linalg.norm(f64) <= 2e-2


def test_dequantize_rows_equals_gguf():
    rng = np.random.default_rng(9)
    n, k = 11, 96
    w = rng.normal(size=(n, k)).astype(np.float32)
    raw = quantize_q4_0(w)
    packed = tilegen.pack_rhs("qsi4c32pscalef16", nr=4, kr=16, sr=2, bl=32, ggml=raw, n=n, k=k)
    rows = np.array([10, 0, 3])
    got = tilegen.dequantize_rows(packed, "qsi4c32pscalef16", n, k, 4, 16, 2, 32, rows)
    deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    assert np.array_equal(got, deq[rows])


def test_kernel_geometry_comes_from_layouts(q4_lib):
    """Per-kernel getters (KleidiAI's) agree with the layout objects and the golden sizes."""
    import json
    man = json.loads((q4_lib / "manifest.json").read_text())
    entry = next(e for e in man["kernels"] if e["name"].endswith("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"))
    from tilegen.generator.descriptor import descriptor
    from tilegen.generator.spec import parse_unchecked
    from tilegen.runtime.binding import Kernel

    class _Fn:   # a stand-in for the ctypes function: geometry needs no Arm CPU
        restype = argtypes = None
    k = Kernel(descriptor(parse_unchecked(entry["spec"])), entry, _Fn())
    assert (k.m_step, k.n_step, k.kr, k.spec.lhs_mr) == (16, 4, 16, 4)
    assert k.rhs_packed_size(12, 96, 32) == QSI4C32PScaleF16(4, 16, 2, 32).packed_size(12, 96) == 648
    assert k.lhs_packed_size(5, 96, 32) == QSI8D32P(4, 16, 2, 32).packed_size(5, 96) == 816
    assert k.rhs_packed_offset(8, 96, 32) == 2 * 4 * 3 * 18
    assert k.lhs_packed_offset(4, 96, 32) == 4 * 3 * 34
    assert k.dst_offset(2, 4, 64) == 2 * 64 + 16 and k.dst_size(5, 12) == 240
    assert {p["name"] for p in man["packers"]} >= {"lhs_quant_pack_qsi8d32p4x8_f32_neon",
                                                    "lhs_quant_pack_qai8dxp4x4_f32_neon"}


@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_tiny_activations_through_matmul(cpu, q4_lib):
    """lib.matmul at the small edges of test_lhs_pack_neon.TINY_KINDS (issue #30 item 2): the
    generated qsi8d32p (q4_0) and qai8dxp (q4_0_dx) packers and the kernels, against the
    float64 product of x with the dequantised weights: every row finite, either within 2 % of
    sum |x||w| or exactly 0 (no bias) -- and 0 only where the format's scale holds nothing of
    the row (flushed_rows); q4_0 also bit for bit the numpy packer + reference."""
    from test_lhs_pack_neon import TINY_KINDS, flushed_rows, tiny_rows
    rng = np.random.default_rng(3042)
    n, k = 21, 256
    x = tiny_rows(rng, k)
    m = x.shape[0]
    w = rng.normal(size=(n, k)).astype(np.float32)
    for kind, fmt in (("q4_0", "qsi8d32p"), ("q4_0_dx", "qai8dxp")):
        res = guest(cpu).call("guest_calls:q4_ops", str(q4_lib), kind, w, x, None, (1, 3))
        y = res["outs"][0]
        assert np.array_equal(y, res["outs"][1]) and np.isfinite(y).all(), kind
        if kind == "q4_0":
            kspec = next(s for s in ALL_SPECS if s.name == res["kernel"])
            lhs = QSI8D32P(kspec.lhs_mr, kspec.kr, kspec.sr, 32).pack(x)
            ref = matmul_qsi8d32p_qsi4c32pscalef16(lhs, res["packed"], m, n, k, 32, kspec.lhs_mr,
                                                   kspec.nr, kspec.kr, kspec.sr, -3.4e38, 3.4e38)
            assert np.array_equal(y, ref), res["kernel"]
        deq = tilegen.dequantize_rows(res["packed"], res["format"], n, k, res["nr"], res["kr"],
                                      res["sr"], 32, np.arange(n)).astype(np.float64)
        y64 = x.astype(np.float64) @ deq.T
        mag = np.abs(x.astype(np.float64)) @ np.abs(deq).T
        flushed = flushed_rows(x, fmt)
        for i, what in enumerate(TINY_KINDS):
            if not y[i].any() and mag[i].max() > 0:
                assert flushed[i], f"{kind} row {what!r}: 0, though its scale is representable"
                continue
            err = np.abs(y[i] - y64[i]).max()
            assert err <= 0.02 * mag[i].max(), f"{kind} row {what!r}: error {err:.3g}"
