"""f32 NEON kernels executed in the emulated aarch64 Python on several qemu CPU models."""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.emulate.remote import GuestError
from tilegen.layout import F32PackedRHS
from tilegen.reference.f32 import matmul_f32, matmul_f64

from conftest import EXEC_CPUS, F32_EXTRA_TILES, F32_TILES, guest
from guest_calls import BAD_KERNEL_CALLS

SENTINEL = np.float32(-12345.5)


def _shapes(mr: int, nr: int, rng) -> list[tuple[int, int, int]]:
    """m, n, k sweep: 1, primes, exact tiles and non-multiples of the tile."""
    fixed = [(1, 1, 1), (1, nr, 4), (mr, nr, 8), (mr + 1, nr + 1, 5), (2 * mr + 3, 3 * nr - 1, 17),
             (7, 13, 31), (mr * 2, 1, 3), (1, 2 * nr + 3, 64), (11, 5, 2)]
    rand = [(int(rng.integers(1, 3 * mr + 2)), int(rng.integers(1, 3 * nr + 2)),
             int(rng.integers(1, 70))) for _ in range(3)]
    return fixed + rand


def _case(m, n, k, nr, rng, clamp):
    lhs_base = (rng.normal(size=(m + 1, k + 3)) * 2).astype(np.float32)   # padded: stride != 4k
    w = (rng.normal(size=(n, k)) * 2).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    packed = F32PackedRHS(nr).pack(w, bias=bias)
    ref64 = matmul_f64(lhs_base[:m, :k], w, bias, -np.inf, np.inf)
    if clamp:
        lo, hi = np.quantile(ref64, [0.2, 0.8]) if ref64.size > 1 else (ref64.min() - 1, ref64.max())
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    else:
        cmin, cmax = -3.4028234663852886e38, 3.4028234663852886e38
    dst_base = np.full((m + 2, n + 3), SENTINEL, np.float32)
    return dict(m=m, n=n, k=k, lhs_base=lhs_base, packed=packed, dst_base=dst_base,
                clamp_min=cmin, clamp_max=cmax), w, bias


def _check(tile, cpu, f32_lib, seed):
    mr, nr = map(int, tile.split("x"))
    name = f"matmul_clamp_f32_f32_f32p{nr}x1b_{mr}x{nr}_neon_mla"
    rng = np.random.default_rng(seed)
    cases, refs = [], []
    for i, (m, n, k) in enumerate(_shapes(mr, nr, rng)):
        c, w, bias = _case(m, n, k, nr, rng, clamp=bool(i % 2))
        cases.append(c)
        refs.append((w, bias))
    outs = guest(cpu).call("guest_calls:run_f32_cases", str(f32_lib), name, cases)
    for c, (w, bias), out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        lhs = c["lhs_base"][:m, :k]
        got = out[:m, :n]
        # nothing outside the m x n region of the strided dst is written
        assert (out[m:, :] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), (m, n, k)
        exact = matmul_f32(lhs, w, bias, c["clamp_min"], c["clamp_max"])
        assert np.array_equal(got.view(np.uint32), exact.view(np.uint32)), \
            f"{name} m={m} n={n} k={k}: {np.sum(got != exact)} outputs differ from the FMA chain"
        ref = matmul_f64(lhs, w, bias, c["clamp_min"], c["clamp_max"])
        scale = np.abs(lhs.astype(np.float64)) @ np.abs(w.astype(np.float64)).T + np.abs(bias) + 1e-30
        assert np.all(np.abs(got - ref) <= 1e-5 * np.sqrt(k) * scale), (m, n, k)


@pytest.mark.parametrize("cpu", EXEC_CPUS)
@pytest.mark.parametrize("tile", F32_TILES + F32_EXTRA_TILES)
def test_f32_tile(tile, cpu, f32_lib):
    _check(tile, cpu, f32_lib, seed=sum(map(ord, tile + cpu)))


@pytest.mark.parametrize("cpu", ["cortex-a53", "max"])
def test_matmul_op_batched_and_gemv(cpu, f32_lib):
    rng = np.random.default_rng(11)
    w = rng.normal(size=(37, 29)).astype(np.float32)
    bias = rng.normal(size=37).astype(np.float32)
    x = rng.normal(size=(3, 5, 29)).astype(np.float32)
    y, nr, kname = guest(cpu).call("guest_calls:matmul", str(f32_lib), w, x, bias, (-1.5, 2.0))
    assert y.shape == (3, 5, 37) and y.dtype == np.float32
    exact = matmul_f32(x.reshape(-1, 29), w, bias, -1.5, 2.0).reshape(3, 5, 37)
    assert np.array_equal(y, exact)
    # m == 1 picks a gemv (mr = 1) tile with the same nr
    x1 = rng.normal(size=(1, 29)).astype(np.float32)
    y1, nr1, kname1 = guest(cpu).call("guest_calls:matmul", str(f32_lib), w, x1, None, None, "nk", 16)
    assert "_1x16_" in kname1
    assert np.array_equal(y1, matmul_f32(x1, w, None, -np.inf, np.inf))
    # weights given as (k, n)
    y2, _, _ = guest(cpu).call("guest_calls:matmul", str(f32_lib), np.ascontiguousarray(w.T), x1,
                               None, None, "kn")
    assert np.array_equal(y2, y1)


@pytest.mark.parametrize("what", BAD_KERNEL_CALLS)
def test_bad_arguments_raise(what, f32_lib):
    with pytest.raises(GuestError) as e:
        guest("max").call("guest_calls:bad_kernel_call", str(f32_lib),
                          "matmul_clamp_f32_f32_f32p8x1b_3x8_neon_mla", what)
    assert e.value.type_name == "ArgumentError", e.value


def test_unknown_kernel_and_tampered_library(f32_lib, tmp_path):
    import shutil
    with pytest.raises(GuestError, match="no kernel"):
        guest("max").call("guest_calls:kernel_call", str(f32_lib), "matmul_nope", None, None, None)
    bad = tmp_path / "lib"
    shutil.copytree(f32_lib, bad)
    with open(bad / "libtilegen.so", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\x00\x01")
    assert "does not match its manifest" in guest("max").call("guest_calls:load_error", str(bad))
    (bad / "manifest.json").unlink()
    assert "no manifest.json" in guest("max").call("guest_calls:load_error", str(bad))


def test_guest_is_aarch64():
    info = guest("cortex-a53").call("guest_calls:machine")
    assert info["machine"] == "aarch64" and info["features"] == ["neon"]
    info = guest("neoverse-n1").call("guest_calls:machine")
    assert "dotprod" in info["features"] and "sve" not in info["features"]


def test_threads_bit_identical(f32_lib):
    rng = np.random.default_rng(5)
    w = rng.normal(size=(203, 40)).astype(np.float32)
    x = rng.normal(size=(37, 40)).astype(np.float32)
    outs = guest("max").call("guest_calls:matmul_threads", str(f32_lib), w, x)
    for o in outs[1:]:
        assert np.array_equal(o, outs[0])
    assert np.array_equal(outs[0], matmul_f32(x, w, None, -np.inf, np.inf))


def test_f16_weights(f32_lib):
    rng = np.random.default_rng(6)
    w16 = rng.normal(size=(19, 24)).astype(np.float16)
    x = rng.normal(size=(3, 24)).astype(np.float32)
    y, _, _ = guest("neoverse-n1").call("guest_calls:matmul", str(f32_lib), w16, x, None, None,
                                        "nk", None, None, "f16")
    assert np.array_equal(y, matmul_f32(x, w16.astype(np.float32), None, -np.inf, np.inf))
