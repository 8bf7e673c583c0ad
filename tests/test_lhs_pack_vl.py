"""VL-scaled LHS packers (the SME kernels' LHS: bf16p<vl>x2, f32p<vl>x1, f16p<vl>x2,
qai8dxp<vl>x4, qsi8d32p<vl>x4) as generated NEON code taking mr at run time.

Byte-identical to the layout objects' numpy packers under qemu at SVL 128, 512 and 2048 (mr =
units x SVL/32 rows, the row count of the SME kernels at that SVL), source rows ending at a guard
page and the packed region ending at one (no over-read, no over-write, nothing before it
touched); KleidiAI's packed SME LHS (bf16_* vectors) reproduced on the bytes it writes; and
lib.matmul through the SME kernels packs with these routines, never in numpy.
"""
from __future__ import annotations

import json
import re
import subprocess

import numpy as np
import pytest

import tilegen
from tilegen.build.library import MANIFEST_NAME
from tilegen.build.defaults import default_specs
from tilegen.build.targets import get_target
from tilegen.build.toolchain import discover
from tilegen.generator.manifest import parse_packer_spec
from tilegen.generator.packers import (VL_ROWS_MAX, VL_ROWS_MIN, PackerSpec, packer_for, render,
                                       streaming_packer_for)
from tilegen.records import SpecError
from tilegen.layout.bf16 import f32_to_bf16_rne

from conftest import SME_ON, guest, vector_files, vector_params
from test_lhs_pack_neon import (MARGIN, PREFILLS, _check, _qai8dxp_rows, _qsi8d32p_rows,
                                _rows_bytes, hot_loop, model_qai8dxp, model_qsi8d32p, tiny_rows)

SVLS = (128, 512, 2048)
F = np.float32

SPECS = [PackerSpec("bf16px2", u, 2, 1, mr_vl=True) for u in (1, 2, 4)] + [
    PackerSpec("f32p", u, 1, 1, mr_vl=True) for u in (1, 2, 4)] + [
    PackerSpec("qai8dxp", 1, 4, 1, mr_vl=True),      # q8_0:sme:1vlx4vl, q4_0_dx:sme:1vlx2vl
    PackerSpec("qsi8d32p", 1, 8, 2, mr_vl=True),     # q4_0:sme:1vlx2vl
    PackerSpec("f16px2", 1, 4, 2, mr_vl=True),       # q4_0_f16:sme2:1vlx4vl (kr 4, sr 2)
]
# the streaming twins (ZA transpose; mr = units x the guest's SVL/32 only)
SME_SPECS = [PackerSpec(fmt, u, kr, 1, mr_vl=True, isa=isa)
             for fmt, kr, isa in (("bf16px2", 2, "sme2"), ("f32p", 1, "sme")) for u in (1, 2, 4)]
SPECS += SME_SPECS
# the SME kernels' streaming twins: what lib.matmul packs with (lib.packer / pack_lhs: NEON)
SME_TWINS = {
    "bf16:sme2:2vlx2vl": "lhs_pack_bf16p2vlx2_f32_sme2",
    "f32:sme:2vlx2vl": "lhs_pack_f32p2vlx1_f32_sme",
    "f32:sme2:2vlx2vl": "lhs_pack_f32p2vlx1_f32_sme",
    "f32:sme2:1vlx4vl": "lhs_pack_f32p1vlx1_f32_sme",
}
# the SME kernels of the default build and the NEON packer each reads
SME_KERNELS = {
    "bf16:sme2:2vlx2vl": "lhs_pack_bf16p2vlx2_f32_neon",
    "f32:sme:2vlx2vl": "lhs_pack_f32p2vlx1_f32_neon",
    "f32:sme2:2vlx2vl": "lhs_pack_f32p2vlx1_f32_neon",
    "f32:sme2:1vlx4vl": "lhs_pack_f32p1vlx1_f32_neon",
    "q8_0:sme:1vlx4vl": "lhs_quant_pack_qai8dxp1vlx4_f32_neon",
    "q4_0_dx:sme:1vlx2vl": "lhs_quant_pack_qai8dxp1vlx4_f32_neon",
    "q4_0:sme:1vlx2vl": "lhs_quant_pack_qsi8d32p1vlx4_f32_neon",
    "q4_0_f16:sme2:1vlx4vl": "lhs_pack_f16p1vlx2_f32_neon",
}


