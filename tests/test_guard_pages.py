"""Kernels never touch memory outside the buffers they are given (guard-page tests).

Inside the emulated aarch64 Python every buffer of a kernel call -- LHS (f32 rows or packed
q4 LHS), packed RHS and dst -- is placed flush against a PROT_NONE page, once with the page
directly AFTER its last byte and once directly BEFORE its first byte (tests/guest_pack.py,
``guarded_*_cases``).  A kernel that reads past the last LHS row / packed RHS block, reads
ahead of a buffer, or stores beyond dst faults, the guest dies and the call raises
GuestCrashed.  Results must still be bit-exact, and dst is a strided view into a larger
sentinel-filled region: nothing outside the m x n elements may change (row gaps included).
"""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.layout import F32PackedRHS
from tilegen.reference.f32 import matmul_f32

from conftest import F32_EXTRA_TILES, F32_TILES, guest
from test_exec_q4 import ALL_SPECS, _pack, q4_lib  # noqa: F401 - shared session fixture

FLT_MAX = 3.4028234663852886e38
SENTINEL = np.float32(-31337.75)
PLACEMENTS = ("end", "start")


def _f32_shapes(mr: int, nr: int, rng) -> list[tuple[int, int, int]]:
    """m, n, k from 1 to a few tiles: exact tiles, tile +- 1, odd and prime sizes."""
    fixed = [(1, 1, 1), (1, nr, 4), (mr, nr, 8), (mr + 1, nr + 1, 5), (max(mr - 1, 1), nr - 1 or 1, 3),
             (2 * mr + 3, 3 * nr - 1, 17), (3 * mr, 1, 2), (1, 2 * nr + 3, 33), (7, 13, 31),
             (2 * mr - 1 if mr > 1 else 2, 2 * nr, 7)]
    rand = [(int(rng.integers(1, 3 * mr + 2)), int(rng.integers(1, 3 * nr + 2)),
             int(rng.integers(1, 40))) for _ in range(2)]
    return fixed + rand


def _q4_shapes(spec, rng) -> list[tuple[int, int, int]]:
    mr, nr = spec.mr, spec.nr
    ms = [1, mr, mr + 1, 2 * mr + 3 if mr > 1 else 1, 3 * mr - 1 if mr > 1 else 1,
          int(rng.integers(1, 3 * mr + 1))]
    ns = [1, nr, nr + 1, 3 * nr - 1, 2 * nr + 3, int(rng.integers(1, 4 * nr))]
    ks = [32, 64, 96, 160, 32, 256]
    return [(ms[i], ns[(i + 2) % len(ns)], ks[i]) for i in range(len(ms))]


def _clamps(i: int, free: np.ndarray) -> tuple[float, float]:
    if i % 2 == 0:
        return -FLT_MAX, FLT_MAX
    if free.size > 1:
        lo, hi = np.quantile(free, [0.2, 0.8])
    else:
        lo, hi = free.min() - 1, free.max()
    return float(np.float32(lo)), float(np.float32(hi))


def _check_dst(region: np.ndarray, off: int, m: int, n: int, stride: int, what) -> np.ndarray:
    """The m x n result of a strided dst in ``region``; asserts every other float is intact."""
    idx = off + np.arange(m)[:, None] * stride + np.arange(n)[None, :]
    outside = np.ones(region.size, bool)
    outside[idx.ravel()] = False
    bad = np.flatnonzero(region[outside].view(np.uint32) != SENTINEL.view(np.uint32))
    assert bad.size == 0, f"{what}: {bad.size} floats outside the m x n dst region changed"
    return region[idx]


def _check_guarded(name, cases, refs, outs) -> None:
    """Every placement of every case: nothing outside dst changed, results bit-exact."""
    assert len(outs) == len(cases)
    for c, exact, res in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        assert len(res) == len(PLACEMENTS)
        for at, (region, off) in zip(PLACEMENTS, res):
            what = f"{name} m={m} n={n} k={k} guard at {at}"
            got = _check_dst(region, off, m, n, c["dst_stride"], what)
            assert np.array_equal(got.view(np.uint32), exact.view(np.uint32)), \
                f"{what}: {np.sum(got != exact)} outputs differ from the reference"


def _guard_f32(g, lib, name, nr, shapes, rng) -> None:
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        lhs = (rng.normal(size=(m, k)) * 2).astype(np.float32)
        w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
        bias = rng.normal(size=n).astype(np.float32)
        cmin, cmax = _clamps(i, matmul_f32(lhs, w, bias, -np.inf, np.inf))
        cases.append(dict(m=m, n=n, k=k, lhs=lhs, packed=F32PackedRHS(nr).pack(w, bias=bias),
                          lhs_stride=k + (0, 1, 3, 5)[i % 4], dst_stride=n + (0, 2, 1, 3)[i % 4],
                          clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL))
        refs.append(matmul_f32(lhs, w, bias, cmin, cmax))
    outs = g.call("guest_pack:guarded_f32_cases", str(lib), name, cases, PLACEMENTS)
    _check_guarded(name, cases, refs, outs)


