"""What the block-32 table families' execution tests share (test_exec_iq4_nl, test_exec_mxfp4):
the shape sweep of one kernel (m, n not multiples of the tile, k of 1, 2, 3, 5 and 9 blocks,
every second case clamped), bit-exact with the family's numpy reference of its arithmetic on
the numpy packings (``matmul_qsi8d32p_<rhs format>``), sentinels around dst untouched, and the
error against float64 no worse than ggml's own arithmetic (q8_0 activations, f32 sum per block)
on the same inputs; the runs at every SVE vector length and SME2 SVL, and the refusals on CPU
models without the ISA.  Each family is a :class:`Table32` record."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tilegen.layout.ggml import quantize_q8_0, split_q8_0
from tilegen.layout.lhs_int8 import QSI8D32P

from conftest import SME_ON, guest, refused_for_missing_features

CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
SENTINEL = np.float32(-4242.25)
FMAX = 3.4e38
# (cpu, SVE bits): max at several vector lengths, and the SVE models at their own
SVE_RUNS = (("max", 128), ("max", 256), ("max", 512), ("max", 2048), ("neoverse-n2", None),
            ("neoverse-v1", None))
SVE_IDS = [f"{c}-{v or 'default'}" for c, v in SVE_RUNS]
SME2_SVLS = (128, 256, 512, 2048)
#: (spec, cpu, m, n, k) -> (tilegen's error, ggml's) vs float64, of every compared case
ERRORS: dict = {}


@dataclass(frozen=True)
class Table32:
    """One family's hooks: its RHS layout class and reference, random ggml blocks for case i
    of the sweep (``blocks(n, k, seed, i)``), its dequantiser, ggml's per-block scale as f32
    (``ggml_scale(split scale field)``), its block splitter and table, the seed offset of its
    sweeps, and the cases whose error against float64 is compared (``compare_error(i)``)."""
    rhs: type
    reference: Callable
    blocks: Callable
    dequantize: Callable
    split: Callable
    kvalues: tuple
    ggml_scale: Callable
    seed: int = 0
    compare_error: Callable = lambda i: True


def ggml_q8_0(fam: Table32, x, raw, n, k) -> np.ndarray:
    """ggml's own arithmetic (the generic ggml_vec_dot_<type>_q8_0): x quantised to q8_0
    (quantize_row_q8_0_ref), per block sumi = sum q8 * kvalues (int), then
    sumf += (f32(d_y) * scale_x) * f32(sumi) in f32, block after block."""
    m = x.shape[0]
    q8, dy = split_q8_0(quantize_q8_0(x), m, k)
    idx, sx = fam.split(raw, n, k)
    v = np.array(fam.kvalues, np.int64)[idx]
    dyf = dy.view(np.float16).astype(np.float32)
    dxf = fam.ggml_scale(sx)
    out = np.zeros((m, n), np.float32)
    with np.errstate(under="ignore"):
        for b in range(k // 32):
            s = q8[:, 32 * b:32 * b + 32].astype(np.int64) @ v[:, 32 * b:32 * b + 32].T
            out = (out + ((dyf[:, None, b] * dxf[None, :, b]).astype(np.float32)
                          * s.astype(np.float32)).astype(np.float32)).astype(np.float32)
    return out


def shapes(mr, nr, rng):
    ms = [1, mr, mr + 1, 2 * mr + 3 if mr > 1 else 1, int(rng.integers(1, 3 * mr + 1))]
    ns = [nr + 1, 3 * nr - 1, 1, int(rng.integers(1, 4 * nr)), nr]
    return [(ms[i], ns[i], 32 * kb) for i, kb in enumerate((1, 2, 3, 5, 9))]


def run(fam: Table32, sess, lib, spec, vl_bytes=None, cpu=""):
    """The shape sweep through kernel ``spec`` on guest ``sess`` (vectors of ``vl_bytes``),
    bit-exact with the reference; the error vs float64 no worse than ggml's arithmetic."""
    mr, nr = spec.mr_at(vl_bytes), spec.nr_at(vl_bytes)
    P = spec.lhs_mr_at(vl_bytes)
    rng = np.random.default_rng(sum(map(ord, spec.name + cpu)) + (vl_bytes or 0) + fam.seed)
    cases, refs = [], []
    for i, (m, n, k) in enumerate(shapes(mr, nr, rng)):
        x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
        raw = fam.blocks(n, k, int(rng.integers(1 << 30)), i)
        lhs = QSI8D32P(P, spec.kr, spec.sr, 32).pack(x)
        rhs = fam.rhs(nr, spec.kr, spec.sr, 32).pack_from_ggml(raw, n, k)
        ref = lambda lo, hi: fam.reference(lhs, rhs, m, n, k, 32, P, nr,  # noqa: E731
                                           spec.kr, spec.sr, lo, hi)
        free = ref(-FMAX, FMAX)
        cmin, cmax = (-FMAX, FMAX)
        if i % 2 and free.size > 1:
            lo, hi = np.quantile(free, [0.2, 0.8])
            cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs,
                          clamp_min=cmin, clamp_max=cmax, sentinel=SENTINEL))
        refs.append((ref(cmin, cmax), x, raw, i))
    outs = sess.call("guest_calls:run_q4_cases", str(lib), spec.name, cases)
    for c, (exact, x, raw, i), out in zip(cases, refs, outs):
        m, n, k = c["m"], c["n"], c["k"]
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all(), "wrote outside dst"
        got = out[:m, :n]
        assert np.array_equal(got.view(np.uint32), exact.view(np.uint32)), \
            f"{spec.name} VL={vl_bytes} m={m} n={n} k={k}: {np.sum(got != exact)} differ"
        if c["clamp_min"] < -1e38 and k >= 96 and fam.compare_error(i):
            # error vs float64 no worse than ggml's arithmetic on the same inputs (+ 5 %)
            ref64 = x.astype(np.float64) @ fam.dequantize(raw, n, k).astype(np.float64).T
            e_tg = np.linalg.norm(got - ref64) / np.linalg.norm(ref64)
            e_gg = np.linalg.norm(ggml_q8_0(fam, x, raw, n, k) - ref64) / np.linalg.norm(ref64)
            ERRORS[(spec.name, cpu, m, n, k)] = (e_tg, e_gg)
            assert e_tg <= 1.05 * e_gg + 1e-7, (e_tg, e_gg)


