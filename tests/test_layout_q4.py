"""Host-side tests of the int8/int4 layouts (tilegen.layout.lhs_int8 / rhs_int4 / ggml / api) and the numpy
references of the int kernels (tilegen.reference.q4) against KleidiAI's golden vectors."""

import numpy as np
import pytest

from tilegen.layout import api
from tilegen.layout.base import LayoutError
from tilegen.layout.bf16 import bf16_to_f32, f32_to_bf16_rne
from tilegen.layout.f32 import F32PackedRHS
from tilegen.layout.ggml import (dequantize_q4_0, f16_bits_to_f32, join_q4_0, quantize_q4_0,
                                 split_q4_0)
from tilegen.layout.lhs_int8 import QAI8DXP, QSI8D32P
from tilegen.layout.rhs_int4 import QSI4C32P, QSI4C32PScaleF16
from tilegen.reference.q4 import matmul_qai8dxp_qsi4c32p, matmul_qsi8d32p_qsi4c32pscalef16

from conftest import vector_files, vector_params

FLT_MAX = 3.4028234663852886e38


def _ids(p):
    return p.stem


def _i(z, key):
    return int(z[key])


def _bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _masked_equal(got, exp, mask):
    assert got.dtype == np.uint8 and got.shape == exp.shape, (got.shape, exp.shape)
    m = mask == 1
    assert np.array_equal(got[m], exp[m]), f"{np.count_nonzero(got[m] != exp[m])} written bytes differ"
    assert not np.any(got[~m]), "untouched slots must stay zero"


# -----------------------------------------------------------------------------------------
# LHS qai8dxp
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", vector_params("lhs_qai8dxp_*.npz"), ids=_ids)
def test_qai8dxp_pack_vectors(path):
    z = np.load(path)
    m, k, mr, kr, sr, ms = (_i(z, f) for f in ("m", "k", "mr", "kr", "sr", "m_idx_start"))
    lay = QAI8DXP(mr, kr, sr)
    got = lay.pack(z["lhs"], m_idx_start=ms)
    _masked_equal(got, z["packed"], z["written_mask"])
    assert np.array_equal(got, z["packed"])                 # vectors are zero-filled too
    assert lay.packed_size(m, k) == _i(z, "packed_size")
    assert lay.packed_offset(ms, k) == _i(z, "packed_offset_of_m_idx_start")
    assert lay.region_size(m, k, ms) == z["packed"].size
    q, off, rs = lay.unpack(z["packed"], m, k, ms)
    assert np.array_equal(q, z["decoded_q"])
    assert np.array_equal(off, z["decoded_offset"])
    assert np.array_equal(_bits(rs), _bits(z["decoded_recip_scale"]))
    assert np.array_equal(api.pack_lhs("qai8dxp", z["lhs"], mr=mr, kr=kr, sr=sr, m_idx_start=ms), got)


