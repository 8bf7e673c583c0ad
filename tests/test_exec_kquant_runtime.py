"""The runtime on K-quant weights (every K-quant kind of the registry), run in the emulated guest: ggml
blocks through ``lib.pack_weights(from_ggml=)``, the kernel pick per m, ``matmul`` (1 and 3
threads), ``plan``, ``pack_lhs`` (the generated q8kp packer), ``get_rows``, ``for_ops``, a
packed-weights file, ``adopt`` from another nr/kr, and the refusals (float weights, k not a
multiple of 256, truncated blocks, non-finite d / dmin, a bias, non-finite activations).

Every result is bit-exact with :mod:`tilegen.reference.kquant`'s ``matmul_blocks``, computed
from the float activations and the ggml blocks (not from packed bytes: a packer and a kernel
that disagree on a byte's place fail here); the guest's LHS bytes equal
:class:`~tilegen.layout.kquant.Q8KP`'s, its weights the host's ``pack_from_ggml``; get_rows
equals ``gguf.quants.dequantize`` bit for bit."""
from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.build import get_target
from tilegen.build.tuned import read_tuned
from tilegen.generator.validate import parse_spec
from tilegen.layout.api import layout_for
from tilegen.layout.base import rhs_layout_for, same_rhs
from tilegen.layout.kquant import Q8KP
from tilegen.families import FAMILIES
from tilegen.records import ISAS, SpecError
from tilegen.families import rhs_layout_class
from tilegen.reference.kquant import matmul_blocks

from conftest import SME_ON, guest
from test_kquant_weights import KQ, write_gguf

T = gguf.GGMLQuantizationType
# KQ: kind -> (RHS format, ggml type, random valid blocks, bytes per block), from the registry
KINDS = tuple(KQ)
SME2_KINDS = tuple(k for k in KINDS if "sme2" in FAMILIES[k].impls)
# the kinds the neoverse-v2 preset carries tuned pairs of
TUNED_KINDS = tuple(k for k in KINDS if k in read_tuned(get_target("neoverse-v2")).families)
# tiles asked of the allocator per ISA (it decides): the gemm and gemv of each library
GEMM_TILES = ("8x4", "4x8", "4x4", "8x1vl", "1vlx2vl")
GEMV_TILES = ("1x4", "1x8", "1x1vl", "1x2vl")
# CPU models and the ISAs their K-quant kernels use (the best the model has first, then the
# next a family without it falls back to); "max" with SME on runs the SME2 kernels (LHS row
# blocks of SVL/32 rows: the VL-scaled q8kp packer), or SVE where a family has no SME2 ones
CPUS = {"max": ("sme2", "sve_i8mm"), "neoverse-v1": ("sve_i8mm",), "neoverse-n2": ("sve_i8mm",),
        "neoverse-n1": ("dotprod",), "cortex-a53": ("neon",)}
N, K = 21, 768                  # n not a multiple of nr (padding columns), 3 super-blocks
F = np.float32


def _first(fam: str, isa: str, tiles, gemm=None):
    """The first of ``tiles`` the allocator accepts (with ``gemm``: on its packed RHS)."""
    for t in tiles:
        try:
            s = parse_spec(f"{fam}:{isa}:{t}")
        except SpecError:
            continue
        if gemm is None or same_rhs(s, gemm):
            return s
    raise AssertionError(f"no {fam}:{isa} tile of {tiles}")


def _specs() -> list[str]:
    """Per K-quant family and ISA: the first gemm tile the allocator accepts, and the first
    gemv tile it accepts on that gemm's packing (q4_K's sme2 1x1vl reads 1vl, its 1vlx2vl 2vl)."""
    out = []
    for fam in KINDS:
        for isa in FAMILIES[fam].impls:
            g = _first(fam, isa, GEMM_TILES)
            out += [g.spec_string, _first(fam, isa, GEMV_TILES, g).spec_string]
    return out


SPECS = _specs()


