"""The tuned presets shipped in tilegen/build/tuned/ (written by `tilegen tune --write`,
scripts/tune_presets.sh): each carries a tuned pair of every family tune models on its target,
every kernel they add to a default build runs bit-exact in emulation, and the runtime picks
them."""
from __future__ import annotations

from functools import partial

import numpy as np
import pytest

import tilegen
from tilegen.build import get_target
from tilegen.analysis.tune import tunable_families
from tilegen.build.tuned import read_tuned, tuned_dir
from tilegen.families import FAMILIES, rhs_layout_class
from tilegen.layout import F32PackedRHS
from tilegen.layout.api import layout_for
from tilegen.layout.kquant import Q8KP, KQuantRhs
from tilegen.layout.lhs_int8 import QAI8DXP
from tilegen.layout.rhs_int8 import QSI8CXP
from tilegen.reference.f32 import matmul_f32
from tilegen.reference.kquant import matmul_blocks
from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp

from conftest import guest
from test_exec_q4 import SENTINEL, _pack, _shapes
import test_exec_bf16
import table32_exec
import test_exec_iq4_nl
import test_exec_mxfp4

PRESETS = sorted(p.stem for p in tuned_dir().glob("*.json"))
# the block-32 table families: their exec tests' shape sweep, bit-exact reference and error
# check against ggml's arithmetic (guest, library, spec, vector bytes)
TABLE32 = {"iq4_nl": partial(table32_exec.run, test_exec_iq4_nl.FAM),
           "mxfp4": partial(table32_exec.run, test_exec_mxfp4.FAM)}


def _kquant(family: str) -> bool:
    """A K-quant family (super-blocks of ggml blocks: q4_K, q5_K, q6_K, iq4_xs): its RHS layout
    is a KQuantRhs with seeded random valid blocks (the bit-exact reference: matmul_blocks, from
    the activations and the blocks, not the packed bytes)."""
    return issubclass(rhs_layout_class(family), KQuantRhs)


def test_presets_are_shipped_and_valid():
    """Each preset carries a tuned pair of every family tune models on its target (bf16 only
    where the CPU has BF16: not n1)."""
    assert {"neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2"} <= set(PRESETS)
    for name in PRESETS:
        tgt = get_target(name)
        tf = read_tuned(tgt)
        assert tf is not None and set(tf.families) == set(tunable_families(tgt)), name
    assert {"q5_K", "iq4_xs", "iq4_nl", "mxfp4", "q8_0", "bf16"} <= set(
        read_tuned(get_target("neoverse-v2")).families)


def _tuned_specs():
    seen = {}
    for name in PRESETS:
        for fam in read_tuned(get_target(name)).families.values():
            for s in fam.specs():       # the pair and the best gemm / gemv of any layout
                seen[s.name] = s
    return [seen[n] for n in sorted(seen)]


@pytest.fixture(scope="module")
def tuned_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned")
    tilegen.build_library(_tuned_specs(), target="linux-aarch64-all", out_dir=out)
    return out


CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "neoverse-n2", "max")
TUNED_SPECS = _tuned_specs()


def _guest(cpu: str):
    return guest(cpu, sve_vl=256) if cpu == "max" else guest(cpu)


def _cases(spec, mr: int, nr: int):
    """(run kind, cases, exact references) of ``spec`` at its tile on the CPU (mr, nr)."""
    rng = np.random.default_rng(sum(map(ord, spec.name)))
    cases, refs = [], []
    if spec.family == "f32":
        for m, n, k in [(1, 1, 1), (mr, nr, 8), (mr + 1, nr + 1, 5), (2 * mr + 3, 2 * nr - 1, 17)]:
            lhs = rng.normal(size=(m, k + 2)).astype(np.float32)
            w = rng.normal(size=(n, k)).astype(np.float32)
            b = rng.normal(size=n).astype(np.float32)
            cases.append(dict(m=m, n=n, k=k, lhs_base=lhs, packed=F32PackedRHS(nr).pack(w, b),
                              dst_base=np.full((m + 1, n + 2), SENTINEL, np.float32),
                              clamp_min=-3.4e38, clamp_max=3.4e38))
            refs.append(matmul_f32(lhs[:, :k], w, b, -3.4e38, 3.4e38))
        return "f32", cases, refs
    if _kquant(spec.family):            # q8kp x a K-quant layout: ggml blocks, reference.kquant
        cls = rhs_layout_class(spec.family)
        for i, (m, n, k) in enumerate([(1, 1, 256), (mr, nr, 512), (mr + 1, nr + 1, 256),
                                       (2 * mr + 3, 2 * nr - 1, 768)]):
            x = (rng.normal(size=(m, k)) * 4).astype(np.float32)
            lhs = Q8KP(spec.lhs_mr, spec.kr).pack(x)
            raw = cls.random_ggml(n, k, i)
            rhs = layout_for(cls.format, nr=nr, kr=spec.kr).pack_from_ggml(raw, n, k)
            cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs,
                              clamp_min=-3.4e38, clamp_max=3.4e38, sentinel=SENTINEL))
            refs.append(matmul_blocks(cls, x, raw, n, -3.4e38, 3.4e38))
    elif spec.family == "q8_0":         # qai8dxp x qsi8cxp, per-channel int8 weights
        for m, n, k in [(1, 1, 1), (mr, nr, 32), (mr + 1, nr + 1, 31), (2 * mr + 3, 2 * nr - 1, 100)]:
            x = (rng.normal(size=(m, k)) * 3).astype(np.float32)
            lhs = QAI8DXP(spec.lhs_mr, spec.kr, spec.sr).pack(x)
            rhs = QSI8CXP(nr, spec.kr).pack(rng.integers(-128, 128, (n, k), dtype=np.int8),
                                            rng.uniform(0.001, 0.01, n).astype(np.float32),
                                            rng.normal(size=n).astype(np.float32))
            cases.append(dict(m=m, n=n, k=k, bl=32, lhs_packed=lhs, rhs_packed=rhs,
                              clamp_min=-3.4e38, clamp_max=3.4e38, sentinel=SENTINEL))
            refs.append(matmul_qai8dxp_qsi8cxp(lhs, rhs, m, n, k, spec.lhs_mr, nr, spec.kr,
                                               spec.sr, -3.4e38, 3.4e38))
    elif spec.family == "bf16":         # bf16p x bf16p (fixed NEON tiles)
        assert not spec.vl_scaled
        for i, (m, n, k) in enumerate([(1, 1, 1), (mr, nr, 8), (mr + 1, nr + 1, 5),
                                       (2 * mr + 3, 2 * nr - 1, 17)]):
            c, r = test_exec_bf16._case(spec, rng, m, n, k, clamped=bool(i % 2))
            cases.append(c)
            refs.append(r)
    else:
        for m, n, k, bl in _shapes(spec, rng, nr=nr):
            lhs, rhs, ref, *_ = _pack(spec, rng, m, n, k, bl, nr=nr)
            cases.append(dict(m=m, n=n, k=k, bl=bl, lhs_packed=lhs, rhs_packed=rhs,
                              clamp_min=-3.4e38, clamp_max=3.4e38, sentinel=SENTINEL))
            refs.append(ref(-3.4e38, 3.4e38))
    return "q4", cases, refs


