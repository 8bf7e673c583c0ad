"""IQ4_NL (family iq4_nl): the ggml codec and the iq4nlp layout against gguf, and every NEON
kernel strategy under emulation, bit-exact with the numpy reference of its arithmetic
(tilegen.families.iq4_nl.matmul_qsi8d32p_iq4nlp) at edge shapes on every CPU model with its
ISA; error against float64 beside ggml's own arithmetic (q8_0 activations, f32 sum per block)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.families.iq4_nl import (IQ4NLP, KVALUES_IQ4NL, dequantize_iq4_nl, join_iq4_nl,
                                     matmul_qsi8d32p_iq4nlp, random_iq4_nl, split_iq4_nl)
from tilegen.generator.validate import parse_spec
from tilegen.layout import LayoutError
from tilegen.layout.lhs_int8 import QSI8D32P
from tilegen.records import SpecError

from conftest import SME_ON, guest
from table32_exec import (CPUS, SENTINEL, SME2_SVLS, SVE_IDS, SVE_RUNS, Table32, all_refused,
                          run_on_cpu, run_sme2, run_sve)

T = gguf.GGMLQuantizationType
# (tile) per ISA: gemm and gemv of every strategy (SMULL, SDOT by lane, SDOT on pairs,
# SMMLA; 12x4, 24x4: 12-row blocks without a mask register), tiles beside llama.cpp's, the f32
# accumulators in the frame (":am")
TILES = ("neon:4x4", "neon:1x4", "neon:8x4", "dotprod:1x4", "dotprod:1x8:k16:s2",
         "dotprod:16x4", "dotprod:12x8", "dotprod:4x8", "dotprod:24x4:am", "i8mm:24x4",
         "i8mm:16x4", "i8mm:8x4", "i8mm:12x4", "i8mm:4x8", "i8mm:1x4:k16:s2", "i8mm:1x12",
         "i8mm:24x4:am", "i8mm:1x16:k8:s2")
SPECS = [parse_spec(f"iq4_nl:{t}") for t in TILES]
# the shared sweep's hooks (tests/table32_exec.py): ggml's d is f16
FAM = Table32(IQ4NLP, matmul_qsi8d32p_iq4nlp, lambda n, k, seed, i: random_iq4_nl(n, k, seed),
              dequantize_iq4_nl, split_iq4_nl, KVALUES_IQ4NL,
              lambda d: d.view(np.float16).astype(np.float32))


# -- codec and layout (host) --------------------------------------------------------------
def test_codec_matches_gguf_bit_for_bit():
    raw = random_iq4_nl(7, 5 * 32, 11)
    assert raw.shape == (7, 5 * 18)
    ref = gguf.quants.dequantize(raw, T.IQ4_NL).reshape(7, 160)
    got = dequantize_iq4_nl(raw, 7, 160)
    assert np.array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    i, d = split_iq4_nl(raw, 7, 160)
    assert np.array_equal(join_iq4_nl(i, d), raw)
    assert tuple(gguf.quants.IQ4_NL.kvalues) == KVALUES_IQ4NL
    # any byte pattern with finite scales is a valid block (every index value occurs)
    assert set(np.unique(i)) == set(range(16))


@pytest.mark.parametrize("nr,kr", [(4, 16), (4, 8), (8, 8), (12, 16)])
def test_layout_round_trip_and_get_rows(nr, kr):
    n, k = 13, 96
    raw = random_iq4_nl(n, k, nr * 100 + kr)
    lay = IQ4NLP(nr, kr, 2, 32)
    packed = lay.pack_from_ggml(raw, n, k)
    assert packed.size == -(-n // nr) * lay.group_stride(k)
    assert np.array_equal(lay.unpack(packed, n, k), raw)
    rows = [12, 0, 5, 5]
    ref = gguf.quants.dequantize(raw, T.IQ4_NL).reshape(n, k)[rows]
    assert np.array_equal(lay.dequantize_rows(packed, n, k, rows).view(np.uint32),
                          ref.astype(np.float32).view(np.uint32))
    # the index bytes are copied as they are (no XOR): the first block's data of slot 0
    d0 = lay.data_offset_in_block
    assert np.array_equal(packed[d0:d0 + kr // 2], raw[0, 2:2 + kr // 2])
    assert lay.name == f"iq4nlp{nr}x{kr // 2}"


def test_layout_refusals():
    lay = IQ4NLP(4, 16, 2, 32)
    with pytest.raises(LayoutError, match="from_ggml="):
        lay.pack_from_float(np.ones((4, 32), np.float32))
    raw = random_iq4_nl(4, 64, 1)
    bad = raw.copy()
    bad[2, 18:20] = np.array([0x7c00], "<u2").view(np.uint8)          # +inf d
    with pytest.raises(LayoutError, match="IQ4_NL"):
        lay.pack_from_ggml(bad, 4, 64)
    with pytest.raises(LayoutError, match="bias"):
        lay.pack_from_ggml(raw, 4, 64, bias=np.zeros(4, np.float32))
    with pytest.raises(LayoutError, match="bl=32"):
        IQ4NLP(4, 16, 2, 64).pack_from_ggml(raw, 4, 64)


def test_twelve_row_smmla_blocks_drop_the_mask_register():
    """The table costs a register: the 12-row SMMLA block fits only without the nibble mask
    (the decode then clears the high nibbles by BIC immediates); narrower tiles keep it."""
    from tilegen.generator.regalloc import allocate
    from tilegen.generator.render import render
    r12 = allocate(parse_spec("iq4_nl:i8mm:12x4"))
    assert r12.mr_reg == 12 and r12.mask is None and len(r12.table) == 1
    text = render(parse_spec("iq4_nl:i8mm:12x4")).text
    assert "bic v" in text and "movi v" not in text.split("m_loop:")[0].split("fmov d")[-1]
    r8 = allocate(parse_spec("iq4_nl:i8mm:8x4"))
    assert r8.mr_reg == 8 and r8.mask is not None
    assert allocate(parse_spec("q4_0:i8mm:12x4")).table == ()


def test_allocator_refusals_are_clear():
    with pytest.raises(SpecError, match="kr/sr = 4"):
        parse_spec("iq4_nl:neon:4x4:k16:s2")
    with pytest.raises(SpecError, match="multiple of 4"):
        parse_spec("iq4_nl:i8mm:6x4")
    with pytest.raises(SpecError, match="32 exist"):
        parse_spec("iq4_nl:neon:4x8")
    with pytest.raises(SpecError, match="no template"):
        parse_spec("iq4_nl:sme:1vlx2vl")
    with pytest.raises(SpecError, match="1vlx1vl or 1vlx2vl"):
        parse_spec("iq4_nl:sme2:1vlx4vl")
    with pytest.raises(SpecError, match="1vlx1vl or 1vlx2vl"):
        parse_spec("iq4_nl:sme2:2vlx2vl")
    with pytest.raises(SpecError, match="2vl or 4vl"):
        parse_spec("iq4_nl:sme2:1x1vl")
    with pytest.raises(SpecError, match="4-byte groups"):
        parse_spec("iq4_nl:sme2:1vlx2vl:k16:s2")


# -- kernels under emulation ---------------------------------------------------------------
@pytest.fixture(scope="module")
def iq4_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iq4lib")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_iq4_nl_kernel(spec, cpu, iq4_lib):
    run_on_cpu(FAM, spec, cpu, iq4_lib)


def _extreme_cases(spec, vl_bytes=None):
    """Block sums at the bound of the magic-number conversion: every LHS value +-127 (rows of
    one sign), the weights the table's ends (index 0: -127, 15: 113) and its middle, so
    |S| = 32 * 127 * 127 = 516128 with both signs (|S| < 2^22 holds; M = 2^23 instead of
    1.5 * 2^23 would break on the negative sums)."""
    mr, nr = spec.mr_at(vl_bytes), spec.nr_at(vl_bytes)
    P = spec.lhs_mr
    m, n, k = min(mr, 3) if mr > 1 else 1, nr + 1, 96
    x = np.ones((m, k), np.float32) * np.array([1, -1, 0.5][:m], np.float32)[:, None]
    x[:, 64:] *= np.float32(-3)                        # block 2: the other sign, other scale
    idx = np.zeros((n, k), np.uint8)
    idx[1::2] = 15
    idx[2::3, 32:64] = np.arange(32) % 16               # block 1: every index
    raw = join_iq4_nl(idx, np.full((n, k // 32), 0x3C00, np.uint16))       # d = 1
    lhs = QSI8D32P(P, spec.kr, spec.sr, 32).pack(x)
    rhs = IQ4NLP(nr, spec.kr, spec.sr, 32).pack_from_ggml(raw, n, k)
    ref = matmul_qsi8d32p_iq4nlp(lhs, rhs, m, n, k, 32, P, nr, spec.kr, spec.sr, -3.4e38, 3.4e38)
    q, _ = QSI8D32P(P, spec.kr, spec.sr, 32).unpack(lhs, m, k)
    assert np.abs(q[:, :k]).min() == 127 and np.abs(ref).max() > 0
    return [dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=-3.4e38,
                 clamp_max=3.4e38, sentinel=SENTINEL)], [ref]


def _run_extreme(sess, lib, specs, vl_bytes=None):
    from tilegen.generator.regalloc import allocate
    modes = set()
    for spec in specs:
        R = allocate(spec)
        if not R.magic:
            continue
        modes.add(R.mode)
        cases, refs = _extreme_cases(spec, vl_bytes)
        outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
        for c, ref, out in zip(cases, refs, outs):
            assert np.array_equal(out[:c["m"], :c["n"]], ref), (spec.name, vl_bytes)
    return modes


def test_magic_sums_at_their_bound(iq4_lib):
    """The NEON kernels that convert by the magic number (SMMLA, SDOT by lane and on pairs),
    bit-exact at the largest block sums the format gives."""
    assert _run_extreme(guest("neoverse-n2"), iq4_lib, SPECS) == {"mm", "dot4", "dot8"}


SVE_TILES = ("sve_dotprod:1x1vl", "sve_dotprod:1x2vl", "sve_dotprod:1x1vl:k16:s2",
             "sve_dotprod:8x1vl", "sve_dotprod:4x2vl", "sve_i8mm:16x1vl", "sve_i8mm:8x1vl",
             "sve_i8mm:4x2vl")
SVE_SPECS = [parse_spec(f"iq4_nl:{t}") for t in SVE_TILES]


@pytest.fixture(scope="module")
def iq4_sve_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iq4sve")
    tilegen.build_library(SVE_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu,vl", SVE_RUNS, ids=SVE_IDS)
def test_iq4_nl_sve_every_vl(cpu, vl, iq4_sve_lib):
    run_sve(FAM, cpu, vl, iq4_sve_lib, SVE_SPECS)


def test_magic_sums_at_their_bound_sve(iq4_sve_lib):
    """The same on SVE (SDOT by lane and SMMLA convert by the magic number; dot8 does not)."""
    assert _run_extreme(guest("max", sve_vl=256), iq4_sve_lib, SVE_SPECS, 32) == {"mm", "dot4"}


def test_iq4_nl_sve_refused_without_sve(iq4_sve_lib):
    assert all_refused("neoverse-n1", iq4_sve_lib, SVE_SPECS)


def test_llvm_mca_models_the_kernels():
    """`tilegen analyze` (the hot loop through llvm-mca) reads the TBL decode: its operand list
    once read as a branch target (`{ v6.16b }, v0.16b` matched the branch rewrite)."""
    from tilegen.analysis.mca import analyze, per_k
    for s in ("iq4_nl:i8mm:12x4", "iq4_nl:dotprod:1x4", "iq4_nl:sve_i8mm:16x1vl"):
        r = analyze(s, "neoverse-v2")
        assert r.cycles_per_iter > 0 and r.block32_macs_per_cycle > 0
        assert per_k(parse_spec(s), "neoverse-v2", 256).macs_per_cycle > 0


# ggml's repack gemvs, MAC/cycle per 32-k block (llvm-mca-19, its best build), as measured by
# `python bench/vs_ggml.py --models neoverse-v2 neoverse-n2 neoverse-v1 --kernels
# ggml_gemv_iq4_nl_4x4_q8_0 ggml_gemv_mxfp4_4x4_q8_0 --no-trace-tilegen ...` on main 6d55374;
# issue #32's gemv target is 1.3x these
GGML_GEMV = {("iq4_nl", "neoverse-v2"): 15.49, ("iq4_nl", "neoverse-n2"): 7.52,
             ("mxfp4", "neoverse-v2"): 13.11, ("mxfp4", "neoverse-n2"): 6.39}
SPLIT_GEMVS = ("iq4_nl:i8mm:1x16:k8:s2", "iq4_nl:i8mm:1x8:k8:s2", "iq4_nl:dotprod:1x16",
               "mxfp4:dotprod:1x20", "mxfp4:i8mm:1x8:k8:s2")
# the tiles held to the target: the best of each family (dotprod's iq4_nl gemv widens its f16
# scales without FMLAL: 4 more vector uops per block)
TARGET_GEMVS = ("iq4_nl:i8mm:1x16:k8:s2", "iq4_nl:i8mm:1x8:k8:s2", "mxfp4:dotprod:1x20")


@pytest.mark.parametrize("text", SPLIT_GEMVS)
def test_gemv_splits_half_the_nibbles_on_the_integer_pipes(text):
    """The NEON gemvs' vector pipes bind them (USHR, AND, 2 TBL, 2 SDOT per 16 index bytes + 3
    per 4 columns per block: 108 uops per 512 MACs); every second RHS vector's nibbles are
    split by LDP/AND/LSR/STP through the frame instead (92 uops), which puts the best tiles
    over 1.3x ggml's gemv on neoverse-v2 and -n2 (it failed at 1.22x / 1.26x without)."""
    from tilegen.analysis.mca import per_k
    from tilegen.generator.regalloc import allocate
    from tilegen.generator.render import render
    spec = parse_spec(text)
    R = allocate(spec)
    assert R.split and R.split_every == 2 and len(set(R.split)) == 4
    body = render(spec).text.split("tilegen:block-begin")[1].split("tilegen:block-end")[0]
    n_split = body.count("ldp x")
    assert n_split and n_split == body.count("ushr v") == body.count("stp x") // 2, n_split
    if text in TARGET_GEMVS:
        for model in ("neoverse-v2", "neoverse-n2"):
            got = per_k(spec, model, 32).macs_per_cycle
            assert got >= 1.3 * GGML_GEMV[(spec.family, model)], (text, model, got)