def _mr(spec: PackerSpec, svl_bits: int) -> int:
    return spec.mr * svl_bits // 32


@pytest.fixture(scope="module")
def vl_lib(tmp_path_factory) -> str:
    tc = discover("elf")
    out = tmp_path_factory.mktemp("packvl")
    objs = []
    for s in SPECS:
        src = out / f"{s.name}.S"
        src.write_text(render(s, "elf"))
        obj = out / f"{s.name}.o"
        subprocess.run(tc.assemble_cmd(src, obj), check=True, capture_output=True)
        objs.append(obj)
    so = out / "libpackvl.so"
    subprocess.run(tc.link_cmd(objs, so), check=True, capture_output=True)
    return str(so)


def _sme_guest(svl: int):
    return guest("max", None, svl, dict(SME_ON))


def _case(spec, args, src, dst_size):
    return dict(name=spec.name, fmt=spec.fmt, args=args, src=src, dst_size=dst_size,
                prefills=list(PREFILLS), margin=MARGIN)


# --------------------------------------------------------------------------------------------
# inputs

_SPECIAL_BITS = np.array([
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7F80FFFF,   # NaNs (sNaN too)
    0x7F800000, 0xFF800000,                                                    # +-Inf
    0x00000001, 0x807FFFFF, 0x00400000, 0x00008000, 0x80018000,                # subnormals
    0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000, 0x3F807FFF, 0x3F808001,   # ties, near ties
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x80000000, 0x00000000, 0x3F800000,   # overflow, +-0
], np.uint32)


def _float_rows(rng, m: int, k: int, special: bool) -> np.ndarray:
    x = (rng.normal(size=(m, k)) * 10.0 ** rng.uniform(-3, 3, size=(m, 1))).astype(F)
    x[x == 0] = F(0.5)          # random inputs are non-zero (specials add zeros on purpose)
    if special:
        hit = rng.random((m, k)) < 0.3
        x.view(np.uint32)[hit] = rng.choice(_SPECIAL_BITS, size=int(hit.sum()))
    return x


def _shapes(spec: PackerSpec, mr: int, rng) -> list[tuple]:
    """(m, k, m_idx_start, row pad in bytes, bl): m not a multiple of mr, odd k, k = 1, starts at
    row-block boundaries (any row for the quantized formats), strides beyond 4k."""
    kmax = 40 if mr >= 64 else 70
    ms_any = spec.fmt in ("qai8dxp", "qsi8d32p")
    out = []
    ms_choices = [0, mr, 2 * mr] + ([1, mr - 1, mr + 3] if ms_any else [])
    ms_choices = [v for v in ms_choices if v >= 0]
    m_choices = [1, 2, mr - 1, mr, mr + 1, 2 * mr + 3] if mr <= 32 else [1, 3, mr - 1, mr + 1]
    if spec.fmt == "qsi8d32p":
        ks = [(bl, bl * j) for bl in (32, 64) for j in (1, 2)] + [(32, 96)]
    else:
        ks = [(None, k) for k in (1, 2, 3, 7, 8, 9, 16, 17, 31, 33)] + [(None, kmax)]
    for i, (bl, k) in enumerate(ks):
        m = m_choices[i % len(m_choices)] or 1
        ms = ms_choices[(i * 5 + 1) % len(ms_choices)]
        pad = [0, 4, 12, 64, 8][i % 5]
        out.append((m, k, ms, pad, bl))
    return out


def _expected(spec, mr, x, ms, bl):
    """(region from the lhs_packed pointer, written mask) from the layout's numpy packer; for
    the quantized formats the mask of real-row slots comes from the spec model, which must
    agree with the layout packer on them."""
    lay = spec.layout(bl, mr)
    if spec.fmt == "qai8dxp":
        exp = lay.pack(x, m_idx_start=ms)
        model, mask = model_qai8dxp(x, mr, spec.L, ms)
    elif spec.fmt == "qsi8d32p":
        exp = lay.pack(x[ms:], m_idx_start=ms)
        model, mask = model_qsi8d32p(x, x.shape[0] - ms, bl, mr, spec.L, ms, spec.rounding)
    else:
        exp = lay.pack(x)
        return exp, np.ones_like(exp)       # whole row blocks written, padding rows 0
    assert exp.size == model.size and np.array_equal(exp[mask == 1], model[mask == 1])
    assert not exp[mask == 0].any()
    return exp, mask


