"""Host-side tests of the bf16 layouts (tilegen.layout.bf16) and the numpy reference of the bf16
kernels (tilegen.reference.bf16) against KleidiAI's golden vectors (SME at SVL 128/256/512 bits,
NEON BFMMLA and BFDOT)."""

import numpy as np
import pytest

from tilegen.layout.base import LayoutError
from tilegen.layout.bf16 import (BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B, bf16_to_f32,
                                 f32_to_bf16_rne)
from tilegen.reference.bf16 import matmul_bf16, matmul_bf16_f64, rto32_add

from conftest import vector_params

FLT_MAX = 3.4028234663852886e38


ALL = vector_params("bf16_*.npz")
NEON = vector_params("bf16_*.npz", keep=lambda p: "_sme_" not in p.name)
GEMV = vector_params("bf16_m1_*.npz", keep=lambda p: "_sme_" not in p.name)


def _ids(p):
    return p.stem


def _bits(a):
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def _mnk(z):
    return tuple(int(v) for v in z["shape_mnk"])


def _masked_equal(got, exp, mask):
    assert got.dtype == np.uint8 and got.shape == exp.shape, (got.shape, exp.shape)
    m = mask.astype(bool)
    assert np.array_equal(got[m], exp[m]), f"{np.count_nonzero(got[m] != exp[m])} written bytes differ"
    assert not np.any(got[~m]), "unwritten slots must be zero"


def _sme(z):
    vl = int(z["sme2_mopa__svl_bits"]) // 8
    lhs, rhs = BF16PLhs2.for_vl(vl), BF16PRhs2B.for_vl(vl)
    assert (lhs.mr, rhs.nr, lhs.kr) == (int(z["sme2_mopa__mr"]), int(z["sme2_mopa__nr"]),
                                        int(z["sme2_mopa__kr"]))
    return lhs, rhs


# -----------------------------------------------------------------------------------------
# golden vectors: SME
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ALL, ids=_ids)
def test_sme_packers_match_kleidiai(path):
    z = np.load(path)
    lhs, rhs = _sme(z)
    _masked_equal(lhs.pack(z["lhs_f32"]), z["sme2_mopa__lhs_packed"], z["sme2_mopa__lhs_packed_written"])
    _masked_equal(rhs.pack(z["rhs_kxn_f32"], z["bias"], layout="kn"), z["sme2_mopa__rhs_packed"],
                  z["sme2_mopa__rhs_packed_written"])


@pytest.mark.parametrize("path", ALL, ids=_ids)
def test_sme_sizes_match_kleidiai(path):
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = _sme(z)
    ms, ns = int(z["sme2_mopa__m_step"]), int(z["sme2_mopa__n_step"])
    got = [lhs.packed_size(m, k), rhs.packed_size(n, k), rhs.group_stride(k), m * n * 4,
           lhs.packed_offset(lhs.mr, k), rhs.packed_offset(rhs.nr, k),
           lhs.packed_offset(ms, k), rhs.packed_offset(ns, k)]
    assert got == z["sme2_mopa__sizes"].tolist()


@pytest.mark.parametrize("path", ALL, ids=_ids)
def test_sme_reference_bit_exact(path):
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = _sme(z)
    lp, rp = z["sme2_mopa__lhs_packed"], z["sme2_mopa__rhs_packed"]
    d = matmul_bf16(lp, rp, m, n, k, lhs, rhs, -FLT_MAX, FLT_MAX)
    assert np.array_equal(_bits(d), _bits(z["sme2_mopa__dst"]))
    dc = matmul_bf16(lp, rp, m, n, k, lhs, rhs, float(z["clamp_min"]), float(z["clamp_max"]))
    assert np.array_equal(_bits(dc), _bits(z["sme2_mopa__dst_clamped"]))


# -----------------------------------------------------------------------------------------
# golden vectors: NEON (BFMMLA 8x12, BFDOT 1x36)
# -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", NEON, ids=_ids)
def test_neon_packers_match_kleidiai(path):
    z = np.load(path)
    _masked_equal(BF16PLhs4(8).pack(z["lhs_f32"]), z["neon_mmla_8x12__lhs_packed"],
                  z["neon_mmla_8x12__lhs_packed_written"])
    _masked_equal(BF16PRhs4B(12).pack(z["rhs_kxn_f32"], z["bias"], layout="kn"),
                  z["neon_bf16p12x4b__rhs_packed"], z["neon_bf16p12x4b__rhs_packed_written"])


