"""The runtime on the block-32 table families' weights (IQ4_NL, MXFP4: every family of the
registry with int8 per-32 activations, ``qsi8d32p``, and a table-decode RHS layout, one with a
``table``), in the emulated guest: ggml blocks through ``lib.pack_weights(from_ggml=)``, the
kernel pick per m, ``matmul`` (1 and 3 threads), a bias, ``plan``, the generated qsi8d32p LHS
packer, ``get_rows``, ``for_ops``, a packed-weights file, ``adopt`` from another nr/kr,
``tilegen.gguf.load_tensor`` (with and without a library), and the refusals (float weights, a
non-finite d where the scale format has one, a bias in the packing, kn order, k not a multiple
of 32).

Every result is bit-exact with the family's reference ``matmul_qsi8d32p_<rhs format>`` (e.g.
:func:`tilegen.families.iq4_nl.matmul_qsi8d32p_iq4nlp`) on the numpy packings of the same
activations and blocks; get_rows equals ``gguf.quants.dequantize`` bit for bit.  The guest
scenario is ``guest_iq4_nl.scenario``, run with the family's kind."""
from __future__ import annotations

import re

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.families import FAMILIES, plugin, rhs_layout_class
from tilegen.layout.lhs_int8 import QSI8D32P

from conftest import guest
from test_kquant_weights import write_gguf

T = gguf.GGMLQuantizationType
F = np.float32
N, K = 21, 160                  # n not a multiple of nr (padding columns), 5 blocks

#: the registry's block-32 table families
TABLE32 = tuple(f.name for f in FAMILIES.values()
                if f.lhs == "qsi8d32p" and getattr(rhs_layout_class(f.name), "table", None)
                is not None)

#: per family: the seed offset; CPU model -> the ops of the picked gemm and gemv (the best the
#: model has); the (nr, kr) of a layout no kernel reads (adopt repacks); the layout
#: load_tensor picks without a library and its (nr, kr); the byte offset of a block's scale
#: to make non-finite (None: the scale format has no non-finite value)
DATA = {
    # no SME kernels yet; the i8mm gemm's gemv partner is the kr16 SDOT kernel, as q4_0's
    # llama.cpp pair
    "iq4_nl": dict(seed=4, cpus={"cortex-a53": ("neon", "neon"),
                                 "neoverse-n1": ("neon_dotprod", "neon_dotprod"),
                                 "neoverse-v1": ("sve_i8mm", "sve_dotprod"),
                                 "neoverse-n2": ("sve_i8mm", "sve_dotprod"),
                                 "max": ("sve_i8mm", "sve_dotprod")},
                   foreign=(12, 4), nolib=("iq4nlp4x8", 4, 16), nan_d=18),
    # no NEON i8mm or SME kernels: the SVE models run the SVE pair
    "mxfp4": dict(seed=5, cpus={"cortex-a53": ("neon", "neon"),
                                "neoverse-n1": ("neon_dotprod", "neon_dotprod"),
                                "neoverse-v1": ("sve_i8mm", "sve_dotprod"),
                                "neoverse-n2": ("sve_i8mm", "sve_dotprod"),
                                "max": ("sve_i8mm", "sve_dotprod")},
                  foreign=(12, 16), nolib=("mxfp4p4x4", 4, 8), nan_d=None),
}
CASES = [(fam, cpu) for fam in TABLE32 for cpu in DATA[fam]["cpus"]]


def test_every_table_family_has_its_data():
    """A new block-32 table family fails here until its expectations are written."""
    assert set(TABLE32) == set(DATA) and {"iq4_nl", "mxfp4"} <= set(TABLE32)


def _layout(fam: str):
    return rhs_layout_class(fam)


