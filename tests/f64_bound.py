"""The float64 reference of a matmul on the exact weights packed weights hold, and a bound on
how far a kernel's result may be from it (tests/guest_state.py, tests/guest_moe.py)."""
from __future__ import annotations

import numpy as np


def _lhs(fam: str) -> str:
    from tilegen.families import FAMILIES
    return FAMILIES[fam].lhs


def f64_bound(fam: str, x: np.ndarray, deq: np.ndarray, biases=()) -> tuple[np.ndarray, np.ndarray]:
    """(ref, bound), float64 (m, n): ref = x @ deq.T (+ the biases that are not None), and
    ``sum_j delta_j |w_j| + (k + 8) 2^-23 (sum_j (|x_j| + delta_j) |w_j| + |bias|)``, delta_j
    a bound of the rounding of activation x_j by a kernel of family ``fam``: none (f32),
    2^-8 |x_j| (bf16, nearest even), 2^-11 |x_j| + 2^-25 (f16: the SME2 q4_0 gemm, which also
    rounds each weight to f16), the quantisation step (q4_0: block max / 127; q4_0_dx, q8_0:
    per-row range / 255).  Not for the K-quants (their bound needs the ggml blocks:
    :func:`tilegen.reference.kquant.error_bound`)."""
    x64 = x.astype(np.float64)
    w64 = deq.astype(np.float64)
    m, k = x64.shape
    ax = np.abs(x64)
    if fam == "bf16":
        delta = ax * 2.0 ** -8
    elif fam in ("q4_0", "q4_0_s1s0") or _lhs(fam) == "qsi8d32p":   # int8 per 32-block
        blk = ax.reshape(m, -1, 32).max(axis=2) / 127
        delta = np.repeat(blk, 32, axis=1)
    elif fam == "q4_0_f16":      # x rounded to f16 (nearest even; 2^-25 in its subnormals)
        delta = ax * 2.0 ** -11 + 2.0 ** -25
    elif fam in ("q4_0_dx", "q8_0"):
        rng = np.maximum(x64.max(axis=1), 0) - np.minimum(x64.min(axis=1), 0)
        delta = np.repeat((rng / 255)[:, None], k, axis=1)
    elif fam == "f32":
        delta = np.zeros_like(x64)
    else:
        raise ValueError(f"no float64 bound for family {fam!r} here")
    aw = np.abs(w64)
    ref = x64 @ w64.T
    mag = (ax + delta) @ aw.T
    for b in biases:
        if b is not None:
            ref = ref + b.astype(np.float64)
            mag = mag + np.abs(b.astype(np.float64))
    bound = delta @ aw.T + (k + 8) * 2.0 ** -23 * mag + 1e-35
    if fam == "q4_0_f16":       # and each int4 x scale product rounded to f16 (2^-11, 2^-25)
        bound = bound + (ax + delta) @ (aw * 2.0 ** -11 + 2.0 ** -25).T
    return ref, bound
