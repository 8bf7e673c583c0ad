"""The runtime on MXFP4 weights (kind "mxfp4"), in the emulated guest: ggml blocks through
``lib.pack_weights(from_ggml=)``, the kernel pick per m, ``matmul`` (1 and 3 threads), a bias,
``plan``, the generated qsi8d32p LHS packer, ``get_rows``, ``for_ops``, a packed-weights file,
``adopt`` from another nr/kr, ``tilegen.gguf.load_tensor`` (with and without a library), and
the refusals (float weights, a bias in the packing, kn order, k not a multiple of 32).

Every result is bit-exact with :func:`tilegen.families.mxfp4.matmul_qsi8d32p_mxfp4p` on the
numpy packings of the same activations and blocks; get_rows equals ``gguf.quants.dequantize``
bit for bit.  (The guest scenario is test_runtime_iq4_nl's, run with kind "mxfp4".)"""
from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.families.mxfp4 import MXFP4P, matmul_qsi8d32p_mxfp4p, random_mxfp4
from tilegen.layout.lhs_int8 import QSI8D32P

from conftest import guest
from test_kquant_weights import write_gguf

T = gguf.GGMLQuantizationType
F = np.float32
N, K = 21, 160                  # n not a multiple of nr (padding columns), 5 blocks
# CPU model -> the ops of the picked gemm and gemv (the best the model has; no NEON i8mm or
# SME kernels: the SVE models run the SVE pair)
CPUS = {"cortex-a53": ("neon", "neon"), "neoverse-n1": ("neon_dotprod", "neon_dotprod"),
        "neoverse-v1": ("sve_i8mm", "sve_dotprod"), "neoverse-n2": ("sve_i8mm", "sve_dotprod"),
        "max": ("sve_i8mm", "sve_dotprod")}


@pytest.fixture(scope="module")
def mx_lib(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("mxrt")
    from tilegen.families import plugin
    tilegen.build_library(list(plugin("mxfp4").DEFAULT_KERNELS), target="linux-aarch64-all",
                          out_dir=out)
    return str(out)


def _ref(run, x, raw, clamp) -> np.ndarray:
    m = x.shape[0]
    lhs = QSI8D32P(run["mr"], run["kr"], run["sr"], 32).pack(x)
    rhs = MXFP4P(run["nr"], run["rhs_kr"], 2, 32).pack_from_ggml(raw, N, K)
    assert np.array_equal(rhs, run["data"])
    assert np.array_equal(run["lhs"], lhs), f"{run['kernel']}: pack_lhs != QSI8D32P.pack"
    return matmul_qsi8d32p_mxfp4p(lhs, rhs, m, N, K, 32, run["mr"], run["nr"], run["kr"],
                                  run["sr"], *clamp)


def _check(runs, x, raw, clamp, op) -> None:
    for m, run in runs.items():
        want = _ref(run, x[:m], raw, clamp)
        assert run["kernel"].endswith("_" + op[m == 1]), run["kernel"]
        assert ("_1x" in run["kernel"]) == (m == 1), run["kernel"]
        for key in ("y", "y1", "plan"):
            assert np.array_equal(run[key].view(np.uint32), want.view(np.uint32)), \
                (m, key, run["kernel"])


@pytest.mark.parametrize("cpu", CPUS)
def test_runtime_paths_bit_exact(cpu, mx_lib, tmp_path):
    rng = np.random.default_rng(sum(map(ord, cpu)) + 5)
    raw = random_mxfp4(N, K, int(rng.integers(1 << 30)))
    x = (rng.standard_normal((7, K)) * 3).astype(F)
    x[2, 64:96] = 0                                       # an all-zero LHS block
    rows = np.array([20, 0, 9, 9])
    clamp = (-4.0, 3.5)
    foreign_lay = MXFP4P(12, 16, 2, 32)                    # no kernel reads it: adopt repacks
    foreign = tilegen.PackedWeights(foreign_lay, N, K, foreign_lay.pack_from_ggml(raw, N, K),
                                    False, "mxfp4")
    path = tmp_path / "mx.gguf"
    write_gguf(path, {"blk.0.ffn_up.weight": (T.MXFP4, raw)})
    r = guest(cpu).call("guest_iq4_nl:scenario", mx_lib, raw, N, K, x, rows, clamp, foreign,
                        str(path), "blk.0.ffn_up.weight", "mxfp4")
    assert isinstance(r, dict), r
    assert r["kind"] == "mxfp4" and r["layout"].startswith("mxfp4p")
    want_rows = gguf.quants.dequantize(raw, T.MXFP4).astype(F)[rows]
    assert np.array_equal(r["rows"].view(np.uint32), want_rows.view(np.uint32))
    op = CPUS[cpu]
    _check(r["runs"], x, raw, clamp, op)
    _check(r["for_ops"], x, raw, clamp, op)
    big = r["runs"][7]
    full = _ref(big, x, raw, clamp)
    base = _ref(big, x, raw, (-np.inf, np.inf))
    assert np.array_equal(r["bias_y"], np.clip(base + np.arange(N, dtype=F), F(clamp[0]),
                                               F(clamp[1])))
    assert r["loaded"]["layout"] == r["layout"] and np.array_equal(r["loaded"]["y"], full)
    a = r["adopt"]
    assert (a["layout"], a["kind"]) == (r["layout"], "mxfp4") and np.array_equal(a["data"], r["data"])
    assert np.array_equal(a["y"], full) and np.array_equal(a["y_foreign"], full)
    g = r["gguf"]
    assert (g["kind"], g["layout"]) == ("mxfp4", r["layout"]) and np.array_equal(g["data"], r["data"])
    assert np.array_equal(g["y"], full)
    kind, layout, data = g["nolib"]
    assert (kind, layout) == ("mxfp4", "mxfp4p4x4")
    assert np.array_equal(data, MXFP4P(4, 8, 2, 32).pack_from_ggml(raw, N, K))


def test_pack_weights_refusals(mx_lib):
    raw = random_mxfp4(3, 64, 5)
    src = dict(kind="mxfp4", n=3, k=64)
    calls = [
        ((np.ones((3, 64), F),), {"kind": "mxfp4"}, r"from_ggml="),
        ((), {**src, "from_ggml": raw, "bias": np.zeros(3, F)}, r"no bias.*matmul\(bias=\)"),
        ((), {**src, "from_ggml": raw, "layout": "kn"}, r"k/32 MXFP4 blocks"),
        ((), {**src, "from_ggml": raw, "k": 48}, r"multiple of"),
    ]
    got = guest("max").call("guest_weights:packs", mx_lib, [(a, kw) for a, kw, _ in calls])
    for (_, kw, pattern), r in zip(calls, got):
        assert isinstance(r, str) and r.startswith("ArgumentError: "), (kw.keys(), r)
        assert re.search(pattern, r), (pattern, r)
