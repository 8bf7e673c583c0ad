"""Edge rows for the q8kp quantisers (issue #30 items 2 and 9) and the values ggml's Q8_K gives
for them, in q8kp's sign convention: the expectation every q8kp implementation (numpy, the
generated NEON packers at a fixed mr and VL-scaled, the export's C packer) is held to.

Each row is k/256 super-blocks (SBs), one of each kind of :data:`KINDS` in turn (a row of
``len(KINDS)`` SBs has them all):

* ``control``: Gaussian values, scale 2 (an ordinary SB);
* ``1e-38``: Gaussian values times 1e-38 (max|x| about 3e-38 < 127/FLT_MAX: 127/amax overflows);
* ``denormal``: every value subnormal (at most 2^-127), the smallest (2^-149) included;
* ``zero``: +0 and -0;
* ``flushed_edge``: max|x| the largest f32 whose 127/max|x| overflows;
* ``kept_edge``: max|x| the next f32 up (127/max|x| finite, d subnormal);
* ``1e-36``: Gaussian times 1e-36 (kept; d subnormal);
* ``ties``: multiples of 0.5 with max|x| = 127 (inv = 1: exact .5 ties, rounded to even).
"""
from __future__ import annotations

import numpy as np

from tilegen.reference.kquant import quantize_q8_k

F = np.float32
KINDS = ("control", "1e-38", "denormal", "zero", "flushed_edge", "kept_edge", "1e-36", "ties")


def flush_edge() -> tuple[np.float32, np.float32]:
    """(largest f32 amax whose f32 127/amax is +inf, the next f32: 127/amax finite)."""
    a = F(127) / np.finfo(F).max
    with np.errstate(over="ignore", divide="ignore"):
        while np.isinf(F(127) / a):
            a = np.nextafter(a, F(1))
        while not np.isinf(F(127) / a):
            a = np.nextafter(a, F(0))
    return F(a), np.nextafter(F(a), F(1))


def edge_rows(rng, m: int, k: int, first: int = 0) -> np.ndarray:
    """float32 (m, k): SB s of row r is of kind KINDS[(first + r + s) % len(KINDS)]."""
    flushed, kept = flush_edge()
    x = np.zeros((m, k), F)
    for r in range(m):
        for s in range(k // 256):
            kind = KINDS[(first + r + s) % len(KINDS)]
            g = rng.standard_normal(256)
            sign = np.where(rng.random(256) < 0.5, F(-1), F(1))
            if kind == "control":
                v = (g * 2).astype(F)
            elif kind == "1e-38":
                v = (g * 1e-38).astype(F)
                v[rng.random(256) < 0.1] = 0
            elif kind == "denormal":
                v = (rng.integers(1, 1 << 22, 256) * sign).astype(F) * F(2.0 ** -149)
                v[int(rng.integers(256))] = F(2.0 ** -149)
            elif kind == "zero":
                v = np.where(rng.random(256) < 0.5, F(-0.0), F(0.0)).astype(F)
            elif kind in ("flushed_edge", "kept_edge"):
                top = flushed if kind == "flushed_edge" else kept
                v = (rng.random(256) * sign).astype(F) * top
                v[int(rng.integers(256))] = top * sign[0]
            elif kind == "1e-36":
                v = (g * 1e-36).astype(F)
            else:
                v = (rng.integers(-254, 255, 256) * 0.5).astype(F)
                v[int(rng.integers(256))] = F(127) * sign[0]
            x[r, 256 * s:256 * s + 256] = v
    return x


def expected_q8kp(x: np.ndarray):
    """(q int8 (m, k), d f32 (m, S), bsum_hi, bsum_lo int8 (m, S, 8)) that q8kp must hold for
    rows ``x``: ggml's ``quantize_row_q8_K_ref`` values (tilegen.reference.kquant.quantize_q8_k)
    times s = -sign(max), so that d >= 0 (ggml keeps the sign of the SB's first value of largest
    magnitude in d and q; q8kp does not), and their sums per 32 split as hi = sum >> 7,
    lo = sum - 128 hi."""
    m, k = x.shape
    S = k // 256
    qg, dg, bsums = quantize_q8_k(x)
    xb = x.reshape(m, S, 256)
    mx = np.take_along_axis(xb, np.abs(xb).argmax(axis=2)[..., None], axis=2)[..., 0]
    s = np.where(mx > 0, -1, 1)
    q = (qg.reshape(m, S, 256).astype(np.int32) * s[..., None]).astype(np.int8).reshape(m, k)
    d = np.abs(dg).astype(F)                       # s * d: the same value, d >= 0 (0 for -0)
    assert ((dg * s >= 0) | np.isnan(dg)).all()
    bsum = (bsums.reshape(m, S, 8, 2).sum(axis=3) * s[..., None]).astype(np.int32)
    hi = bsum >> 7
    return q, d, hi.astype(np.int8), (bsum - 128 * hi).astype(np.int8)


def check_q8kp(got, want, what: str) -> None:
    """``got`` / ``want``: (q, d, hi, lo) as Q8KP.unpack and :func:`expected_q8kp` give them;
    d compared by its bits."""
    for name, g, w in zip(("q", "d", "bsum_hi", "bsum_lo"), got, want):
        g, w = np.asarray(g), np.asarray(w)
        if name == "d":
            g, w = g.astype(F).view(np.uint32), w.astype(F).view(np.uint32)
        bad = np.argwhere(g != w)
        assert not bad.size, (f"{what}: {name} differs at {len(bad)} places, first "
                              f"{tuple(bad[0])}: got {g[tuple(bad[0])]}, want {w[tuple(bad[0])]}")