def test_no_split_outside_the_neon_gemvs():
    from tilegen.generator.regalloc import allocate
    for text in ("iq4_nl:i8mm:12x4", "iq4_nl:dotprod:4x8", "iq4_nl:neon:1x4",
                 "iq4_nl:sve_dotprod:1x2vl", "iq4_nl:i8mm:24x4:am", "q4_0:dotprod:1x4"):
        assert not getattr(allocate(parse_spec(text)), "split", ()), text


# -- SME2 (LUTI4 through ZT0) -----------------------------------------------------------------
# the gemm and the gemv of the runtime's pair (one packing) at every SVL; the other tiles
# (1vlx1vl, 1x4vl) at SVL 512
SME2_PAIR = [parse_spec("iq4_nl:sme2:1vlx2vl"), parse_spec("iq4_nl:sme2:1x2vl")]
SME2_MORE = [parse_spec("iq4_nl:sme2:1vlx1vl"), parse_spec("iq4_nl:sme2:1x4vl")]


@pytest.fixture(scope="module")
def iq4_sme2_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("iq4sme2")
    tilegen.build_library(SME2_PAIR + SME2_MORE, target="linux-aarch64-all", out_dir=out)
    return out


def test_iq4_nl_sme2_decodes_by_luti4():
    """The SME2 kernels look the indices up in ZT0 (LUTI4 + UZP), not by shifts or TBL; the
    gemm and the gemv read one packing; q4_0's SME kernels keep their shift decode."""
    from tilegen.generator.render import render
    from tilegen.layout.base import same_rhs
    for spec in SME2_PAIR + SME2_MORE:
        text = render(spec).text
        hot = text.split("hot-loop-begin")[1].split("hot-loop-end")[0]
        assert "ldr zt0, [sp]" in text and "luti4 {" in hot and "uzp" in hot, spec
        assert "lsl z" not in hot and "tbl" not in hot and "asr z" not in text, spec
    assert same_rhs(*(s for s in SME2_PAIR))
    assert "luti4" not in render(parse_spec("q4_0:sme:1vlx2vl")).text


