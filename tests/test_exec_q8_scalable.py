"""q8_0 kernels on SVE (sve_dotprod SDOT, sve_i8mm SMMLA) at every vector length, and on
SME/SME2 at every streaming vector length: bit-exact against tilegen.reference.q8 on
operands packed with the concrete tile the guest library reports; SME kernels leave SVCR
clear.  Also: gemm + gemv read one packed RHS, the runtime refuses them without the ISA, the
ABI probe, and at VL 128 the 1vl panels are KleidiAI's nr=4 layouts (golden vectors)."""
from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.layout.base import same_rhs
from tilegen.layout.lhs_int8 import QAI8DXP
from tilegen.layout.rhs_int8 import QSI8CXP
from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp

from conftest import SME_ON, guest, vector_params
from test_exec_q8 import FMAX, SENTINEL, _check

VLS = (128, 256, 512, 1024, 2048)
Q8_SVE = ("q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1", "q8_0:sve_i8mm:8x2vl",
          "q8_0:sve_i8mm:4x1vl", "q8_0:sve_i8mm:12x1vl", "q8_0:sve_dotprod:8x1vl",
          "q8_0:sve_dotprod:1x1vl", "q8_0:sve_dotprod:4x4vl", "q8_0:sve_dotprod:1x2vl:k8:s1",
          "q8_0:sve_dotprod:1x4vl", "q8_0:sve_dotprod:16x1vl")
SVE_RUNS = [("max", v) for v in VLS] + [("neoverse-v1", None), ("neoverse-n2", None),
                                        ("cortex-a710", None)]
SVE_NATIVE_VL = {"neoverse-n2": 128, "neoverse-v1": 256, "cortex-a710": 128}


@pytest.fixture(scope="module")
def q8_sve_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8sve")
    tilegen.build_library([tilegen.parse_spec(s) for s in Q8_SVE], target="linux-aarch64-all",
                          out_dir=out)
    return out


def _shapes(mr, nr, rng):
    fixed = [(1, 1, 1), (mr, nr, 32), (mr + 1, nr + 1, 31), (2 * mr + 3, 2 * nr - 1, 70),
             (1, 3 * nr + 3, 100), (min(7, mr), 13, 33), (mr, 2 * nr, 257)]
    rand = [(int(rng.integers(1, 2 * mr + 2)), int(rng.integers(1, 2 * nr + 2)),
             int(rng.integers(1, 160))) for _ in range(3)]
    return fixed + rand


def run_q8(sess, lib, spec, vl_bits, sme=False):
    """The shape sweep through kernel ``spec`` on a CPU with ``vl_bits`` vectors."""
    info = sess.call("guest_calls:vl_info", str(lib), spec.name)
    vlb = vl_bits // 8
    mr, nr = spec.mr_at(vlb), spec.nr_at(vlb)
    assert info["runnable"] and (info["mr"], info["nr"]) == (mr, nr), (spec.name, info)
    lhs_mr = spec.lhs_mr_at(vlb)
    rng = np.random.default_rng(vl_bits + sum(map(ord, spec.name)))
    cases, refs = [], []
    for i, (m, n, k) in enumerate(_shapes(mr, nr, rng)):
        x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
        q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
        scale = rng.uniform(0.001, 0.01, size=n).astype(np.float32)
        bias = rng.normal(size=n).astype(np.float32)
        lhs = QAI8DXP(lhs_mr, spec.kr, spec.sr).pack(x)
        rhs = QSI8CXP(nr, spec.kr).pack(q, scale, bias)

        def ref(cmin, cmax):
            return matmul_qai8dxp_qsi8cxp(lhs, rhs, m, n, k, lhs_mr, nr, spec.kr, spec.sr,
                                          cmin, cmax)
        cmin, cmax = -FMAX, FMAX
        free = ref(cmin, cmax)
        if i % 2 and free.size > 1:
            cmin, cmax = (float(np.float32(v)) for v in np.quantile(free, [0.2, 0.8]))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs,
                          clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL))
        refs.append(ref(cmin, cmax))
    outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    if sme:
        assert sess.call("guest_calls:svcr_now", str(lib)) == 0
    try:
        _check(cases, refs, outs)
    except AssertionError as e:
        raise AssertionError(f"{spec.name} VL={vl_bits}: {e}") from None


