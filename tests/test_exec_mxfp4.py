"""MXFP4 (family mxfp4): the ggml codec and the mxfp4p layout against gguf (every E8M0 byte,
subnormal scales included), and the NEON and SVE kernels (iq4_nl's table decode on the q4
skeletons, bf16 column scales widened by SHLL / LSL #16) under emulation (SVE at several
vector lengths), bit-exact with the numpy reference of
their arithmetic (tilegen.families.mxfp4.matmul_qsi8d32p_mxfp4p) at edge shapes on every CPU
model with their ISA; error against float64 beside ggml's own arithmetic (q8_0 activations,
f32 sum per block)."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.families.mxfp4 import (E8M0_HALF_BF16, KVALUES_MXFP4, MXFP4P, dequantize_mxfp4,
                                    join_mxfp4, matmul_qsi8d32p_mxfp4p, random_mxfp4,
                                    split_mxfp4)
from tilegen.generator.validate import parse_spec
from tilegen.layout import LayoutError
from tilegen.layout.lhs_int8 import QSI8D32P
from tilegen.records import SpecError

from conftest import SME_ON, guest
from table32_exec import (CPUS, SME2_SVLS, SVE_IDS, SVE_RUNS, Table32, all_refused, run_on_cpu,
                          run_sme2, run_sve)

T = gguf.GGMLQuantizationType
# gemm and gemv of the SMULL and SDOT-by-lane / SDOT-pair strategies, the f32 accumulators
# in the frame (":am"), tiles beside ggml's 4x4; i8mm: SMMLA with the f32 accumulators in
# registers (12x4: one LHS pair, row scales per row block, no mask register; 8x8: two LHS
# pairs, mask), in the frame (24x4:am), and the SDOT gemvs (1x4 kr16: column pairs; 1x8 kr8:
# by lane), bf16 column scales widened (no FMLAL)
TILES = ("neon:4x4", "neon:1x4", "neon:8x4", "dotprod:1x4", "dotprod:1x8:k16:s2",
         "dotprod:16x4", "dotprod:12x8", "dotprod:4x8", "dotprod:24x4:am", "dotprod:4x4",
         "i8mm:12x4", "i8mm:8x8", "i8mm:24x4:am", "i8mm:1x4", "i8mm:1x8:k8:s2")
SPECS = [parse_spec(f"mxfp4:{t}") for t in TILES]
# the shared sweep's hooks (tests/table32_exec.py): scales around 1 and (case 2) the far ends,
# subnormal 2^-128 .. 2^-100 (its error against float64 not compared); ggml's scale is the
# E8M0 byte's half as f32 (E8M0_HALF_BF16 widened)
FAM = Table32(MXFP4P, matmul_qsi8d32p_mxfp4p,
              lambda n, k, seed, i: random_mxfp4(n, k, seed,
                                                 e_range=(0, 30) if i == 2 else (118, 134)),
              dequantize_mxfp4, split_mxfp4, KVALUES_MXFP4,
              lambda e: (E8M0_HALF_BF16[e].astype(np.uint32) << 16).view(np.float32), seed=7,
              compare_error=lambda i: i != 2)


# -- codec and layout (host) --------------------------------------------------------------
def test_worked_example_by_hand():
    """One block written out from the format: e = 128 -> scale 2^0 = 1 (half of 2^1), so the
    weights are the table itself; e = 0 -> 2^-128 (an f32 subnormal, bf16 bits 0x0020);
    e = 255 -> 2^127.  Byte j holds code j (low nibble) and code j + 16 (high nibble)."""
    codes = np.array([list(range(16)) + list(range(15, -1, -1))], np.uint8)
    raw = join_mxfp4(codes, np.array([[128]], np.uint8))
    assert raw[0, 0] == 128 and raw[0, 1] == 0xF0 and raw[0, 16] == 0x0F
    want = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.float32)
    assert np.array_equal(dequantize_mxfp4(raw, 1, 32)[0], np.concatenate([want, want[::-1]]))
    raw0 = join_mxfp4(codes, np.array([[0]], np.uint8))
    assert dequantize_mxfp4(raw0, 1, 32)[0, 1] == np.float32(2.0 ** -128)
    assert E8M0_HALF_BF16[0] == 0x0020 and E8M0_HALF_BF16[128] == 0x3F80
    assert E8M0_HALF_BF16[255] == 0x7F00
    assert tuple(gguf.quants.MXFP4.kvalues) == KVALUES_MXFP4


def test_codec_matches_gguf_bit_for_bit():
    raw = random_mxfp4(9, 5 * 32, 11, e_range=(0, 255))
    assert raw.shape == (9, 5 * 17)
    ref = gguf.quants.dequantize(raw, T.MXFP4).reshape(9, 160)
    got = dequantize_mxfp4(raw, 9, 160)
    assert np.array_equal(got.view(np.uint32), ref.astype(np.float32).view(np.uint32))
    c, e = split_mxfp4(raw, 9, 160)
    assert np.array_equal(join_mxfp4(c, e), raw)
    assert set(np.unique(c)) == set(range(16))
    # every E8M0 byte: gguf's scale and the bf16 one agree bit for bit
    every = np.arange(256, dtype=np.uint8)[:, None]
    blocks = join_mxfp4(np.full((256, 32), 1, np.uint8), every)           # value 1 * scale
    d = gguf.quants.dequantize(blocks, T.MXFP4).reshape(256, 32)[:, 0].astype(np.float32)
    assert np.array_equal(d.view(np.uint32), E8M0_HALF_BF16.astype(np.uint32) << 16)


@pytest.mark.parametrize("nr,kr", [(4, 16), (4, 8), (8, 8), (12, 16)])
def test_layout_round_trip_and_get_rows(nr, kr):
    n, k = 13, 96
    raw = random_mxfp4(n, k, nr * 100 + kr, e_range=(0, 255))
    lay = MXFP4P(nr, kr, 2, 32)
    packed = lay.pack_from_ggml(raw, n, k)
    assert packed.size == -(-n // nr) * lay.group_stride(k)
    assert np.array_equal(lay.unpack(packed, n, k), raw)
    rows = [12, 0, 5, 5]
    ref = gguf.quants.dequantize(raw, T.MXFP4).reshape(n, k)[rows]
    assert np.array_equal(lay.dequantize_rows(packed, n, k, rows).view(np.uint32),
                          ref.astype(np.float32).view(np.uint32))
    # the block starts with the nr bf16 scales (slot 0 first), then the code bytes unchanged
    assert packed[:2].view("<u2")[0] == E8M0_HALF_BF16[raw[0, 0]]
    d0 = lay.data_offset_in_block
    assert d0 == 2 * nr
    assert np.array_equal(packed[d0:d0 + kr // 2], raw[0, 1:1 + kr // 2])
    assert lay.name == f"mxfp4p{nr}x{kr // 2}"
    assert lay.scale_format == "bf16" and MXFP4P.__mro__[1].scale_format == "f16"


def test_layout_refusals():
    lay = MXFP4P(4, 16, 2, 32)
    with pytest.raises(LayoutError, match="from_ggml="):
        lay.pack_from_float(np.ones((4, 32), np.float32))
    raw = random_mxfp4(4, 64, 1)
    with pytest.raises(LayoutError, match="bias"):
        lay.pack_from_ggml(raw, 4, 64, bias=np.zeros(4, np.float32))
    with pytest.raises(LayoutError, match="bl=32"):
        MXFP4P(4, 16, 2, 64).pack_from_ggml(raw, 4, 64)
    with pytest.raises(LayoutError, match="must hold"):
        lay.pack_from_ggml(raw[:, :-1], 4, 64)
    packed = lay.pack_from_ggml(raw, 4, 64)
    packed[0] ^= 1                                   # a scale no E8M0 byte gives
    with pytest.raises(LayoutError, match="powers of two"):
        lay.unpack(packed, 4, 64)


def test_refusals():
    """SME (without 2) has no mxfp4 template; SME2 and i8mm refuse the tiles their allocators
    cannot serve."""
    with pytest.raises(SpecError, match="no template"):
        parse_spec("mxfp4:sme:1vlx2vl")
    with pytest.raises(SpecError, match="1vlx1vl or 1vlx2vl"):
        parse_spec("mxfp4:sme2:1vlx4vl")
    with pytest.raises(SpecError, match="2vl or 4vl"):
        parse_spec("mxfp4:sme2:1x1vl")
    with pytest.raises(SpecError, match="multiple of 4"):
        parse_spec("mxfp4:i8mm:6x4")
    with pytest.raises(SpecError, match="kr/sr = 8"):
        parse_spec("mxfp4:i8mm:8x4:k8:s2")
    with pytest.raises(SpecError, match="32 exist"):
        parse_spec("mxfp4:i8mm:4x12")
    with pytest.raises(SpecError, match="multiple of 4"):
        parse_spec("mxfp4:i8mm:8x6")


# -- kernels under emulation ---------------------------------------------------------------
@pytest.fixture(scope="module")
def mx_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mxlib")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_mxfp4_kernel(spec, cpu, mx_lib):
    run_on_cpu(FAM, spec, cpu, mx_lib)


SVE_TILES = ("sve_dotprod:1x1vl", "sve_dotprod:1x2vl", "sve_dotprod:1x1vl:k16:s2",
             "sve_dotprod:8x1vl", "sve_dotprod:4x2vl", "sve_i8mm:16x1vl", "sve_i8mm:8x1vl",
             "sve_i8mm:4x2vl")
SVE_SPECS = [parse_spec(f"mxfp4:{t}") for t in SVE_TILES]


@pytest.fixture(scope="module")
def mx_sve_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mxsve")
    tilegen.build_library(SVE_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu,vl", SVE_RUNS, ids=SVE_IDS)
def test_mxfp4_sve_every_vl(cpu, vl, mx_sve_lib):
    run_sve(FAM, cpu, vl, mx_sve_lib, SVE_SPECS)


def test_mxfp4_sve_refused_without_sve(mx_sve_lib):
    assert all_refused("neoverse-n1", mx_sve_lib, SVE_SPECS)


# -- SME2 (iq4_nl's templates: LUTI4 through ZT0; the bf16 scales widened by LSL #16) --------
SME2_PAIR = [parse_spec("mxfp4:sme2:1vlx2vl"), parse_spec("mxfp4:sme2:1x2vl")]
SME2_MORE = [parse_spec("mxfp4:sme2:1vlx1vl"), parse_spec("mxfp4:sme2:1x4vl")]


@pytest.fixture(scope="module")
def mx_sme2_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mxsme2")
    tilegen.build_library(SME2_PAIR + SME2_MORE, target="linux-aarch64-all", out_dir=out)
    return out


def test_mxfp4_sme2_widens_bf16_scales():
    """The SME2 kernels load the layout's table into ZT0 and widen the bf16 column scales by a
    16-bit shift of the zero-extended halfwords (exact), never by FCVT from f16."""
    from tilegen.generator.render import render
    for spec in SME2_PAIR + SME2_MORE:
        text = render(spec).text
        block = text.split("block-begin")[1].split("hot-loop-begin")[0]
        assert "ldr zt0, [sp]" in text and "#-12\n" in text, spec          # the table's -12
        assert block.count(".s, #16\n") == spec.nr and block.count(".h\n") <= 1, spec


@pytest.mark.parametrize("svl", SME2_SVLS)
def test_mxfp4_sme2_every_svl(svl, mx_sme2_lib):
    """Bit-exact with matmul_qsi8d32p_mxfp4p at edge shapes (scales around 1 and, in one case,
    down to the subnormal 2^-128), the error vs float64 no worse than ggml's arithmetic."""
    run_sme2(FAM, svl, mx_sme2_lib, SME2_PAIR, SME2_MORE)