@pytest.mark.parametrize("path", vector_params("lhs_qai8dxp_*.npz"), ids=_ids)
def test_qai8dxp_geometry_getters_vectors(path):
    """Read the fields straight from the vector's bytes with the generator-facing getters."""
    z = np.load(path)
    m, k, mr, kr, sr = (_i(z, f) for f in ("m", "k", "mr", "kr", "sr"))
    lay = QAI8DXP(mr, kr, sr)
    buf = z["packed"]
    S = lay.row_block_stride(k)
    assert S == mr * (lay.k_padded(k) + 8) and lay.L == kr // sr and lay.data_offset(k) == 0
    for r in range(m):
        base, x = (r // mr) * S, r % mr
        o = base + lay.offset_field_offset(k) + 4 * x
        assert buf[o:o + 4].view("<i4")[0] == z["decoded_offset"][r]
        o = base + lay.rscale_offset(k) + 4 * x
        assert buf[o:o + 4].view("<u4")[0] == _bits(z["decoded_recip_scale"][r])
        t = np.arange(lay.k_padded(k))
        pos = base + lay.data_offset(k) + (t // lay.L) * lay.chunk_bytes + x * lay.L + t % lay.L
        assert np.array_equal(buf[pos].view(np.int8), z["decoded_q"][r])
        assert lay.element_offset(x, 5) == (5 // lay.L) * mr * lay.L + x * lay.L + 5 % lay.L


def _qai8dxp_rows(rng, m, k):
    x = (rng.normal(size=(m, k)) * 10.0 ** rng.uniform(-3, 3, size=(m, 1))).astype(np.float32)
    kinds = np.arange(m) % 5
    x[kinds == 1] = np.abs(x[kinds == 1])
    x[kinds == 2] = -np.abs(x[kinds == 2])
    x[kinds == 3] = 0
    ties = rng.integers(-255, 256, size=(int(np.sum(kinds == 4)), k)).astype(np.float32) * np.float32(0.25)
    if ties.size:
        ties[:, 0], ties[:, -1] = -63.75, 63.75
    x[kinds == 4] = ties
    return x


@pytest.mark.parametrize("mr,kr,sr", [(1, 8, 2), (4, 8, 2), (4, 16, 2), (8, 4, 1), (2, 2, 1), (4, 32, 2)])
@pytest.mark.parametrize("ms", [0, 1, 3, 5, 6])
def test_qai8dxp_m_idx_start_consistent(mr, kr, sr, ms):
    """Packing rows [ms, ms+m) with m_idx_start=ms gives the same bytes as packing the whole
    matrix, inside the region of the row blocks holding them, and zeros in foreign slots."""
    rng = np.random.default_rng(100 + mr * 7 + ms)
    k, m = 37, 7
    x = _qai8dxp_rows(rng, ms + m, k)
    lay = QAI8DXP(mr, kr, sr)
    full = lay.pack(x)
    assert full.size == lay.packed_size(ms + m, k)
    part = lay.pack(x[ms:], m_idx_start=ms)
    off = lay.packed_offset(ms, k)
    assert part.size == lay.region_size(m, k, ms) == -(-((ms % mr) + m) // mr) * lay.row_block_stride(k)
    q, o, r = lay.unpack(part, m, k, ms)
    qf, of, rf = lay.unpack(full, ms + m, k)
    assert np.array_equal(q, qf[ms:]) and np.array_equal(o, of[ms:]) and np.array_equal(_bits(r), _bits(rf[ms:]))
    # written slots agree with the full packing, the others are zero
    mask = np.zeros(part.size, bool)
    S = lay.row_block_stride(k)
    for g in range(ms, ms + m):
        base, x_ = (g // mr - ms // mr) * S, g % mr
        t = np.arange(lay.k_padded(k))
        mask[base + lay.element_offset(x_, 0) + (t // lay.L) * mr * lay.L + t % lay.L] = True
        mask[base + lay.offset_field_offset(k) + 4 * x_ + np.arange(4)] = True
        mask[base + lay.rscale_offset(k) + 4 * x_ + np.arange(4)] = True
    seg = full[off:off + part.size]
    assert np.array_equal(part[mask], seg[mask])
    assert not part[~mask].any()
    # strided rows (a view with padding between rows) give the same bytes
    wide = np.zeros((ms + m, k + 5), np.float32)
    wide[:, :k] = x
    assert np.array_equal(lay.pack(wide[ms:, :k], m_idx_start=ms), part)


def test_qai8dxp_special_rows():
    lay = QAI8DXP(1, 8, 2)
    x = np.zeros((4, 40), np.float32)
    x[1] = np.linspace(0.5, 3.0, 40, dtype=np.float32)        # all positive -> offset +128
    x[2] = -x[1]                                               # all negative -> offset -127
    x[3] = np.arange(40, dtype=np.float32) * np.float32(0.25) - np.float32(4.75)
    q, off, rs = lay.unpack(lay.pack(x), 4, 40)
    assert np.all(q[0] == 127) and off[0] == -127 and rs[0] == 1.0      # all-zero row
    assert off[1] == 128 and off[2] == -127
    assert np.all(q[:, 40:] == q[:, 39:40])                   # padding repeats the last value
    assert q.shape == (4, 64)


def test_qai8dxp_extreme_ranges_follow_the_c_code():
    """Finite rows whose range overflows 255/(rmax-rmin): KAI_MIN/KAI_MAX ternaries with NaN,
    saturating (int32_t)roundf, int32 wrap-around of the zero-point add, then the clamp."""
    x = np.zeros((3, 3), np.float32)
    x[0] = [1e-39, -2e-40, 0.0]          # scale = inf: dmin = -inf, dmax = inf, sum NaN
    x[1] = [1e-39, 5e-40, 1e-39]         # rmin = 0: 0 * inf = NaN
    x[2] = [-3e38, 3e38, 1.0]            # rmax - rmin = inf: scale = 0
    q, off, rs = QAI8DXP.quantize_rows(x)
    assert list(q[0]) == [127, 127, -128] and off[0] == 128 and rs[0] == 0
    assert list(q[1]) == [127, 127, 127] and off[1] == 128 and rs[1] == 0
    assert list(q[2]) == [127, 127, 127] and off[2] == -127 and rs[2] == 0


# -----------------------------------------------------------------------------------------
# LHS qsi8d32p
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", vector_params("lhs_qsi8d32p*.npz"), ids=_ids)
def test_qsi8d32p_pack_vectors(path):
    z = np.load(path)
    m, k, bl, mr, kr, sr, ms = (_i(z, f) for f in ("m", "k", "bl", "mr", "kr", "sr", "m_idx_start"))
    rounding = "even" if "4x8sb" in str(z["producer"]) else "away"
    lay = QSI8D32P(mr, kr, sr, bl, rounding)
    rows = z["lhs"][ms:ms + m]                 # these files hold the whole matrix
    got = lay.pack(rows, m_idx_start=ms)
    _masked_equal(got, z["packed"], z["written_mask"])
    assert lay.packed_size(m, k) == _i(z, "packed_size")
    assert lay.packed_offset(ms, k) == _i(z, "packed_offset_of_m_idx_start")
    assert np.array_equal(api.pack_lhs("qsi8d32p", rows, mr=mr, kr=kr, sr=sr, bl=bl, m_idx_start=ms,
                                       rounding=rounding), got)


def _qsi8d32p_lhs_params(p):
    out = [pytest.param(p, "", id=p.stem)]
    if "lhs_packed_sb" in np.load(p).files:
        out.append(pytest.param(p, "_sb", id=p.stem + "-sb"))
    return out


def _qsi8d32p_lhs_cases():
    return vector_params("qsi8d32p_lhs_*.npz", nargs=2, expand=_qsi8d32p_lhs_params)


@pytest.mark.parametrize("path,suffix", _qsi8d32p_lhs_cases())
def test_qsi8d32p_lhs_files(path, suffix):
    z = np.load(path)
    m, k, bl, mr, kr, sr, ms = (_i(z, f) for f in ("m", "k", "bl", "mr", "kr", "sr", "m_idx_start"))
    func = str(z["function" + suffix])
    rounding = "even" if "4x8sb" in func else "away"
    assert (rounding == "even") == (suffix == "_sb")
    lay = QSI8D32P(mr, kr, sr, bl, rounding)
    exp = z["lhs_packed" + suffix]
    got = lay.pack(z["lhs"][ms:ms + m], m_idx_start=ms)
    _masked_equal(got, exp, z["written_mask" + suffix])
    assert lay.packed_offset(ms, k) == _i(z, "lhs_packed_group_offset")
    assert lay.packed_size(ms + m, k) == _i(z, "lhs_packed_size_full")
    q, sc = lay.unpack(exp, m, k, ms)
    assert np.array_equal(q, z["qvalues" + suffix])
    assert np.array_equal(sc, z["scale_f16_bits" + suffix])
    # generator-facing getters: scales at scale_offset(b), row data at data_offset(b)
    S = lay.row_block_stride(k)
    assert lay.block_stride == mr * (bl + 2) and S == (k // bl) * lay.block_stride
    for r in range(m):
        base, x = (r // mr) * S, r % mr
        for b in range(k // bl):
            o = base + lay.scale_offset(b) + 2 * x
            assert exp[o:o + 2].view("<u2")[0] == z["scale_f16_bits" + suffix][r, b]
            e = np.arange(bl)
            pos = base + lay.data_offset(b) + (e // lay.L) * lay.chunk_bytes + x * lay.L + e % lay.L
            assert np.array_equal(exp[pos].view(np.int8), z["qvalues" + suffix][r, b * bl:(b + 1) * bl])
        e = bl + 5                                                # block 1, element 5
        assert lay.element_offset(x, e) == \
            lay.data_offset(1) + (5 // lay.L) * lay.chunk_bytes + x * lay.L + 5 % lay.L


def test_qsi8d32p_rounding_modes_differ_on_ties():
    z = np.load(vector_files("qsi8d32p_lhs_ties_*.npz")[0])
    m, k, bl, mr, kr, sr = (_i(z, f) for f in ("m", "k", "bl", "mr", "kr", "sr"))
    away = QSI8D32P(mr, kr, sr, bl, "away").pack(z["lhs"][:m])
    even = QSI8D32P(mr, kr, sr, bl, "even").pack(z["lhs"][:m])
    assert np.count_nonzero(away != even) > 0
    assert not np.array_equal(away, z["lhs_packed_sb"]) and not np.array_equal(even, z["lhs_packed"])


@pytest.mark.parametrize("mr,kr,sr,bl", [(1, 8, 2, 32), (4, 16, 2, 32), (4, 8, 2, 64), (8, 4, 1, 32),
                                         (3, 32, 2, 128)])
@pytest.mark.parametrize("ms", [0, 1, 2, 5, 11])
def test_qsi8d32p_m_idx_start_consistent(mr, kr, sr, bl, ms):
    rng = np.random.default_rng(7 * mr + ms + bl)
    m, k = 6, 2 * bl
    x = (rng.normal(size=(ms + m, k)) * 10.0 ** rng.uniform(-3, 3, size=(ms + m, 1))).astype(np.float32)
    lay = QSI8D32P(mr, kr, sr, bl)
    full = lay.pack(x)
    part = lay.pack(x[ms:], m_idx_start=ms)
    assert part.size == lay.region_size(m, k, ms)
    q, s = lay.unpack(part, m, k, ms)
    qf, sf = lay.unpack(full, ms + m, k)
    assert np.array_equal(q, qf[ms:]) and np.array_equal(s, sf[ms:])
    seg = full[lay.packed_offset(ms, k):][:part.size]
    nz = part != 0
    assert np.array_equal(part[nz], seg[nz])


def test_qsi8d32p_special_values():
    lay = QSI8D32P(1, 8, 2, 32)
    x = np.zeros((1, 160), np.float32)
    x[0, 32:64] = -0.0
    x[0, 64:96] = np.float32(1e7)                 # f16 scale overflows to +inf
    x[0, 96:128] = np.float32(1e-6)               # f16 scale rounds to 0
    x[0, 128:160] = np.arange(32, dtype=np.float32) - 16   # amax 16: not a tie grid
    q, s = lay.unpack(lay.pack(x), 1, 160)
    assert s[0, 0] == 0 and s[0, 1] == 0 and np.all(q[0, :64] == 0)
    assert s[0, 2] == 0x7C00 and np.all(q[0, 64:96] == 127)
    assert s[0, 3] == 0 and np.all(q[0, 96:128] == 127)
    assert q[0, 128] == -127


# -----------------------------------------------------------------------------------------
# RHS qsi4c32p (s1s0 -> bf16 scales, rsum, bias)
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", vector_params("rhs_qsi4c32p_s1s0_*.npz"), ids=_ids)
def test_qsi4c32p_pack_vectors(path):
    z = np.load(path)
    n, k, nr, kr, sr, bl = (_i(z, f) for f in ("n", "k", "nr", "kr", "sr", "bl"))
    bias = z["bias"] if _i(z, "has_bias") else None
    lay = QSI4C32P(nr, kr, sr, bl)
    got = lay.pack(z["rhs_bytes"], z["scale_bf16"], bias)
    assert got.dtype == np.uint8 and np.array_equal(got, z["packed"])
    assert lay.packed_size(n, k) == _i(z, "packed_size") == got.size
    assert np.array_equal(lay.pack_u4(z["rhs_u4"], z["scale_bf16"], bias), z["packed"])
    u, s, rsum, b = lay.unpack(z["packed"], n, k)
    assert np.array_equal(u, z["rhs_u4"]) and np.array_equal(s, z["scale_bf16"])
    assert np.array_equal(_bits(rsum), _bits(z["decoded_rsum"][:n]))
    assert np.array_equal(_bits(b), _bits(z["decoded_bias"][:n]))
    # geometry getters read the same fields from the raw bytes (padding rows included)
    GS = lay.group_stride(k)
    assert GS == nr * ((k // bl) * (bl // 2 + 2) + 8)
    for j in range(-(-n // nr) * nr):
        g, i = divmod(j, nr)
        src = min(j, n - 1)
        o = g * GS + lay.rsum_offset(k) + 4 * i
        assert z["packed"][o:o + 4].view("<u4")[0] == _bits(z["decoded_rsum"][j])
        assert z["decoded_rsum"][j] == z["decoded_rsum"][src]
        o = g * GS + lay.bias_offset(k) + 4 * i
        assert z["packed"][o:o + 4].view("<f4")[0] == (0.0 if bias is None else bias[src])
        for blk in range(k // bl):
            o = g * GS + lay.block_offset(blk) + lay.scale_offset_in_block + 2 * i
            assert z["packed"][o:o + 2].view("<u2")[0] == z["scale_bf16"][src, blk]
    # dequantize: (u - 8) * f32(bf16)
    rows = [n - 1, 0, n // 2]
    d = lay.dequantize_rows(z["packed"], n, k, rows)
    exp = (z["rhs_u4"][rows].astype(np.float32) - 8) * np.repeat(bf16_to_f32(z["scale_bf16"][rows]), bl, axis=1)
    assert np.array_equal(_bits(d), _bits(exp))
    assert np.array_equal(api.dequantize_rows(z["packed"], "qsi4c32p", n, k, nr, kr, sr, bl, rows), d)


def test_qsi4c32p_pack_strided_inputs():
    """rhs_stride > k/2 and scale arrays wider than k/bl (KleidiAI's strides)."""
    z = np.load(vector_files("rhs_qsi4c32p_s1s0_n12_*.npz")[0])
    n, k, nr, kr, sr, bl = (_i(z, f) for f in ("n", "k", "nr", "kr", "sr", "bl"))
    wide = np.full((n, z["rhs_bytes"].shape[1] + 7), 0xAB, np.uint8)
    wide[:, :k // 2] = z["rhs_bytes"]
    sw = np.full((n, k // bl + 3), 0x7F80, np.uint16)
    sw[:, :k // bl] = z["scale_bf16"]
    got = QSI4C32P(nr, kr, sr, bl).pack(wide, sw, z["bias"], k=k)
    assert np.array_equal(got, z["packed"])


def test_f32_to_bf16_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, 1.0078125 + 2 ** -20, -3.0e-3, 65504.0, np.inf],
                 np.float32)
    b = f32_to_bf16_rne(x)
    assert list(b[:4]) == [0x3F80, 0x3F80, 0x3F82, 0x3F81]   # tie->even, tie->even(up), above tie
    assert np.array_equal(bf16_to_f32(b[4:6]), np.array([-0.0030059814453125, 65536.0], np.float32))
    assert b[6] == 0x7F80


def test_qsi4c32p_pack_from_ggml_and_float():
    rng = np.random.default_rng(11)
    n, k = 9, 128
    w = rng.normal(size=(n, k)).astype(np.float32) * np.float32(0.05)
    raw = quantize_q4_0(w)
    bias = rng.normal(size=n).astype(np.float32)
    for nr, kr, sr in [(4, 8, 2), (8, 16, 2), (4, 4, 1), (16, 16, 2)]:
        lay = QSI4C32P(nr, kr, sr, 32)
        p = lay.pack_from_ggml(raw, n, k, bias)
        assert p.size == lay.packed_size(n, k)
        assert np.array_equal(lay.pack_from_ggml(raw.reshape(-1), n, k, bias), p)
        assert np.array_equal(lay.pack_from_float(w, bias), p)
        assert np.array_equal(api.pack_rhs("qsi4c32p", w, nr=nr, kr=kr, sr=sr, bias=bias), p)
        assert np.array_equal(api.pack_rhs("qsi4c32p", np.ascontiguousarray(w.T), nr=nr, kr=kr, sr=sr,
                                           bias=bias, layout="kn"), p)
        assert np.array_equal(api.pack_rhs("qsi4c32p", ggml=raw, n=n, k=k, nr=nr, kr=kr, sr=sr, bias=bias), p)
        u, s, _, b = lay.unpack(p, n, k)
        u0, d0 = split_q4_0(raw, n, k)
        assert np.array_equal(u, u0) and np.array_equal(b, bias)
        assert np.array_equal(s, f32_to_bf16_rne(f16_bits_to_f32(d0)))
        # the same bytes as the s1s0 packer fed with the equivalent inputs
        s1s0 = (u0[:, 0::2] | (u0[:, 1::2] << 4)).astype(np.uint8)
        assert np.array_equal(lay.pack(s1s0, s, bias), p)
        d = lay.dequantize_rows(p, n, k, np.arange(n))
        exp = (u0.astype(np.float32) - 8) * np.repeat(bf16_to_f32(s), 32, axis=1)
        assert np.array_equal(_bits(d), _bits(exp))


# -----------------------------------------------------------------------------------------
# RHS qsi4c32pscalef16 (q4_0 rows, f16 scales)
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", vector_params("rhs_qsi4c32pscalef16_*.npz"), ids=_ids)
def test_qsi4c32pscalef16_pack_vectors(path):
    z = np.load(path)
    n, k, nr, kr, sr, bl = (_i(z, f) for f in ("n", "k", "nr", "kr", "sr", "bl"))
    lay = QSI4C32PScaleF16(nr, kr, sr, bl)
    raw = z["rhs_bytes"]
    got = lay.pack(raw)
    assert got.dtype == np.uint8 and np.array_equal(got, z["packed"])
    assert np.array_equal(lay.pack(raw.reshape(-1), n, k), got)
    assert np.array_equal(lay.pack_from_ggml(raw), got)
    assert np.array_equal(api.pack_rhs("qsi4c32pscalef16", ggml=raw, nr=nr, kr=kr, sr=sr, bl=bl), got)
    assert lay.packed_size(n, k) == _i(z, "packed_size") == got.size
    assert np.array_equal(lay.unpack(got, n, k), raw)
    v, s = lay.unpack_values(got, n, k)
    assert np.array_equal(v, z["rhs_u4"].astype(np.int8) - 8) and np.array_equal(s, z["scale_f16"])
    # getters: scale_offset / data_offset / segment_bytes, padding rows replicate row n-1
    GS = lay.group_stride(k)
    h = kr // 2
    for j in range(-(-n // nr) * nr):
        g, i = divmod(j, nr)
        src = raw[min(j, n - 1)].reshape(k // bl, 2 + bl // 2)
        for b in range(k // bl):
            o = g * GS + lay.scale_offset(b) + 2 * i
            assert np.array_equal(z["packed"][o:o + 2], src[b, :2])
            for sg in range(lay.segments_per_block):
                o = g * GS + lay.data_offset(b) + sg * lay.segment_bytes + i * h
                assert np.array_equal(z["packed"][o:o + h], src[b, 2 + sg * h:2 + (sg + 1) * h] ^ 0x88)


@pytest.mark.parametrize("path", vector_params("rhs_qsi4c32pscalef16_*.npz"), ids=_ids)
def test_qsi4c32pscalef16_dequantize_equals_gguf(path):
    import gguf  # the `test` extra (pyproject.toml) installs it
    z = np.load(path)
    n, k, nr, kr, sr, bl = (_i(z, f) for f in ("n", "k", "nr", "kr", "sr", "bl"))
    lay = QSI4C32PScaleF16(nr, kr, sr, bl)
    ref = gguf.quants.dequantize(z["rhs_bytes"], gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    rows = [n - 1, 0, 3, 3]
    got = lay.dequantize_rows(z["packed"], n, k, rows)
    assert got.dtype == np.float32 and np.array_equal(_bits(got), _bits(ref[rows]))
    assert np.array_equal(_bits(api.dequantize_rows(z["packed"], "qsi4c32pscalef16", n, k, nr, kr, sr,
                                                    bl, rows)), _bits(ref[rows]))


@pytest.mark.parametrize("nr,kr", [(4, 8), (4, 16), (8, 8), (4, 2), (16, 16), (3, 4)])
def test_qsi4c32pscalef16_ggml_round_trip(nr, kr):
    import gguf  # the `test` extra (pyproject.toml) installs it
    rng = np.random.default_rng(nr * 31 + kr)
    n, k = 11, 160
    w = (rng.normal(size=(n, k)) * 10.0 ** rng.uniform(-4, 2, size=(n, 1))).astype(np.float32)
    raw = quantize_q4_0(w)
    lay = QSI4C32PScaleF16(nr, kr, 2, 32)
    p = lay.pack_from_ggml(raw, n, k)
    assert np.array_equal(lay.pack_from_float(w), p)
    assert np.array_equal(api.pack_rhs("qsi4c32pscalef16", w, nr=nr, kr=kr, sr=2), p)
    assert np.array_equal(lay.unpack(p, n, k), raw)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(_bits(lay.dequantize_rows(p, n, k, np.arange(n))), _bits(ref))


@pytest.mark.parametrize("bl", [64, 128])
def test_qsi4c32pscalef16_long_blocks_pair_q_with_q_plus_half(bl):
    rng = np.random.default_rng(bl)
    n, k, nr, kr = 5, 2 * bl, 4, 16
    u4 = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    d = (rng.uniform(0.01, 0.1, size=(n, k // bl)) * rng.choice([-1, 1], size=(n, k // bl))).astype(np.float16)
    raw = join_q4_0(u4, d.view(np.uint16), bl=bl)
    # byte q of a block = element q (low) | element q + bl/2 (high)
    blk = raw.reshape(n, k // bl, 2 + bl // 2)
    assert np.array_equal(blk[0, 0, 2] & 15, u4[0, 0]) and np.array_equal(blk[0, 0, 2] >> 4, u4[0, bl // 2])
    lay = QSI4C32PScaleF16(nr, kr, 2, bl)
    p = lay.pack(raw)
    assert p.size == lay.packed_size(n, k)
    got = lay.dequantize_rows(p, n, k, np.arange(n))
    exp = (u4.astype(np.float32) - 8) * np.repeat(d.astype(np.float32), bl, axis=1)
    assert np.array_equal(_bits(got), _bits(exp))
    assert np.array_equal(dequantize_q4_0(raw, n, k, bl=bl), exp)
    # pack_from_float with the q4_0-style quantiser of bl-blocks
    w = rng.normal(size=(n, k)).astype(np.float32)
    assert np.array_equal(lay.pack_from_float(w), lay.pack(quantize_q4_0(w, bl=bl)))


# -----------------------------------------------------------------------------------------
# ggml Q4_0
# -----------------------------------------------------------------------------------------
def _q4_inputs():
    rng = np.random.default_rng(2024)
    out = {}
    out["normal"] = rng.normal(size=(16, 256)).astype(np.float32)
    z = (rng.normal(size=(9, 96)) * 3).astype(np.float32)
    z[0, :32] = 0
    z[1, 32:64] = -0.0
    z[2, :] = 0
    out["zero_blocks"] = z
    t = rng.integers(-16, 17, size=(12, 128)).astype(np.float32) * np.float32(0.5)   # many ties
    t[:, 0] = 8.0
    t[1::2, 0] = -8.0
    t[3, :32] = np.float32(4.0) * np.sign(rng.normal(size=32)).astype(np.float32)  # equal magnitudes
    out["ties"] = t
    out["large_range"] = (rng.normal(size=(10, 64)) * 10.0 ** rng.uniform(-30, 30, size=(10, 1))).astype(np.float32)
    out["f16_overflow"] = (rng.normal(size=(3, 64)) * np.float32(1e6)).astype(np.float32)
    out["tiny"] = (rng.normal(size=(4, 64)) * np.float32(1e-7)).astype(np.float32)
    out["ints"] = rng.integers(-8, 8, size=(6, 64)).astype(np.float32)
    return out


@pytest.mark.parametrize("kind", list(_q4_inputs()))
def test_quantize_q4_0_matches_gguf(kind):
    import gguf  # the `test` extra (pyproject.toml) installs it
    w = _q4_inputs()[kind]
    with np.errstate(all="ignore"):
        exp = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
        got = quantize_q4_0(w)
        assert got.dtype == np.uint8 and got.shape == (w.shape[0], w.shape[1] // 32 * 18)
        assert np.array_equal(got, exp)
        n, k = w.shape
        ref = gguf.quants.dequantize(exp, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
    deq = dequantize_q4_0(got, n, k)
    assert np.array_equal(_bits(deq), _bits(ref))
    assert np.array_equal(_bits(dequantize_q4_0(got.reshape(-1), n, k)), _bits(deq))


@pytest.mark.parametrize("path", vector_params("qsi8d32p_mm_*.npz"), ids=_ids)
def test_quantize_q4_0_matches_vectors(path):
    z = np.load(path)
    assert np.array_equal(quantize_q4_0(z["rhs_f32"]), z["rhs_q4_0"])


def test_q4_0_semantics():
    w = np.zeros((1, 32), np.float32)
    w[0, 3], w[0, 7] = -2.0, 2.0          # first of equal magnitudes wins: max = -2, d = 0.25
    raw = quantize_q4_0(w)
    u, d = split_q4_0(raw, 1, 32)
    assert f16_bits_to_f32(d)[0, 0] == 0.25
    assert u[0, 3] == 0 and u[0, 7] == 15 and u[0, 0] == 8   # -2/0.25 + 8.5 -> 0; 2 -> 16 -> 15
    assert np.array_equal(join_q4_0(u, d), raw)
    z = quantize_q4_0(np.zeros((1, 32), np.float32))
    assert list(z[0, :2]) == [0x00, 0x80] and np.all(z[0, 2:] == 0x88)   # d = -0.0, q = 8


# -----------------------------------------------------------------------------------------
# matmul vectors: packed operands and the reference arithmetic
# -----------------------------------------------------------------------------------------
def _geom(z):
    return tuple(_i(z, f) for f in ("m", "n", "k", "bl", "mr", "nr", "kr", "sr"))


@pytest.mark.parametrize("path", vector_params("matmul_clamp_f32_qai8dxp*.npz"), ids=_ids)
def test_matmul_qai8dxp_qsi4c32p_vectors(path):
    z = np.load(path)
    m, n, k, bl, mr, nr, kr, sr = g = _geom(z)
    lhs = QAI8DXP(mr, kr, sr).pack(z["lhs"])
    assert np.array_equal(lhs, z["lhs_packed"])
    rhs = QSI4C32P(nr, kr, sr, bl).pack(z["rhs_bytes"], z["scale_bf16"], z["bias"])
    assert np.array_equal(rhs, z["rhs_packed"])
    assert QSI4C32P(nr, kr, sr, bl).packed_size(n, k) == z["rhs_packed"].size
    assert QAI8DXP(mr, kr, sr).packed_size(m, k) == z["lhs_packed"].size
    dst = matmul_qai8dxp_qsi4c32p(z["lhs_packed"], z["rhs_packed"], *g,
                                  float(z["clamp_min"]), float(z["clamp_max"]))
    assert dst.dtype == np.float32 and dst.shape == (m, n)
    assert np.array_equal(_bits(dst), _bits(z["dst"]))


@pytest.mark.parametrize("path", vector_params("matmul_clamp_f32_qsi8d32p*.npz")
                         + vector_params("qsi8d32p_mm_*.npz"), ids=_ids)
def test_matmul_qsi8d32p_qsi4c32pscalef16_vectors(path):
    z = np.load(path)
    m, n, k, bl, mr, nr, kr, sr = g = _geom(z)
    # matmul_clamp_f32_qsi8d32p* (README.md): generic packer; qsi8d32p_mm_*: the named packer
    rounding = "even" if "lhs_packer" in z.files and "4x8sb" in str(z["lhs_packer"]) else "away"
    lhs_lay = QSI8D32P(mr, kr, sr, bl, rounding)
    lhs = lhs_lay.pack(z["lhs"])
    assert np.array_equal(lhs, z["lhs_packed"])
    assert lhs_lay.packed_size(m, k) == z["lhs_packed"].size
    raw = z["rhs_q4_0"] if "rhs_q4_0" in z.files else z["rhs_bytes"]
    rhs_lay = QSI4C32PScaleF16(nr, kr, sr, bl)
    assert np.array_equal(rhs_lay.pack(raw), z["rhs_packed"])
    assert rhs_lay.packed_size(n, k) == z["rhs_packed"].size
    if "rhs_f32" in z.files:
        assert np.array_equal(rhs_lay.pack_from_float(z["rhs_f32"]), z["rhs_packed"])
        assert np.array_equal(api.pack_rhs("qsi4c32pscalef16", z["rhs_f32"], nr=nr, kr=kr, sr=sr, bl=bl),
                              z["rhs_packed"])
    if "rhs_u4" in z.files:
        v, s = rhs_lay.unpack_values(z["rhs_packed"], n, k)
        assert np.array_equal(v, z["rhs_u4"].astype(np.int8) - 8) and np.array_equal(s, z["scale_f16"])
    dst = matmul_qsi8d32p_qsi4c32pscalef16(z["lhs_packed"], z["rhs_packed"], *g,
                                           float(z["clamp_min"]), float(z["clamp_max"]))
    assert dst.dtype == np.float32 and dst.shape == (m, n)
    assert np.array_equal(_bits(dst), _bits(z["dst"]))
    if "dst_unclamped" in z.files:
        free = matmul_qsi8d32p_qsi4c32pscalef16(z["lhs_packed"], z["rhs_packed"], *g, -FLT_MAX, FLT_MAX)
        assert np.array_equal(_bits(free), _bits(z["dst_unclamped"]))


def test_worked_bytes_of_the_qsi4c32p_doc():
    """The first packed bytes docs/layouts.md#qsi4c32p works out, from their vector."""
    [path] = vector_files("rhs_qsi4c32p_s1s0_n8_k64_nr4_kr8_sr2_bl32.npz")
    assert list(np.load(path)["packed"][:4]) == [0x53, 0x81, 0x19, 0xB3]


def test_mm_vectors_hold_the_optional_fields():
    """test_matmul_qsi8d32p_qsi4c32pscalef16_vectors checks rhs_f32, rhs_u4 and dst_unclamped
    where a vector has them: some vectors must, or those checks run nowhere."""
    files = vector_files("matmul_clamp_f32_qsi8d32p*.npz") + vector_files("qsi8d32p_mm_*.npz")
    for key in ("rhs_f32", "rhs_u4", "dst_unclamped"):
        assert any(key in np.load(f).files for f in files), key


def test_reference_clamp_order():
    """max first, then min: clamp_min > clamp_max gives clamp_max (docs/layouts.md#arith-qai8dxp)."""
    z = np.load(vector_files("matmul_clamp_f32_qai8dxp1x4_*_m1_*.npz")[0])
    dst = matmul_qai8dxp_qsi4c32p(z["lhs_packed"], z["rhs_packed"], *_geom(z), 1.0, -1.0)
    assert np.all(dst == -1.0)
    z = np.load(vector_files("qsi8d32p_mm_*_m1_n8_*.npz")[0])
    dst = matmul_qsi8d32p_qsi4c32pscalef16(z["lhs_packed"], z["rhs_packed"], *_geom(z), 1.0, -1.0)
    assert np.all(dst == -1.0)


def test_reference_ignores_padding_slots():
    z = np.load(vector_files("matmul_clamp_f32_qai8dxp4x8_*_m5_*.npz")[0])
    lhs = z["lhs_packed"].copy()
    lay = QAI8DXP(4, 16, 2)
    S, k = lay.row_block_stride(_i(z, "k")), _i(z, "k")
    lhs[S:] = np.where(np.arange(S, lhs.size) % 7 == 0, 0xFF, lhs[S:])   # scribble, keep row 4
    q, o, r = lay.unpack(lhs, 5, k)
    assert q.shape[0] == 5
    g = _geom(z)
    ref = matmul_qai8dxp_qsi4c32p(z["lhs_packed"], z["rhs_packed"], *g, -FLT_MAX, FLT_MAX)
    # rows 0..3 do not depend on block 1
    got = matmul_qai8dxp_qsi4c32p(lhs, z["rhs_packed"], *g, -FLT_MAX, FLT_MAX)
    assert np.array_equal(_bits(got[:4]), _bits(ref[:4]))


# -----------------------------------------------------------------------------------------
# names, api dispatch
# -----------------------------------------------------------------------------------------
def test_names_and_formats():
    assert QAI8DXP(4, 16, 2).name == "qai8dxp4x8" and QAI8DXP(1, 8, 2).name == "qai8dxp1x4"
    assert QSI8D32P(1, 16, 2).name == "qsi8d32p1x8" and QSI8D32P(4, 8, 2).format == "qsi8d32p"
    assert QSI4C32P(4, 16, 2, 32).name == "qsi4c32p4x8" and QSI4C32P(8, 16, 2).format == "qsi4c32p"
    # KleidiAI labels both int4 RHS formats qsi4c32p<nr>x<L>; the name tells them apart
    assert QSI4C32PScaleF16(4, 8, 2, 32).label == "qsi4c32p4x4" == QSI4C32P(4, 8, 2).label
    assert QSI4C32PScaleF16(4, 8, 2, 32).name == "qsi4c32p4x4scalef16"
    assert QSI4C32PScaleF16(4, 8, 2, 32).format == "qsi4c32pscalef16"
    assert QAI8DXP(4, 8, 2).format == "qai8dxp"
    assert QSI4C32PScaleF16.label_for("1vl", 8, 2) == "qsi4c32p1vlx4"


def test_geometry_numbers():
    a = QAI8DXP(4, 16, 2)
    assert (a.k_padded(96), a.row_block_stride(96), a.offset_field_offset(96), a.rscale_offset(96)) == \
        (96, 416, 384, 400)
    assert a.packed_size(5, 100) == 2 * 4 * (128 + 8) and a.packed_offset(5, 100) == 4 * 136
    q = QSI8D32P(4, 16, 2, 32)
    assert q.block_stride == 136 and q.row_block_stride(64) == 272
    assert (q.scale_offset(1), q.data_offset(1)) == (136, 144)
    r = QSI4C32P(4, 8, 2, 32)
    assert (r.block_bytes, r.group_stride(64), r.rsum_offset(64), r.bias_offset(64)) == (72, 176, 144, 160)
    assert r.block_offset(1) == 72 and r.scale_offset_in_block == 64 and r.packed_offset(8, 64) == 352
    s = QSI4C32PScaleF16(4, 16, 2, 32)
    assert (s.block_stride, s.group_stride(64), s.scale_offset(1), s.data_offset(1), s.segment_bytes) == \
        (72, 144, 72, 80, 32)
    assert s.packed_size(10, 96) == 3 * 4 * 3 * 18 and s.packed_offset(4, 96) == 216


def test_layout_for():
    assert api.layout_for("qai8dxp", mr=4, kr=16, sr=2) == QAI8DXP(4, 16, 2)
    assert api.layout_for("qsi8d32p", mr=4, kr=16, sr=2, bl=64, rounding="even") == QSI8D32P(4, 16, 2, 64, "even")
    assert api.layout_for("qsi4c32p", nr=4, kr=8, sr=2, bl=32) == QSI4C32P(4, 8, 2, 32)
    assert api.layout_for("qsi4c32pscalef16", nr=4, kr=8, sr=2, bl=32) == QSI4C32PScaleF16(4, 8, 2, 32)
    assert api.layout_for("f32p", nr=16) == F32PackedRHS(16)
    assert api.layout_for("f32p16x1b", nr=16, kr=1, sr=1, bl=32) == F32PackedRHS(16)
    with pytest.raises(LayoutError, match="unknown layout"):
        api.layout_for("q8_0", nr=4)
    with pytest.raises(LayoutError, match="unexpected geometry"):
        api.layout_for("qai8dxp", mr=4, kr=16, sr=2, nr=4)
    with pytest.raises(LayoutError, match="needs nr"):
        api.layout_for("qsi4c32p", kr=8, sr=2)


def test_api_pack_f32p_and_lhs():
    z = np.load(vector_files("rhs_f32p16x1b_kxn_*.npz")[0])
    bias = z["bias"] if int(z["has_bias"]) else None
    assert np.array_equal(api.pack_rhs("f32p", z["rhs_kxn"], nr=16, bias=bias, layout="kn"), z["packed"])
    f = api.dequantize_rows(z["packed"], "f32p", _i(z, "n"), _i(z, "k"), 16, 1, 1, 32, [1, 0])
    assert np.array_equal(f, z["rhs_kxn"].T[[1, 0]])
    x = np.random.default_rng(3).normal(size=(3, 64)).astype(np.float32)
    assert np.array_equal(api.pack_lhs("qsi8d32p", x, mr=4, kr=8, sr=2), QSI8D32P(4, 8, 2).pack(x))
    assert np.array_equal(api.pack_lhs("qai8dxp", x, mr=4, kr=8, sr=2, m_idx_start=2),
                          QAI8DXP(4, 8, 2).pack(x, m_idx_start=2))


# -----------------------------------------------------------------------------------------
# errors
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("make,msg", [
    (lambda: QAI8DXP(4, 15, 2), "multiple of sr"),
    (lambda: QAI8DXP(4, 24, 2), "divide 32"),
    (lambda: QAI8DXP(0, 8, 2), "positive"),
    (lambda: QSI8D32P(4, 16, 2, 48), "multiple of 32"),
    (lambda: QSI8D32P(4, 16, 2, 32, "nearest"), "rounding"),
    (lambda: QSI8D32P(4, 24, 1, 32), "divide bl"),
    (lambda: QSI4C32P(6, 8, 2, 32), "nr=6"),
    (lambda: QSI4C32P(4, 8, 3, 32), "multiple of sr"),
    (lambda: QSI4C32P(4, 8, 2, 40), "multiple of 32"),
    (lambda: QSI4C32P(4, 12, 2, 32), "multiple of kr"),
    (lambda: QSI4C32P(4, 6, 2, 96), "even and divide 16"),
    (lambda: QSI4C32P(4, 32, 1, 32), "even and divide 16"),
    (lambda: QSI4C32PScaleF16(4, 8, 1, 32), "sr=2"),
    (lambda: QSI4C32PScaleF16(4, 32, 2, 64), "kr <= 16"),
    (lambda: QSI4C32PScaleF16(4, 12, 2, 32), "multiple of kr"),
])
def test_bad_geometry(make, msg):
    with pytest.raises(LayoutError, match=msg):
        make()


def test_bad_inputs():
    x = np.zeros((3, 64), np.float32)
    with pytest.raises(LayoutError, match="float32"):
        QAI8DXP(4, 8, 2).pack(x.astype(np.float64))
    with pytest.raises(LayoutError, match="2-D"):
        QAI8DXP(4, 8, 2).pack(x[0])
    with pytest.raises(LayoutError, match="k >= 1"):
        QAI8DXP(4, 8, 2).pack(np.zeros((2, 0), np.float32))
    with pytest.raises(LayoutError, match="m_idx_start"):
        QAI8DXP(4, 8, 2).pack(x, m_idx_start=-1)
    with pytest.raises(LayoutError, match="multiple of bl"):
        QSI8D32P(4, 8, 2, 32).pack(np.zeros((2, 48), np.float32))
    with pytest.raises(LayoutError, match="bytes"):
        QSI8D32P(4, 8, 2).unpack(np.zeros(10, np.uint8), 3, 64)
    lay = QSI4C32P(4, 8, 2, 32)
    s1s0 = np.zeros((5, 32), np.uint8)
    sc = np.zeros((5, 2), np.uint16)
    with pytest.raises(LayoutError, match="uint8"):
        lay.pack(s1s0.astype(np.int8), sc)
    with pytest.raises(LayoutError, match="uint16"):
        lay.pack(s1s0, sc.astype(np.float32))
    with pytest.raises(LayoutError, match="rows"):
        lay.pack(s1s0, sc[:4])
    with pytest.raises(LayoutError, match="k/2"):
        lay.pack(s1s0[:, :20], sc)
    with pytest.raises(LayoutError, match="multiple of bl"):
        lay.pack(s1s0, sc, k=48)
    with pytest.raises(LayoutError, match="bias"):
        lay.pack(s1s0, sc, np.zeros(4, np.float32))
    with pytest.raises(LayoutError, match="bias"):
        lay.pack(s1s0, sc, np.zeros(5, np.float64))
    with pytest.raises(LayoutError, match="0..15"):
        lay.pack_u4(np.full((5, 64), 16, np.uint8), sc)
    with pytest.raises(LayoutError, match="bl=32"):
        QSI4C32P(4, 8, 2, 64).pack_from_ggml(np.zeros((5, 36), np.uint8), 5, 64)
    with pytest.raises(LayoutError, match="bytes"):
        lay.pack_from_ggml(np.zeros((5, 35), np.uint8), 5, 64)
    with pytest.raises(LayoutError, match="multiple of nr"):
        lay.packed_offset(2, 64)
    with pytest.raises(LayoutError, match="row indices"):
        lay.dequantize_rows(np.zeros(lay.packed_size(5, 64), np.uint8), 5, 64, [5])
    f16 = QSI4C32PScaleF16(4, 8, 2, 32)
    with pytest.raises(LayoutError, match="multiple of 18"):
        f16.pack(np.zeros((5, 35), np.uint8))
    with pytest.raises(LayoutError, match="uint8"):
        f16.pack(np.zeros((5, 36), np.int16))
    with pytest.raises(LayoutError, match="both n and k"):
        f16.pack(np.zeros(180, np.uint8), n=5)
    with pytest.raises(LayoutError, match="must hold"):
        f16.pack(np.zeros(170, np.uint8), 5, 64)
    with pytest.raises(LayoutError, match="float32"):
        quantize_q4_0(np.zeros((2, 64), np.float64))
    with pytest.raises(LayoutError, match="multiple of the block length"):
        quantize_q4_0(np.zeros((2, 48), np.float32))
    with pytest.raises(LayoutError, match="no bias"):
        api.pack_rhs("qsi4c32pscalef16", np.zeros((4, 64), np.float32), nr=4, kr=8, sr=2,
                     bias=np.zeros(4, np.float32))
    with pytest.raises(LayoutError, match="exactly one"):
        api.pack_rhs("qsi4c32p", nr=4, kr=8, sr=2)
    with pytest.raises(LayoutError, match="needs n and k"):
        api.pack_rhs("qsi4c32p", ggml=np.zeros((4, 36), np.uint8), nr=4, kr=8, sr=2)
    with pytest.raises(LayoutError, match="unknown RHS"):
        api.pack_rhs("qai8dxp", np.zeros((4, 64), np.float32), nr=4)
    with pytest.raises(LayoutError, match="unknown LHS"):
        api.pack_lhs("qsi4c32p", x, mr=4, kr=8, sr=2)
    with pytest.raises(LayoutError, match="rounding"):
        api.pack_lhs("qai8dxp", x, mr=4, kr=8, sr=2, rounding="even")


# -----------------------------------------------------------------------------------------
# tiny activations (issue #30 item 2): every int8 LHS quantiser through its kernel reference
# -----------------------------------------------------------------------------------------
def test_lhs_quantisers_at_tiny_activations_against_float64():
    """qai8dxp (x qsi4c32p and x qsi8cxp) and qsi8d32p (ties away and even, x qsi4c32pscalef16)
    at test_lhs_pack_neon.TINY_KINDS, through the bit-exact kernel references, against the
    float64 product of x with the dequantised weights.  A row is either right (relative error
    <= 0.02 of sum |x||w|) or flushed -- exactly 0 (the bias, 0 here), never NaN, never values saturated
    to +-127 through a reciprocal scale of +inf -- and it is flushed only where the format's
    scale cannot hold it: qai8dxp's 255/(rmax - rmin) overflows f32 (range < 255/FLT_MAX, the
    stored 1/scale is 0, as KleidiAI's packer), qsi8d32p's f16(amax/127) is 0 in every block."""
    from test_lhs_pack_neon import TINY_KINDS, flushed_rows, tiny_rows
    from tilegen.layout.rhs_int8 import QSI8CXP
    from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp
    F = np.float32
    rng = np.random.default_rng(3041)
    n, k = 8, 96
    x = tiny_rows(rng, k)
    m = x.shape[0]
    w = (rng.normal(size=(n, k)) * 0.5).astype(F)
    bias = np.zeros(n, F)     # a bias of O(1) would hide the tiny rows' results (1 + 1e-37 = 1)
    inf = float("inf")
    raw = quantize_q4_0(w)
    s8 = (np.abs(w).max(axis=1) / 127).astype(F)
    q8 = np.clip(np.rint(w / s8[:, None]), -127, 127).astype(np.int8)
    q4p = QSI4C32P(4, 8, 2, 32)
    q4p_packed = q4p.pack_from_float(w, bias)
    runs = []
    lhs = QAI8DXP(4, 8, 2).pack(x)
    runs.append(("qai8dxp x qsi4c32p", "qai8dxp", bias,
                 q4p.dequantize_rows(q4p_packed, n, k, np.arange(n)),
                 matmul_qai8dxp_qsi4c32p(lhs, q4p_packed, m, n, k, 32, 4, 4, 8, 2, -inf, inf)))
    runs.append(("qai8dxp x qsi8cxp", "qai8dxp", bias, q8.astype(F) * s8[:, None],
                 matmul_qai8dxp_qsi8cxp(lhs, QSI8CXP(4, 8).pack(q8, s8, bias), m, n, k,
                                        4, 4, 8, 2, -inf, inf)))
    for rounding in ("away", "even"):
        lay = QSI8D32P(4, 16, 2, 32, rounding)
        runs.append((f"qsi8d32p ({rounding}) x qsi4c32pscalef16", "qsi8d32p", np.zeros(n, F),
                     dequantize_q4_0(raw, n, k),
                     matmul_qsi8d32p_qsi4c32pscalef16(lay.pack(x), QSI4C32PScaleF16(4, 16, 2, 32)
                                                      .pack(raw), m, n, k, 32, 4, 4, 16, 2,
                                                      -inf, inf)))
    x64 = x.astype(np.float64)
    for what, fmt, b, wd, y in runs:
        wd = wd.astype(np.float64)
        y64 = x64 @ wd.T + b
        mag = np.abs(x64) @ np.abs(wd).T
        assert np.all(np.isfinite(y)), what
        flushable = flushed_rows(x, fmt)
        for i, kind in enumerate(TINY_KINDS):
            label = f"{what}, row {kind!r}"
            if np.array_equal(y[i], b) and mag[i].max() > 0:
                assert flushable[i], f"{label}: flushed, though its scale is representable"
                continue
            err = np.abs(y[i] - y64[i]).max()
            assert err <= 0.02 * mag[i].max(), f"{label}: error {err:.3g}, |x||w| {mag[i].max():.3g}"
    # every edge row was seen on both sides: flushed ones below the edges, kept ones above
    assert list(flushed_rows(x, "qai8dxp")) == [k_ in ("1e-38", "few ulps", "1e-38 positive", "1e-38 negative",
                                    "subnormal", "below the edge") for k_ in TINY_KINDS]
