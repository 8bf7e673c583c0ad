"""bf16 kernels (family bf16: bf16p<mr>x4 x bf16p<nr>x4b; NEON BFMMLA gemm, BFDOT gemv) and the
generated f32 -> bf16 LHS packer under emulation, bit-exact against tilegen.reference.bf16 and
KleidiAI's golden vectors; the runtime kinds bf16 and f16.

CPU models: this qemu's neoverse-v1 reports no FEAT_BF16 (HWCAP2 has SVEBF16, not BF16; the
AdvSIMD BFMMLA/BFDOT are UNDEF there), so the bf16 kernels run on neoverse-n2 and max and are
refused on cortex-a53, neoverse-n1 and neoverse-v1.

BFDOT gemv: bit-exact against the same model as BFMMLA.  qemu's BFDOT (FPCR.EBF = 0) computes
one lane as RTO32(acc + RTO32(a0*b0 + a1*b1)) like one BFMMLA step, and the kernel keeps one
chain per column in k order (UZP1/UZP2 put one column per lane), so every output is the
model's.  KleidiAI's 1x36 BFDOT kernel sums in another order (compared within 1e-6 relative)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.layout.bf16 import BF16PLhs4, BF16PRhs4B, bf16_to_f32, f32_to_bf16_rne
from tilegen.reference.bf16 import matmul_bf16, matmul_bf16_f64

from conftest import guest, vector_params

BF16_CPUS = ("neoverse-n2", "max")                 # FEAT_BF16 in this qemu
NO_BF16_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1")
BF16_SPECS = ("bf16:bf16:8x12", "bf16:bf16:1x12", "bf16:bf16:4x8", "bf16:bf16:2x4",
              "bf16:bf16:6x16", "bf16:bf16:12x8", "bf16:bf16:1x4", "bf16:bf16:1x24")
ALL_SPECS = [tilegen.parse_spec(s) for s in BF16_SPECS]
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
SWEEP = list(itertools.product((1, 2, 7, 9, 17), (1, 5, 12, 13, 30), (1, 2, 3, 4, 5, 31, 70)))


@pytest.fixture(scope="session")
def bf16_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bf16lib")
    tilegen.build_library(ALL_SPECS + ["f32:neon:6x16", "f32:neon:1x16"],
                          target="linux-aarch64-all", out_dir=out)
    return out


def _ref(lp, rp, m, n, k, mr, nr, cmin=-FMAX, cmax=FMAX):
    return matmul_bf16(lp, rp, m, n, k, BF16PLhs4(mr), BF16PRhs4B(nr), cmin, cmax)


def _case(spec, rng, m, n, k, clamped, scale=1.0):
    x = (rng.normal(size=(m, k)) * scale).astype(np.float32)
    w = (rng.normal(size=(n, k)) * scale).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    lp, rp = BF16PLhs4(spec.mr).pack(x), BF16PRhs4B(spec.nr).pack(w, bias)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = _ref(lp, rp, m, n, k, spec.mr, spec.nr)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lp, rhs_packed=rp, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, _ref(lp, rp, m, n, k, spec.mr, spec.nr, cmin, cmax)


def _check(cases, refs, outs, what=""):
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
            f"{what} m={m} n={n} k={k}: wrote outside dst"
        got = out[:m, :n]
        assert np.array_equal(got, exact, equal_nan=True), f"{what} m={m} n={n} k={k}: {np.sum(got != exact)} differ"


def test_specs_and_names():
    s = tilegen.parse_spec("bf16:bf16:8x12")
    assert s.name == "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla"
    assert tilegen.parse_spec("bf16:bf16:1x12").name == \
        "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x12_neon_dot"
    assert s.features == ("neon", "bf16") and s.lhs_mr == 8 and s.packs_lhs
    from tilegen.layout.base import same_rhs
    assert same_rhs(s, tilegen.parse_spec("bf16:bf16:1x12"))
    for bad in ("bf16:bf16:3x12", "bf16:bf16:8x6", "bf16:bf16:8x12:k2:s1", "bf16:neon:8x12",
                "bf16:bf16:16x16"):
        with pytest.raises(tilegen.SpecError):
            tilegen.parse_spec(bad)


def test_manifest_round_trip(bf16_lib):
    import json
    from tilegen.generator.manifest import kernel_entry, packer_entry, parse_packer_spec
    man = json.loads((bf16_lib / "manifest.json").read_text())
    names = {e["name"] for e in man["kernels"]}
    assert {s.name for s in ALL_SPECS} <= names
    for e in man["kernels"]:
        spec = tilegen.parse_spec(e["spec"])
        assert kernel_entry(spec, e["symbol"]) == {k: v for k, v in e.items() if k != "preferred"}
    packers = {e["name"]: e for e in man["packers"]}
    assert {"lhs_quant_pack_bf16p8x4_f32_neon", "lhs_quant_pack_bf16p1x4_f32_neon"} <= set(packers)
    for e in packers.values():
        assert packer_entry(parse_packer_spec(e["spec"]), e["symbol"]) == e
    hdr = (bf16_lib / "tilegen_kernels.h").read_text()
    assert "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla" in hdr
    assert "get_rhs_packed_offset_matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla" in hdr


@pytest.mark.parametrize("cpu", BF16_CPUS + NO_BF16_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_bf16_kernel(spec, cpu, bf16_lib):
    g = guest(cpu)
    if cpu in NO_BF16_CPUS:   # the runtime refuses a kernel whose ISA the CPU lacks
        msg = g.call("guest_calls:kernel_refused", str(bf16_lib), spec.name)
        assert "ArgumentError" in msg and "bf16" in msg, msg
        return
    rng = np.random.default_rng(sum(map(ord, spec.name + cpu)))
    if cpu == "neoverse-n2":
        shapes = SWEEP
    else:
        shapes = [(int(rng.integers(1, 3 * spec.mr + 2)), int(rng.integers(1, 4 * spec.nr)),
                   int(rng.integers(1, 160))) for _ in range(8)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2), scale=(1.0, 1e-3, 3e3)[i % 3])
        cases.append(c)
        refs.append(r)
    outs = g.call("guest_calls:run_q4_cases", str(bf16_lib), spec.name, cases)
    _check(cases, refs, outs, spec.spec_string)


def _vector_files():
    return vector_params("bf16_m*_n*_k*.npz", keep=lambda p: "sme" not in p.name)


@pytest.mark.parametrize("path", _vector_files(), ids=lambda p: p.stem)
def test_kernels_reproduce_kleidiai_vectors(path, bf16_lib):
    """dst and dst_clamped of KleidiAI's 8x12 BFMMLA kernel bit for bit, through the generated
    8x12 kernel on KleidiAI's packed buffers and on tilegen's (numpy and generated packers);
    for m = 1 the BFDOT gemv on the same buffers gives the model's bits too, and KleidiAI's
    1x36 BFDOT output within 1e-6 relative."""
    z = np.load(path)
    m, n, k = (int(v) for v in z["shape_mnk"])
    cmin, cmax = float(z["clamp_min"]), float(z["clamp_max"])
    x, w_kn, bias = z["lhs_f32"], z["rhs_kxn_f32"], z["bias"]
    stem = "neon_mmla_8x12"
    rhs_k = z["neon_bf16p12x4b__rhs_packed"].copy()
    lhs_k = z[f"{stem}__lhs_packed"].copy()
    ours_r = BF16PRhs4B(12).pack(w_kn, bias, layout="kn")
    ours_l = BF16PLhs4(8).pack(x)
    wr = z["neon_bf16p12x4b__rhs_packed_written"]
    assert np.array_equal(ours_r[wr], rhs_k[wr]) and ours_r.size == rhs_k.size
    lw = z[f"{stem}__lhs_packed_written"]
    assert np.array_equal(ours_l[lw], lhs_k[lw]) and ours_l.size == lhs_k.size
    gemm = tilegen.parse_spec("bf16:bf16:8x12")
    from tilegen.layout import lhs_layout_for, rhs_layout_for
    L, R = lhs_layout_for(gemm), rhs_layout_for(gemm)
    assert [gemm.m_step, gemm.n_step, gemm.lhs_mr, gemm.nr, gemm.kr, gemm.sr] == \
        list(z[f"{stem}__params"])
    assert [L.packed_size(m, k), R.packed_size(n, k), 4 * m * n, L.packed_offset(8, k),
            R.packed_offset(12, k)] == list(z[f"{stem}__sizes"])
    g = guest("neoverse-n2")
    neon_l = g.call("guest_calls:lib_pack_lhs", str(bf16_lib), "bf16px4", x, 8, 4, 1, 32, 0)
    assert np.array_equal(neon_l, ours_l)
    cases, want = [], []
    for lhs, rhs in ((lhs_k, rhs_k), (ours_l, ours_r), (neon_l, ours_r)):
        for key, lo, hi in (("dst", -FMAX, FMAX), ("dst_clamped", cmin, cmax)):
            cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=lo,
                              clamp_max=hi, sentinel=SENTINEL))
            want.append(z[f"{stem}__{key}"])
    outs = g.call("guest_calls:run_q4_cases", str(bf16_lib), gemm.name, cases)
    _check(cases, want, outs, path.stem)
    assert np.array_equal(z[f"{stem}__dst"], _ref(ours_l, ours_r, m, n, k, 8, 12))
    if m == 1:
        gemv = tilegen.parse_spec("bf16:bf16:1x12")
        l1 = z["neon_dot_1x36__lhs_packed"].copy()
        assert np.array_equal(l1[z["neon_dot_1x36__lhs_packed_written"]],
                              BF16PLhs4(1).pack(x)[z["neon_dot_1x36__lhs_packed_written"]])
        cases = [dict(m=m, n=n, k=k, bl=32, lhs_packed=l1, rhs_packed=rhs_k, clamp_min=lo,
                      clamp_max=hi, sentinel=SENTINEL) for lo, hi in ((-FMAX, FMAX), (cmin, cmax))]
        outs = g.call("guest_calls:run_q4_cases", str(bf16_lib), gemv.name, cases)
        _check(cases, [z[f"{stem}__dst"], z[f"{stem}__dst_clamped"]], outs, path.stem + " gemv")
        kd = z["neon_dot_1x36__dst"]
        got = outs[0][:m, :n]
        assert np.abs(got - kd).max() <= 1e-6 * np.abs(kd).max()


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-40, -1e-40, 3.4e38, -3.4e38,
                     1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -9, 65504.0], np.float32)


@pytest.mark.parametrize("cpu", ("cortex-a53", "neoverse-n2"))
def test_generated_lhs_packer_is_the_numpy_layout(cpu, bf16_lib):
    """The NEON packer (plain NEON integer rounding: runs without FEAT_BF16) writes the bytes
    BF16PLhs4.pack writes: every m, k tail, padded row strides, NaN/Inf/subnormal/ties; NaN
    payloads become quiet NaNs like the numpy conversion."""
    g = guest(cpu)
    rng = np.random.default_rng(5)
    for mr in (8, 1):
        for m, k in [(1, 1), (3, 2), (8, 3), (9, 4), (17, 5), (7, 8), (16, 13), (5, 31), (9, 70)]:
            x = rng.normal(size=(m, k)).astype(np.float32)
            sel = rng.random(size=x.shape) < 0.3
            x[sel] = rng.choice(SPECIALS, size=int(sel.sum()))
            bits = x.view(np.uint32)
            bits[0, 0] = 0x7FA01234            # signalling NaN with a payload
            want = BF16PLhs4(mr).pack(x)
            for pad in (0, 3):
                got = g.call("guest_calls:lib_pack_lhs", str(bf16_lib), "bf16px4", x, mr, 4, 1, 32,
                             0, pad)
                assert np.array_equal(got, want), (mr, m, k, pad)
    assert np.array_equal(f32_to_bf16_rne(np.float32([np.nan])) & 0x7FC0, [0x7FC0])
    msg = g.call("guest_bf16:packer_refusal", str(bf16_lib), np.ones((3, 4), np.float32), 2)
    assert "ArgumentError" in msg and "m_idx_start" in msg


def _bf16_model(x, w, bias=None):
    """The bf16 kernels' result for f32 rows x (m, k) and weights w (n, k)."""
    m, k = x.shape
    n = w.shape[0]
    L, R = BF16PLhs4(8), BF16PRhs4B(12)
    return matmul_bf16(L.pack(x), R.pack(w, bias), m, n, k, L, R, -FMAX, FMAX)