def test_mxfp4_sme2_refused_without_sme2(mx_sme2_lib):
    assert all_refused("neoverse-v1", mx_sme2_lib, SME2_PAIR)


def test_mxfp4_runtime_picks_the_sme2_pair(tmp_path):
    """pack_weights(kind="mxfp4") on an SME2 CPU with SME on packs for the defaults' SME2 pair
    (gemm for m > 1, gemv for m = 1), bit-exact with the reference."""
    from tilegen.families import plugin
    tilegen.build_library(list(plugin("mxfp4").DEFAULT_KERNELS), target="linux-aarch64-all",
                          out_dir=tmp_path)
    n, k, clamp = 37, 160, (-3.4e38, 3.4e38)
    rng = np.random.default_rng(4)
    raw = random_mxfp4(n, k, 5)
    x = (rng.normal(size=(19, k)) * 3).astype(np.float32)
    out = guest("max", None, 256, SME_ON).call("guest_iq4_nl:sme2_pick", str(tmp_path), raw, n,
                                              k, x, clamp, "mxfp4")
    assert out["layout"] == "mxfp4p16x4", out["layout"]          # 2vl at SVL 256, kr 8
    for m, run in out["runs"].items():
        assert run["kernel"].endswith("_sme2_sdot" if m == 1 else "_sme2_mopa"), run["kernel"]
        lhs = QSI8D32P(run["mr"], run["kr"], run["sr"], 32).pack(x[:m])
        assert np.array_equal(run["lhs"], lhs)
        want = matmul_qsi8d32p_mxfp4p(lhs, run["data"], m, n, k, 32, run["mr"], run["nr"],
                                      run["kr"], run["sr"], *clamp)
        for key in ("y", "y1", "plan"):
            assert np.array_equal(run[key].view(np.uint32), want.view(np.uint32)), (m, key)
