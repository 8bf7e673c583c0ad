"""What the K-quant NEON / SVE execution tests share (test_exec_kquant_q4, test_exec_kquant_q5,
test_exec_iq4xs): one kernel case from random valid ggml blocks of the spec's family (its RHS
layout's ``random_ggml``), packed by the layouts and referenced by
``tilegen.reference.kquant.matmul_blocks`` from the float activations and the blocks (never
from the packed bytes); the check of a kernel's outputs (bit-exact, sentinels around dst
untouched); and a NEON kernel's run on one CPU model (the full shape sweep on its ISA's sweep
CPU, a shorter random set elsewhere, refused where the model lacks the ISA)."""
from __future__ import annotations

import numpy as np

from tilegen.families import rhs_layout_class
from tilegen.layout.kquant import Q8KP
from tilegen.reference.kquant import matmul_blocks

from conftest import guest, refused_for_missing_features

KQ_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
# the CPU each ISA gets the full shape sweep on (the other CPUs run a shorter random set)
SWEEP_CPU = {"neon": "cortex-a53", "dotprod": "neoverse-n1", "i8mm": "neoverse-v1"}
SENTINEL = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
# m, n not multiples of the tiles; k = 1, 2 and 4 super-blocks
SWEEP = [(1, 1, 256), (3, 5, 512), (5, 13, 256), (13, 7, 1024), (17, 30, 512), (8, 8, 256),
         (2, 33, 256), (30, 3, 512)]


def kquant_case(spec, rng, m, n, k, clamped, seed, nr=None):
    """(the guest's case dict, the expected m x n result) of ``spec`` on random activations of
    mixed magnitudes per row (each SB has its own d) and ``seed``'s random blocks of the
    family; ``nr``: the RHS panel width where it is not ``spec.nr`` (an SVE tile's, from the
    VL); ``clamped``: clamp to the 20-80 % quantiles of the free results."""
    layout = rhs_layout_class(spec.family)
    x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 8.0, size=(m, 1))).astype(np.float32)
    raw = layout.random_ggml(n, k, seed)
    lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
    rhs = layout(nr or spec.nr, spec.kr).pack_from_ggml(raw, n, k)

    def ref(cmin, cmax):
        return matmul_blocks(layout, x, raw, n, cmin, cmax)
    cmin, cmax = -FMAX, FMAX
    if clamped:
        free = ref(-FMAX, FMAX)
        lo, hi = np.quantile(free, [0.2, 0.8]) if free.size > 1 else (free.min() - 1, free.max() + 1)
        cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
    case = dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs, clamp_min=cmin,
                clamp_max=cmax, sentinel=SENTINEL)
    return case, ref(cmin, cmax)


def kquant_cases(spec, rng, shapes, seed, nr=None):
    """The cases and expected results of ``shapes`` ((m, n, k), ...): every other one clamped,
    case i from blocks of seed ``seed + i``."""
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes):
        c, r = kquant_case(spec, rng, m, n, k, clamped=bool(i % 2), seed=seed + i, nr=nr)
        cases.append(c)
        refs.append(r)
    return cases, refs


def check_outputs(name, cases, refs, outs):
    """Each output bit-exact with its reference in its m x n corner, the sentinel elsewhere
    (``name`` heads the message: the kernel, and the CPU / VL where it matters)."""
    for c, exact, out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        where = f"{name} m={m} n={n} k={k}"
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), \
            f"{where}: wrote outside dst"
        np.testing.assert_array_equal(out[:m, :n].view(np.uint32), exact.view(np.uint32),
                                      err_msg=where)


def run_neon_kernel(spec, cpu, lib) -> None:
    """A K-quant NEON kernel of ``lib`` on the qemu model ``cpu``: refused there if the model
    lacks its features, else the sweep (its ISA's sweep CPU) or three random shapes."""
    g = guest(cpu)
    if refused_for_missing_features(cpu, lib, spec):
        return
    seed = sum(map(ord, spec.name + cpu))
    rng = np.random.default_rng(seed)
    if SWEEP_CPU[spec.isa] == cpu:
        shapes = SWEEP
    else:
        shapes = [(int(rng.integers(1, 3 * spec.mr + 2)), int(rng.integers(1, 4 * spec.nr)),
                   256 * int(rng.choice([1, 2, 4]))) for _ in range(3)]
    cases, refs = kquant_cases(spec, rng, shapes, seed)
    outs = g.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    check_outputs(f"{spec.name} {cpu}", cases, refs, outs)