@pytest.mark.parametrize("cpu,vl", SVE_RUNS, ids=[f"{c}-{v or 'default'}" for c, v in SVE_RUNS])
def test_sve_q8_every_vl(cpu, vl, q8_sve_lib):
    sess = guest(cpu, sve_vl=vl)
    for text in Q8_SVE:
        run_q8(sess, q8_sve_lib, tilegen.parse_spec(text), vl or SVE_NATIVE_VL[cpu])


@pytest.mark.parametrize("vl", (128, 512))
def test_sve_q8_abi(vl, q8_sve_lib):
    specs = [tilegen.parse_spec(s) for s in Q8_SVE]
    res = guest("max", sve_vl=vl).call("guest_calls:check_abi_of", str(q8_sve_lib),
                                       [s.name for s in specs])
    assert res == {s.name: [] for s in specs}


def test_sve_q8_refused_without_the_isa(q8_sve_lib):
    # a64fx has SVE but neither dotprod nor i8mm; neoverse-n1 has dotprod but no SVE
    for cpu in ("a64fx", "neoverse-n1"):
        for text in Q8_SVE:
            name = tilegen.parse_spec(text).name
            msg = guest(cpu).call("guest_calls:refused", str(q8_sve_lib), name)
            assert "ArgumentError" in msg, (cpu, name, msg)


def test_sve_q8_pairs_share_the_packed_rhs():
    """The gemv partners read the gemm kernels' packed RHS at every vector length."""
    p = tilegen.parse_spec
    assert same_rhs(p("q8_0:sve_i8mm:16x1vl"), p("q8_0:sve_dotprod:1x1vl:k8:s1"))
    assert same_rhs(p("q8_0:sve_dotprod:8x1vl"), p("q8_0:sve_dotprod:1x1vl"))
    assert not same_rhs(p("q8_0:sve_i8mm:16x1vl"), p("q8_0:sve_dotprod:1x1vl"))


KLEIDIAI_AT_VL128 = {   # KleidiAI kernel stem -> scalable spec with the same layouts at VL 128
    "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod": "q8_0:sve_dotprod:1x1vl:k8:s1",
    "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod": "q8_0:sve_dotprod:1x1vl",
    "qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod": "q8_0:sve_dotprod:16x1vl",
    "qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm": "q8_0:sve_i8mm:16x1vl",
}


@pytest.mark.parametrize("path", vector_params("q8_qai8dxp_qsi8cxp_*.npz"),
                         ids=lambda p: p.stem)
def test_sve_q8_reproduce_kleidiai_vectors(path, q8_sve_lib):
    """At VL 128 one VL unit is 4 columns: KleidiAI's packed buffers in, KleidiAI's dst out."""
    z = np.load(path)
    m, n, k = (int(v) for v in z["shape_mnk"])
    sess = guest("max", sve_vl=128)
    for stem, text in KLEIDIAI_AT_VL128.items():
        spec = tilegen.parse_spec(text)
        cases, want = [], []
        for clamped in (False, True):
            cmin, cmax = ((float(z["clamp_min"]), float(z["clamp_max"])) if clamped
                          else (-FMAX, FMAX))
            cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=z[f"{stem}__lhs_packed"].copy(),
                              rhs_packed=z[f"{stem}__rhs_packed"], clamp_min=cmin,
                              clamp_max=cmax, sentinel=SENTINEL))
            want.append(z[f"{stem}__dst_clamped" if clamped else f"{stem}__dst"])
        outs = sess.call("guest_calls:run_q4_cases", str(q8_sve_lib), spec.name, cases)
        for w, out in zip(want, outs):
            assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all()
            assert np.array_equal(out[:m, :n], w), f"{text}: {np.sum(out[:m, :n] != w)} differ"