def _cases(spec, mr, rng):
    cases, refs = [], []
    for m, k, ms, pad, bl in _shapes(spec, mr, rng):
        stride = 4 * k + pad
        if spec.fmt == "qsi8d32p":
            x = _qsi8d32p_rows(rng, ms + m, k, bl)
            src = _rows_bytes(x, stride)           # lhs = row 0 of the whole matrix
            args = dict(m=m, k=k, bl=bl, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                        lhs_stride=stride)
        else:
            x = (_qai8dxp_rows(rng, m, k) if spec.fmt == "qai8dxp"
                 else _float_rows(rng, m, k, special=spec.fmt != "f32p" or m % 2 == 1))
            src = _rows_bytes(x, stride)           # lhs = the first row to pack
            args = dict(m=m, k=k, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                        lhs_stride=stride)
        exp, mask = _expected(spec, mr, x, ms, bl)
        cases.append(_case(spec, args, src, exp.size))
        refs.append((exp, mask, f"mr={mr} m={m} k={k} bl={bl} ms={ms} stride={stride}"))
    return cases, refs


# --------------------------------------------------------------------------------------------
# execution: numpy layout packers, golden vectors, refusals

@pytest.mark.parametrize("svl", SVLS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_matches_layout_packer(spec, svl, vl_lib):
    mr = _mr(spec, svl)
    rng = np.random.default_rng(sum(map(ord, spec.name)) + svl)
    cases, refs = _cases(spec, mr, rng)
    outs = _sme_guest(svl).call("guest_pack:run_cases", vl_lib, cases)
    for (exp, mask, what), o in zip(refs, outs):
        _check(o, exp, mask, f"{spec.name} svl={svl} {what}")


def test_tiny_activations(vl_lib):
    """The VL-scaled qai8dxp and qsi8d32p packers at the quantisers' small edges (issue #30
    item 2; test_lhs_pack_neon.TINY_KINDS: 1e-38, subnormals, a few ulps, +-0, either side of
    127/FLT_MAX and 255/FLT_MAX, a normal control) at SVL 512, m_idx_start 0 and 3: the numpy
    layout packer's bytes."""
    svl, rng = 512, np.random.default_rng(3039)
    cases, refs = [], []
    for spec in (s for s in SPECS if s.fmt in ("qai8dxp", "qsi8d32p")):
        mr = _mr(spec, svl)
        x = tiny_rows(rng, 96)
        for ms in (0, 3):
            if spec.fmt == "qsi8d32p":
                xs = np.concatenate([np.zeros((ms, 96), F), x])
                args = dict(m=len(x), k=96, bl=32, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                            lhs_stride=4 * 96)
                exp, mask = _expected(spec, mr, xs, ms, 32)
                src = _rows_bytes(xs, 4 * 96)
            else:
                args = dict(m=len(x), k=96, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                            lhs_stride=4 * 96)
                exp, mask = _expected(spec, mr, x, ms, None)
                src = _rows_bytes(x, 4 * 96)
            cases.append(_case(spec, args, src, exp.size))
            refs.append((exp, mask, f"{spec.name} m_idx_start={ms}"))
    assert len(cases) == 4
    outs = _sme_guest(svl).call("guest_pack:run_cases", vl_lib, cases)
    for (exp, mask, what), o in zip(refs, outs):
        _check(o, exp, mask, f"tiny activations svl={svl} {what}")


def test_bf16_specials_exact():
    """The numpy reference itself on the special values (the asm is compared against it)."""
    b = f32_to_bf16_rne(_SPECIAL_BITS.view(F)).astype(np.uint32)
    want = {0x7FC00000: 0x7FC0, 0xFFC00000: 0xFFC0, 0x7F800001: 0x7FC0, 0xFF800001: 0xFFC0,
            0x7F800000: 0x7F80, 0x00000001: 0x0000, 0x807FFFFF: 0x8080, 0x3F808000: 0x3F80,
            0x3F818000: 0x3F82, 0x3F808001: 0x3F81, 0x7F7FFFFF: 0x7F80, 0x7F7F8000: 0x7F80,
            0x80000000: 0x8000}
    for bits, v in want.items():
        assert b[list(_SPECIAL_BITS).index(bits)] == v, hex(bits)


def _has_sme_lhs(p) -> bool:
    return "sme2_mopa__lhs_packed" in np.load(p).files


GOLDEN = vector_params("bf16_*.npz", keep=_has_sme_lhs, minimum=3)


def test_golden_vectors_found():
    files = vector_files("bf16_*.npz", keep=_has_sme_lhs, minimum=3)
    svls = {int(np.load(p)["sme2_mopa__svl_bits"]) for p in files}
    assert {128, 256, 512} <= svls, (files, svls)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.stem)