_RUNS: dict = {}


def _cpu_runs(cpu: str, lib) -> dict:
    """Every tuned kernel on ``cpu``, batched: the CPU's features, each kernel's refusal or
    concrete tile (one guest call), then every runnable kernel but the block-32 table ones (their
    exec tests' sweep, a call each) on its cases in one guest call.  Per spec name: (features
    needed and present, refusal, vl_info, cases, references, outputs)."""
    key = (cpu, str(lib))
    if key not in _RUNS:
        g = _guest(cpu)
        feats = set(g.call("guest_calls:machine")["features"])
        infos = g.call("guest_calls:kernel_infos", str(lib), [s.name for s in TUNED_SPECS])
        res, jobs = {}, []
        for spec in TUNED_SPECS:
            err, info = infos[spec.name]
            runs = set(spec.features) <= feats
            res[spec.name] = [runs, err, info, None, None, None]
            if runs and not err and spec.family not in TABLE32:
                kind, cases, refs = _cases(spec, info["mr"], info["nr"])
                res[spec.name][3:5] = cases, refs
                jobs.append((kind, spec.name, cases))
        outs = g.call("guest_calls:run_batch", str(lib), jobs) if jobs else []
        for (_, name, _), out in zip(jobs, outs):
            res[name][5] = out
        _RUNS[key] = res
    return _RUNS[key]


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("spec", TUNED_SPECS, ids=lambda s: s.spec_string)
def test_tuned_kernel_bit_exact(spec, cpu, tuned_lib):
    runs, err, info, cases, refs, outs = _cpu_runs(cpu, tuned_lib)[spec.name]
    if not runs:                        # the runtime refuses it on this CPU
        assert "ArgumentError" in err, err
        return
    assert not err, err
    if spec.family in TABLE32:          # qsi8d32p x iq4nlp / mxfp4p: the exec tests' sweep
        vl = info["vl_bytes"][spec.isa_info.vl_kind] if spec.vl_scaled else None
        TABLE32[spec.family](_guest(cpu), tuned_lib, spec, vl, cpu)
        return
    assert outs is not None and len(outs) == len(cases)
    for c, exact, out in zip(cases, refs, outs):
        m, n = c["m"], c["n"]
        assert np.array_equal(out[:m, :n], exact), (spec.name, m, n, c["k"])
        assert (out[m:] == SENTINEL).all() and (out[:, n:] == SENTINEL).all()


def test_runtime_picks_the_tuned_pair(v2_default_lib):
    """neoverse-v2's default build (conftest's, built once per session) picks each tuned pair
    and marks the best gemm and gemv of any layout."""
    tf = read_tuned(get_target("neoverse-v2"))
    kinds = [FAMILIES[f].kinds[0] for f in tf.families]
    assert len(kinds) == len(tunable_families(get_target("neoverse-v2")))
    picks = guest("max", sve_vl=256).call("guest_calls:picks", str(v2_default_lib), kinds)
    for fam_name, kind in zip(tf.families, kinds):
        fam = tf.families[fam_name]
        assert picks[kind] == (fam.gemm.name, fam.gemv.name), (kind, picks[kind])
    # the default build also has the best gemm and gemv of any layout, marked for for_ops
    import json
    entries = {e["name"]: e for e in json.loads((v2_default_lib / "manifest.json").read_text())["kernels"]}
    for fam in tf.families.values():
        assert entries[fam.gemm.name]["preferred"] and entries[fam.gemv.name]["preferred"]
        assert entries[fam.top_gemm.name].get("best") == "gemm"
        assert entries[fam.top_gemv.name].get("best") == "gemv"
    assert sum(e.get("best") == "gemm" for e in entries.values()) == len(tf.families)
    assert sum(e.get("best") == "gemv" for e in entries.values()) == len(tf.families)
