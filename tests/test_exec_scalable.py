"""SVE and SME/SME2 f32 kernels (tiles in vector-length units) at every vector length.

Each kernel runs in an emulated aarch64 Python with the VL set through qemu; the packed
RHS is made on the host with the concrete panel width the guest library reports, and the
results must equal the f32 FMA-chain reference bit for bit (and float64 within 1e-5*sqrt(k)).
SME kernels must leave PSTATE.SM and PSTATE.ZA clear (SVCR == 0) after every call.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.layout import F32PackedRHS
from tilegen.reference.f32 import matmul_f32, matmul_f64

from conftest import SME_ON, guest, vector_files, vector_params

SENTINEL = np.float32(-12345.5)
VLS = (128, 256, 512, 1024, 2048)
SVE_TILES = ("6x4vl", "8x2vl", "4x4vl", "1x4vl", "3x1vl", "3x8vl", "1x8vl")
SME_TILES = ("2vlx2vl", "1vlx4vl", "4vlx1vl", "1vlx3vl")
SME2_TILES = ("2vlx2vl", "1vlx4vl", "4vlx1vl", "1vlx1vl", "1vlx2vl", "2vlx1vl", "1x4vl", "1x2vl",
              "1x8vl", "1x16vl")
SVE_RUNS = [("max", v) for v in VLS] + [("neoverse-n2", None), ("neoverse-v1", None),
                                        ("a64fx", None), ("cortex-a710", None)]
SVE_NATIVE_VL = {"neoverse-n2": 128, "neoverse-v1": 256, "a64fx": 512, "cortex-a710": 128}


def _specs(isa, tiles):
    return [tilegen.parse_spec(f"f32:{isa}:{t}") for t in tiles]


@pytest.fixture(scope="module")
def scal_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("scalable")
    specs = _specs("sve", SVE_TILES) + _specs("sme", SME_TILES) + _specs("sme2", SME2_TILES)
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out


def _sme_guest(vl, isa_env=None):
    env = dict(SME_ON, **({"TILEGEN_ISA": isa_env} if isa_env else {}))
    return guest("max", None, vl, env)


def _shapes(mr, nr, rng):
    fixed = [(1, 1, 1), (mr, nr, 8), (mr + 1, nr + 1, 5), (2 * mr + 3, 2 * nr - 1, 17),
             (1, 2 * nr + 3, 33), (min(7, mr), 13, 4)]
    rand = [(int(rng.integers(1, 2 * mr + 2)), int(rng.integers(1, 2 * nr + 2)),
             int(rng.integers(1, 40))) for _ in range(2)]
    return fixed + rand


def _run(sess, lib, name, seed, shapes=None):
    info = sess.call("guest_calls:vl_info", str(lib), name)
    assert info["runnable"], info
    mr, nr = info["mr"], info["nr"]
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes(mr, nr) if shapes else _shapes(mr, nr, rng)):
        lhs_base = (rng.normal(size=(m + 1, k + 3)) * 2).astype(np.float32)
        w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
        bias = rng.normal(size=n).astype(np.float32)
        lo, hi = (-3.4028234663852886e38, 3.4028234663852886e38)
        if i % 2:
            ref = matmul_f64(lhs_base[:m, :k], w, bias, -np.inf, np.inf)
            lo, hi = (float(np.float32(q)) for q in np.quantile(ref, [0.2, 0.8]))
        cases.append(dict(m=m, n=n, k=k, lhs_base=lhs_base, packed=F32PackedRHS(nr).pack(w, bias),
                          dst_base=np.full((m + 2, n + 3), SENTINEL, np.float32),
                          clamp_min=lo, clamp_max=hi))
        refs.append((w, bias))
    res = sess.call("guest_calls:run_scalable_cases", str(lib), name, cases)
    assert res["svcr"] == [0] * len(cases), f"{name}: SVCR after return {res['svcr']}"
    for c, (w, bias), out in zip(cases, refs, res["outs"]):
        m, n, k = c["m"], c["n"], c["k"]
        lhs = c["lhs_base"][:m, :k]
        got = out[:m, :n]
        assert (out[m:, :] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), (name, m, n, k)
        exact = matmul_f32(lhs, w, bias, c["clamp_min"], c["clamp_max"])
        assert np.array_equal(got.view(np.uint32), exact.view(np.uint32)), \
            f"{name} m={m} n={n} k={k}: {np.sum(got != exact)} outputs differ from the FMA chain"
        ref = matmul_f64(lhs, w, bias, c["clamp_min"], c["clamp_max"])
        scale = np.abs(lhs.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(bias) + 1e-30
        assert np.all(np.abs(got - ref) <= 1e-5 * np.sqrt(k) * scale), (name, m, n, k)
    return info


@pytest.mark.parametrize("cpu,vl", SVE_RUNS, ids=[f"{c}-{v or 'default'}" for c, v in SVE_RUNS])
def test_sve_f32_every_vl(cpu, vl, scal_lib):
    sess = guest(cpu, sve_vl=vl)
    want = vl or SVE_NATIVE_VL[cpu]
    for spec in _specs("sve", SVE_TILES):
        info = _run(sess, scal_lib, spec.name, seed=want + spec.mr)
        assert info["vl_bytes"]["sve"] == want // 8
        assert info["nr"] == spec.nr * want // 32 and info["mr"] == spec.mr
        assert info["rhs_format"] == f"f32p{info['nr']}x1b"


@pytest.mark.parametrize("isa,tiles", [("sme", SME_TILES), ("sme2", SME2_TILES)])
@pytest.mark.parametrize("vl", VLS)
def test_sme_f32_every_svl(isa, tiles, vl, scal_lib):
    sess = _sme_guest(vl)
    for spec in _specs(isa, tiles):
        info = _run(sess, scal_lib, spec.name, seed=vl + spec.mr * 7 + spec.nr)
        assert info["vl_bytes"]["sme"] == vl // 8
        assert (info["mr"], info["nr"]) == (spec.mr_at(vl // 8), spec.nr * vl // 32)
        assert info["lhs_format"] == (f"f32p{info['mr']}x1" if spec.mr_vl else None)


@pytest.mark.parametrize("vl", (128, 2048))
def test_sme2_f32_every_k_count(vl, scal_lib):
    # the SME2 hot loops take 8 (FMOPA) or 4 (gemv) k steps with groups loaded a block ahead:
    # every k from 1 to 27 (block counts 0-6, both parities, every remainder)
    sess = _sme_guest(vl)
    for t in ("2vlx2vl", "1vlx4vl", "4vlx1vl", "1x16vl", "1x4vl"):
        spec = tilegen.parse_spec(f"f32:sme2:{t}")
        _run(sess, scal_lib, spec.name, seed=vl + spec.nr,
             shapes=lambda mr, nr: [(min(mr, 3) + 1, nr + 1, k) for k in range(1, 28)])


@pytest.mark.parametrize("vl", (128, 512))
def test_scalable_kernels_conform_to_the_abi(vl, scal_lib):
    names = [s.name for s in _specs("sve", SVE_TILES) + _specs("sme", SME_TILES)
             + _specs("sme2", SME2_TILES)]
    res = guest("max", vl, vl, SME_ON).call("guest_calls:check_abi_of", str(scal_lib), names)
    assert res == {n: [] for n in names}


def test_refused_without_the_isa(scal_lib):
    sve = _specs("sve", ("6x4vl",))[0].name
    sme = _specs("sme", ("2vlx2vl",))[0].name
    sme2 = _specs("sme2", ("2vlx2vl",))[0].name
    # no SVE on neoverse-n1; SME is opt-in (TILEGEN_SME defaults to 0) even on max
    assert "ArgumentError" in guest("neoverse-n1").call("guest_calls:refused", str(scal_lib), sve)
    assert "sme" in guest("max").call("guest_calls:refused", str(scal_lib), sme)
    # SME without SME2: SME kernels run, SME2 kernels are refused (never gated on SME alone)
    only_sme = _sme_guest(256, isa_env="neon,sve,sve2,sme")
    assert only_sme.call("guest_calls:refused", str(scal_lib), sme) == ""
    msg = only_sme.call("guest_calls:refused", str(scal_lib), sme2)
    assert "ArgumentError" in msg and "sme2" in msg


# -- SVE int4 x int8 (q4_0, q4_0_dx): SDOT / SMMLA on Z registers -------------------------
Q4_SVE = [(f, i, t) for f in ("q4_0", "q4_0_dx") for i, t in
          (("sve_dotprod", "8x1vl"), ("sve_dotprod", "4x2vl"), ("sve_dotprod", "1x2vl"),
           ("sve_dotprod", "1x1vl"), ("sve_i8mm", "8x1vl"), ("sve_i8mm", "16x1vl"),
           ("sve_i8mm", "4x2vl"), ("sve_dotprod", "1x1vl:k16"), ("sve_dotprod", "1x2vl:k16"))]
Q4_SVE_RUNS = [("max", v) for v in VLS] + [("neoverse-n2", None), ("neoverse-v1", None),
                                           ("cortex-a710", None)]


def _q4_specs():
    return [tilegen.parse_spec(f"{f}:{i}:{t}") for f, i, t in Q4_SVE]


@pytest.fixture(scope="module")
def q4_sve_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q4sve")
    tilegen.build_library(_q4_specs(), target="linux-aarch64-all", out_dir=out)
    return out


def _run_q4(sess, lib, spec, vl_bits, sme=False):
    """Every shape of the q4 sweep through kernel ``spec`` on a CPU with ``vl_bits`` vectors,
    bit-exact against the packed-integer reference; SME kernels also leave SVCR clear."""
    from test_exec_q4 import SENTINEL as Q4_SENTINEL, _pack, _shapes
    info = sess.call("guest_calls:vl_info", str(lib), spec.name)
    mr, nr = spec.mr_at(vl_bits // 8), spec.nr_at(vl_bits // 8)
    assert info["runnable"] and (info["mr"], info["nr"]) == (mr, nr), (spec.name, info)
    lhs_mr = mr if spec.mr_vl else spec.lhs_mr
    rng = np.random.default_rng(vl_bits + sum(map(ord, spec.name)))
    cases, refs = [], []
    for i, (m, n, k, bl) in enumerate(_shapes(spec, rng, mr=mr, nr=nr)):
        lhs, rhs, ref, *_ = _pack(spec, rng, m, n, k, bl, nr=nr, lhs_mr=lhs_mr)
        free = ref(-3.4028234663852886e38, 3.4028234663852886e38)
        cmin, cmax = -3.4028234663852886e38, 3.4028234663852886e38
        if i % 2 and free.size > 1:
            cmin, cmax = (float(np.float32(q)) for q in np.quantile(free, [0.15, 0.85]))
        cases.append(dict(m=m, n=n, k=k, bl=bl, lhs_packed=lhs, rhs_packed=rhs,
                          clamp_min=cmin, clamp_max=cmax, sentinel=Q4_SENTINEL))
        refs.append(ref(cmin, cmax))
    outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    if sme:
        assert sess.call("guest_calls:svcr_now", str(lib)) == 0
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        got = out[:m, :n]
        assert (out[m:] == Q4_SENTINEL).all() and (out[:, n:] == Q4_SENTINEL).all(), spec.name
        assert np.array_equal(got, exact), \
            f"{spec.name} VL={vl_bits} m={m} n={n} k={k}: {np.sum(got != exact)} differ"


@pytest.mark.parametrize("cpu,vl", Q4_SVE_RUNS, ids=[f"{c}-{v or 'default'}" for c, v in Q4_SVE_RUNS])
def test_sve_q4_every_vl(cpu, vl, q4_sve_lib):
    sess = guest(cpu, sve_vl=vl)
    for spec in _q4_specs():
        _run_q4(sess, q4_sve_lib, spec, vl or SVE_NATIVE_VL[cpu])


def test_sve_q4_refused_without_dotprod_or_i8mm(q4_sve_lib):
    # a64fx has SVE but neither dotprod nor i8mm; neoverse-n1 has dotprod but no SVE
    for cpu in ("a64fx", "neoverse-n1"):
        for spec in _q4_specs():
            msg = guest(cpu).call("guest_calls:refused", str(q4_sve_lib), spec.name)
            assert "ArgumentError" in msg, (cpu, spec.name, msg)


# -- SME int4: SMOPA gemm (int32 ZA tiles folded per block into f32 ZA tiles) and the SME2
#    gemv (SDOT by lane into a ZA-array vector group), in streaming mode -----------------
Q4_SME = [f"{f}:{t}" for f in ("q4_0", "q4_0_dx")
          for t in ("sme:1vlx2vl", "sme:1vlx1vl", "sme2:1x4vl", "sme2:1x2vl")]


@pytest.fixture(scope="module")
def q4_sme_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("q4sme")
    specs = [tilegen.parse_spec(t) for t in Q4_SME]
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out, specs


@pytest.mark.parametrize("vl", VLS)
def test_sme_q4_every_svl(vl, q4_sme_lib):
    lib, specs = q4_sme_lib
    sess = _sme_guest(vl)
    for spec in specs:
        _run_q4(sess, lib, spec, vl, sme=True)
    res = sess.call("guest_calls:check_abi_of", str(lib), [s.name for s in specs])
    assert res == {s.name: [] for s in specs}


def test_sme2_q4_refused_on_sme_only(q4_sme_lib):
    lib, specs = q4_sme_lib
    only_sme = _sme_guest(256, isa_env="neon,sve,sve2,sme")
    for spec in specs:
        msg = only_sme.call("guest_calls:refused", str(lib), spec.name)
        if spec.isa == "sme2":
            assert "ArgumentError" in msg and "sme2" in msg, msg
        else:
            assert msg == "", msg


# -- KleidiAI golden vectors through the scalable kernels at VL 128 -----------------------
# At 128 bits one VL unit is 4 f32 lanes, so 1vl / 4vl panels are the vectors' nr=4 / nr=16
# layouts byte for byte: the SVE kernels must reproduce KleidiAI's dst exactly.
_GOLDEN_SPECS = {"qai8dxp4x8_qsi4c32p4x8": "q4_0_dx:sve_i8mm:8x1vl",
                 "qsi8d32p4x8_qsi4c32p4x8": "q4_0:sve_i8mm:16x1vl",
                 "qsi8d32p1x8_qsi4c32p4x8": "q4_0:sve_dotprod:1x1vl:k16",
                 "qai8dxp1x4_qsi4c32p4x4": "q4_0_dx:sve_dotprod:1x1vl",
                 "f32_f32p16x1b": "f32:sve:6x4vl"}


def _golden_spec(f) -> str | None:
    """The scalable kernel spec whose VL 128 layouts are golden vector ``f``'s, if any."""
    if not (f.name.startswith("matmul_clamp_f32_") or f.name.startswith("qsi8d32p_mm_")):
        return None
    return next((s for key, s in _GOLDEN_SPECS.items() if key in f.name), None)