def test_reproduces_kleidiai_lhs(path, vl_lib):
    """kai_run_lhs_pack_bf16p2vlx2_f32_sme's bytes (where it writes) from the generated
    packer at the vector's SVL, m_idx_start = 0, lhs_stride = 4k; the layout packer too."""
    z = np.load(path)
    svl = int(z["sme2_mopa__svl_bits"])
    spec = PackerSpec("bf16px2", 2, 2, 1, mr_vl=True)
    mr = int(z["sme2_mopa__mr"])
    assert mr == _mr(spec, svl)
    x = z["lhs_f32"]
    m, k = x.shape
    exp, mask = z["sme2_mopa__lhs_packed"], z["sme2_mopa__lhs_packed_written"].astype(np.uint8)
    assert exp.size == spec.packed_size(m, k, mr=mr) == int(z["sme2_mopa__lhs_packed_size"])
    lay_bytes = spec.layout(None, mr).pack(x)
    assert np.array_equal(lay_bytes[mask == 1], exp[mask == 1])
    case = _case(spec, dict(m=m, k=k, mr=mr, kr=2, sr=1, m_idx_start=0, lhs_stride=4 * k),
                 _rows_bytes(x, 4 * k), exp.size)
    (o,) = _sme_guest(svl).call("guest_pack:run_cases", vl_lib, [case])
    _check(o, exp, mask, f"{path.name}")
    _check(o, lay_bytes, np.ones_like(lay_bytes), f"{path.name} (all bytes vs layout)")


def test_nothing_written_on_bad_arguments(vl_lib):
    rng = np.random.default_rng(11)
    cases, what = [], []
    for spec in SPECS:
        unit, limit = spec.vl_rows[0], spec.vl_rows[-1]
        k = 64
        x = _float_rows(rng, 9, k, special=False)
        src = _rows_bytes(x, 4 * k)
        base = dict(m=9, k=k, mr=unit, kr=spec.kr, sr=spec.sr, m_idx_start=0, lhs_stride=4 * k)
        if spec.fmt == "qsi8d32p":
            base["bl"] = 32
        bad = [{"mr": 0}, {"mr": unit + 1}, {"mr": unit // 2}, {"mr": limit + unit},
               {"mr": 2 * limit}, {"m": 0}, {"k": 0}, {"kr": spec.kr * 2}, {"sr": 0}]
        if spec.fmt in ("bf16px2", "f32p", "f16px2"):
            bad += [{"m_idx_start": 1}, {"m_idx_start": unit + 1}, {"sr": 3 - spec.sr}]
        for b in bad:
            cases.append(_case(spec, {**base, **b}, src, 512))
            what.append((spec.name, b))
    outs = guest("max").call("guest_pack:run_cases", vl_lib, cases)
    for w, o in zip(what, outs):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), w


