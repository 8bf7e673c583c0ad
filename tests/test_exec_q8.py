"""int8 x int8 kernels (q8_0 family: qai8dxp x qsi8cxp; dotprod, i8mm, plain NEON) under
emulation, bit-exact against tilegen.reference.q8 and KleidiAI's golden vectors."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.layout.lhs_int8 import QAI8DXP
from tilegen.layout.rhs_int8 import QSI8CXP
from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp

from conftest import CPU_FEATURES, guest, refused_for_missing_features, vector_params

Q8_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
# the CPU each ISA gets the full edge sweep on (the other CPUs run a shorter random set)
SWEEP_CPU = {"neon": "cortex-a53", "dotprod": "neoverse-n1", "i8mm": "neoverse-v1"}
Q8_SPECS = ("q8_0:dotprod:1x4", "q8_0:dotprod:1x4:k8:s1", "q8_0:dotprod:1x8", "q8_0:dotprod:4x4",
            "q8_0:dotprod:8x8", "q8_0:dotprod:16x4", "q8_0:dotprod:12x8",
            "q8_0:i8mm:16x4", "q8_0:i8mm:4x4", "q8_0:i8mm:8x8", "q8_0:i8mm:4x12",
            "q8_0:neon:1x4", "q8_0:neon:4x4", "q8_0:neon:16x4", "q8_0:neon:1x8:k8:s1")
ALL_SPECS = [tilegen.parse_spec(s) for s in Q8_SPECS]
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
SWEEP = list(itertools.product((1, 3, 5, 17), (1, 5, 13, 30), (1, 31, 70, 100)))


@pytest.fixture(scope="session")
def q8_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q8lib")
    tilegen.build_library(ALL_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _case(spec, rng, m, n, k, clamped):
    x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
    q = rng.integers(-128, 128, size=(n, k), dtype=np.int8)
    scale = rng.uniform(0.001, 0.01, size=n).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    lhs = QAI8DXP(spec.lhs_mr, spec.kr, spec.sr).pack(x)
    rhs = QSI8CXP(spec.nr, spec.kr).pack(q, scale, bias)

    def ref(cmin, cmax):
        return matmul_qai8dxp_qsi8cxp(lhs, rhs, m, n, k, spec.lhs_mr, spec.nr, spec.kr, spec.sr,
                                      cmin, cmax)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = ref(-FMAX, FMAX)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, ref(cmin, cmax)


def _check(cases, refs, outs):
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
            f"m={m} n={n} k={k}: wrote outside dst"
        got = out[:m, :n]
        assert np.array_equal(got, exact), f"m={m} n={n} k={k}: {np.sum(got != exact)} differ"
        assert got.min() >= np.float32(c["clamp_min"]) and got.max() <= np.float32(c["clamp_max"])


@pytest.mark.parametrize("cpu", Q8_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_q8_kernel(spec, cpu, q8_lib):
    g = guest(cpu)
    if refused_for_missing_features(cpu, q8_lib, spec):
        return
    rng = np.random.default_rng(sum(map(ord, spec.name + cpu)))
    if SWEEP_CPU[spec.isa] == cpu:
        shapes = SWEEP
    else:
        shapes = [(int(rng.integers(1, 3 * spec.mr + 2)), int(rng.integers(1, 4 * spec.nr)),
                   int(rng.integers(1, 160))) for _ in range(6)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2))
        cases.append(c)
        refs.append(r)
    outs = g.call("guest_calls:run_q4_cases", str(q8_lib), spec.name, cases)
    _check(cases, refs, outs)


def _vector_files():
    return vector_params("q8_qai8dxp_qsi8cxp_*.npz")


KLEIDIAI_Q8 = {   # KleidiAI kernel stem -> spec of the generated kernel of the same name
    "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod": "q8_0:dotprod:1x4:k8:s1",
    "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod": "q8_0:dotprod:1x4",
    "qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod": "q8_0:dotprod:16x4",
    "qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm": "q8_0:i8mm:16x4",
}


@pytest.mark.parametrize("path", _vector_files(), ids=lambda p: p.stem)
def test_q8_kernels_match_kleidiai_vectors(path, q8_lib):
    """The generated kernels reproduce KleidiAI's dst bit for bit, on KleidiAI's packed
    buffers and on the same inputs packed by tilegen's layout objects."""
    z = np.load(path)
    m, n, k = (int(v) for v in z["shape_mnk"])
    cases, want, names = [], [], []
    for stem, s in KLEIDIAI_Q8.items():
        spec = tilegen.parse_spec(s)
        assert spec.name == "matmul_clamp_f32_" + stem
        mr, nr, kr, sr = (int(z[f"{stem}__{f}"]) for f in ("mr", "nr", "kr", "sr"))
        assert (spec.lhs_mr, spec.nr, spec.kr, spec.sr) == (mr, nr, kr, sr)
        lhs = z[f"{stem}__lhs_packed"].copy()
        rhs = z[f"{stem}__rhs_packed"]
        ours_rhs = QSI8CXP(nr, kr).pack(z["rhs_qs8"], z["rhs_scale"], z["bias"])
        assert np.array_equal(ours_rhs, rhs)
        ours_lhs = QAI8DXP(mr, kr, sr).pack(z["lhs_f32"])
        wr = z[f"{stem}__lhs_packed_written"]
        assert np.array_equal(ours_lhs[wr], lhs[wr])
        for clamped in (False, True):
            cmin, cmax = ((float(z["clamp_min"]), float(z["clamp_max"])) if clamped
                          else (-FMAX, FMAX))
            for buf in (lhs, ours_lhs):
                cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=buf, rhs_packed=rhs,
                                  clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL))
                want.append(z[f"{stem}__dst_clamped" if clamped else f"{stem}__dst"])
        names.append(spec.name)
    for i, name in enumerate(names):
        sl = slice(4 * i, 4 * i + 4)
        outs = guest("max").call("guest_calls:run_q4_cases", str(q8_lib), name, cases[sl])
        for c, w, out in zip(cases[sl], want[sl], outs):
            assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all()
            assert np.array_equal(out[:m, :n], w), f"{name}: {np.sum(out[:m, :n] != w)} differ"


