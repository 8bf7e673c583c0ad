"""The user-facing ops over a full default library on every CPU model."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.emulate.remote import GuestError
from tilegen.layout.ggml import quantize_q4_0
from tilegen.reference.f32 import matmul_f32

from conftest import SME_ON, guest

OPS_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "a64fx", "max", "max-sme")
EXPECTED_F32 = {      # (gemm, gemv) per best f32 ISA: gemv reads the gemm's packed weights
    "neon": ("matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla",
             "matmul_clamp_f32_f32_f32p16x1b_1x16_neon_mla"),
    "sve": ("matmul_clamp_f32_f32_f32p8vlx1b_3x8vl_sve_mla",
            "matmul_clamp_f32_f32_f32p8vlx1b_1x8vl_sve_mla"),
    "sme": ("matmul_clamp_f32_f32p1vlx1_f32p4vlx1b_1vlx4vl_sme2_mopa",
            "matmul_clamp_f32_f32_f32p4vlx1b_1x4vl_sme2_mla"),
}
EXPECTED_Q4_0 = {   # (gemm, gemv) suffixes each CPU must select
    "cortex-a53": ("_4x4_neon", "qsi8d32p1x4_qsi4c32p4x4_1x4_neon"),
    "a64fx": ("_4x4_neon", "qsi8d32p1x4_qsi4c32p4x4_1x4_neon"),        # SVE but no dotprod
    "neoverse-n1": ("_16x4_neon_dotprod", "qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod"),
    "neoverse-v1": ("_16x1vl_sve_i8mm", "qsi8d32p1x8_qsi4c32p1vlx8_1x1vl_sve_dotprod"),
    "neoverse-n2": ("_16x1vl_sve_i8mm", "qsi8d32p1x8_qsi4c32p1vlx8_1x1vl_sve_dotprod"),
    "max": ("_16x1vl_sve_i8mm", "qsi8d32p1x8_qsi4c32p1vlx8_1x1vl_sve_dotprod"),
    # SME2: llama.cpp's Q4_0 pair, the f16-activation FMOPA gemm + the int8 LUTI4 gemv on one
    # qsi4c32ps1s0scalef16 packing
    "max-sme": ("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
                "qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_luti4"),
}


# qemu CPU models with FEAT_BF16 (its neoverse-v1 reports none): f16 weights run on bf16 kernels
BF16_CPUS = ("neoverse-n2", "max")


def _bf16_model(x, w):
    from tilegen.layout.bf16 import BF16PLhs4, BF16PRhs4B
    from tilegen.reference.bf16 import matmul_bf16
    L, R = BF16PLhs4(8), BF16PRhs4B(12)
    return matmul_bf16(L.pack(x), R.pack(w), x.shape[0], w.shape[0], x.shape[1], L, R,
                       -np.inf, np.inf)


@pytest.fixture(scope="session")
def all_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("alllib")
    tilegen.build_library(None, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", OPS_CPUS)
def test_every_op_on_every_cpu(cpu, all_lib, tmp_path):
    sme = cpu.endswith("-sme")          # max with SME enabled (opt-in: TILEGEN_SME=1)
    cpu = cpu.removesuffix("-sme")
    g = guest(cpu, env=SME_ON if sme else None)
    picks = g.call("guest_calls:picks", str(all_lib))
    gemm, gemv = picks["q4_0"]
    want = EXPECTED_Q4_0["max-sme" if sme else cpu]
    assert gemm.endswith(want[0]) and gemv.endswith(want[1]), picks
    f32 = "sme" if sme else "sve" if cpu in ("neoverse-v1", "neoverse-n2", "a64fx", "max") else "neon"
    assert picks["f32"] == EXPECTED_F32[f32], picks
    rng = np.random.default_rng(len(cpu))
    n, k = 45, 128
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(2, 9, k)).astype(np.float32)            # batched
    # f32 and f16: bit-exact FMA chain; f16 on CPUs with bf16: the bf16 kernels' arithmetic
    for kind, wk in (("f32", w), ("f16", w.astype(np.float16))):
        r = g.call("guest_calls:run_ops", str(all_lib), kind, wk, x, (1, 2, 3, 8))
        bf16 = kind == "f16" and cpu in BF16_CPUS
        ref = (_bf16_model(x.reshape(-1, k), wk.astype(np.float32)) if bf16 else
               matmul_f32(x.reshape(-1, k), wk.astype(np.float32), None, -np.inf, np.inf))
        for o in r["outs"]:
            assert np.array_equal(o.reshape(-1, n), ref)
        assert ("_bf16p" in r["kernel"]) is bf16, r["kernel"]    # NEON BFMMLA or SME2 BFMOPA
        assert r["ws"] == 0 or sme or bf16      # SME outer products and bf16 pack the LHS
    # q4_0: threads bit-identical, vs gguf dequant, get_rows exact, save/load round trip
    saved = str(tmp_path / "w.tgpw")
    r = g.call("guest_calls:run_ops", str(all_lib), "q4_0", w, x, (1, 2, 3, 8),
               np.array([3, 0, 44]), saved)
    for o in r["outs"][1:]:
        assert np.array_equal(o, r["outs"][0])
    assert np.array_equal(r["reloaded"], r["outs"][0])
    assert r["kernel"].endswith(want[0]) and r["ws"] > 0
    deq = gguf.quants.dequantize(quantize_q4_0(w), gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    f64 = x.reshape(-1, k).astype(np.float64) @ deq.astype(np.float64).T
    err = np.linalg.norm(r["outs"][0].reshape(-1, n) - f64) / np.linalg.norm(f64)
    assert err <= 2e-2
    assert np.array_equal(r["rows"], deq[[3, 0, 44]])
    # m == 1 goes to the gemv kernel (SME2: int8 activations there, f16 in the gemm, so the
    # two agree within the quantisation error only)
    r1 = g.call("guest_calls:run_ops", str(all_lib), "q4_0", w, x[0, :1], (1,))
    assert r1["kernel"].endswith(want[1])
    if sme:
        assert np.linalg.norm(r1["outs"][0] - f64[:1]) <= 2e-2 * np.linalg.norm(f64[:1])
    else:
        assert np.allclose(r1["outs"][0], r["outs"][0][0, :1], rtol=1e-5, atol=1e-4)


def test_gguf_round_trip(all_lib, tmp_path):
    rng = np.random.default_rng(8)
    n, k = 24, 96
    w = rng.normal(size=(n, k)).astype(np.float32)
    path = tmp_path / "tiny.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    wr.add_tensor("blk.0.q4", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    wr.add_tensor("blk.0.f16", w.astype(np.float16))
    wr.add_tensor("blk.0.f32", w)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    x = rng.normal(size=(5, k)).astype(np.float32)
    rows = np.array([0, 23, 7])
    deq = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    y, got_rows, fmt = guest("neoverse-v1").call("guest_calls:gguf_matmul", str(all_lib), str(path),
                                                 "blk.0.q4", x, rows)
    assert fmt == "qsi4c32pscalef16" and np.array_equal(got_rows, deq[rows])
    f64 = x.astype(np.float64) @ deq.astype(np.float64).T
    assert np.linalg.norm(y - f64) / np.linalg.norm(f64) <= 2e-2
    for name, wt in (("blk.0.f16", w.astype(np.float16).astype(np.float32)), ("blk.0.f32", w)):
        y, got_rows, _ = guest("neoverse-v1").call("guest_calls:gguf_matmul", str(all_lib),
                                                   str(path), name, x, rows)
        assert np.array_equal(y, matmul_f32(x, wt, None, -np.inf, np.inf))
        assert np.array_equal(got_rows, wt[rows])
    from tilegen.gguf import load_tensor
    with pytest.raises(KeyError, match="no tensor"):
        load_tensor(path, "nope")


def test_saved_weights_are_checked(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(8, 64)).astype(np.float32)
    pw = tilegen.PackedWeights.from_q4_0(quantize_q4_0(w), 8, 64)
    p = tmp_path / "w.bin"
    pw.save(p)
    again = tilegen.PackedWeights.load(p)
    assert np.array_equal(again.data, pw.data) and (again.n, again.k, again.nr) == (8, 64, 4)
    blob = p.read_bytes()
    (tmp_path / "trunc.bin").write_bytes(blob[:-10])
    (tmp_path / "flip.bin").write_bytes(blob[:-1] + bytes([blob[-1] ^ 1]))
    (tmp_path / "junk.bin").write_bytes(b"not a weights file")
    for name, match in (("trunc.bin", "truncated"), ("flip.bin", "checksum"), ("junk.bin", "not a tilegen")):
        with pytest.raises(tilegen.runtime.LoadError, match=match):
            tilegen.PackedWeights.load(tmp_path / name)


def test_concurrent_callers_bit_identical(all_lib):
    rng = np.random.default_rng(4)
    w = rng.normal(size=(36, 64)).astype(np.float32)
    xs = [rng.normal(size=(int(rng.integers(1, 20)), 64)).astype(np.float32) for _ in range(8)]
    serial, got = guest("max").call("guest_calls:concurrent_matmuls", str(all_lib), w, xs)
    for a, b in zip(serial, got):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("env,expect", [({"TILEGEN_ISA": "neon"}, "_4x4_neon"),
                                        ({"TILEGEN_ISA": "neon,dotprod"}, "_16x4_neon_dotprod")])
def test_isa_override_restricts_selection(env, expect, all_lib):
    from tilegen.emulate.remote import GuestSession
    with GuestSession("max", paths=[str(Path(__file__).parent)], env=env) as g:
        assert g.call("guest_calls:picks", str(all_lib))["q4_0"][0].endswith(expect)


def test_threads_must_be_positive(all_lib):
    with pytest.raises(GuestError, match="threads must be a positive int"):
        guest("max").call("guest_calls:run_ops", str(all_lib), "f32",
                          np.ones((4, 8), np.float32), np.ones((2, 8), np.float32), (0,))


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
def test_call_time_bias_and_clamp(kind, all_lib):
    rng = np.random.default_rng(12)
    w = rng.normal(size=(21, 64)).astype(np.float32)
    x = rng.normal(size=(5, 64)).astype(np.float32)
    b = rng.normal(size=21).astype(np.float32)
    y = guest("max").call("guest_calls:matmul_bias", str(all_lib), kind, w, x, b, (-2.0, 3.0))
    wd = w if kind == "f32" else gguf.quants.dequantize(
        quantize_q4_0(w), gguf.GGMLQuantizationType.Q4_0).reshape(w.shape)
    ref = np.clip(x.astype(np.float64) @ wd.astype(np.float64).T + b, -2.0, 3.0)
    tol = 1e-5 if kind == "f32" else 5e-2       # q4: the int8 activation quantisation
    assert np.max(np.abs(y - ref)) <= tol * max(1.0, np.abs(ref).max())
    assert y.min() >= -2.0 and y.max() <= 3.0
    with pytest.raises(GuestError, match="bias must be float32"):
        guest("max").call("guest_calls:matmul_bias", str(all_lib), kind, w, x, b[:3], None)


def test_ggml_bytes_like_and_get_rows_of_no_rows(all_lib):
    rng = np.random.default_rng(41)
    n, k = 13, 64
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
    r = guest("max").call("guest_calls:ggml_bytes_and_empty_rows", str(all_lib), raw, n, k)
    assert r["q4_0"] == r["q4_0_dx"] == [True, True, True]
    for kind in ("q4_0", "q4_0_dx", "f32"):
        rows = r[kind + " rows"]
        assert rows.shape == (0, k) and rows.dtype == np.float32


def _gguf_q4(path, w):
    wr = gguf.GGUFWriter(str(path), "llama")
    q = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    wr.add_tensor("q4", q, raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return q


@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_weights_of_other_layouts_are_adopted(cpu, all_lib, tmp_path):
    rng = np.random.default_rng(61)
    n, k = 21, 128
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(6, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    raw = _gguf_q4(tmp_path / "w.gguf", w)
    r = guest(cpu).call("guest_calls:adopt_weights", str(all_lib), w, x, bias, raw,
                        str(tmp_path / "w.gguf"), "q4")
    assert r["q4_0 geometry"][0] == (4, 16, 2)
    # neoverse-n1: no kernel reads kr=16 (those need i8mm); max: a NEON i8mm kernel does
    assert r["q4_0 readable"] == (cpu == "max")
    assert r["q4_0 foreign kept"] if r["q4_0 readable"] else r["q4_0 adopted"]
    assert r["q4_0 native kept"]
    for y in ("q4_0 y", "q4_0 y1"):
        if r["q4_0 readable"]:      # read as it is, by another kernel than the native weights
            assert np.allclose(*r[y], rtol=1e-4, atol=1e-3)
        else:                       # adopted per call: the same kernel on the same bytes
            assert np.array_equal(*r[y])
    for kind in ("q4_0_dx", "f32"):
        assert r[f"{kind} adopted"], kind
        assert np.array_equal(*r[f"{kind} y"]), kind
    assert "cannot repack" in r["cross"]
    if cpu == "max":                # q4_0 kernels of several nr
        alt, got, kernel_nr = r["gguf nr"]
        assert got == kernel_nr == alt
    assert r["gguf nr 8"] == 8


def test_set_table_forces_a_kernel(all_lib):
    rng = np.random.default_rng(62)
    w = rng.normal(size=(19, 64)).astype(np.float32)
    x = rng.normal(size=(7, 64)).astype(np.float32)
    r = guest("max").call("guest_calls:choose_kernel", str(all_lib), w, x, "_4x4_neon")
    assert r["picked"] == r["want"]
    assert np.allclose(*r["y"], rtol=1e-5, atol=1e-4)
    empty, family, gemv, junk = r["errors"]
    assert "empty" in empty and "not a q4_0_f16 or q4_0 kernel" in family
    assert "does not read the packed weights" in gemv and "KernelPair" in junk