def test_streaming_twin_packs_the_running_svl_only(vl_lib):
    """A streaming packer transposes through ZA tiles of SVL/32 rows: at SVL 512 a call with the
    row count of another SVL (valid for the NEON packer) writes nothing."""
    rng = np.random.default_rng(5)
    cases, what = [], []
    for spec in SME_SPECS:
        x = _float_rows(rng, 9, 40, special=False)
        for svl in (128, 256, 1024, 2048):
            args = dict(m=9, k=40, mr=_mr(spec, svl), kr=spec.kr, sr=spec.sr, m_idx_start=0,
                        lhs_stride=160)
            cases.append(_case(spec, args, _rows_bytes(x, 160), 4096))
            what.append((spec.name, svl))
    outs = _sme_guest(512).call("guest_pack:run_cases", vl_lib, cases)
    for w, o in zip(what, outs):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), w


# --------------------------------------------------------------------------------------------
# the runtime: default build, lib.packer, matmul through the SME kernels

def test_default_build_brings_the_packers():
    """Every default target with SME kernels gets the VL packer of each (packer_for is what
    build_library adds); the SME kernel specs name the packers above."""
    for spec_text, name in SME_KERNELS.items():
        p = packer_for(tilegen.parse_spec(spec_text))
        assert p is not None and p.mr_vl and p.name == name, (spec_text, p)
        assert parse_packer_spec(p.spec_string) == p
        twin = streaming_packer_for(tilegen.parse_spec(spec_text))
        assert (twin and twin.name) == SME_TWINS.get(spec_text), spec_text
        if twin is not None:
            assert twin.streaming and (twin.fmt, twin.mr, twin.kr, twin.sr) == (p.fmt, p.mr, p.kr, p.sr)
            assert parse_packer_spec(twin.spec_string) == twin
    assert streaming_packer_for(tilegen.parse_spec("f32:neon:6x16")) is None
    assert streaming_packer_for(tilegen.parse_spec("bf16:bf16:8x12")) is None
    for tgt in ("linux-aarch64-all", "apple-m4"):
        specs = default_specs(get_target(tgt))
        sme = {s.spec_string for s in specs if s.spec_string in SME_KERNELS}
        assert sme, tgt
        names = {packer_for(s).name for s in specs if packer_for(s) is not None}
        assert {SME_KERNELS[s] for s in sme} <= names, tgt


E2E = [  # (kernels of one library, weight kind) -- one SME kernel per library, so it is picked
    (["bf16:sme2:2vlx2vl"], "bf16"),
    (["f32:sme:2vlx2vl"], "f32"),
    (["f32:sme2:2vlx2vl"], "f32"),
    (["f32:sme2:1vlx4vl"], "f32"),
    (["q8_0:sme:1vlx4vl"], "q8_0"),
    (["q4_0:sme:1vlx2vl"], "q4_0"),
    (["q4_0_f16:sme2:1vlx4vl"], "q4_0"),
    (["q4_0_dx:sme:1vlx2vl"], "q4_0_dx"),
]


