"""The SME2 q4 gemv on KleidiAI's layouts (family q4_0_s1s0: QSI8D32PScaleTail LHS x
QSI4C32PS1S0ScaleF16 RHS, LUTI4 unpack) at SVL 128 / 512 / 2048: bit-exact with the q4_0
reference arithmetic on the values both layouts carry, sentinels around dst untouched, SVCR
clear after the call."""
from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.layout.ggml import quantize_q4_0
from tilegen.layout.lhs_int8 import QSI8D32P, QSI8D32PScaleTail
from tilegen.layout.rhs_int4 import QSI4C32PS1S0ScaleF16
from tilegen.reference.f32 import fma_f32

from conftest import SME_ON, guest

SPEC = "q4_0_s1s0:sme2:1x4vl"
GEMM = "q4_0_s1s0:sme2:1vlx4vl"
SENTINEL = np.float32(-12345.5)


@pytest.fixture(scope="module")
def luti4_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("luti4")
    tilegen.build_library([tilegen.parse_spec(SPEC), tilegen.parse_spec(GEMM)],
                          target="linux-aarch64-all", out_dir=out)
    return out


def _reference(x, raw, n, k, bl, nr, lo, hi):
    """a = +0; per block: a = fma(f32(S), f32(dr) * f32(dl), a); max(lo) then min(hi)."""
    q, dl_bits = QSI8D32P(1, 4, 1, bl, "away").quantize_rows(x)
    lay = QSI4C32PS1S0ScaleF16(nr, 4, 1, bl)
    u, dr_bits = lay.unpack(lay.pack(raw, n, k), n, k)
    v = u.astype(np.int64) - 8
    m, B = x.shape[0], k // bl
    S = np.einsum("mbt,nbt->mnb", q.astype(np.int64).reshape(m, B, bl), v.reshape(n, B, bl))
    dl = dl_bits.astype(np.uint16).view(np.float16).astype(np.float32)
    dr = dr_bits.view(np.float16).astype(np.float32)
    a = np.zeros((m, n), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        for b in range(B):
            s = (dr[None, :, b] * dl[:, None, b]).astype(np.float32)
            a = fma_f32(S[:, :, b].astype(np.float32), s, a)
    return np.minimum(np.maximum(a, np.float32(lo)), np.float32(hi))


def _check(sess, lib, name, shapes, nr, mr, seed):
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k, bl) in enumerate(shapes):
        w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
        x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
        raw = quantize_q4_0(w, bl=bl)
        lo, hi = (-3.4e38, 3.4e38) if i % 2 == 0 else (-20.0, 25.0)
        cases.append(dict(m=m, n=n, k=k, bl=bl, sentinel=SENTINEL, clamp_min=lo, clamp_max=hi,
                          lhs_packed=QSI8D32PScaleTail(mr, 4, 1, bl).pack(x),
                          rhs_packed=QSI4C32PS1S0ScaleF16(nr, 4, 1, bl).pack(raw, n, k)))
        refs.append(_reference(x, raw, n, k, bl, nr, lo, hi))
    outs = sess.call("guest_calls:run_q4_cases", str(lib), name, cases)
    for c, ref, out in zip(cases, refs, outs):
        m, n = c["m"], c["n"]
        assert (out[m:, :] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), (m, n)
        got = out[:m, :n]
        assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), \
            f"m={m} n={n} k={c['k']} bl={c['bl']}: {np.sum(got != ref)} outputs differ"
    assert sess.call("guest_calls:svcr_now", str(lib)) == 0


@pytest.mark.parametrize("vl", (128, 512, 2048))
def test_luti4_gemv_every_svl(vl, luti4_lib):
    name = tilegen.parse_spec(SPEC).name
    sess = guest("max", None, vl, SME_ON)
    info = sess.call("guest_calls:vl_info", str(luti4_lib), name)
    assert info["runnable"], info
    nr = info["nr"]
    assert nr == vl // 8 and info["mr"] == 1
    shapes = [(1, 1, 32, 32), (1, nr, 64, 32), (2, nr + 3, 96, 32), (3, 2 * nr - 1, 128, 64),
              (1, 2 * nr + 5, 32, 32), (4, 7, 160, 32)]
    _check(sess, luti4_lib, name, shapes, nr, 1, vl)


@pytest.mark.parametrize("vl", (128, 512, 2048))
def test_luti4_gemm_every_svl(vl, luti4_lib):
    name = tilegen.parse_spec(GEMM).name
    sess = guest("max", None, vl, SME_ON)
    info = sess.call("guest_calls:vl_info", str(luti4_lib), name)
    assert info["runnable"], info
    nr, mr = info["nr"], info["mr"]
    assert nr == vl // 8 and mr == vl // 32
    shapes = [(1, 1, 32, 32), (mr, nr, 64, 32), (mr + 1, nr + 3, 96, 32),
              (2 * mr + 3, 2 * nr - 1, 128, 64), (3, 2 * nr + 5, 32, 32), (mr - 1, 7, 160, 32)]
    _check(sess, luti4_lib, name, shapes, nr, mr, vl + 1)


@pytest.mark.parametrize("vl", (256, 1024))
@pytest.mark.parametrize("which", ("gemv", "gemm"))
def test_luti4_random_shapes(vl, which, luti4_lib):
    """Drawn shapes (m, n, k, bl) at the other SVLs, one guest call per kernel."""
    name = tilegen.parse_spec(SPEC if which == "gemv" else GEMM).name
    sess = guest("max", None, vl, SME_ON)
    info = sess.call("guest_calls:vl_info", str(luti4_lib), name)
    nr, mr = info["nr"], info["mr"]
    rng = np.random.default_rng(vl + len(which))
    shapes = []
    for _ in range(12):
        bl = int(rng.choice([32, 64, 96]))
        shapes.append((int(rng.integers(1, 3 * mr + 2)), int(rng.integers(1, 3 * nr + 2)),
                       bl * int(rng.integers(1, 5)), bl))
    _check(sess, luti4_lib, name, shapes, nr, mr, vl)


@pytest.mark.parametrize("which", ("gemv", "gemm"))
def test_luti4_guard_pages(which, luti4_lib):
    """Every buffer (packed LHS, packed RHS, dst with a row stride) next to a guard page at
    either end, SVL 512: no access outside them, results bit-exact."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    name = tilegen.parse_spec(SPEC if which == "gemv" else GEMM).name
    sess = guest("max", None, 512, SME_ON)
    info = sess.call("guest_calls:vl_info", str(luti4_lib), name)
    nr, mr = info["nr"], info["mr"]
    rng = np.random.default_rng(len(which))
    cases, refs = [], []
    for i, (m, n, k) in enumerate([(1, 1, 32), (mr, nr, 64), (mr + 1, nr + 3, 96),
                                   (2 * mr + 1, 2 * nr - 1, 32), (3, 5, 128)]):
        bl = 32
        w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
        x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
        raw = quantize_q4_0(w, bl=bl)
        cases.append(dict(m=m, n=n, k=k, bl=bl, sentinel=GUARD_SENTINEL, clamp_min=-3.4e38,
                          clamp_max=3.4e38, dst_stride=n + i % 4,
                          lhs_packed=QSI8D32PScaleTail(mr, 4, 1, bl).pack(x),
                          rhs_packed=QSI4C32PS1S0ScaleF16(nr, 4, 1, bl).pack(raw, n, k)))
        refs.append(_reference(x, raw, n, k, bl, nr, -3.4e38, 3.4e38))
    outs = sess.call("guest_pack:guarded_q4_cases", str(luti4_lib), name, cases, PLACEMENTS)
    _check_guarded(name, cases, refs, outs)
