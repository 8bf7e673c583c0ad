"""The SME2 gemm of f16 activations x q4_0 weights (family q4_0_f16: F16PLhs2 LHS x
QSI4C32PS1S0ScaleF16 RHS, LUTI4 unpack, FMUL by the block scales in f16, FMOPA into ZA over all
of k) -- llama.cpp's ``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa`` -- at SVL 128
to 2048: bit-exact with the numpy reference of KleidiAI's arithmetic
(:func:`tilegen.reference.q4.matmul_f16p_qsi4c32ps1s0`), sentinels around dst untouched, SVCR
clear after the call, no access outside the buffers."""
from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.layout.f16 import F16PLhs2
from tilegen.layout.ggml import quantize_q4_0
from tilegen.layout.rhs_int4 import QSI4C32PS1S0ScaleF16
from tilegen.reference.q4 import matmul_f16p_qsi4c32ps1s0

from conftest import SME_ON, guest

SPEC = "q4_0_f16:sme2:1vlx4vl"
NAME = "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa"
SENTINEL = np.float32(-12345.5)
BIG = 3.4e38


def test_name_is_kleidiai():
    """The spec's kernel name is KleidiAI's (kr = 4, sr = 2 give the x2 tokens)."""
    assert tilegen.parse_spec(SPEC).name == NAME


@pytest.fixture(scope="module")
def f16_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q4f16")
    tilegen.build_library([tilegen.parse_spec(SPEC)], target="linux-aarch64-all", out_dir=out)
    return out


def _case(rng, m, n, k, bl, mr, nr, clamp, **extra):
    w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
    x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
    raw = quantize_q4_0(w, bl=bl)
    lo, hi = clamp
    lhs = F16PLhs2(mr, 4, 2).pack(x)
    rhs = QSI4C32PS1S0ScaleF16(nr, 4, 2, bl).pack(raw, n, k)
    ref = matmul_f16p_qsi4c32ps1s0(lhs, rhs, m, n, k, bl, mr, nr, lo, hi)
    return dict(m=m, n=n, k=k, bl=bl, clamp_min=lo, clamp_max=hi, lhs_packed=lhs,
                rhs_packed=rhs, **extra), ref


def _check(sess, lib, shapes, nr, mr, seed):
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k, bl) in enumerate(shapes):
        c, ref = _case(rng, m, n, k, bl, mr, nr, (-BIG, BIG) if i % 2 == 0 else (-20.0, 25.0),
                       sentinel=SENTINEL)
        cases.append(c)
        refs.append(ref)
    outs = sess.call("guest_calls:run_q4_cases", str(lib), NAME, cases)
    for c, ref, out in zip(cases, refs, outs):
        m, n = c["m"], c["n"]
        assert (out[m:, :] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), (m, n)
        got = out[:m, :n]
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"m={m} n={n} k={c['k']} bl={c['bl']}: {np.sum(got != ref)} outputs differ"
    assert sess.call("guest_calls:svcr_now", str(lib)) == 0


def _tile(sess, lib, vl):
    info = sess.call("guest_calls:vl_info", str(lib), NAME)
    assert info["runnable"], info
    nr, mr = info["nr"], info["mr"]
    assert nr == vl // 8 and mr == vl // 32
    assert info["lhs_format"] == f"f16p{mr}x2" and info["rhs_format"] == f"qsi4c32p{nr}x2s1s0scalef16"
    return nr, mr


@pytest.mark.parametrize("vl", (128, 256, 512, 1024, 2048))
def test_f16_gemm_every_svl(vl, f16_lib):
    """Edge shapes (m, n not multiples of the tile, one row, one column, several row blocks and
    column groups, bl = 64 and 96) plus drawn ones, at every SVL."""
    sess = guest("max", None, vl, SME_ON)
    nr, mr = _tile(sess, f16_lib, vl)
    shapes = [(1, 1, 32, 32), (mr, nr, 64, 32), (mr + 1, nr + 3, 96, 32),
              (2 * mr + 3, 2 * nr - 1, 128, 64), (3, 2 * nr + 5, 32, 32), (mr - 1, 7, 192, 96)]
    rng = np.random.default_rng(vl)
    for _ in range(4):
        bl = int(rng.choice([32, 64]))
        shapes.append((int(rng.integers(1, 3 * mr + 2)), int(rng.integers(1, 3 * nr + 2)),
                       bl * int(rng.integers(1, 5)), bl))
    _check(sess, f16_lib, shapes, nr, mr, vl + 7)


