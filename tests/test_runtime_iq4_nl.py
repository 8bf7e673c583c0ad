"""The runtime on IQ4_NL weights (kind "iq4_nl"), in the emulated guest: ggml blocks through
``lib.pack_weights(from_ggml=)``, the kernel pick per m, ``matmul`` (1 and 3 threads), a bias,
``plan``, the generated qsi8d32p LHS packer, ``get_rows``, ``for_ops``, a packed-weights file,
``adopt`` from another nr/kr, ``tilegen.gguf.load_tensor`` (with and without a library), and
the refusals (float weights, non-finite d, a bias in the packing, kn order).

Every result is bit-exact with :func:`tilegen.families.iq4_nl.matmul_qsi8d32p_iq4nlp` on the
numpy packings of the same activations and blocks; get_rows equals ``gguf.quants.dequantize``
bit for bit."""
from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.families.iq4_nl import IQ4NLP, matmul_qsi8d32p_iq4nlp, random_iq4_nl
from tilegen.layout.lhs_int8 import QSI8D32P

from conftest import guest
from test_kquant_weights import write_gguf

T = gguf.GGMLQuantizationType
F = np.float32
N, K = 21, 160                  # n not a multiple of nr (padding columns), 5 blocks
# CPU model -> the ops of the picked gemm and gemv (the best the model has; no SME kernels
# yet; the i8mm gemm's gemv partner is the kr16 SDOT kernel, as q4_0's llama.cpp pair)
CPUS = {"cortex-a53": ("neon", "neon"), "neoverse-n1": ("neon_dotprod", "neon_dotprod"),
        "neoverse-v1": ("sve_i8mm", "sve_dotprod"), "neoverse-n2": ("sve_i8mm", "sve_dotprod"),
        "max": ("sve_i8mm", "sve_dotprod")}


@pytest.fixture(scope="module")
def iq4_lib(tmp_path_factory) -> str:
    """The families' default kernels (iq4_nl's among them) for every aarch64 CPU."""
    out = tmp_path_factory.mktemp("iq4rt")
    from tilegen.families import plugin
    tilegen.build_library(list(plugin("iq4_nl").DEFAULT_KERNELS), target="linux-aarch64-all",
                          out_dir=out)
    return str(out)


def _ref(run, x, raw, clamp) -> np.ndarray:
    m = x.shape[0]
    lhs = QSI8D32P(run["mr"], run["kr"], run["sr"], 32).pack(x)
    rhs = IQ4NLP(run["nr"], run["rhs_kr"], 2, 32).pack_from_ggml(raw, N, K)
    assert np.array_equal(rhs, run["data"])
    assert np.array_equal(run["lhs"], lhs), f"{run['kernel']}: pack_lhs != QSI8D32P.pack"
    return matmul_qsi8d32p_iq4nlp(lhs, rhs, m, N, K, 32, run["mr"], run["nr"], run["kr"],
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
def test_runtime_paths_bit_exact(cpu, iq4_lib, tmp_path):
    rng = np.random.default_rng(sum(map(ord, cpu)) + 4)
    raw = random_iq4_nl(N, K, int(rng.integers(1 << 30)))
    x = (rng.standard_normal((7, K)) * 3).astype(F)
    x[2, 64:96] = 0                                       # an all-zero LHS block
    rows = np.array([20, 0, 9, 9])
    clamp = (-4.0, 3.5)
    foreign_lay = IQ4NLP(12, 4, 2, 32)                     # no kernel reads it: adopt repacks
    foreign = tilegen.PackedWeights(foreign_lay, N, K, foreign_lay.pack_from_ggml(raw, N, K),
                                    False, "iq4_nl")
    path = tmp_path / "iq4.gguf"
    write_gguf(path, {"blk.0.ffn_up.weight": (T.IQ4_NL, raw)})
    r = guest(cpu).call("guest_iq4_nl:scenario", iq4_lib, raw, N, K, x, rows, clamp, foreign,
                        str(path), "blk.0.ffn_up.weight")
    assert isinstance(r, dict), r
    assert r["kind"] == "iq4_nl" and r["layout"].startswith("iq4nlp")
    want_rows = gguf.quants.dequantize(raw, T.IQ4_NL).astype(F)[rows]
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
    assert (a["layout"], a["kind"]) == (r["layout"], "iq4_nl") and np.array_equal(a["data"], r["data"])
    assert np.array_equal(a["y"], full) and np.array_equal(a["y_foreign"], full)
    g = r["gguf"]
    assert (g["kind"], g["layout"]) == ("iq4_nl", r["layout"]) and np.array_equal(g["data"], r["data"])
    assert np.array_equal(g["y"], full)
    kind, layout, data = g["nolib"]
    assert (kind, layout) == ("iq4_nl", "iq4nlp4x8")
    assert np.array_equal(data, IQ4NLP(4, 16, 2, 32).pack_from_ggml(raw, N, K))


def test_pack_weights_refusals(iq4_lib):
    raw = random_iq4_nl(3, 64, 5)
    nan_d = raw.copy()
    nan_d[1, 18:20] = np.array([0x7E00], "<u2").view(np.uint8)
    src = dict(kind="iq4_nl", n=3, k=64)
    calls = [
        ((np.ones((3, 64), F),), {"kind": "iq4_nl"}, r"from_ggml="),
        ((), {**src, "from_ggml": nan_d}, r"IQ4_NL.*non-finite"),
        ((), {**src, "from_ggml": raw, "bias": np.zeros(3, F)}, r"no bias.*matmul\(bias=\)"),
        ((), {**src, "from_ggml": raw, "layout": "kn"}, r"k/32 IQ4_NL blocks"),
        ((), {**src, "from_ggml": raw, "k": 48}, r"multiple of"),
    ]
    got = guest("max").call("guest_weights:packs", iq4_lib, [(a, kw) for a, kw, _ in calls])
    for (_, kw, pattern), r in zip(calls, got):
        assert isinstance(r, str) and r.startswith("ArgumentError: "), (kw.keys(), r)
        assert re.search(pattern, r), (pattern, r)