@pytest.mark.parametrize("path", NEON, ids=_ids)
def test_neon_sizes_match_kleidiai(path):
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = BF16PLhs4(8), BF16PRhs4B(12)
    assert (int(z["neon_mmla_8x12__mr"]), int(z["neon_mmla_8x12__nr"]), int(z["neon_mmla_8x12__kr"])) == (8, 12, 4)
    got = [lhs.packed_size(m, k), rhs.packed_size(n, k), m * n * 4,
           lhs.packed_offset(8, k), rhs.packed_offset(12, k)]
    assert got == z["neon_mmla_8x12__sizes"].tolist()


@pytest.mark.parametrize("path", NEON, ids=_ids)
def test_neon_mmla_reference_bit_exact(path):
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = BF16PLhs4(8), BF16PRhs4B(12)
    lp, rp = z["neon_mmla_8x12__lhs_packed"], z["neon_bf16p12x4b__rhs_packed"]
    d = matmul_bf16(lp, rp, m, n, k, lhs, rhs, -FLT_MAX, FLT_MAX)
    assert np.array_equal(_bits(d), _bits(z["neon_mmla_8x12__dst"]))
    dc = matmul_bf16(lp, rp, m, n, k, lhs, rhs, float(z["clamp_min"]), float(z["clamp_max"]))
    assert np.array_equal(_bits(dc), _bits(z["neon_mmla_8x12__dst_clamped"]))
    # MMLA and SME agree bit for bit on the same inputs
    assert np.array_equal(_bits(d), _bits(z["sme2_mopa__dst"]))


@pytest.mark.parametrize("path", GEMV, ids=_ids)
def test_neon_dot_gemv_within_tolerance(path):
    """The BFDOT 1x36 kernel sums in another order: same packed inputs, not bit-exact with the
    pairwise round-to-odd model; within 2e-7 (relative to max |dst|) of float64."""
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = BF16PLhs4(1), BF16PRhs4B(12)
    _masked_equal(lhs.pack(z["lhs_f32"]), z["neon_dot_1x36__lhs_packed"], z["neon_dot_1x36__lhs_packed_written"])
    assert z["neon_dot_1x36__sizes"].tolist() == [lhs.packed_size(m, k), rhs.packed_size(n, k), m * n * 4]
    lp, rp = z["neon_dot_1x36__lhs_packed"], z["neon_bf16p12x4b__rhs_packed"]
    exp = matmul_bf16_f64(lp, rp, m, n, k, lhs, rhs)
    got = z["neon_dot_1x36__dst"].astype(np.float64)
    assert np.abs(got - exp).max() <= 2e-7 * np.abs(exp).max()
    model = matmul_bf16(lp, rp, m, n, k, lhs, rhs, -FLT_MAX, FLT_MAX)
    assert np.abs(model - exp).max() <= 2e-7 * np.abs(exp).max()


@pytest.mark.parametrize("path", NEON[:2], ids=_ids)
def test_round_to_nearest_accumulation_does_not_reproduce(path):
    """Plain f32 (round-to-nearest) accumulation of the same pairs differs from the vectors."""
    z = np.load(path)
    m, n, k = _mnk(z)
    lhs, rhs = BF16PLhs4(8), BF16PRhs4B(12)
    a = bf16_to_f32(lhs.unpack(z["neon_mmla_8x12__lhs_packed"], m, k)).astype(np.float64)
    bv, bias = rhs.unpack(z["neon_bf16p12x4b__rhs_packed"], n, k)
    b = bf16_to_f32(bv).astype(np.float64)
    acc = np.broadcast_to(bias, (m, n)).astype(np.float32)
    for p in range(a.shape[1] // 2):
        t = (a[:, 2 * p, None] * b[None, :, 2 * p] + a[:, 2 * p + 1, None] * b[None, :, 2 * p + 1]).astype(np.float32)
        acc = (acc + t).astype(np.float32)
    assert not np.array_equal(_bits(acc), _bits(z["neon_mmla_8x12__dst"]))


# -----------------------------------------------------------------------------------------
# conversions and round-to-odd
# -----------------------------------------------------------------------------------------
def test_f32_to_bf16_round_to_nearest_even():
    b = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x3F80FFFF, 0x7F7FFFFF, 0x80000000], np.uint32)
    assert f32_to_bf16_rne(b.view(np.float32)).tolist() == [0x3F80, 0x3F82, 0x3F81, 0x3F81, 0x7F80, 0x8000]
    x = np.random.default_rng(5).standard_normal(1000).astype(np.float32)
    r = bf16_to_f32(f32_to_bf16_rne(x))
    assert np.all(np.abs(r - x) <= np.abs(x) * 2.0 ** -8)