def _golden_params():
    files = vector_params("*.npz", keep=_golden_spec, nargs=2)
    return [pytest.param(f, _golden_spec(f), id=f.stem) if isinstance(f, Path) else f
            for f in files]


def test_golden_vectors_cover_every_format():
    files = vector_files("*.npz", keep=_golden_spec)
    assert len(files) == 12 and len({_golden_spec(f) for f in files}) == 5   # 2 f32 + 10 q4


@pytest.mark.parametrize("path,text", _golden_params())
def test_sve_kernels_reproduce_kleidiai_vectors(path, text, tmp_path):
    z = np.load(path)
    spec = tilegen.parse_spec(text)
    lib = tmp_path / "lib"
    tilegen.build_library([spec], target="linux-aarch64-all", out_dir=lib)
    sess = guest("max", sve_vl=128)
    m, n, k = (int(z[x]) for x in ("m", "n", "k"))
    if spec.family == "f32":
        sent = np.float32(-12345.5)
        case = dict(m=m, n=n, k=k, lhs_base=np.ascontiguousarray(z["lhs"]).reshape(m, -1),
                    packed=z["rhs_packed"], dst_base=np.full((m + 2, n + 3), sent, np.float32),
                    clamp_min=float(z["clamp_min"]), clamp_max=float(z["clamp_max"]))
        out = sess.call("guest_calls:run_scalable_cases", str(lib), spec.name, [case])["outs"][0]
    else:
        sent = np.float32(-4242.25)
        case = dict(m=m, n=n, k=k, bl=int(z["bl"]), lhs_packed=z["lhs_packed"],
                    rhs_packed=z["rhs_packed"], clamp_min=float(z["clamp_min"]),
                    clamp_max=float(z["clamp_max"]), sentinel=sent)
        out = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, [case])[0]
    got = out[:m, :n]
    assert np.array_equal(got, z["dst"].reshape(m, n)), f"{np.sum(got != z['dst'].reshape(m, n))} differ"
    assert (out[m:] == sent).all() and (out[:, n:] == sent).all()
