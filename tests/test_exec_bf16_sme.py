"""bf16 SME2 BFMOPA kernels (tiles in VL units) at every streaming vector length: bit-exact
against reference_bf16 on KleidiAI's bf16p<vl>x2 / bf16p<vl>x2b layouts at the guest's SVL."""
from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.layout.bf16 import BF16PLhs2, BF16PRhs2B
from tilegen.reference.bf16 import matmul_bf16

from conftest import SME_ON, guest, vector_params

SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
VLS = (128, 256, 512, 1024, 2048)
TILES = ("2vlx2vl", "1vlx4vl", "4vlx1vl")
SPECS = [tilegen.parse_spec(f"bf16:sme2:{t}") for t in TILES]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16sme")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _case(lhs_l, rhs_l, rng, m, n, k, clamped):
    x = rng.normal(size=(m, k)).astype(np.float32)
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    lp, rp = lhs_l.pack(x), rhs_l.pack(w, bias)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = matmul_bf16(lp, rp, m, n, k, lhs_l, rhs_l, cmin, cmax)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lp, rhs_packed=rp, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, matmul_bf16(lp, rp, m, n, k, lhs_l, rhs_l, cmin, cmax)


@pytest.mark.parametrize("vl", VLS)
def test_bf16_sme2_every_vl(vl, lib):
    g = guest("max", None, vl, dict(SME_ON))
    for spec in SPECS:
        svl = vl // 8
        lhs_l, rhs_l = BF16PLhs2.for_vl(svl, spec.mr), BF16PRhs2B.for_vl(svl, spec.nr)
        mr, nr = lhs_l.mr, rhs_l.nr
        rng = np.random.default_rng(vl + mr)
        shapes = [(1, 1, 1), (mr, nr, 8), (mr + 1, nr + 1, 5), (2 * mr + 3, 2 * nr - 1, 17),
                  (1, 2 * nr + 3, 33), (7, 13, 3), (9, 33, 64), (3, 5, 2)]
        cases, refs = [], []
        for i, (m, n, k) in enumerate(shapes):
            c, r = _case(lhs_l, rhs_l, rng, m, n, k, clamped=bool(i % 2))
            cases.append(c)
            refs.append(r)
        outs = g.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
        assert g.call("guest_calls:svcr_now", str(lib)) == 0, f"{spec.spec_string}: SVCR after return"
        for c, exact, out in zip(cases, refs, outs):
            m, n, k = c["m"], c["n"], c["k"]
            assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), (spec, vl, m, n, k)
            got = out[:m, :n]
            assert np.array_equal(got, exact), \
                f"{spec.spec_string} svl={vl} m={m} n={n} k={k}: {np.sum(got != exact)} differ"


def _sme_vectors():
    return vector_params("bf16_*.npz", keep=lambda p: "sme2_mopa__svl_bits" in np.load(p).files,
                         minimum=3)


@pytest.mark.parametrize("path", _sme_vectors(), ids=lambda p: p.stem)
def test_reproduces_kleidiai_sme_vectors(path, lib):
    """KleidiAI's own packed buffers (bytes it left unwritten taken from our packer), the
    2vlx2vl kernel at the vector's SVL: dst and dst_clamped bit for bit."""
    z = np.load(path)
    svl = int(z["sme2_mopa__svl_bits"]) // 8
    lhs_l, rhs_l = BF16PLhs2.for_vl(svl, 2), BF16PRhs2B.for_vl(svl, 2)
    assert (lhs_l.mr, rhs_l.nr) == (int(z["sme2_mopa__mr"]), int(z["sme2_mopa__nr"]))
    m, n, k = (int(v) for v in z["shape_mnk"])
    lp = np.where(z["sme2_mopa__lhs_packed_written"], z["sme2_mopa__lhs_packed"],
                  lhs_l.pack(z["lhs_f32"])).astype(np.uint8)
    rp = np.where(z["sme2_mopa__rhs_packed_written"], z["sme2_mopa__rhs_packed"],
                  rhs_l.pack(z["rhs_kxn_f32"], z["bias"], layout="kn")).astype(np.uint8)
    cases = [dict(m=m, n=n, k=k, bl=32, lhs_packed=lp, rhs_packed=rp, clamp_min=c0,
                  clamp_max=c1, sentinel=SENTINEL)
             for c0, c1 in ((-FMAX, FMAX), (float(z["clamp_min"]), float(z["clamp_max"])))]
    g = guest("max", None, svl * 8, dict(SME_ON))
    name = SPECS[0].name
    assert SPECS[0].spec_string == "bf16:sme2:2vlx2vl"
    outs = g.call("guest_calls:run_q4_cases", str(lib), name, cases)
    assert g.call("guest_calls:svcr_now", str(lib)) == 0
    for out, key in zip(outs, ("dst", "dst_clamped")):
        want = z[f"sme2_mopa__{key}"]
        assert np.array_equal(out[:m, :n].view(np.uint32), want.view(np.uint32)), \
            f"{path.name} {key}: {np.sum(out[:m, :n] != want)} differ"


def test_refused_without_sme2(lib):
    name = SPECS[0].name
    # SME is opt-in (TILEGEN_SME defaults to 0); SME without SME2 refuses the SME2 kernel
    assert "sme" in guest("max").call("guest_calls:refused", str(lib), name)
    only_sme = guest("max", None, 256, dict(SME_ON, TILEGEN_ISA="neon,sve,sve2,sme"))
    msg = only_sme.call("guest_calls:refused", str(lib), name)
    assert "ArgumentError" in msg and "sme2" in msg, msg
    assert "ArgumentError" in guest("neoverse-n2").call("guest_calls:refused", str(lib), name)


def test_runtime_kind_bf16_and_f16_pick_sme2(tmp_path):
    """On SME2 with TILEGEN_SME=1 the default library's bf16/f16 weights go to the BFMOPA
    kernel for gemm and gemv (m = 1); the results equal reference_bf16."""
    tilegen.build_library(["bf16:sme2:2vlx2vl", "bf16:bf16:8x12", "bf16:bf16:1x12",
                           "f32:neon:6x16", "f32:neon:1x16"],
                          target="linux-aarch64-all", out_dir=tmp_path)
    rng = np.random.default_rng(7)
    w = rng.normal(size=(37, 21)).astype(np.float32)
    x = rng.normal(size=(11, 21)).astype(np.float32)
    g = guest("max", None, 512, dict(SME_ON))
    name = SPECS[0].name
    for kind in ("bf16", "f16"):
        wk = w.astype(np.float16) if kind == "f16" else w
        res = g.call("guest_calls:q4_ops", str(tmp_path), kind, wk, x, threads=(1, 2))
        assert res["kernel"] == name and res["gemv"] == name, res["kernel"]
        svl = 64
        lhs_l, rhs_l = BF16PLhs2.for_vl(svl, 2), BF16PRhs2B.for_vl(svl, 2)
        want = matmul_bf16(lhs_l.pack(x), res["packed"], 11, 37, 21, lhs_l, rhs_l, -FMAX, FMAX)
        for out in res["outs"]:
            assert np.array_equal(out, want), kind
    assert g.call("guest_calls:svcr_now", str(tmp_path)) == 0
