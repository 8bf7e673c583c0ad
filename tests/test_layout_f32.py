import numpy as np
import pytest

import tilegen
from tilegen.layout import F32PackedRHS, LayoutError

from conftest import vector_params


@pytest.mark.parametrize("path", vector_params("rhs_f32p16x1b_kxn_*.npz"), ids=lambda p: p.stem)
def test_pack_matches_kleidiai_vectors(path):
    z = np.load(path)
    bias = z["bias"] if int(z["has_bias"]) else None
    w_kn = z["rhs_kxn"]
    got_kn = tilegen.pack_rhs("f32p", w_kn, nr=16, bias=bias, layout="kn")
    got_nk = tilegen.pack_rhs("f32p", np.ascontiguousarray(w_kn.T), nr=16, bias=bias)
    assert got_kn.dtype == np.uint8
    assert np.array_equal(got_kn, z["packed"])
    assert np.array_equal(got_nk, z["packed"])
    assert F32PackedRHS(16).packed_size(int(z["n"]), int(z["k"])) == int(z["packed_size"])


@pytest.mark.parametrize("path", vector_params("matmul_clamp_f32_f32_f32p16x1b_*.npz"), ids=lambda p: p.stem)
def test_matmul_vector_rhs_and_reference(path):
    from tilegen.reference.f32 import matmul_f32
    z = np.load(path)
    packed = tilegen.pack_rhs("f32p", z["rhs_kxn"], nr=16, bias=z["bias"], layout="kn")
    assert np.array_equal(packed, z["rhs_packed"])
    ref = matmul_f32(z["lhs"], z["rhs_kxn"].T, z["bias"], float(z["clamp_min"]), float(z["clamp_max"]))
    assert np.array_equal(ref.view(np.uint32), z["dst"].view(np.uint32))


@pytest.mark.parametrize("nr", [4, 8, 12, 16, 24])
@pytest.mark.parametrize("n,k", [(1, 1), (5, 3), (17, 9), (40, 2)])
def test_roundtrip_and_padding(nr, n, k):
    rng = np.random.default_rng(n * 100 + k + nr)
    w = rng.normal(size=(n, k)).astype(np.float32)
    b = rng.normal(size=n).astype(np.float32)
    lay = F32PackedRHS(nr)
    p = lay.pack(w, bias=b)
    assert p.size == lay.packed_size(n, k) == -(-n // nr) * nr * 4 * (1 + k)
    w2, b2 = lay.unpack(p, n, k)
    assert np.array_equal(w2, w) and np.array_equal(b2, b)
    panels = p.view(np.float32).reshape(-1, 1 + k, nr)
    last = n - (panels.shape[0] - 1) * nr
    assert not panels[-1, :, last:].any()          # columns past n are zero
    assert lay.packed_offset(nr, k) == lay.panel_stride(k)


def test_pack_errors():
    lay = F32PackedRHS(8)
    with pytest.raises(LayoutError, match="float32"):
        lay.pack(np.ones((4, 4)))
    with pytest.raises(LayoutError, match="2-D"):
        lay.pack(np.ones(4, np.float32))
    with pytest.raises(LayoutError, match="bias"):
        lay.pack(np.ones((4, 4), np.float32), bias=np.ones(3, np.float32))
    with pytest.raises(LayoutError, match="layout"):
        lay.pack(np.ones((4, 4), np.float32), layout="xy")
    with pytest.raises(LayoutError, match="multiple of nr"):
        lay.packed_offset(3, 4)
    with pytest.raises(LayoutError, match="unknown RHS format"):
        tilegen.pack_rhs("f16p", np.ones((4, 4), np.float32), nr=8)


def test_fma_reference_is_fused():
    from tilegen.reference.f32 import fma_f32
    # 1 + 2^-24 is not representable; a*b + c rounded twice loses the low term
    a = np.float32(1 + 2 ** -12)
    c = np.float32(-1 - 2 ** -11)
    exact = np.float64(a) * np.float64(a) + np.float64(c)     # = 2^-24, exact in f64
    assert fma_f32(np.array([a]), np.array([a]), np.array([c]))[0] == np.float32(exact)
    assert np.float32(a * a) + c != np.float32(exact)
    # midpoint case: p + c lands on an f32 midpoint in f64, the error term breaks the tie
    rng = np.random.default_rng(7)
    x = rng.normal(size=100000).astype(np.float32)
    y = rng.normal(size=100000).astype(np.float32)
    z = rng.normal(size=100000).astype(np.float32)
    r = fma_f32(x, y, z)
    ref = np.array([float(np.float32(np.longdouble(a) * np.longdouble(b) + np.longdouble(c)))
                    for a, b, c in zip(x[:2000], y[:2000], z[:2000])], dtype=np.float32)
    assert np.array_equal(r[:2000], ref)


def test_f32_packed_lhs_roundtrip_and_geometry():
    from tilegen.layout import F32PackedLHS
    rng = np.random.default_rng(3)
    x = rng.normal(size=(13, 7)).astype(np.float32)
    lay = F32PackedLHS(mr=8)
    p = lay.pack(x)
    assert p.nbytes == lay.packed_size(13, 7) == 2 * 8 * 7 * 4
    blk = p.view(np.float32).reshape(2, 7, 8)
    assert np.array_equal(blk[0], x[:8].T) and np.array_equal(blk[1][:, :5], x[8:].T)
    assert not blk[1][:, 5:].any()                      # rows past m are zero
    assert np.array_equal(lay.unpack(p, 13, 7), x)
    assert lay.packed_offset(8, 7) == 8 * 7 * 4
    with pytest.raises(LayoutError):
        lay.packed_offset(3, 7)