def test_rto32_add():
    one = 1.0
    u = 2.0 ** -23                                   # ulp of 1.0 in f32
    cases = [
        (one, 0.0, one),                             # exact
        (one, u / 4, one + u),                       # inexact, even LSB -> set it
        (one + u, u / 4, one + u),                   # inexact, LSB already odd
        (one, -u / 4, one - u / 2),                  # below 1.0: truncated to 1 - 2^-24 (odd)
        (-one, -u / 4, -(one + u)),
        (one, 2.0 ** -80, one + u),                  # beyond float64 precision: TwoSum keeps it
        (one + u, -(2.0 ** -80), one + u),           # truncates to 1.0 (even), inexact -> 1 + u
        (2.0 ** -130, 0.0, 0.0),                     # subnormal result flushes to zero
    ]
    for x, y, exp in cases:
        got = rto32_add(np.array([x]), np.array([y]))[0]
        assert got == exp, (x, y, got, exp)
    # random agreement with an exact rational model
    from fractions import Fraction
    rng = np.random.default_rng(9)
    xs = rng.standard_normal(300) * 2.0 ** rng.integers(-20, 20, 300)
    ys = rng.standard_normal(300) * 2.0 ** rng.integers(-40, 0, 300)
    got = rto32_add(xs, ys)
    for x, y, g in zip(xs, ys, got):
        v = Fraction(x) + Fraction(y)
        t = np.float32(float(v))
        if abs(Fraction(float(t))) > abs(v):
            t = np.nextafter(t, np.float32(0))
        if Fraction(float(t)) != v and not (t.view(np.uint32) & 1):
            t = (t.view(np.uint32) | np.uint32(1)).view(np.float32)
        assert g == float(t)


# -----------------------------------------------------------------------------------------
# geometry and round trips
# -----------------------------------------------------------------------------------------
LAYOUTS_LHS = [BF16PLhs4(8), BF16PLhs4(1), BF16PLhs2(8), BF16PLhs2(32), BF16PLhs2.for_vl(32, 1)]
LAYOUTS_RHS = [BF16PRhs4B(12), BF16PRhs4B(8), BF16PRhs2B(16), BF16PRhs2B.for_vl(64)]