@pytest.fixture(scope="module")
def kq_lib(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("kqrt")
    tilegen.build_library(SPECS, target="linux-aarch64-all", out_dir=out)
    return str(out)


def _x(rng, m: int) -> np.ndarray:
    """Activations with super-blocks of several magnitudes (one all zero), and in the first
    super-block of the even rows exact .5 ties after scaling: amax = 127 * 2^-e, so 127/amax
    = 2^e exactly, and values (j + 1/2) * 2^-e (magnitudes of the other rows, so that the
    results are not all clamped).  The q8kp packer's rounding (ties away from zero) decides
    those int8 values and the results are compared with the numpy quantiser's: a
    rounding-mode change in the packer fails here, not only in tests/test_lhs_pack_q8kp.py
    (issue #30 item 8)."""
    x = (rng.standard_normal((m, K)) * 3).astype(F)
    x[:, 256:512] *= F(1e-3)
    x[m // 2, 512:] = 0
    for r in range(0, m, 2):
        half = rng.integers(-127, 127, size=256) + F(0.5)       # -126.5 .. 126.5
        half[int(rng.integers(256))] = 127 * (1 - 2 * (r % 4 == 2))
        x[r, :256] = half * F(2.0 ** -(5 + r % 3))
    return x


def _ref(kind, x, raw, clamp) -> np.ndarray:
    """The reference of one run, from the activations and the ggml blocks."""
    return matmul_blocks(rhs_layout_class(kind), x, raw, N, *clamp)


def _check_runs(kind, x, runs, clamp, raw, what) -> set:
    kernels = set()
    for m, run in runs.items():
        lay = layout_for(KQ[kind][0], nr=run["nr"], kr=run["kr"])
        assert np.array_equal(run["data"], lay.pack_from_ggml(raw, N, K)), (what, m)
        want = _ref(kind, x[:m], raw, clamp)
        for key in ("y", "y1", "plan"):
            got = run[key]
            assert got.shape == (m, N) and np.array_equal(got.view(np.uint32),
                                                          want.view(np.uint32)), \
                (what, m, key, run["kernel"], np.abs(got - want).max())
        lhs = Q8KP(run["mr"], run["kr"]).pack(x[:m])       # the kernel's mr/kr
        assert np.array_equal(run["lhs"], lhs), f"{run['kernel']}: pack_lhs != Q8KP.pack"
        kernels.add(run["kernel"])
        if what == "pack_weights":      # the LHS bytes of the table's first pair for m rows
            assert run["workspace"] == Q8KP(run["mr"], run["kr"]).packed_size(m, K), (what, m)
        assert ("_1x" in run["kernel"]) == (m == 1), (what, m, run["kernel"])
    return kernels


@pytest.fixture(scope="module")
def v2_lib(v2_default_lib) -> str:
    """The default build of neoverse-v2: its tuned K-quant pairs and best kernels (conftest's,
    built once per session)."""
    return str(v2_default_lib)


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("kind", KINDS)
def test_runtime_paths_bit_exact(kind, cpu, kq_lib):
    isa = next((i for i in CPUS[cpu] if i in FAMILIES[kind].impls), None)
    rng = np.random.default_rng(sum(map(ord, kind + cpu)))
    raw = KQ[kind][2](N, K, int(rng.integers(1 << 30))).reshape(N, -1)
    if isa is None:     # no kernel of the family runs here: a clear refusal
        r = _guest(cpu).call("guest_weights:pack", kq_lib, (),
                            dict(kind=kind, from_ggml=raw, n=N, k=K))
        assert isinstance(r, str) and re.match(rf"ArgumentError: no kernel for {kind} weights "
                                               rf"in .* runs on this CPU", r), r
        return
    r = _scenario(kind, cpu, kq_lib, rng, raw)
    impl = FAMILIES[kind].impls[isa]
    for k in r["kernels"]:      # the ISA's gemm op, its gemv op (where it has one) at m = 1
        op = impl.gemv_op if impl.gemv_op and "_1x" in k else impl.op
        assert f"_{op}" in k, (r["kernels"], op)


@pytest.mark.parametrize("kind", TUNED_KINDS)
def test_tuned_default_build(kind, v2_lib, tmp_path):
    """The neoverse-v2 preset: the tuned pair and, with for_ops, the best gemm and gemv of any
    layout (two packings where they differ); a GGUF tensor read with lib= is packed for the
    pair."""
    from tilegen.build import get_target
    from tilegen.build.tuned import read_tuned
    tf = read_tuned(get_target("neoverse-v2")).families[kind]
    rng = np.random.default_rng(len(kind) + 2)
    raw = KQ[kind][2](N, K, 77).reshape(N, -1)
    r = _scenario(kind, "max", v2_lib, rng, raw, sve_vl=128)   # neoverse-v2's 128-bit SVE
    assert r["runs"][2]["kernel"] == tf.gemm.name and r["runs"][1]["kernel"] == tf.gemv.name
    fo = r["for_ops"]["runs"]
    assert (fo[1]["kernel"], fo[2]["kernel"]) == (tf.top_gemv.name, tf.top_gemm.name)
    assert r["for_ops"]["layouts"] == [rhs_layout_for(s, vl=16).name
                                       for s in (tf.top_gemm, tf.top_gemv)]
    path = tmp_path / "kq.gguf"
    write_gguf(path, {"blk.0.w": (KQ[kind][1], raw)})
    t = guest("max", 128).call("guest_kquant:gguf_tensor", v2_lib, str(path), "blk.0.w")
    assert (t["kind"], t["layout"]) == (kind, r["layout"]) and np.array_equal(t["data"], r["data"])


def _max_guest(kind: str):
    """qemu ``max`` for the refusal tests: SME off, unless the family's kernels are all SME."""
    sme_only = all(ISAS[i].vl_kind == "sme" for i in FAMILIES[kind].impls)
    return guest("max", env=SME_ON if sme_only else None)


def _guest(cpu: str, sve_vl: int | None = None, sme_vl: int | None = None):
    """The guest of ``cpu`` (SME on where CPUS gives it an SME ISA)."""
    sme = cpu in CPUS and ISAS[CPUS[cpu][0]].vl_kind == "sme"
    return guest(cpu, sve_vl, sme_vl, env=SME_ON if sme else None)


@pytest.mark.parametrize("svl", (128, 2048))
@pytest.mark.parametrize("kind", SME2_KINDS)
def test_sme2_row_blocks_follow_the_svl(kind, svl, kq_lib):
    """The SME2 gemm's LHS row block is SVL/32 rows (4 at SVL 128, 64 at 2048, the VL-scaled
    q8kp packer's bounds): every runtime path bit-exact there too."""
    rng = np.random.default_rng(svl + len(kind))
    raw = KQ[kind][2](N, K, int(rng.integers(1 << 30))).reshape(N, -1)
    r = _scenario(kind, "max", kq_lib, rng, raw, sme_vl=svl)
    gemm = r["runs"][7]
    assert "_sme2_mopa" in gemm["kernel"] and gemm["mr"] == svl // 32, gemm["kernel"]


def _scenario(kind, cpu, libdir, rng, raw, sve_vl: int | None = None,
              sme_vl: int | None = None) -> dict:
    """guest_kquant.scenario on ``raw`` (N x K blocks of ``kind``), every result checked."""
    fmt, typ, _, _ = KQ[kind]
    x = _x(rng, 7)
    rows = np.array([20, 0, 9, 9])
    clamp = (-40.0, 35.0)
    foreign_lay = layout_for(fmt, nr=12, kr=4)        # no kernel reads it: adopt repacks
    foreign = tilegen.PackedWeights(foreign_lay, N, K, foreign_lay.pack_from_ggml(raw, N, K),
                                    False, kind)
    r = _guest(cpu, sve_vl, sme_vl).call("guest_kquant:scenario", libdir, kind, raw, N, K, x, rows,
                                clamp, foreign)
    assert isinstance(r, dict), r
    assert r["kind"] == kind and r["layout"].startswith(fmt)
    want_rows = gguf.quants.dequantize(raw, typ).astype(F)[rows]
    assert np.array_equal(r["rows"].view(np.uint32), want_rows.view(np.uint32))
    r["kernels"] = _check_runs(kind, x, r["runs"], clamp, raw, "pack_weights")
    base = _ref(kind, x, raw, (-np.inf, np.inf))
    bias_y = np.clip(base + np.arange(N, dtype=F), F(clamp[0]), F(clamp[1]))
    assert np.array_equal(r["bias_y"], bias_y)
    _check_runs(kind, x, r["for_ops"]["runs"], clamp, raw, "for_ops")
    full = _ref(kind, x, raw, clamp)
    assert r["loaded"]["layout"] == r["layout"] and np.array_equal(r["loaded"]["y"], full)
    a = r["adopt"]
    assert (a["layout"], a["kind"]) == (r["layout"], kind) and np.array_equal(a["data"], r["data"])
    assert np.array_equal(a["y"], full) and np.array_equal(a["y_foreign"], full)
    return r


@pytest.mark.parametrize("kind", KINDS)
def test_pack_weights_refusals(kind, kq_lib, tmp_path):
    """Float weights, k not a multiple of 256, truncated or overlong blocks, non-finite d (and
    dmin), a bias, kn order: ArgumentErrors saying so; bytes and flat arrays are accepted.
    gguf.load_tensor(lib=) of a tensor with a NaN d names the tensor (it did not)."""
    fmt, _, rand, bb = KQ[kind]
    raw = rand(3, 512, 11)
    flat = raw.reshape(-1)
    nan_d = raw.reshape(3, 2, bb).copy()
    lay = layout_for(fmt, nr=4, kr=16)
    # d first (with dmin; IQ4_XS's ggml_d_offset), or last (Q6_K)
    off = 0 if hasattr(lay, "dmin_offset") else getattr(lay, "ggml_d_offset", bb - 2)
    nan_d[1, 1, off:off + 2] = np.array([0x7E00], "<u2").view(np.uint8)
    src = dict(kind=kind, n=3, k=512)
    calls = [
        ((np.ones((3, 512), F),), {"kind": kind}, r"from_ggml="),
        ((), {**src, "from_ggml": raw, "k": 384}, r"multiple of 256"),
        ((), {**src, "from_ggml": raw, "k": 300}, r"multiple of 256"),
        ((), {**src, "from_ggml": flat[:-7]}, r"truncated"),
        ((), {**src, "from_ggml": np.concatenate([flat, flat[:bb]])}, r"must hold"),
        # (n, row bytes): a 3-D from_ggml is an expert stack since #33
        ((), {**src, "from_ggml": nan_d.reshape(3, -1)}, r"block 3 \(row 1, block 1 of the row\) has a "
                                          r"non-finite f16 d \(NaN"),
        ((), {**src, "from_ggml": raw, "bias": np.zeros(3, F)}, r"no bias.*matmul\(bias=\)"),
        ((), {**src, "from_ggml": raw, "layout": "kn"},
         rf"always n rows of k/256 {kind.upper()} blocks \(ggml's \(n, k\) order\): layout must be 'nk'"),
        ((), {"kind": kind, "from_ggml": raw}, r"needs n and k"),
    ]
    if hasattr(lay, "dmin_offset"):
        bad = raw.reshape(3, 2, bb).copy()
        bad[2, 0, 2:4] = np.array([0xFC00], "<u2").view(np.uint8)
        calls.append(((), {**src, "from_ggml": bad.reshape(3, -1)}, r"block 4 \(row 2, block 0 of the row\) "
                                                     r"has a non-finite f16 dmin \(-Inf"))
    ok = [((), {**src, "from_ggml": flat.tobytes()}), ((), {**src, "from_ggml": flat}),
          ((), {**src, "from_ggml": bytearray(flat.tobytes())})]
    got = _max_guest(kind).call("guest_weights:packs", kq_lib,
                            [(a, kw) for a, kw, _ in calls] + ok)
    for (_, kw, pattern), r in zip(calls, got):
        assert isinstance(r, str) and r.startswith("ArgumentError: "), (kw.keys(), r)
        assert re.search(pattern, r), (pattern, r)
    path = tmp_path / "nan_d.gguf"
    write_gguf(path, {"blk.0.ffn_down.weight": (KQ[kind][1], nan_d.reshape(3, -1))})
    r = _max_guest(kind).call("guest_weights:load", kq_lib, str(path), "blk.0.ffn_down.weight")
    assert isinstance(r, str) and re.match(
        r"ArgumentError: tensor 'blk.0.ffn_down.weight': ggml \w+ block 3 \(row 1, block 1 of "
        r"the row\) has a non-finite f16 d \(NaN", r), r
    want = layout_for(fmt, nr=got[len(calls)].nr, kr=got[len(calls)].kr).pack_from_ggml(raw, 3, 512)
    for r in got[len(calls):]:
        assert isinstance(r, tilegen.PackedWeights) and np.array_equal(r.data, want), r


@pytest.mark.parametrize("kind", KINDS)
def test_non_finite_activations_are_refused(kind, kq_lib):
    raw = KQ[kind][2](5, 256, 3)
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(F)
    xs = []
    for v in (np.nan, np.inf, -np.inf):
        b = x.copy()
        b[1, 7] = v
        xs.append(b)
    got = _max_guest(kind).call("guest_kquant:refusals", kq_lib, kind, raw, 5, 256, xs)
    for r in got:
        assert isinstance(r, str) and re.match(rf"ArgumentError: {kind} activations must be "
                                               rf"finite", r), r


@pytest.mark.parametrize("target", ["neoverse-v2", "neoverse-n1", "cortex-a53"])
def test_default_builds_carry_kquant_pairs(target):
    """Each preset's default build has, per K-quant kind, a gemm and a gemv on one packed RHS
    of the best ISA the target has (the runtime's first table entry)."""
    from tilegen.build import default_specs, get_target
    from tilegen.layout.base import same_rhs
    specs = default_specs(get_target(target))
    best = {"neoverse-v2": "i8mm", "neoverse-n1": "dotprod", "cortex-a53": "neon"}[target]
    for kind in KINDS:
        mine = [s for s in specs if s.family == kind]
        if best not in FAMILIES[kind].impls:        # no kernel of the family for the target
            assert not mine, mine
            continue
        gemms = [s for s in mine if s.isa == best and not s.is_gemv]
        gemvs = [s for s in mine if s.isa == best and s.is_gemv]
        assert gemms and gemvs and any(same_rhs(g, v) for g in gemms for v in gemvs), \
            (target, [s.spec_string for s in mine])