def _guard_q4(g, lib, spec, shapes, rng, nr=None, lhs_mr=None) -> None:
    bl = 32
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        lhs, rhs, ref, *_ = _pack(spec, rng, m, n, k, bl, nr=nr, lhs_mr=lhs_mr)
        cmin, cmax = _clamps(i, ref(-FLT_MAX, FLT_MAX))
        cases.append(dict(m=m, n=n, k=k, bl=bl, lhs_packed=lhs, rhs_packed=rhs,
                          dst_stride=n + (0, 1, 2, 3)[i % 4], clamp_min=cmin, clamp_max=cmax,
                          sentinel=SENTINEL))
        refs.append(ref(cmin, cmax))
    outs = g.call("guest_pack:guarded_q4_cases", str(lib), spec.name, cases, PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


@pytest.mark.parametrize("cpu", ["cortex-a53", "max"])
@pytest.mark.parametrize("tile", F32_TILES + F32_EXTRA_TILES)
def test_f32_guard_pages(tile, cpu, f32_lib):
    mr, nr = map(int, tile.split("x"))
    name = f"matmul_clamp_f32_f32_f32p{nr}x1b_{mr}x{nr}_neon_mla"
    rng = np.random.default_rng(sum(map(ord, "guard" + tile + cpu)))
    _guard_f32(guest(cpu), f32_lib, name, nr, _f32_shapes(mr, nr, rng), rng)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_q4_guard_pages(spec, q4_lib):
    rng = np.random.default_rng(sum(map(ord, "guard" + spec.name)))
    _guard_q4(guest("max"), q4_lib, spec, _q4_shapes(spec, rng), rng)


@pytest.mark.parametrize("fmt,mr,kr,sr", [("qsi8d32p", 4, 8, 2), ("qsi8d32p", 1, 16, 2),
                                          ("qai8dxp", 4, 8, 2), ("qai8dxp", 1, 8, 2)])
def test_library_packers_with_guard_pages(fmt, mr, kr, sr, q4_lib):
    """The library's NEON packers (source rows and packed output) against guard pages at both
    ends: no read or write outside, bytes equal to the numpy packer."""
    import tilegen
    rng = np.random.default_rng(mr + kr)
    cases = []
    for m, k, start, pad in [(1, 32, 0, 0), (5, 64, 0, 3), (mr + 1, 96, 1 if mr > 1 else 0, 1),
                             (9, 160, 0, 0)]:
        if fmt == "qai8dxp" and k == 160:
            k = 37       # qai8dxp: any k, including a tail that is not a multiple of 4
        cases.append(dict(x=(rng.normal(size=(m, k)) * 3).astype(np.float32), bl=32,
                          m_idx_start=start, pad=pad))
    outs = guest("max").call("guest_pack:guarded_lib_pack_cases", str(q4_lib), fmt, mr, kr, sr, cases)
    for i, c in enumerate(cases):
        ref = tilegen.pack_lhs(fmt, c["x"], mr=mr, kr=kr, sr=sr, bl=32, m_idx_start=c["m_idx_start"])
        for j in range(2):
            assert np.array_equal(outs[2 * i + j], ref), (fmt, c["x"].shape, j)


# -- scalable kernels (tiles in VL units) at a wide vector length --------------------------
SCALABLE_F32 = ("f32:sve:6x4vl", "f32:sve:1x8vl", "f32:sve:3x8vl", "f32:sme:2vlx2vl",
                "f32:sme2:1vlx4vl", "f32:sme2:2vlx2vl", "f32:sme2:1x4vl", "f32:sme2:1x16vl")
SCALABLE_Q4 = ("q4_0:sve_i8mm:16x1vl", "q4_0:sve_dotprod:1x1vl:k16", "q4_0_dx:sve_dotprod:8x1vl",
               "q4_0:sme:1vlx2vl", "q4_0_dx:sme:1vlx1vl", "q4_0:sme2:1x2vl", "q4_0_dx:sme2:1x4vl")
# the block-32 table families' SME2 kernels (LUTI4 through ZT0; the layout's table and, for
# mxfp4, the bf16 scales), at the smallest SVL and a wide one
SCALABLE_TABLE32 = tuple(f"{f}:sme2:{t}" for f in ("iq4_nl", "mxfp4")
                         for t in ("1vlx1vl", "1vlx2vl", "1x2vl", "1x4vl"))
SCALABLE_Q4_RUNS = ([(t, 512) for t in SCALABLE_Q4]
                    + [(t, vl) for t in SCALABLE_TABLE32 for vl in (128, 512)])


@pytest.fixture(scope="module")
def scalable_lib(tmp_path_factory):
    import tilegen
    out = tmp_path_factory.mktemp("guard_scalable")
    tilegen.build_library(list(SCALABLE_F32 + SCALABLE_Q4 + SCALABLE_TABLE32),
                          target="linux-aarch64-all", out_dir=out)
    return out


def _scalable_guest(vl):
    from conftest import SME_ON
    return guest("max", vl, vl, SME_ON)


@pytest.mark.parametrize("text", SCALABLE_F32)
def test_scalable_f32_guard_pages(text, scalable_lib):
    import tilegen
    spec = tilegen.parse_spec(text)
    g = _scalable_guest(512)
    info = g.call("guest_calls:vl_info", str(scalable_lib), spec.name)
    mr, nr = info["mr"], info["nr"]
    rng = np.random.default_rng(sum(map(ord, "guard" + text)))
    _guard_f32(g, scalable_lib, spec.name, nr, _f32_shapes(mr, nr, rng)[::2], rng)


@pytest.mark.parametrize("text,vl", SCALABLE_Q4_RUNS)
def test_scalable_q4_guard_pages(text, vl, scalable_lib):
    import tilegen
    spec = tilegen.parse_spec(text)
    g = _scalable_guest(vl)
    info = g.call("guest_calls:vl_info", str(scalable_lib), spec.name)
    mr, nr = info["mr"], info["nr"]
    rng = np.random.default_rng(sum(map(ord, "guard" + text)))
    shapes = []
    for m, n, k in _q4_shapes(spec, rng):
        m = min(m, 2 * mr + 3) if spec.mr_vl else m
        n = 1 + (n * nr) // (4 * spec.nr) if spec.nr_vl else n      # scale to the VL panel
        shapes.append((m, n, k))
    _guard_q4(g, scalable_lib, spec, shapes, rng, nr=nr, lhs_mr=mr if spec.mr_vl else spec.lhs_mr)