@pytest.mark.parametrize("lay", LAYOUTS_LHS, ids=lambda l: l.name)
@pytest.mark.parametrize("m,k", [(1, 1), (7, 3), (9, 19), (33, 131), (64, 32)])
def test_lhs_geometry_and_round_trip(lay, m, k):
    kp = -(-k // lay.kr) * lay.kr
    S = lay.mr * kp * 2
    assert lay.row_block_stride(k) == S
    assert lay.packed_size(m, k) == -(-m // lay.mr) * S
    for blk in range(-(-m // lay.mr)):
        assert lay.packed_offset(blk * lay.mr, k) == blk * S
    if lay.mr > 1:
        with pytest.raises(LayoutError):
            lay.packed_offset(1, k)
    rng = np.random.default_rng(100 + m * 7 + k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[x == 0] = 1
    buf = lay.pack(x)
    assert buf.size == lay.packed_size(m, k)
    v = lay.unpack(buf, m, k)
    assert np.array_equal(v[:, :k], f32_to_bf16_rne(x)) and not v[:, k:].any()
    i, t = m - 1, k - 1
    off = lay.packed_offset(i // lay.mr * lay.mr, k) + lay.element_offset(i % lay.mr, t)
    assert buf[off:off + 2].view(np.uint16)[0] == f32_to_bf16_rne(x[i, t])
    pad = lay.unpack(buf, -(-m // lay.mr) * lay.mr, k)[m:]
    if isinstance(lay, BF16PLhs4):
        assert np.array_equal(pad, np.broadcast_to(v[(m - 1) // lay.mr * lay.mr], pad.shape))
    else:
        assert not pad.any()


@pytest.mark.parametrize("lay", LAYOUTS_RHS, ids=lambda l: l.name)
@pytest.mark.parametrize("n,k", [(1, 1), (13, 3), (37, 19), (70, 131), (64, 32)])
def test_rhs_geometry_and_round_trip(lay, n, k):
    kp = -(-k // lay.kr) * lay.kr
    S = lay.nr * (4 + kp * 2)
    assert lay.group_stride(k) == S
    assert lay.packed_size(n, k) == -(-n // lay.nr) * S
    for g in range(-(-n // lay.nr)):
        assert lay.packed_offset(g * lay.nr, k) == g * S
    assert lay.data_offset(k) == lay.bias_bytes == 4 * lay.nr
    rng = np.random.default_rng(200 + n * 7 + k)
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[w == 0] = 1
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    buf = lay.pack(w, bias)
    assert np.array_equal(buf, lay.pack(np.ascontiguousarray(w.T), bias, layout="kn"))
    assert buf.size == lay.packed_size(n, k)
    v, b = lay.unpack(buf, n, k)
    assert np.array_equal(v[:, :k], f32_to_bf16_rne(w)) and np.array_equal(b, bias)
    assert np.array_equal(v[:, k:], np.broadcast_to(v[:, :1], v[:, k:].shape))   # K-row 0 repeated
    j, t = n - 1, k - 1
    off = lay.packed_offset(j // lay.nr * lay.nr, k) + lay.data_offset(k) + lay.element_offset(j % lay.nr, t)
    assert buf[off:off + 2].view(np.uint16)[0] == f32_to_bf16_rne(w[j, t])
    vp, bp = lay.unpack(buf, -(-n // lay.nr) * lay.nr, k)
    assert not vp[n:].any() and not bp[n:].any()
    assert np.array_equal(lay.dequantize_rows(buf, n, k, [0, n - 1]), bf16_to_f32(f32_to_bf16_rne(w[[0, n - 1]])))
    assert not lay.unpack(lay.pack(w), n, k)[1].any()


def test_names_and_vl():
    assert BF16PLhs4().name == "bf16p8x4" and BF16PRhs4B().name == "bf16p12x4b"
    assert BF16PLhs2.for_vl(64).name == "bf16p32x2" and BF16PRhs2B.for_vl(16).name == "bf16p8x2b"
    assert BF16PLhs2.for_vl(32, units=1).mr == 8
    for bad in (lambda: BF16PLhs4(8, 2), lambda: BF16PLhs2(8, 4), lambda: BF16PRhs4B(12, 2),
                lambda: BF16PRhs2B(0), lambda: BF16PLhs2.for_vl(18)):
        with pytest.raises(LayoutError):
            bad()
    with pytest.raises(LayoutError):
        BF16PLhs4().pack(np.zeros((2, 3), np.float64))
    with pytest.raises(LayoutError):
        BF16PRhs4B().pack(np.zeros((2, 3), np.float32), np.zeros(3, np.float32))


def test_reference_close_to_float64():
    """Round trip of the whole path on fresh inputs: packers + reference vs float64."""
    rng = np.random.default_rng(77)
    m, n, k = 11, 29, 45
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    bias = rng.uniform(-1, 1, n).astype(np.float32)
    for lhs, rhs in ((BF16PLhs4(8), BF16PRhs4B(12)), (BF16PLhs2(16), BF16PRhs2B(16))):
        lp, rp = lhs.pack(x), rhs.pack(w, bias)
        d = matmul_bf16(lp, rp, m, n, k, lhs, rhs, -FLT_MAX, FLT_MAX)
        e = matmul_bf16_f64(lp, rp, m, n, k, lhs, rhs)
        assert np.abs(d - e).max() <= 1e-6 * np.abs(e).max()


def test_api_dispatch():
    from tilegen.layout import api
    assert api.layout_for("bf16p12x4b") == BF16PRhs4B(12)
    assert api.layout_for("bf16px4b", nr=12, kr=4, sr=1, bl=32) == BF16PRhs4B(12)
    assert api.layout_for("bf16p32x2b") == BF16PRhs2B(32) == api.layout_for("bf16px2b", nr=32)
    assert api.layout_for("bf16p8x4") == BF16PLhs4(8)
    assert api.layout_for("bf16px2", mr=16) == BF16PLhs2(16)
    with pytest.raises(LayoutError):
        api.layout_for("bf16p12x4b", nr=8)
    with pytest.raises(LayoutError):
        api.layout_for("bf16px2b")
    rng = np.random.default_rng(61)
    w = rng.standard_normal((10, 7)).astype(np.float32)
    x = rng.standard_normal((3, 7)).astype(np.float32)
    b = rng.standard_normal(10).astype(np.float32)
    assert np.array_equal(api.pack_rhs("bf16px4b", w, nr=12, bias=b), BF16PRhs4B(12).pack(w, b))
    assert np.array_equal(api.pack_rhs("bf16p16x2b", np.ascontiguousarray(w.T), nr=16, kr=2, bias=b, layout="kn"),
                          BF16PRhs2B(16).pack(w, b))
    assert np.array_equal(api.pack_lhs("bf16px4", x, mr=8, kr=4, sr=1), BF16PLhs4(8).pack(x))
    assert np.array_equal(api.pack_lhs("bf16p16x2", x, mr=16, kr=2, sr=1), BF16PLhs2(16).pack(x))
    buf = BF16PRhs4B(12).pack(w, b)
    assert np.array_equal(api.dequantize_rows(buf, "bf16p12x4b", 10, 7, 12, 4, 1, 32, [0, 9]),
                          BF16PRhs4B(12).dequantize_rows(buf, 10, 7, [0, 9]))
