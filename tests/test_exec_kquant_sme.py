"""K-quant SME2 kernels (q4_K: q8kp x q4kp, q5_K: q8kp x q5kp, q6_K: q8kp x q6kp, iq4_xs: q8kp x iq4xsp, all at kr = 4; the int16-SMOPA
gemms and the ZA-array SDOT gemvs) under emulation at SVL 128 / 256 / 512 / 2048 (qemu
``max``): bit-exact against tilegen.reference.kquant (``matmul_blocks``: from the activations
and the ggml blocks, not the packed bytes) on random valid ggml blocks, m and n not
multiples of the tile, k of 1, 2 and 3 super-blocks (q5_K: and 4, at SVL 1024 too), sentinels
around dst untouched, SVCR clear after the call; guard pages around every buffer at SVL 512."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families.q4_k import Q4KP, matmul_q8kp_q4kp, random_q4_k
from tilegen.families.q5_k import Q5KP, random_q5_k
from tilegen.families.q6_k import Q6KP, matmul_q8kp_q6kp, random_q6_k
from tilegen.families.iq4_xs import IQ4XSP, random_iq4_xs
from tilegen.layout.kquant import Q8KP
from tilegen.families import rhs_layout_class
from tilegen.reference.kquant import matmul_blocks

from conftest import SME_ON, guest

GEMMS = ("q4_K:sme2:1vlx2vl", "q4_K:sme2:1vlx1vl", "q4_K:sme2:4vlx1vl", "q4_K:sme2:4vlx1vl:i16")
GEMVS = ("q4_K:sme2:1x2vl", "q4_K:sme2:1x4vl", "q4_K:sme2:1x1vl")
Q6_SPECS = ("q6_K:sme2:1vlx1vl", "q6_K:sme2:1vlx2vl", "q6_K:sme2:1vlx4vl", "q6_K:sme2:4vlx1vl",
            "q6_K:sme2:4vlx1vl:i16", "q6_K:sme2:1x2vl", "q6_K:sme2:1x4vl")
IQ4XS_SPECS = ("iq4_xs:sme2:1vlx1vl", "iq4_xs:sme2:1vlx2vl", "iq4_xs:sme2:1vlx4vl",
               "iq4_xs:sme2:4vlx1vl", "iq4_xs:sme2:4vlx1vl:i16", "iq4_xs:sme2:1x2vl",
               "iq4_xs:sme2:1x4vl", "iq4_xs:sme2:1x1vl")
Q5_SPECS = ("q5_K:sme2:1vlx1vl", "q5_K:sme2:1vlx2vl", "q5_K:sme2:4vlx1vl",
            "q5_K:sme2:4vlx1vl:i16", "q5_K:sme2:1x2vl",
            "q5_K:sme2:1x4vl")
ALL_SPECS = [tilegen.parse_spec(s) for s in GEMMS + GEMVS + Q6_SPECS + IQ4XS_SPECS + Q5_SPECS]
# family -> (random ggml blocks, RHS layout)
KINDS = {"q4_K": (random_q4_k, Q4KP), "q5_K": (random_q5_k, Q5KP), "q6_K": (random_q6_k, Q6KP),
         "iq4_xs": (random_iq4_xs, IQ4XSP)}
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
SVLS = (128, 256, 512, 2048)
Q5_SVLS = (128, 256, 512, 1024, 2048)


@pytest.fixture(scope="module")
def kq_sme_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kqsme")
    tilegen.build_library(ALL_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _shapes(mr: int, nr: int, gemv: bool, ks=(256, 512, 256, 768, 512)) -> list[tuple[int, int, int]]:
    """m, n off the tile (and past one tile), k = 256, 512, 768 (or ``ks``)."""
    ms = (1, 1, 2, 1, 3) if gemv else (1, mr, mr + 1, 2 * mr + 3, mr - 1 or 1)
    ns = (1, nr, nr + 3, 2 * nr - 1, 2 * nr + 5)
    return list(zip(ms, ns, ks))


def _cases(family: str, mr: int, nr: int, shapes, seed: int, lhs_layout=Q8KP, rhs_layout=None):
    """The cases on ``rhs_layout`` (the spec's RHS layout class; default the family's)."""
    rand, family_layout = KINDS[family]
    rhs_layout = rhs_layout or family_layout
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        # activations of mixed magnitudes per row (each SB has its own d)
        x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 8.0, size=(m, 1))).astype(np.float32)
        raw = rand(n, k, seed + i)
        lhs = lhs_layout(mr, 4).pack(x)
        rhs = rhs_layout(nr, 4).pack_from_ggml(raw, n, k)
        free = matmul_blocks(rhs_layout_class(family), x, raw, n, -FMAX, FMAX)
        lo, hi = -FMAX, FMAX
        if i % 2 and free.size > 1:
            lo, hi = (float(np.float32(q)) for q in np.quantile(free, [0.2, 0.8]))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=lo,
                          clamp_max=hi, sentinel=SENTINEL))
        refs.append(matmul_blocks(rhs_layout_class(family), x, raw, n, lo, hi))
    return cases, refs


def _check_kernel(spec, vl, lib, ks=(256, 512, 256, 768, 512)):
    sess = guest("max", None, vl, SME_ON)
    info = sess.call("guest_calls:vl_info", str(lib), spec.name)
    assert info["runnable"], info
    mr, nr = info["mr"], info["nr"]
    assert nr == spec.nr * vl // 32 and mr == (1 if spec.is_gemv else spec.mr * vl // 32)
    cases, refs = _cases(spec.family, mr, nr, _shapes(mr, nr, spec.is_gemv, ks), vl + spec.nr,
                         spec.lhs_layout_class, spec.rhs_layout_class)
    outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        where = f"{spec.name} svl={vl} m={m} n={n} k={k}"
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
            f"{where}: wrote outside dst"
        np.testing.assert_array_equal(out[:m, :n].view(np.uint32), exact.view(np.uint32),
                                      err_msg=where)
    assert sess.call("guest_calls:svcr_now", str(lib)) == 0


@pytest.mark.parametrize("vl", SVLS)
@pytest.mark.parametrize("spec", ALL_SPECS[:-len(Q5_SPECS)], ids=lambda s: s.spec_string)
def test_kquant_sme2_kernel(spec, vl, kq_sme_lib):
    _check_kernel(spec, vl, kq_sme_lib)


@pytest.mark.parametrize("vl", Q5_SVLS)
@pytest.mark.parametrize("spec", ALL_SPECS[-len(Q5_SPECS):], ids=lambda s: s.spec_string)
def test_q5k_sme2_kernel(spec, vl, kq_sme_lib):
    """q5_K's SME2 kernels at SVL 128-2048, k up to 4 super-blocks (4 quarters each)."""
    _check_kernel(spec, vl, kq_sme_lib, ks=(256, 512, 768, 1024, 512))