def test_f16_gemm_guard_pages(f16_lib):
    """Every buffer (packed LHS, packed RHS, dst with a row stride) next to a guard page at
    either end, SVL 512: no access outside them, results bit-exact."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    sess = guest("max", None, 512, SME_ON)
    nr, mr = _tile(sess, f16_lib, 512)
    rng = np.random.default_rng(23)
    cases, refs = [], []
    for i, (m, n, k) in enumerate([(1, 1, 32), (mr, nr, 64), (mr + 1, nr + 3, 96),
                                   (2 * mr + 1, 2 * nr - 1, 32), (3, 5, 128)]):
        c, ref = _case(rng, m, n, k, 32, mr, nr, (-BIG, BIG), sentinel=GUARD_SENTINEL,
                       dst_stride=n + i % 4)
        cases.append(c)
        refs.append(ref)
    outs = sess.call("guest_pack:guarded_q4_cases", str(f16_lib), NAME, cases, PLACEMENTS)
    _check_guarded(NAME, cases, refs, outs)


GEMV = "q4_0_s1s0:sme2:1x4vl"


@pytest.fixture(scope="module")
def pair_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q4pair")
    tilegen.build_library([tilegen.parse_spec(SPEC), tilegen.parse_spec(GEMV)],
                          target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("vl", (128, 512, 2048))
def test_runtime_q4_0_pair(vl, pair_lib):
    """q4_0 weights in tilegen's runtime on an SME2 CPU: packed once (from floats and from ggml
    blocks, the same bytes) in qsi4c32ps1s0scalef16 for llama.cpp's pair; m > 1 runs the f16
    gemm (LHS packed by the generated f16 packer, split over threads) and m = 1 the int8 LUTI4
    gemv, each bit-exact with its reference; get_rows dequantises the packing."""
    from test_exec_q4_luti4 import _reference as luti4_reference
    from tilegen.layout.ggml import dequantize_q4_0
    sess = guest("max", None, vl, SME_ON)
    mr, nr = vl // 32, vl // 8
    rng = np.random.default_rng(vl + 5)
    m, n, k = 2 * mr + 3, 2 * nr + 5, 96
    w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
    x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
    raw = quantize_q4_0(w)
    r = sess.call("guest_calls:q4_ops", str(pair_lib), "q4_0", w, x, raw, (1, 2, 3), [0, n - 1])
    assert (r["kernel"], r["gemv"]) == (NAME, tilegen.parse_spec(GEMV).name)
    assert r["format"] == "qsi4c32ps1s0scalef16" and r["nr"] == nr
    want = QSI4C32PS1S0ScaleF16(nr, 4, 2, 32).pack(raw, n, k)
    assert np.array_equal(r["packed"], want) and np.array_equal(r["packed_ggml"], want)
    ref = matmul_f16p_qsi4c32ps1s0(F16PLhs2(mr, 4, 2).pack(x), want, m, n, k, 32, mr, nr,
                                   -np.inf, np.inf)
    for out in r["outs"]:
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))
    ref1 = luti4_reference(x[:1], raw, n, k, 32, nr, -np.inf, np.inf)
    assert np.array_equal(r["gemv_out"].view(np.uint32), ref1.view(np.uint32))
    assert np.array_equal(r["rows"], dequantize_q4_0(raw, n, k)[[0, n - 1]])


def test_f16_activations_beyond_f16_are_refused(pair_lib):
    """The f16 gemm converts activations to f16: |x| above 65504 (f16's largest finite value)
    would become Inf, so matmul and plan refuse it (ArgumentError naming the limit), as the int8
    LHS formats refuse x beyond theirs; at the limit it runs."""
    sess = guest("max", None, 512, SME_ON)
    rng = np.random.default_rng(77)
    n, k, m = 40, 64, 20
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(m, k)).astype(np.float32)
    at, over, nan = x.copy(), x.copy(), x.copy()
    at[3, 5], over[3, 5], nan[1, 1] = 65504.0, 65536.0, np.nan
    r = sess.call("guest_calls:activation_limit_outcomes", str(pair_lib), "q4_0", w,
                  [at, over, nan])
    assert r[0] == r[1] == ("ok", NAME), r
    for got in r[2:]:
        assert got[0] == "ArgumentError" and "65504" in got[1], r
