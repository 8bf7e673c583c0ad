"""Calling the ops: concurrent callers, out= aliasing, clamp, Inf/NaN, threads=, TILEGEN_ISA."""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.reference import matmul_f32

from conftest import guest
from test_runtime_ops import all_lib  # noqa: F401 - shared session fixture


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
def test_mixed_threads_race(kind, all_lib):
    """8 Python threads, thread i with threads=i + 1, 100 rounds, the pool rebuilt each round."""
    rng = np.random.default_rng(21)
    n, k = 128, 32                  # n splits into 8 parts for the 16- and 4-column kernels
    w = rng.normal(size=(n, k)).astype(np.float32)
    xs = [rng.normal(size=(int(rng.integers(2, 9)), k)).astype(np.float32) for _ in range(8)]
    errors, bad_rounds, stray = guest("cortex-a53").call("guest_calls:mixed_threads_race",
                                                         str(all_lib), w, xs, kind, 100)
    assert errors == [] and bad_rounds == 0
    assert stray <= 0           # replaced pools do not leave threads behind


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
@pytest.mark.parametrize("alias", ["x", "bias"])
def test_out_aliasing_inputs(kind, alias, all_lib):
    """out= sharing memory with x (n == k) or with the call-time bias gives the same result as
    a separate out."""
    rng = np.random.default_rng(22)
    k = 64
    w = rng.normal(size=(k, k)).astype(np.float32)
    x = rng.normal(size=(2, 7, k)).astype(np.float32)
    b = rng.normal(size=k).astype(np.float32) if alias == "bias" else None
    g = guest("cortex-a53")
    for threads in (1, 3):
        want = g.call("guest_calls:matmul_try", str(all_lib), kind, w, x, bias=b, threads=threads)
        y, same = g.call("guest_calls:matmul_out_alias", str(all_lib), kind, w, x, b, alias, threads)
        assert same and np.array_equal(y, want)
    if kind == "f32":
        ref = matmul_f32(x.reshape(-1, k), w, None, -np.inf, np.inf)
        assert np.array_equal(want.reshape(-1, k), ref if b is None else ref + b)