def test_kquant_sme2_refusals():
    """Tiles the strategies cannot serve are refused with the rule."""
    for text, words in (("q4_K:sme2:1vlx4vl", "1vlx1vl or 1vlx2vl"),
                        ("q4_K:sme2:2vlx1vl", "1vlx1vl or 1vlx2vl"),
                        ("q4_K:sme2:1x3vl", "1x1vl, 1x2vl or 1x4vl"),
                        ("q4_K:sme2:4x2vl", "1 x nu vl"),
                        ("q4_K:sme2:1vlx2vl:k8:s2", "kr = 4"),
                        ("q6_K:sme2:1vlx3vl", "1vlx1vl, 1vlx2vl or 1vlx4vl"),
                        ("q6_K:sme2:2vlx1vl", "or 4vlx1vl"),
                        ("q6_K:sme2:4vlx2vl", "or 4vlx1vl"),
                        ("q6_K:sme2:1x1vl", "1x2vl or 1x4vl"),
                        ("q6_K:sme2:1vlx2vl:k16:s2", "kr = 4"),
                        ("iq4_xs:sme2:1vlx3vl", "1vlx1vl, 1vlx2vl or 1vlx4vl"),
                        ("iq4_xs:sme2:2vlx1vl", "1vlx1vl, 1vlx2vl or 1vlx4vl"),
                        ("iq4_xs:sme2:1x3vl", "1x1vl, 1x2vl or 1x4vl"),
                        ("iq4_xs:sme2:1vlx2vl:k8:s2", "kr = 4"),
                        ("q5_K:sme2:1vlx4vl", "1vlx1vl or 1vlx2vl"),
                        ("q5_K:sme2:2vlx1vl", "1vlx1vl or 1vlx2vl"),
                        ("q5_K:sme2:1x3vl", "1x2vl or 1x4vl"),
                        ("q5_K:sme2:4x2vl", "1 x nu vl"),
                        ("q5_K:sme2:1vlx2vl:k8:s2", "kr = 4"),
                        ("q4_K:sme2:1vlx2vl:i16", "tiles 4vlx1vl, not 1vlx2vl"),
                        ("q4_K:sme2:1x2vl:i16", "tiles 4vlx1vl, not 1x2vl"),
                        ("q6_K:sme2:1vlx2vl:i16", "tiles 4vlx1vl, not 1vlx2vl"),
                        ("q4_K:i8mm:8x4:i16", "no q4_K i8mm kernel")):
        with pytest.raises(tilegen.SpecError, match=words):
            tilegen.parse_spec(text)


