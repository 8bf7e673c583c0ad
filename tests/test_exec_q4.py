"""int4 x int8 kernels (q4_0 and q4_0_dx families, dotprod and i8mm) under emulation."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.families import rhs_layout_class
from tilegen.generator import validate
from tilegen.layout.ggml import quantize_q4_0
from tilegen.layout.lhs_int8 import QAI8DXP, QSI8D32P
from tilegen.layout.rhs_int4 import QSI4C32P, QSI4C32PScaleF16
from tilegen.reference.q4 import matmul_qai8dxp_qsi4c32p, matmul_qsi8d32p_qsi4c32pscalef16

from conftest import (  # noqa: F401 (CPU_FEATURES: the fuzz / q6_K tests import it here)
    CPU_FEATURES, guest, refused_for_missing_features, vector_params)

Q4_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
# (isa, tile, kr) run against the reference; 1x16 is a gemv tile KleidiAI does not ship
Q4_TILES = (("dotprod", "1x4", 8), ("dotprod", "1x8", 16), ("dotprod", "4x8", 8),
            ("dotprod", "16x4", 8), ("dotprod", "12x4", 8), ("dotprod", "24x4", 8),
            ("i8mm", "4x8", 16), ("i8mm", "8x4", 16),
            ("i8mm", "16x4", 16), ("dotprod", "1x16", 8),
            # one LHS register pair, one row block's scales at a time: 12-row register blocks
            ("i8mm", "12x4", 16), ("i8mm", "24x4", 16),
            # gemv on i8mm cores: SDOT with the scale products by FMLAL (by element)
            ("i8mm", "1x20", 8), ("i8mm", "1x8", 16),
            ("dotprod", "1x4", 16),   # llama.cpp's gemv partner of the i8mm 16x4 gemm
            ("neon", "1x4", 8), ("neon", "4x4", 8),   # plain-NEON fallback (SMULL/SADALP)
            # f32 accumulators in the frame (acc_mem, ":am"): 24-row register blocks
            ("i8mm", "24x4:am", 16), ("i8mm", "8x8:am", 16), ("dotprod", "24x4:am", 8),
            ("dotprod", "8x8:am", 8))
FAMILIES = ("q4_0", "q4_0_dx")
SENTINEL = np.float32(-4242.25)


def _spec(family, isa, tile, kr):
    tile, _, opt = tile.partition(":")
    mr, nr = map(int, tile.split("x"))
    return validate(tilegen.KernelSpec(family, isa, mr, nr, kr=kr, sr=2, acc_mem=opt == "am"))


ALL_SPECS = [_spec(f, i, t, kr) for f in FAMILIES for (i, t, kr) in Q4_TILES]


@pytest.fixture(scope="session")
def q4_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("q4lib")
    tilegen.build_library(ALL_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


def _lhs_rows(rng, m, k):
    return (rng.normal(size=(m, k)) * 3).astype(np.float32)   # normally distributed activations


def _pack(spec, rng, m, n, k, bl, nr=None, lhs_mr=None):
    """(lhs_packed, rhs_packed, exact reference, float reference inputs); ``nr``/``lhs_mr``:
    the panel width / LHS row-block height on the CPU for tiles in VL units."""
    P = spec.lhs_mr if lhs_mr is None else lhs_mr
    nr = spec.nr if nr is None else nr
    x = _lhs_rows(rng, m, k)
    w = rng.normal(size=(n, k)).astype(np.float32)
    rhs_cls = rhs_layout_class(spec.family)
    if rhs_cls is not QSI4C32PScaleF16 and issubclass(rhs_cls, QSI4C32PScaleF16):
        # a table family on q4_0's layout (iq4_nl, mxfp4): random valid ggml blocks, q4_0's
        # activations, the shared reference told the RHS layout class
        lhs = QSI8D32P(P, spec.kr, spec.sr, bl).pack(x)
        raw = rhs_cls.random_ggml(n, k, int(rng.integers(1 << 30)))
        rhs_lay = rhs_cls(nr, spec.kr, spec.sr, bl)
        rhs = rhs_lay.pack_from_ggml(raw, n, k)
        ref = lambda cmin, cmax: matmul_qsi8d32p_qsi4c32pscalef16(  # noqa: E731
            lhs, rhs, m, n, k, bl, P, nr, spec.kr, spec.sr, cmin, cmax, rhs_layout=rhs_cls)
        return lhs, rhs, ref, x, rhs_lay.dequantize_rows(rhs, n, k, np.arange(n)), None
    if spec.family == "q4_0":
        lhs_lay = QSI8D32P(P, spec.kr, spec.sr, bl)
        rhs_lay = QSI4C32PScaleF16(nr, spec.kr, spec.sr, bl)
        if bl == 32:
            raw = quantize_q4_0(w)
            rhs = rhs_lay.pack(raw)
        else:  # random u4 blocks with f16 scales in the bl-block source format
            B = k // bl
            d = (rng.uniform(0.002, 0.02, size=(n, B)) * rng.choice([-1, 1], size=(n, B))).astype(np.float16)
            data = rng.integers(0, 256, size=(n, B, bl // 2), dtype=np.uint8)
            raw = np.concatenate([d.view(np.uint8).reshape(n, B, 2), data], axis=2).reshape(n, -1)
            rhs = rhs_lay.pack(raw)
        lhs = lhs_lay.pack(x)
        ref = lambda cmin, cmax: matmul_qsi8d32p_qsi4c32pscalef16(
            lhs, rhs, m, n, k, bl, P, nr, spec.kr, spec.sr, cmin, cmax)
        if bl == 32:   # gguf's own Q4_0 dequantisation of the raw ggml blocks
            import gguf
            deq = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0).reshape(n, k)
        else:
            deq = rhs_lay.dequantize_rows(rhs, n, k, np.arange(n))
        bias = None
    else:
        lhs_lay = QAI8DXP(P, spec.kr, spec.sr)
        rhs_lay = QSI4C32P(nr, spec.kr, spec.sr, bl)
        u4 = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
        s1s0 = (u4[:, 0::2] | (u4[:, 1::2] << 4)).astype(np.uint8)
        scale = (rng.uniform(0.002, 0.02, size=(n, k // bl)).astype(np.float32)
                 * rng.choice([-1, 1], size=(n, k // bl)).astype(np.float32))
        bf16 = (scale.view(np.uint32) >> 16).astype(np.uint16)
        bias = rng.normal(size=n).astype(np.float32)
        rhs = rhs_lay.pack(s1s0, bf16, bias)
        lhs = lhs_lay.pack(x)
        ref = lambda cmin, cmax: matmul_qai8dxp_qsi4c32p(
            lhs, rhs, m, n, k, bl, P, nr, spec.kr, spec.sr, cmin, cmax)
        deq = rhs_lay.dequantize_rows(rhs, n, k, np.arange(n))
    return lhs, rhs, ref, x, deq, bias


def _shapes(spec, rng, mr=None, nr=None):
    mr = spec.mr if mr is None else mr
    nr = spec.nr if nr is None else nr
    ms = [1, mr, mr + 1, 2 * mr + 3 if mr > 1 else 1, int(rng.integers(1, 3 * mr + 1))]
    ns = [nr + 1, 3 * nr - 1, 1, int(rng.integers(1, 4 * nr))]
    ks = [1, 2, 3, 5, 8]
    out = []
    for i, mult in enumerate(ks):
        bl = 64 if i == 2 else 32
        out.append((ms[i % len(ms)], ns[i % len(ns)], bl * mult, bl))
    return out


@pytest.mark.parametrize("cpu", Q4_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.name)
def test_q4_kernel(spec, cpu, q4_lib):
    g = guest(cpu)
    if refused_for_missing_features(cpu, q4_lib, spec):
        return
    rng = np.random.default_rng(sum(map(ord, spec.name + cpu)))
    cases, refs = [], []
    for i, (m, n, k, bl) in enumerate(_shapes(spec, rng)):
        lhs, rhs, ref, x, deq, bias = _pack(spec, rng, m, n, k, bl)
        free = ref(-3.4028234663852886e38, 3.4028234663852886e38)
        if i % 2:
            lo, hi = np.quantile(free, [0.15, 0.85]) if free.size > 1 else (free.min() - 1, free.max() + 1)
            cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
        else:
            cmin, cmax = -3.4028234663852886e38, 3.4028234663852886e38
        cases.append(dict(m=m, n=n, k=k, bl=bl, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                          clamp_max=cmax, sentinel=SENTINEL))
        refs.append((ref(cmin, cmax), x, deq, bias, cmin, cmax))
    outs = g.call("guest_calls:run_q4_cases", str(q4_lib), spec.name, cases)
    for c, (exact, x, deq, bias, cmin, cmax), out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        got = out[:m, :n]
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), "wrote outside dst"
        # float64 evaluation of the identical packed integer math (bit-exact reference)
        assert np.allclose(got, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max()), (m, n, k)
        assert np.array_equal(got, exact), f"m={m} n={n} k={k}: {np.sum(got != exact)} differ"
        assert got.min() >= np.float32(cmin) and got.max() <= np.float32(cmax)
        if k >= 256 and cmin < -1e38:   # vs float64 x @ dequant(W).T
            ref64 = x.astype(np.float64) @ deq.astype(np.float64).T
            if bias is not None:
                ref64 = ref64 + bias
            err = np.linalg.norm(got - ref64) / np.linalg.norm(ref64)
            assert err <= 2e-2, err


@pytest.mark.parametrize("path", vector_params("matmul_clamp_f32_q*.npz")
                         + vector_params("qsi8d32p_mm_*.npz"), ids=lambda p: p.stem)
def test_q4_kernels_match_kleidiai_vectors(path, q4_lib, tmp_path):
    z = np.load(path)
    fam = "q4_0_dx" if "qai8dxp" in path.name else "q4_0"
    isa = "i8mm" if "i8mm" in path.name else "dotprod"
    spec = validate(tilegen.KernelSpec(fam, isa, int(z["m_step"]), int(z["n_step"]),
                                       kr=int(z["kr"]), sr=int(z["sr"])))
    lib = q4_lib
    if spec.name not in {s.name for s in ALL_SPECS}:
        lib = tmp_path / "lib"
        tilegen.build_library([spec], target="linux-aarch64-all", out_dir=lib)
    m, n, k, bl = (int(z[x]) for x in ("m", "n", "k", "bl"))
    case = dict(m=m, n=n, k=k, bl=bl, lhs_packed=z["lhs_packed"], rhs_packed=z["rhs_packed"],
                clamp_min=float(z["clamp_min"]), clamp_max=float(z["clamp_max"]), sentinel=SENTINEL)
    out = guest("max").call("guest_calls:run_q4_cases", str(lib), spec.name, [case])[0]
    got = out[:m, :n]
    assert np.allclose(got, z["dst"], rtol=1e-5, atol=0)
    assert np.array_equal(got, z["dst"])
    assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all()