# -- SME SMOPA gemm (int32 sums in ZA tiles) and the SME2 gemv (SDOT by lane into ZA-array
#    groups), in streaming mode -----------------------------------------------------------
Q8_SME = ("q8_0:sme:1vlx4vl", "q8_0:sme:1vlx2vl", "q8_0:sme:1vlx1vl", "q8_0:sme:1vlx3vl",
          "q8_0:sme2:1x4vl", "q8_0:sme2:1x2vl",
          # the SME2 gemm (multi-vector loads), every width: nu = 3 has RHS groups of four that
          # straddle two k chunks
          "q8_0:sme2:1vlx4vl", "q8_0:sme2:1vlx3vl", "q8_0:sme2:1vlx2vl", "q8_0:sme2:1vlx1vl")


@pytest.fixture(scope="module")
def q8_sme_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q8sme")
    specs = [tilegen.parse_spec(t) for t in Q8_SME]
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out, specs


def _sme_guest(vl, isa_env=None):
    env = dict(SME_ON, **({"TILEGEN_ISA": isa_env} if isa_env else {}))
    return guest("max", None, vl, env)


@pytest.mark.parametrize("vl", VLS)
def test_sme_q8_every_svl(vl, q8_sme_lib):
    lib, specs = q8_sme_lib
    sess = _sme_guest(vl)
    for spec in specs:
        run_q8(sess, lib, spec, vl, sme=True)
    res = sess.call("guest_calls:check_abi_of", str(lib), [s.name for s in specs])
    assert res == {s.name: [] for s in specs}


def test_sme2_q8_refused_on_sme_only(q8_sme_lib):
    lib, specs = q8_sme_lib
    only_sme = _sme_guest(256, isa_env="neon,sve,sve2,sme")
    for spec in specs:
        msg = only_sme.call("guest_calls:refused", str(lib), spec.name)
        if spec.isa == "sme2":
            assert "ArgumentError" in msg and "sme2" in msg, msg
        else:
            assert msg == "", msg


def test_sme_q8_pairs_share_the_packed_rhs():
    p = tilegen.parse_spec
    assert same_rhs(p("q8_0:sme:1vlx4vl"), p("q8_0:sme2:1x4vl"))
    assert same_rhs(p("q8_0:sme:1vlx2vl"), p("q8_0:sme2:1x2vl"))
    assert same_rhs(p("q8_0:sme2:1vlx4vl"), p("q8_0:sme2:1x4vl"))
    assert same_rhs(p("q8_0:sme2:1vlx4vl"), p("q8_0:sme:1vlx4vl"))


# -- the default q8_0 kernels through the runtime: pack once, gemm for m > 1, gemv for m = 1 --
DEFAULT_PICKS = {   # (cpu, sve VL, sme SVL) -> (gemm spec, gemv spec) of the default table
    ("neoverse-v1", None, None): ("q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1"),
    ("neoverse-n2", None, None): ("q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1"),
    ("max", 512, None): ("q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1"),
    ("max", None, 256): ("q8_0:sme:1vlx4vl", "q8_0:sme2:1x4vl"),
    ("max", None, 1024): ("q8_0:sme:1vlx4vl", "q8_0:sme2:1x4vl"),
    ("neoverse-n1", None, None): ("q8_0:dotprod:16x4", "q8_0:dotprod:1x4"),
}