@pytest.mark.parametrize("svl", (128, 512))
@pytest.mark.parametrize("kernels,kind", E2E, ids=lambda v: v if isinstance(v, str) else v[0])
def test_matmul_packs_with_the_generated_packer(kernels, kind, svl, tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    tilegen.build_library(kernels, target="linux-aarch64-all", out_dir=out)
    spec = tilegen.parse_spec(kernels[0])
    neon = SME_KERNELS[kernels[0]]
    twin = streaming_packer_for(spec)
    # the streaming twin where the format has one, from the SVL where it is the cheaper
    name = twin.name if twin is not None and svl >= twin.streaming_from_svl else neon
    man = json.loads((out / MANIFEST_NAME).read_text())
    assert {name, neon} <= {p["name"] for p in man["packers"]}
    rng = np.random.default_rng(svl + len(kind))
    mr = spec.mr * svl // 32
    m, n, k = 2 * mr + 3, 37, 64
    x = rng.normal(size=(m, k)).astype(F)
    w = rng.normal(size=(n, k)).astype(F)
    res = _sme_guest(svl).call("guest_pack:ops_packers", str(out), kind, w, x)
    assert res["spec"] == kernels[0], res["kernel"]
    assert res["mr"] == mr
    assert res["packer"] == (name, mr) and res["found"] == neon     # lib.packer: NEON
    assert res["used"] and {u for u in res["used"]} == {(name, mr)}, res["used"]
    for o in res["outs"]:
        assert np.array_equal(o.view(np.uint32), res["ref"].view(np.uint32)), kernels
    assert res["pack_lhs_same"] and res["call_mr_same"]
    assert res["unbound"].startswith("ArgumentError") and "mr" in res["unbound"], res["unbound"]
    assert _sme_guest(svl).call("guest_calls:svcr_now", str(out)) == 0     # streaming left


# --------------------------------------------------------------------------------------------
# specs, names, rendering

def test_spec_validation_and_names():
    s = PackerSpec("bf16px2", 2, 2, 1, mr_vl=True)
    assert s.name == "lhs_pack_bf16p2vlx2_f32_neon" and s.spec_string == "lhs:bf16px2:2vlx2:k2:s1"
    assert s.vl_rows == tuple(range(8, 129, 8))
    assert PackerSpec("f32p", 2, 1, 1, mr_vl=True).name == "lhs_pack_f32p2vlx1_f32_neon"
    assert PackerSpec("qai8dxp", 1, 4, 1, mr_vl=True).name == \
        "lhs_quant_pack_qai8dxp1vlx4_f32_neon"
    assert PackerSpec("qsi8d32p", 1, 8, 2, mr_vl=True).name == \
        "lhs_quant_pack_qsi8d32p1vlx4_f32_neon"
    assert [n for n, _ in s.signature] == ["m", "k", "mr", "kr", "sr", "m_idx_start", "lhs",
                                           "lhs_stride", "lhs_packed"]
    for p in SPECS:
        assert parse_packer_spec(p.spec_string) == p
        assert p.vl_rows[0] == VL_ROWS_MIN * p.mr and p.vl_rows[-1] == VL_ROWS_MAX * p.mr
        assert p.accepts_mr(p.vl_rows[1]) and not p.accepts_mr(p.vl_rows[0] + 1)
    with pytest.raises(SpecError, match="VL units"):
        PackerSpec("bf16px2", 8, 2, 1)
    with pytest.raises(SpecError, match="VL units"):
        PackerSpec("f32p", 8, 1, 1)
    with pytest.raises(SpecError, match="compile-time mr"):
        PackerSpec("bf16px4", 2, 4, 1, mr_vl=True)
    with pytest.raises(SpecError, match="VL units, got mr=3vl"):
        PackerSpec("qai8dxp", 3, 4, 1, mr_vl=True)
    with pytest.raises(SpecError):
        PackerSpec("bf16px2", 2, 4, 1, mr_vl=True)
    with pytest.raises(SpecError):
        PackerSpec("f32p", 2, 2, 1, mr_vl=True)
    with pytest.raises(SpecError, match="not mr=12"):
        s.layout(None, 12)
    assert s.packed_size(9, 3, mr=8) == 2 * 8 * 4 * 2


_REG = re.compile(r"\b([xwvqdsbh])(\d+)\b")


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_render_both_formats(spec, tmp_path):
    for fmt, target in (("elf", "--target=aarch64-linux-gnu"),
                        ("macho", "--target=arm64-apple-macos")):
        text = render(spec, fmt)
        assert text.count("tilegen:hot-loop-begin") == 1 and text.count("tilegen:hot-loop-end") == 1
        sym = spec.symbol(fmt)
        assert f".globl {sym}\n" in text
        src = tmp_path / f"{spec.name}.{fmt}.S"
        src.write_text(text)
        p = subprocess.run(["clang-19", target, "-c", str(src), "-o", str(src) + ".o"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        body = text.split(f"{sym}:\n", 1)[1]
        if spec.streaming:      # d8-d15 saved around smstart/smstop (it clears the vector file)
            saves = [ln.strip() for ln in body.splitlines() if re.match(r"\s+(stp|ldp) d", ln)]
            ins = [ln.split("//")[0].strip() for ln in body.splitlines()]
            assert len(saves) == 8 and ins.count("smstart") == ins.count("smstop") == 1, saves
            assert ins.index("smstop") > ins.index("smstart")
            body = "\n".join(ln for ln in body.splitlines()
                              if not re.match(r"\s+(stp|ldp) d", ln))
        for kind, num in _REG.findall(body):
            n = int(num)
            assert not (kind in "xw" and 18 <= n <= 30), f"{kind}{n} used"
            assert not (kind in "vqdsbh" and 8 <= n <= 15), f"{kind}{n} used (callee-saved)"
        # mr is the run-time argument: no immediate of a row count of the accepted range
        # other than the bounds of its check
        if spec.streaming:      # mr must be units x SVL/32 of the running CPU
            assert f"rdsvl x9, #{spec.mr}\n" in text
        else:
            assert f"#{spec.vl_rows[-1]}\n" in text
    # 4 rows x 8 values per iteration: 4 loads, (bf16: 8 x to_bf16 (8 each), 4 uzp2), a 4 x 4
    # transpose of 4-byte granules per 4 chunks (8 trn), one 16-byte store per chunk of 4 rows
    loop = hot_loop(render(spec))
    if spec.streaming:
        # 4 rows: per row and chunk of the pass (4 / units chunks) one ZA-slice load (f32p) or
        # a two-vector load, BFCVT and MOVA into the slice (bf16p), then the row step; the
        # slice index and the counter
        chunks, per_chunk = 4 // spec.mr, 3 if spec.fmt == "bf16px2" else 1
        assert len(loop) == 4 * (chunks * per_chunk + 1) + 4, loop
        assert sum(i.startswith("ld1w {z") for i in loop) == 4 * chunks
    elif spec.fmt == "bf16px2":
        assert len(loop) == 4 + 64 + 4 + 8 + 4 + 2, loop
        assert sum(i.startswith("st1 {v") and ".4s}" in i for i in loop) == 4
    elif spec.fmt == "f32p":
        assert len(loop) == 4 + 16 + 8 + 2, loop
        assert sum(i.startswith("st1 {v") and ".4s}" in i for i in loop) == 8


def test_fixed_mr_renders_unchanged_by_vl_variant():
    """The fixed-mr packers of the same formats do not read the run-time-mr parts."""
    for fixed, scaled in ((PackerSpec("qai8dxp", 4, 4, 1), PackerSpec("qai8dxp", 1, 4, 1, mr_vl=True)),
                          (PackerSpec("qsi8d32p", 4, 8, 2), PackerSpec("qsi8d32p", 1, 8, 2, mr_vl=True))):
        a, b = render(fixed), render(scaled)
        assert "cmp x2, #4" in a or "cmp x3, #4" in a
        assert "tst x2, #3" in b or "tst x3, #3" in b


def test_streaming_threshold_is_the_static_models():
    """packer_sme_from_svl (where the runtime switches to the streaming twin) is the smallest
    SVL at which the twin takes fewer instructions per packed element than the NEON packer,
    and it stays cheaper above (tilegen.analysis.sme.packer_mix, every unit count)."""
    from tilegen.analysis.sme import packer_mix
    for twin in SME_SPECS:
        neon = PackerSpec(twin.fmt, twin.mr, twin.kr, twin.sr, mr_vl=True)
        cheaper = [svl for svl in (128, 256, 512, 1024, 2048)
                   if packer_mix(twin, svl).per_element < packer_mix(neon, svl).per_element]
        assert cheaper and cheaper[0] == twin.streaming_from_svl, (twin.name, cheaper)
        assert cheaper == [s for s in (128, 256, 512, 1024, 2048) if s >= cheaper[0]], twin.name


@pytest.mark.parametrize("spec", [s for s in SPECS if s not in SME_SPECS], ids=lambda s: s.name)
def test_neon_packers_on_the_baseline_cpu(spec, vl_lib):
    """The runtime-mr packers are plain NEON (they run outside streaming mode): the same bytes
    on cortex-a53, the baseline model, at the row count of SVL 512."""
    mr = _mr(spec, 512)
    rng = np.random.default_rng(sum(map(ord, spec.name)) + 53)
    cases, refs = _cases(spec, mr, rng)
    outs = guest("cortex-a53").call("guest_pack:run_cases", vl_lib, cases)
    for (exp, mask, what), o in zip(refs, outs):
        _check(o, exp, mask, f"{spec.name} on cortex-a53 {what}")