# every kernel at SVL 512; the 4vl x 1vl gemms (four ZA tiles of row groups) at SVL 128 too
GUARD_RUNS = ([(s, 512) for s in ALL_SPECS]
              + [(s, 128) for s in ALL_SPECS if (s.mr, s.nr) == (4, 1) and s.mr_vl])


@pytest.mark.parametrize("spec,vl", GUARD_RUNS, ids=lambda p: getattr(p, "spec_string", p))
def test_kquant_sme2_guard_pages(spec, vl, kq_sme_lib):
    """Every buffer (packed LHS, packed RHS, dst with a row stride) against a guard page at
    either end: no access outside them (the whole-vector loads of scales, bsums and mins stay
    inside their super-block records), results bit-exact.  The 4vl x 1vl gemms also take m
    past two row groups, one tile group partly filled, k of 3 super-blocks."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    sess = guest("max", None, vl, SME_ON)
    info = sess.call("guest_calls:vl_info", str(kq_sme_lib), spec.name)
    mr, nr = info["mr"], info["nr"]
    shapes = [(1, 1, 256), (mr, nr, 512), (mr + 1, nr + 3, 256), (3, 2 * nr - 1, 256)]
    if (spec.mr, spec.nr) == (4, 1):
        shapes.append((mr + mr // 4 + 1, nr - 1, 768))
    cases, refs = _cases(spec.family, mr, nr, shapes, 7 + spec.nr, spec.lhs_layout_class,
                         spec.rhs_layout_class)
    for i, c in enumerate(cases):
        c.update(sentinel=GUARD_SENTINEL, dst_stride=c["n"] + i % 3)
    outs = sess.call("guest_pack:guarded_q4_cases", str(kq_sme_lib), spec.name, cases,
                     PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


I16_GEMMS = ("q4_K:sme2:4vlx1vl:i16", "iq4_xs:sme2:4vlx1vl:i16", "q5_K:sme2:4vlx1vl:i16",
             "q6_K:sme2:4vlx1vl:i16")


@pytest.fixture(scope="module")
def kq_i16_lib(tmp_path_factory) -> Path:
    """The :i16 gemms alone: the runtime's only kernels of their kinds."""
    out = tmp_path_factory.mktemp("kqi16")
    tilegen.build_library(list(I16_GEMMS), target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("vl", (128, 512))
@pytest.mark.parametrize("text", I16_GEMMS)
def test_i16_gemm_end_to_end(text, vl, kq_i16_lib):
    """Issue #34 item 3: lib.matmul on an :i16 gemm packs its LHS through its layout object
    (q8ki16p, numpy: no generated packer) and runs it, for every m (no gemv in the library),
    bit-exact with the family's reference at 1 and 3 threads, and a plan of it likewise."""
    spec = tilegen.parse_spec(text)
    rand, _ = KINDS[spec.family]
    rng = np.random.default_rng(vl)
    mr = 4 * vl // 32
    n, k = vl // 32 * 3 + 5, 512
    x = (rng.normal(size=(2 * mr + 3, k)) * rng.uniform(0.1, 8.0, size=(2 * mr + 3, 1))
         ).astype(np.float32)
    raw = rand(n, k, vl)
    free = matmul_blocks(rhs_layout_class(spec.family), x, raw, n, -FMAX, FMAX)
    lo, hi = (float(np.float32(q)) for q in np.quantile(free, [0.1, 0.9]))
    out = guest("max", None, vl, SME_ON).call("guest_kquant:runtime_only", str(kq_i16_lib),
                                               spec.family, raw, n, k, x, (lo, hi))
    assert len(out) == 4
    for m, r in out.items():
        want = matmul_blocks(rhs_layout_class(spec.family), x[:m], raw, n, lo, hi)
        assert r["kernel"] == spec.name and r["lhs"] == f"q8ki16p{mr}x2", (m, r["kernel"], r["lhs"])
        for key in ("y", "y1", "plan"):
            assert not isinstance(r[key], str), (m, key, r[key])
            np.testing.assert_array_equal(r[key].view(np.uint32), want.view(np.uint32),
                                          err_msg=f"{spec.name} svl={vl} m={m} {key}")


def test_lib_pack_lhs_q8ki16p_is_the_layout_packer(kq_i16_lib):
    """lib.pack_lhs on q8ki16p, the :i16 gemms' LHS (no generated packer): the layout object's
    numpy packer, bytes equal to tilegen.pack_lhs, for m not a multiple of mr, m_idx_start
    inside and past the first row block, both SVL-128/512 row counts (16, 64); a rounding
    option refused (q8ki16p's conversion is fixed), as a geometry the format does not take.
    (Before: ArgumentError "no q8ki16p packer ... in <lib>", the runtime looked up generated
    packers only.)"""
    rng = np.random.default_rng(34)
    k = 512
    x = (rng.normal(size=(70, k)) * rng.uniform(0.1, 8.0, size=(70, 1))).astype(np.float32)
    cases = [(m, {"mr": mr, "kr": 4, "sr": 2, "m_idx_start": start})
             for mr in (16, 64) for m, start in ((1, 0), (mr - 3, 0), (mr + 5, 0), (7, 3),
                                                 (mr + 2, mr + 1))]
    bad = [(5, {"mr": 16, "kr": 4, "sr": 2, "rounding": "even"}),
           (5, {"mr": 16, "kr": 4, "sr": 1}),
           (5, {"mr": 16, "kr": 4, "sr": 2, "m_idx_start": -1})]
    outs = guest("max", None, 128, SME_ON).call("guest_kquant:lib_pack_lhs_cases",
                                                str(kq_i16_lib), "q8ki16p", x, cases + bad)
    for (m, kw), got in zip(cases, outs):
        assert not isinstance(got, str), (m, kw, got)
        want = tilegen.pack_lhs("q8ki16p", x[:m], **kw)
        np.testing.assert_array_equal(got, want, err_msg=f"m={m} {kw}")
    errs = outs[len(cases):]
    assert errs[0].startswith("ArgumentError") and "rounding" in errs[0], errs[0]
    assert errs[1].startswith("ArgumentError") and "sr" in errs[1], errs[1]
    assert errs[2].startswith("ArgumentError") and "m_idx_start" in errs[2], errs[2]


@pytest.mark.parametrize("spec", ("q4_K:sme2:4vlx1vl", "iq4_xs:sme2:4vlx1vl", "q5_K:sme2:4vlx1vl",
                                  "q6_K:sme2:4vlx1vl"))
def test_kquant_sme2_rows_gemm_is_bound_by_outer_products(spec):
    """Issue #34 item 3 on the M4 model (tilegen.analysis.sme, SVL 512): the 4vl x 1vl gemms
    decode the weights once for four ZA tiles, so their int16 SMOPA bind, within 1.3x of the
    floor (the hot loop's SMOPA over the super-block at the table's cycles), at over 3x the
    MACs per cycle of the 1vl x 2vl gemm.  (q5_K on q5kp's byte decode: z.int bound, 1.86x the
    floor; on q5kps, LUTI4 + predicated ADD + one SQDMULH: 1.13x.)"""
    from tilegen.analysis.sme import M4_UNITS, sme_report
    r = sme_report(spec, block_svl=512)
    floor = 8 * r.loop.mac_insns * M4_UNITS["mopa.i16"].cycles
    assert r.unit.binding == "mopa.i16", r.unit.binding
    assert r.unit.bound <= 1.3 * floor, (r.unit.bound, floor)
    old = sme_report(spec.replace("4vlx1vl", "1vlx2vl"), block_svl=512)
    assert r.block_macs_at_svl / r.unit.bound > 3 * old.block_macs_at_svl / old.unit.bound


def _i8mm_gemms(family: str) -> list:
    """The family's NEON i8mm gemms: the default 8x4 and every i8mm gemm of a tuned preset
    (q6_K: 32x4 on the Neoverse presets)."""
    from tilegen.build.targets import TARGETS
    from tilegen.build.tuned import tuned_specs, tuned_targets
    tuned = {s.spec_string: s for t in tuned_targets() for s in tuned_specs(TARGETS[t])
             if s.family == family and s.isa == "i8mm" and not s.is_gemv}
    return [tilegen.parse_spec(f"{family}:i8mm:8x4")] + sorted(tuned.values(),
                                                              key=lambda s: s.spec_string)


def test_q6k_neon_targets_include_the_tuned_tile():
    """The i16 targets' NEON side for q6_K is its tuned presets' 32x4 (11.52 MACs per
    instruction at SVL 128), not only the default 8x4 (9.81)."""
    assert [s.spec_string for s in _i8mm_gemms("q6_K")] == ["q6_K:i8mm:8x4", "q6_K:i8mm:32x4"]


@pytest.mark.parametrize("text", I16_GEMMS)
def test_i16_gemm_meets_both_targets(text):
    """Issue #34 item 3 on the static count and the M4 model: the :i16 gemm (LHS by LD1H {4
    vectors}, no LD1SB) gives at least the MACs per instruction of the family's NEON i8mm gemms
    (8x4 and the tuned presets' tiles: q6_K's 32x4) per super-block at SVL 128, where the q8kp
    4vl x 1vl does not, and stays bound by its int16 SMOPA within 1.3x of its floor at SVL 512
    (q5_K's on its own packing q5kps)."""
    from tilegen.analysis.sme import M4_UNITS, sme_report
    spec = tilegen.parse_spec(text)
    assert spec.lhs_i16 and spec.spec_string == text and tilegen.parse_spec(spec.spec_string) == spec
    assert spec.lhs_format == "q8ki16p4vlx2" and spec.name != tilegen.parse_spec(
        text.replace(":i16", "")).name
    neon_rate = max(n.mr * n.nr * 256 / sme_report(n, block_svl=128).block.insns
                    for n in _i8mm_gemms(spec.family))
    assert sme_report(spec, block_svl=128).block_macs_per_insn >= neon_rate
    old = text.replace(":i16", "")
    assert sme_report(old, block_svl=128).block_macs_per_insn < neon_rate
    r = sme_report(spec, block_svl=512)
    floor = 256 // r.k_per_iter * r.loop.mac_insns * M4_UNITS["mopa.i16"].cycles
    assert r.unit.binding == "mopa.i16" and r.unit.bound <= 1.3 * floor, (r.unit.binding,
                                                                          r.unit.bound, floor)


@pytest.mark.parametrize("nu", (2, 4))
def test_q5k_sme2_gemv_decode_on_the_model(nu):
    """q5_K's SME2 gemv on the M4 model (SVL 512): q4_K's LUTI4 of the nibbles plus the fifth
    bits' merge (ZIP, one 2-vector URSHL, BSL: 4 Z-register ops per vector of nibbles), at
    most 2.6x q4_K's gemv bound at 1x2vl and 5x at 1x4vl (the byte decode of the first
    version: 4.4x / 8.7x; LSR, LSL, LSL, ZIP, BSL, BSL: 3.5x / 6.75x)."""
    from tilegen.analysis.sme import sme_report
    q5 = sme_report(f"q5_K:sme2:1x{nu}vl", block_svl=512).unit
    q4 = sme_report(f"q4_K:sme2:1x{nu}vl", block_svl=512).unit
    assert q5.bound <= {2: 2.6, 4: 5.0}[nu] * q4.bound, (q5.bound, q4.bound)