GUARD_SPECS = ("q8_0:dotprod:1x4", "q8_0:dotprod:1x4:k8:s1", "q8_0:dotprod:16x4", "q8_0:i8mm:16x4",
               "q8_0:i8mm:8x8", "q8_0:neon:4x4", "q8_0:neon:1x4")


@pytest.mark.parametrize("text", GUARD_SPECS)
def test_q8_guard_pages(text, q8_lib):
    """Packed LHS, packed RHS and a strided dst flush against PROT_NONE pages (both ends, see
    tests/test_guard_pages.py): no access outside, nothing outside m x n written, bit-exact."""
    from test_guard_pages import PLACEMENTS, SENTINEL as GUARD_SENTINEL, _check_guarded
    spec = tilegen.parse_spec(text)
    rng = np.random.default_rng(sum(map(ord, "guard" + text)))
    mr, nr = spec.mr, spec.nr
    shapes = [(1, 1, 1), (mr, nr, 32), (mr + 1, nr + 1, 31), (2 * mr + 3, 3 * nr - 1, 70),
              (3 * mr - 1 if mr > 1 else 1, 2 * nr + 3, 100), (5, 13, 257)]
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2))
        c.update(dst_stride=n + (0, 1, 2, 3)[i % 4], sentinel=GUARD_SENTINEL)
        cases.append(c)
        refs.append(r)
    outs = guest("max").call("guest_pack:guarded_q4_cases", str(q8_lib), spec.name, cases,
                             PLACEMENTS)
    _check_guarded(spec.name, cases, refs, outs)


@pytest.mark.parametrize("cpu", ["cortex-a53", "neoverse-n1", "max"])
def test_q8_kernels_preserve_callee_saved_state(cpu, q8_lib):
    """Every q8 kernel the CPU runs (and its LHS packer) through the ABI probe."""
    res = guest(cpu).call("guest_calls:check_abi", str(q8_lib))
    assert all(v == [] for v in res.values()), {k: v for k, v in res.items() if v}
    ran = {k for k in res if "qsi8cxp" in k}
    want = {s.name for s in ALL_SPECS if set(s.features) <= CPU_FEATURES.get(cpu, {"neon", "dotprod", "i8mm"})}
    assert ran == want


@pytest.mark.parametrize("path", _vector_files(), ids=lambda p: p.stem)
def test_q8_packers_and_getters_match_kleidiai_vectors(path, q8_lib):
    """The library's generated NEON LHS packers write KleidiAI's bytes for every geometry of
    the vectors (and for m_idx_start = 2), and the kernels' sizes/offsets are KleidiAI's."""
    z = np.load(path)
    m, n, k = (int(v) for v in z["shape_mnk"])
    x = z["lhs_f32"]
    g = guest("neoverse-n1")
    for stem, s in KLEIDIAI_Q8.items():
        spec = tilegen.parse_spec(s)
        mr, nr, kr, sr = (int(z[f"{stem}__{f}"]) for f in ("mr", "nr", "kr", "sr"))
        got = g.call("guest_calls:lib_pack_lhs", str(q8_lib), "qai8dxp", x, mr, kr, sr, 32, 0)
        wr = z[f"{stem}__lhs_packed_written"]
        assert got.size == wr.size and np.array_equal(got[wr], z[f"{stem}__lhs_packed"][wr]), stem
        L, LL = QSI8CXP(nr, kr), QAI8DXP(mr, kr, sr)
        sizes = [LL.packed_size(m, k), L.packed_size(n, k), L.group_stride(k), 4 * m * n,
                 LL.packed_offset(mr, k), L.packed_offset(nr, k),
                 LL.packed_offset(spec.m_step, k), L.packed_offset(spec.n_step, k)]
        assert sizes == [int(v) for v in z[f"{stem}__sizes"]], stem
        assert (spec.m_step, spec.n_step) == (int(z[f"{stem}__m_step"]), int(z[f"{stem}__n_step"]))
    got = g.call("guest_calls:lib_pack_lhs", str(q8_lib), "qai8dxp", x, 4, 8, 1, 32, 2)
    want, wr = z["mstart2_mr4_kr8_sr1__lhs_packed"], z["mstart2_mr4_kr8_sr1__lhs_packed_written"]
    assert np.array_equal(got[wr[:got.size]], want[:got.size][wr[:got.size]])
    assert not wr[got.size:].any()


@pytest.mark.parametrize("text", list(KLEIDIAI_Q8.values()) + ["q8_0:neon:4x4"])
def test_q8_large_shapes(text, q8_lib):
    """Long k (many loop iterations), many column groups and row blocks."""
    spec = tilegen.parse_spec(text)
    cpu = "cortex-a53" if spec.isa == "neon" else "neoverse-n1" if spec.isa == "dotprod" else "max"
    rng = np.random.default_rng(sum(map(ord, "large" + text)))
    cases, refs = [], []
    for i, (m, n, k) in enumerate([(37, 45, 1283), (2, 129, 4100), (21, 7, 4097)]):
        c, r = _case(spec, rng, m, n, k, clamped=bool(i % 2))
        cases.append(c)
        refs.append(r)
    _check(cases, refs, guest(cpu).call("guest_calls:run_q4_cases", str(q8_lib), spec.name, cases))