def _random(fam: str, n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid ggml blocks of the family (its RHS layout's ``random_ggml``)."""
    return _layout(fam).random_ggml(n, k, seed)


def _ggml_type(fam: str):
    return T[_layout(fam).ggml_block[0]]


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict:
    """Per family, a library of its default kernels for every aarch64 CPU (built on first
    use)."""
    made: dict = {}

    def get(fam: str) -> str:
        if fam not in made:
            out = tmp_path_factory.mktemp(f"{fam}rt")
            tilegen.build_library(list(plugin(fam).DEFAULT_KERNELS),
                                  target="linux-aarch64-all", out_dir=out)
            made[fam] = str(out)
        return made[fam]
    return get


def _ref(fam, run, x, raw, clamp) -> np.ndarray:
    m = x.shape[0]
    lay = _layout(fam)
    lhs = QSI8D32P(run["mr"], run["kr"], run["sr"], 32).pack(x)
    rhs = lay(run["nr"], run["rhs_kr"], 2, 32).pack_from_ggml(raw, N, K)
    assert np.array_equal(rhs, run["data"])
    assert np.array_equal(run["lhs"], lhs), f"{run['kernel']}: pack_lhs != QSI8D32P.pack"
    ref = getattr(plugin(fam), f"matmul_qsi8d32p_{lay.format}")
    return ref(lhs, rhs, m, N, K, 32, run["mr"], run["nr"], run["kr"], run["sr"], *clamp)


def _check(fam, runs, x, raw, clamp, op) -> None:
    for m, run in runs.items():
        want = _ref(fam, run, x[:m], raw, clamp)
        assert run["kernel"].endswith("_" + op[m == 1]), run["kernel"]
        assert ("_1x" in run["kernel"]) == (m == 1), run["kernel"]
        for key in ("y", "y1", "plan"):
            assert np.array_equal(run[key].view(np.uint32), want.view(np.uint32)), \
                (m, key, run["kernel"])


@pytest.mark.parametrize("fam, cpu", CASES)
def test_runtime_paths_bit_exact(fam, cpu, libs, tmp_path):
    d = DATA[fam]
    lay = _layout(fam)
    rng = np.random.default_rng(sum(map(ord, cpu)) + d["seed"])
    raw = _random(fam, N, K, int(rng.integers(1 << 30)))
    x = (rng.standard_normal((7, K)) * 3).astype(F)
    x[2, 64:96] = 0                                       # an all-zero LHS block
    rows = np.array([20, 0, 9, 9])
    clamp = (-4.0, 3.5)
    foreign_lay = lay(*d["foreign"], 2, 32)               # no kernel reads it: adopt repacks
    foreign = tilegen.PackedWeights(foreign_lay, N, K, foreign_lay.pack_from_ggml(raw, N, K),
                                    False, fam)
    path = tmp_path / f"{fam}.gguf"
    write_gguf(path, {"blk.0.ffn_up.weight": (_ggml_type(fam), raw)})
    r = guest(cpu).call("guest_iq4_nl:scenario", libs(fam), raw, N, K, x, rows, clamp, foreign,
                        str(path), "blk.0.ffn_up.weight", fam)
    assert isinstance(r, dict), r
    assert r["kind"] == fam and r["layout"].startswith(lay.format)
    want_rows = gguf.quants.dequantize(raw, _ggml_type(fam)).astype(F)[rows]
    assert np.array_equal(r["rows"].view(np.uint32), want_rows.view(np.uint32))
    op = d["cpus"][cpu]
    _check(fam, r["runs"], x, raw, clamp, op)
    _check(fam, r["for_ops"], x, raw, clamp, op)
    big = r["runs"][7]
    full = _ref(fam, big, x, raw, clamp)
    base = _ref(fam, big, x, raw, (-np.inf, np.inf))
    assert np.array_equal(r["bias_y"], np.clip(base + np.arange(N, dtype=F), F(clamp[0]),
                                               F(clamp[1])))
    assert r["loaded"]["layout"] == r["layout"] and np.array_equal(r["loaded"]["y"], full)
    a = r["adopt"]
    assert (a["layout"], a["kind"]) == (r["layout"], fam) and np.array_equal(a["data"], r["data"])
    assert np.array_equal(a["y"], full) and np.array_equal(a["y_foreign"], full)
    g = r["gguf"]
    assert (g["kind"], g["layout"]) == (fam, r["layout"]) and np.array_equal(g["data"], r["data"])
    assert np.array_equal(g["y"], full)
    kind, layout, data = g["nolib"]
    name, nr, kr = d["nolib"]
    assert (kind, layout) == (fam, name)
    assert np.array_equal(data, lay(nr, kr, 2, 32).pack_from_ggml(raw, N, K))


@pytest.mark.parametrize("fam", TABLE32)
def test_pack_weights_refusals(fam, libs):
    raw = _random(fam, 3, 64, 5)
    blocks = _layout(fam).ggml_block[0]
    src = dict(kind=fam, n=3, k=64)
    calls = [((np.ones((3, 64), F),), {"kind": fam}, r"from_ggml=")]
    if DATA[fam]["nan_d"] is not None:
        nan_d = raw.copy()
        at = DATA[fam]["nan_d"]
        nan_d[1, at:at + 2] = np.array([0x7E00], "<u2").view(np.uint8)
        calls.append(((), {**src, "from_ggml": nan_d}, rf"{blocks}.*non-finite"))
    calls += [
        ((), {**src, "from_ggml": raw, "bias": np.zeros(3, F)}, r"no bias.*matmul\(bias=\)"),
        ((), {**src, "from_ggml": raw, "layout": "kn"}, rf"k/32 {blocks} blocks"),
        ((), {**src, "from_ggml": raw, "k": 48}, r"multiple of"),
    ]
    got = guest("max").call("guest_weights:packs", libs(fam), [(a, kw) for a, kw, _ in calls])
    for (_, kw, pattern), r in zip(calls, got):
        assert isinstance(r, str) and r.startswith("ArgumentError: "), (kw.keys(), r)
        assert re.search(pattern, r), (pattern, r)