def run_on_cpu(fam: Table32, spec, cpu, lib):
    """The sweep on CPU model ``cpu``, or the kernel refused there (the model lacks its ISA)."""
    if not refused_for_missing_features(cpu, lib, spec):
        run(fam, guest(cpu), lib, spec, cpu=cpu)


def _run_at_vl(fam: Table32, sess, lib, specs, bits, cpu):
    for spec in specs:
        info = sess.call("guest_calls:vl_info", str(lib), spec.name)
        assert info["runnable"] and (info["mr"], info["nr"]) == (spec.mr_at(bits // 8),
                                                                 spec.nr_at(bits // 8)), info
        run(fam, sess, lib, spec, bits // 8, cpu)


def run_sve(fam: Table32, cpu, vl, lib, specs):
    """The SVE kernels on ``cpu`` at SVE length ``vl`` bits (None: the model's own): each
    runnable at that length's tile, the sweep bit-exact."""
    from test_exec_scalable import SVE_NATIVE_VL
    _run_at_vl(fam, guest(cpu, sve_vl=vl), lib, specs, vl or SVE_NATIVE_VL[cpu], cpu)


def run_sme2(fam: Table32, svl, lib, pair, more):
    """The SME2 pair at SVL ``svl`` (the other tiles ``more`` at 512 only), SVCR clear after."""
    sess = guest("max", None, svl, SME_ON)
    _run_at_vl(fam, sess, lib, pair + (more if svl == 512 else []), svl, f"max-{svl}")
    assert sess.call("guest_calls:svcr_now", str(lib)) == 0


def all_refused(cpu, lib, specs) -> bool:
    return all(refused_for_missing_features(cpu, lib, spec) for spec in specs)