def test_runtime_kinds_bf16_and_f16(bf16_lib, tmp_path):
    """kind "bf16" runs the bf16 kernels (2 bytes per weight); kind "f16" picks them where the
    CPU has bf16 and the f32 kernels elsewhere; without bf16, kind "bf16" is refused."""
    from tilegen.reference.f32 import matmul_f32
    rng = np.random.default_rng(9)
    n, k, m = 37, 70, 11
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(m, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    w16 = w.astype(np.float16)
    want = _bf16_model(x, w, bias)
    want16 = _bf16_model(x, w16.astype(np.float32), bias)
    for cpu in BF16_CPUS:
        g = guest(cpu)
        for kind, wk, exp in (("bf16", w, want), ("bf16", w16, want16), ("f16", w16, want16)):
            r = g.call("guest_bf16:ops", str(bf16_lib), kind, wk, x, bias, (1, 2, 3), None,
                       str(tmp_path / f"{cpu}{kind}.tgpw"))
            assert r["gemm"] == "matmul_clamp_f32_bf16p8x4_bf16p12x4b_8x12_neon_mmla", r["gemm"]
            assert r["gemv"] == "matmul_clamp_f32_bf16p1x4_bf16p12x4b_1x12_neon_dot"
            assert r["layout"] == "bf16p12x4b" and r["ws"] == BF16PLhs4(8).packed_size(m, k)
            assert r["nbytes"] == BF16PRhs4B(12).packed_size(n, k)        # 2 bytes per weight
            for o in r["outs"] + [r["reloaded"]]:
                assert np.array_equal(o, exp)
            assert np.array_equal(r["one"], exp[:1])
            wb = bf16_to_f32(f32_to_bf16_rne(wk.astype(np.float32)))
            assert np.array_equal(r["rows"], wb[[0, n - 1]])
        r = g.call("guest_bf16:ops", str(bf16_lib), "bf16", w, x, None, (1,), (-0.5, 0.5))
        assert np.array_equal(r["outs"][0], np.clip(_bf16_model(x, w), np.float32(-0.5),
                                                    np.float32(0.5)))
    for cpu in ("neoverse-n1", "neoverse-v1", "cortex-a53"):
        g = guest(cpu)
        r = g.call("guest_bf16:ops", str(bf16_lib), "f16", w16, x, bias, (1, 2))
        assert r["gemm"].endswith("_6x16_neon_mla") and r["ws"] == 0
        ref = matmul_f32(x, w16.astype(np.float32), bias, -np.inf, np.inf)
        for o in r["outs"]:
            assert np.array_equal(o, ref)
        r = g.call("guest_bf16:ops", str(bf16_lib), "bf16", w, x)
        assert r["error"].startswith("ArgumentError") and "bf16" in r["error"], r


def test_bf16_close_to_float64():
    """The model (and so the kernels) against float64 on the same bf16 inputs."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(9, 131)).astype(np.float32)
    w = rng.normal(size=(30, 131)).astype(np.float32)
    L, R = BF16PLhs4(8), BF16PRhs4B(12)
    lp, rp = L.pack(x), R.pack(w)
    d = matmul_bf16(lp, rp, 9, 30, 131, L, R, -FMAX, FMAX)
    e = matmul_bf16_f64(lp, rp, 9, 30, 131, L, R)
    assert np.abs(d - e).max() <= 2e-6 * np.abs(e).max()


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_bf16_guard_pages(spec, bf16_lib):
    """Packed LHS, packed RHS and a strided dst flush against PROT_NONE pages (after the last
    byte, before the first): no access outside them, nothing outside m x n written, bit-exact."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    rng = np.random.default_rng(sum(map(ord, "guard" + spec.name)))
    mr, nr = spec.mr, spec.nr
    shapes = [(1, 1, 1), (mr, nr, 4), (mr + 1, nr + 1, 5), (2 * mr + 3, 3 * nr - 1, 17),
              (3, 2 * nr + 3, 2), (int(rng.integers(1, 3 * mr + 2)), int(rng.integers(1, 4 * nr)),
                                   int(rng.integers(1, 80)))]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2))
        c.update(dst_stride=n + (0, 1, 2, 3)[i % 4], sentinel=GUARD_SENTINEL)
        cases.append(c)
        refs.append(r)
    outs = guest("neoverse-n2").call("guest_pack:guarded_q4_cases", str(bf16_lib), spec.name,
                                     cases, PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


@pytest.mark.parametrize("mr", (8, 1))
def test_bf16_packer_guard_pages(mr, bf16_lib):
    rng = np.random.default_rng(mr)
    cases = [dict(x=rng.normal(size=(m, k)).astype(np.float32), bl=32, m_idx_start=0, pad=pad)
             for m, k, pad in [(1, 1, 0), (5, 7, 3), (mr + 1, 9, 1), (9, 64, 0), (17, 70, 2)]]
    outs = guest("cortex-a53").call("guest_pack:guarded_lib_pack_cases", str(bf16_lib), "bf16px4",
                                    mr, 4, 1, cases)
    for i, c in enumerate(cases):
        for j in range(2):
            assert np.array_equal(outs[2 * i + j], BF16PLhs4(mr).pack(c["x"])), (c["x"].shape, j)