@pytest.fixture(scope="module")
def q8_all_default_lib(tmp_path_factory):
    from tilegen.build import default_specs, get_target
    out = tmp_path_factory.mktemp("q8alldefault")
    specs = [s for s in default_specs(get_target("linux-aarch64-all")) if s.family == "q8_0"]
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("run", list(DEFAULT_PICKS), ids=lambda r: "-".join(map(str, r)))
def test_q8_default_table_picks_scalable_pairs(run, q8_all_default_lib):
    from tilegen.layout.rhs_int8 import quantize_per_channel
    cpu, sve_vl, sme_vl = run
    sess = guest(cpu, sve_vl, sme_vl, SME_ON if sme_vl else None)
    gemm, gemv = (tilegen.parse_spec(t) for t in DEFAULT_PICKS[run])
    vl_bits = sme_vl or sve_vl or {"neoverse-v1": 256, "neoverse-n2": 128}.get(cpu, 128)
    vlb = vl_bits // 8 if gemm.vl_scaled else None
    rng = np.random.default_rng(vl_bits + len(cpu))
    n, k = 3 * gemm.nr_at(vlb) + 5, 100
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(gemm.mr_at(vlb) + 3, k)).astype(np.float32)
    r = sess.call("guest_calls:q4_ops", str(q8_all_default_lib), "q8_0", w, x, None, (1, 2))
    assert (r["kernel"], r["gemv"]) == (gemm.name, gemv.name)
    nr = gemm.nr_at(vlb)
    assert r["nr"] == nr and r["kr"] == gemm.kr
    q, s = quantize_per_channel(w)
    assert np.array_equal(r["packed"], QSI8CXP(nr, gemm.kr).pack(q, s))

    def ref(rows, spec):
        mr = spec.lhs_mr_at(vlb)
        lhs = QAI8DXP(mr, spec.kr, 1).pack(rows)
        return matmul_qai8dxp_qsi8cxp(lhs, r["packed"], rows.shape[0], n, k, mr, nr, spec.kr, 1,
                                      -FMAX, FMAX)
    for o in r["outs"]:
        assert np.array_equal(o, ref(x, gemm))
    r1 = sess.call("guest_calls:run_ops", str(q8_all_default_lib), "q8_0", w, x[:1], (1,))
    assert r1["kernel"] == gemv.name
    assert np.array_equal(r1["outs"][0], ref(x[:1], gemv))
    if sme_vl:
        assert sess.call("guest_calls:svcr_now", str(q8_all_default_lib)) == 0


GUARD_RUNS = [("q8_0:sve_i8mm:16x1vl", 256, None), ("q8_0:sve_dotprod:1x1vl:k8:s1", 512, None),
              ("q8_0:sve_dotprod:16x1vl", 128, None), ("q8_0:sve_dotprod:1x1vl", 2048, None),
              ("q8_0:sme:1vlx4vl", None, 512), ("q8_0:sme2:1x4vl", None, 256),
              ("q8_0:sme2:1vlx4vl", None, 512), ("q8_0:sme2:1vlx3vl", None, 2048)]


@pytest.mark.parametrize("text,sve_vl,sme_vl", GUARD_RUNS, ids=[r[0] for r in GUARD_RUNS])
def test_q8_scalable_guard_pages(text, sve_vl, sme_vl, tmp_path):
    """Packed LHS, packed RHS and a strided dst flush against PROT_NONE pages (both ends, see
    tests/test_guard_pages.py): no access outside, nothing outside m x n written, bit-exact."""
    from test_exec_q8 import _case
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    spec = tilegen.parse_spec(text)
    tilegen.build_library([spec], target="linux-aarch64-all", out_dir=tmp_path)
    vlb = (sve_vl or sme_vl) // 8
    mr, nr = spec.mr_at(vlb), spec.nr_at(vlb)

    class AtVl:          # the spec's geometry at this VL, for the host-side packing of _case
        lhs_mr, kr, sr = spec.lhs_mr_at(vlb), spec.kr, spec.sr
    AtVl.nr = nr
    rng = np.random.default_rng(sum(map(ord, "guard" + text)))
    shapes = [(1, 1, 1), (mr, nr, 32), (mr + 1, nr + 1, 31), (2 * mr + 3, 3 * nr - 1, 70),
              (3 * mr - 1 if mr > 1 else 1, 2 * nr + 3, 100), (5, 13, 257)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(AtVl, rng, m, n, k, clamped=bool(i % 2))
        c.update(dst_stride=n + (0, 1, 2, 3)[i % 4], sentinel=GUARD_SENTINEL)
        cases.append(c)
        refs.append(r)
    sess = guest("max", sve_vl, sme_vl, SME_ON if sme_vl else None)
    outs = sess.call("guest_pack:guarded_q4_cases", str(tmp_path), spec.name, cases, PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)