@pytest.mark.parametrize("svl", SME2_SVLS)
def test_iq4_nl_sme2_every_svl(svl, iq4_sme2_lib):
    run_sme2(FAM, svl, iq4_sme2_lib, SME2_PAIR, SME2_MORE)


def test_iq4_nl_sme2_refused_without_sme2(iq4_sme2_lib):
    assert all_refused("neoverse-v1", iq4_sme2_lib, SME2_PAIR)


@pytest.fixture(scope="module")
def iq4_default_lib(tmp_path_factory) -> Path:
    """The family's default kernels (its SME2 pair among them)."""
    from tilegen.families import plugin
    out = tmp_path_factory.mktemp("iq4def")
    tilegen.build_library(list(plugin("iq4_nl").DEFAULT_KERNELS), target="linux-aarch64-all",
                          out_dir=out)
    return out


def test_iq4_nl_runtime_picks_the_sme2_pair(iq4_default_lib):
    """On an SME2 CPU with SME on (TILEGEN_SME=1, SVL 512) pack_weights(kind="iq4_nl") packs for
    the SME2 pair of the defaults (as q4_0's SME pair: opt-in, the best ISA first): the SMOPA
    gemm for m > 1, the ZA-array gemv for m = 1, bit-exact with the reference at 1 and 3
    threads and through plan; with SME off the same CPU keeps the SVE pair."""
    n, k, clamp = 37, 160, (-3.4e38, 3.4e38)
    rng = np.random.default_rng(32)
    raw = random_iq4_nl(n, k, 3)
    x = (rng.normal(size=(21, k)) * 3).astype(np.float32)
    out = guest("max", None, 512, SME_ON).call("guest_iq4_nl:sme2_pick", str(iq4_default_lib),
                                              raw, n, k, x, clamp)
    assert out["layout"] == "iq4nlp32x4", out["layout"]          # 2vl at SVL 512, kr 8
    for m, run in out["runs"].items():
        assert run["kernel"].endswith("_sme2_sdot" if m == 1 else "_sme2_mopa"), run["kernel"]
        lhs = QSI8D32P(run["mr"], run["kr"], run["sr"], 32).pack(x[:m])
        assert np.array_equal(run["lhs"], lhs)
        want = matmul_qsi8d32p_iq4nlp(lhs, run["data"], m, n, k, 32, run["mr"], run["nr"],
                                      run["kr"], run["sr"], *clamp)
        for key in ("y", "y1", "plan"):
            assert np.array_equal(run[key].view(np.uint32), want.view(np.uint32)), (m, key)
    off = guest("max", None, 512).call("guest_iq4_nl:sme2_pick", str(iq4_default_lib),
                                       raw, n, k, x[:2], clamp)
    assert all("_sve_" in r["kernel"] for r in off["runs"].values()), off
