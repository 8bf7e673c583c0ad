"""lib.pack_weights and lib.adopt on awkward inputs (issue #21, hardening II): the layout=
argument for every kind, weight sources (w / from_ggml=) per kind, weights beyond the range of
their format, ggml blocks with non-finite scales (pack_weights and gguf.load_tensor), and bf16
weights adopted at another SME vector length or on CPUs without bf16 kernels.

The runtime calls run in the emulated guest (tests/guest_weights.py), with numpy warnings as
errors."""
from __future__ import annotations

import re

import numpy as np
import pytest

import tilegen
from tilegen.runtime.errors import ArgumentError
from tilegen.layout.bf16 import bf16_to_f32, f32_to_bf16_rne
from tilegen.layout.ggml import quantize_q4_0, quantize_q8_0

from conftest import SME_ON, guest

KINDS = ("f32", "f16", "bf16", "q4_0", "q4_0_dx", "q8_0")
GGML_KINDS = ("q4_0", "q4_0_dx", "q8_0")
F = np.float32


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """A library with kernels of every weight kind: NEON f32, q4_0, q4_0_dx, q8_0, NEON bf16
    and SME2 bf16."""
    out = tmp_path_factory.mktemp("packw")
    tilegen.build_library(["f32:neon:6x16", "f32:neon:1x16", "q4_0:neon:4x4", "q4_0:neon:1x4",
                           "q4_0_dx:neon:4x4", "q4_0_dx:neon:1x4", "q8_0:neon:4x4",
                           "q8_0:neon:1x4", "bf16:bf16:8x12", "bf16:bf16:1x12",
                           "bf16:sme2:2vlx2vl"], target="linux-aarch64-all", out_dir=out)
    return str(out)


def _weights(kind: str, w: np.ndarray) -> np.ndarray:
    return w.astype(np.float16) if kind == "f16" else w


def _bf16(w: np.ndarray) -> np.ndarray:
    """float32 w rounded to bf16 (nearest even), as float32."""
    return bf16_to_f32(f32_to_bf16_rne(w))


def _refused(got, pattern: str, what: str) -> None:
    assert isinstance(got, str) and got.startswith("ArgumentError: "), f"{what}: {got!r}"
    assert re.search(pattern, got), f"{what}: {got!r} does not match {pattern!r}"


# ---------------------------------------------------------------------------------------
# layout= and the weight source (items 4 and 11)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_layout_kn_packs_the_transpose_for_every_kind(kind, lib):
    """(k, n) weights with layout="kn" pack to the bytes of their (n, k) transpose (n != k:
    q4/q8 once packed the (k, n) array as (n, k))."""
    rng = np.random.default_rng(4 + KINDS.index(kind))
    n, k = 96, 64
    w = _weights(kind, rng.normal(size=(n, k)).astype(F))
    x = rng.normal(size=(3, k)).astype(F)
    r = guest("max").call("guest_weights:kn_vs_nk", lib, kind, w, x)
    nk, kn = r["nk"], r["kn"]
    assert isinstance(nk, dict), nk
    assert isinstance(kn, dict), kn
    assert nk["shape"] == kn["shape"] == (n, k)
    assert np.array_equal(kn["data"], nk["data"])
    assert np.array_equal(kn["y"], nk["y"]) and np.array_equal(kn["rows"], nk["rows"])


def test_pack_weights_refuses_unknown_layouts_and_mismatched_sources(lib):
    """An unknown layout= is refused for every kind; from_ggml= only for the kinds with ggml
    blocks, never with w, never with layout="kn"; no weights at all is named as such."""
    rng = np.random.default_rng(11)
    w = rng.normal(size=(8, 64)).astype(F)
    raw4 = quantize_q4_0(w)
    raw8 = quantize_q8_0(w)
    raw = {"q4_0": raw4, "q4_0_dx": raw4, "q8_0": raw8}
    block = {"q4_0": "Q4_0", "q4_0_dx": "Q4_0", "q8_0": "Q8_0"}
    cases = []          # (args, kwargs, pattern)
    for kind in KINDS:
        for bad in ("bogus", "NK", None):
            cases.append(((_weights(kind, w),), dict(kind=kind, layout=bad),
                          rf"layout must be 'nk' .* or 'kn' .*got {re.escape(repr(bad))}"))
    for kind in GGML_KINDS:
        src = dict(kind=kind, from_ggml=raw[kind], n=8, k=64)
        cases.append(((), dict(src, layout="kn"),
                      rf"always n rows of k/32 {block[kind]} blocks.*'nk'"))
        cases.append(((w,), src, r"either w or from_ggml=, not both"))
        cases.append(((), dict(src, layout="bogus"), r"layout must be 'nk'"))
    from tilegen.families import GGML_BLOCKS       # every kind with a ggml block form, in order
    types = "/".join(dict.fromkeys(t for t, _ in GGML_BLOCKS.values()))
    assert types.startswith("Q4_0/Q8_0/Q4_K/")
    for kind in ("f32", "f16", "bf16"):
        cases.append(((), dict(kind=kind, from_ggml=raw4, n=8, k=64),
                      rf"takes ggml {types} blocks, for kinds {', '.join(GGML_BLOCKS)}; "
                      rf"kind '{kind}' has no ggml block form"))
    for kind in KINDS:
        cases.append(((), dict(kind=kind), r"no weights: pass w"))
    got = guest("max").call("guest_weights:packs", lib, [(a, kw) for a, kw, _ in cases])
    for (a, kw, pattern), g in zip(cases, got):
        what = {key: v for key, v in kw.items() if key != "from_ggml"}
        _refused(g, pattern, f"{'w, ' if a else ''}{what}")


# ---------------------------------------------------------------------------------------
# weights beyond their format (item 5)
# ---------------------------------------------------------------------------------------
def test_weights_beyond_their_format_are_refused(lib):
    """q4_0 / q4_0_dx weights with |w| above 8 x 65504 (their f16 block scale would be Inf),
    NaN or Inf, and bf16 weights that round to Inf are ArgumentErrors naming the limit and the
    first offending row (of the (n, k) weights, also with layout="kn"), never Inf/NaN blocks
    or numpy warnings."""
    rng = np.random.default_rng(5)
    w = rng.normal(size=(8, 64)).astype(F)
    cases = []
    for kind in ("q4_0", "q4_0_dx"):
        for row, val in ((3, 6.0e5), (5, np.nan), (2, -np.inf), (6, 524033.0)):
            bad = w.copy()
            bad[row, 40] = val
            pat = rf"finite with \|w\| <= 524032 \(8 x 65504.*row {row} of the \(n, k\) weights"
            cases.append(((bad,), dict(kind=kind), pat))
            cases.append(((np.ascontiguousarray(bad.T),), dict(kind=kind, layout="kn"), pat))
    for row, val in ((4, 3.4e38), (1, np.uint32(0xFF7F8000).view(F))):     # -(bf16 max + half a step)
        bad = w.copy()
        bad[row, 7] = val
        cases.append(((bad,), dict(kind="bf16"),
                      rf"bf16 weights must be below 3\.39617\d*e\+38.*row {row} of the \(n, k\)"))
    got = guest("max").call("guest_weights:packs", lib, [(a, kw) for a, kw, _ in cases])
    for (a, kw, pattern), g in zip(cases, got):
        _refused(g, pattern, f"{kw} max |w| {np.nanmax(np.abs(a[0])):g}")


def test_weights_at_the_edges_of_their_format_pack_without_warnings(lib):
    """Weights just inside the limits pack and compute finitely; tiny (subnormal-range)
    weights pack without numpy warnings: q8_0 keeps them (per-channel f32 scale, 1/scale
    overflows f32), q4_0 flushes them to 0 like ggml (their f16 scale is 0)."""
    rng = np.random.default_rng(6)
    w = rng.normal(size=(8, 64)).astype(F)
    x = rng.normal(size=(2, 64)).astype(F)
    g = guest("max")
    big = w / np.abs(w).max() * F(524032.0)
    tiny = w * F(1e-39)
    for kind in ("q4_0", "q4_0_dx", "q8_0"):
        pw = g.call("guest_weights:pack", lib, (big,), dict(kind=kind))
        assert not isinstance(pw, str), (kind, pw)
        r = g.call("guest_weights:run", lib, pw, x)
        assert isinstance(r, dict), (kind, r)
        assert np.isfinite(r["y"]).all() and np.isfinite(r["rows"]).all(), kind
        tol = 1.0 / 7 if kind != "q8_0" else 1.0 / 127      # one quantisation step
        assert np.abs(r["rows"] - big).max() <= tol * 524032.0, kind
        pw = g.call("guest_weights:pack", lib, (tiny,), dict(kind=kind))
        assert not isinstance(pw, str), (kind, pw)
        r = g.call("guest_weights:run", lib, pw, x)
        assert isinstance(r, dict), (kind, r)
        if kind == "q8_0":
            amax = np.abs(tiny).max(axis=1, keepdims=True)
            assert np.all(np.abs(r["rows"] - tiny) <= amax / 100), np.abs(r["rows"] - tiny).max()
        else:
            assert not r["rows"].any()
    top = w.copy()
    bf16_max = bf16_to_f32(np.uint16(0x7F7F))
    top[2, 5] = np.nextafter(np.uint32(0x7F7F8000).view(F), F(0))   # rounds to bf16_max
    pw = g.call("guest_weights:pack", lib, (top,), dict(kind="bf16"))
    assert not isinstance(pw, str), pw
    r = g.call("guest_weights:run", lib, pw, x[:1] * F(1e-30))
    assert isinstance(r, dict), r
    assert np.isfinite(r["rows"]).all() and r["rows"][2, 5] == bf16_max


# ---------------------------------------------------------------------------------------
# ggml blocks with non-finite scales (item 6)
# ---------------------------------------------------------------------------------------
def _with_scale(raw: np.ndarray, block_bytes: int, row: int, blk: int, bits: int) -> np.ndarray:
    out = raw.copy()
    out[row, blk * block_bytes:blk * block_bytes + 2] = np.array([bits], "<u2").view(np.uint8)
    return out


BAD_SCALES = ((2, 1, 0x7E00, "NaN"), (4, 2, 0x7C00, r"\+Inf"), (0, 0, 0xFC00, "-Inf"),
              (5, 2, 0x7C01, "NaN"))


def _ggml_raw(kind: str, w: np.ndarray) -> tuple[np.ndarray, int]:
    return (quantize_q8_0(w), 34) if kind == "q8_0" else (quantize_q4_0(w), 18)


def test_ggml_blocks_with_non_finite_scales_are_refused(lib, tmp_path):
    """A Q4_0 or Q8_0 block whose f16 scale is NaN or Inf is an ArgumentError naming the block
    (index, row, block within the row) in pack_weights(from_ggml=) and in
    gguf.load_tensor(lib=), which names the tensor too (it did not) -- not an all-zero row
    (Q8_0) nor NaN weights (Q4_0)."""
    import gguf
    rng = np.random.default_rng(8)
    n, k = 6, 96
    w = rng.normal(size=(n, k)).astype(F)
    cases, files = [], []
    for kind in GGML_KINDS:
        raw, bb = _ggml_raw(kind, w)
        for row, blk, bits, name in BAD_SCALES:
            bad = _with_scale(raw, bb, row, blk, bits)
            pat = (rf"ggml Q{'8' if kind == 'q8_0' else '4'}_0 block {row * 3 + blk} \(row {row}, "
                   rf"block {blk} of the row\) has a non-finite f16 scale \({name}")
            cases.append(((), dict(kind=kind, from_ggml=bad, n=n, k=k), pat))
            cases.append(((), dict(kind=kind, from_ggml=bad.tobytes(), n=n, k=k), pat))
        if kind != "q4_0_dx":
            path = tmp_path / f"{kind}.gguf"
            row, blk, bits, name = BAD_SCALES[0]
            _write_gguf(gguf, path, kind, _with_scale(raw, bb, row, blk, bits))
            files.append((str(path), kind,
                          rf"^ArgumentError: tensor 'w': ggml Q{kind[1]}_0 block {row * 3 + blk} "
                          rf"\(row {row}, block {blk}"))
    g = guest("max")
    got = g.call("guest_weights:packs", lib, [(a, kw) for a, kw, _ in cases])
    for (_, kw, pattern), r in zip(cases, got):
        _refused(r, pattern, f"{kw['kind']} {type(kw['from_ggml']).__name__}")
    for path, kind, pattern in files:
        r = g.call("guest_weights:load", lib, path)
        _refused(r, pattern, f"load_tensor {kind}")


def _write_gguf(gguf, path, kind: str, raw: np.ndarray) -> None:
    T = gguf.GGMLQuantizationType
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_tensor("w", raw, raw_dtype=T.Q8_0 if kind == "q8_0" else T.Q4_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def test_gguf_tensors_with_non_finite_scales_are_refused_without_a_library(tmp_path):
    """gguf.load_tensor without lib= (llama.cpp's default layouts, numpy on the host) refuses
    Q4_0 and Q8_0 blocks with a NaN or Inf scale the same way, as ArgumentError naming the
    tensor (Q4_0's did not)."""
    import gguf
    from tilegen.gguf import load_tensor
    rng = np.random.default_rng(9)
    w = rng.normal(size=(6, 96)).astype(F)
    for kind in ("q4_0", "q8_0"):
        raw, bb = _ggml_raw(kind, w)
        for row, blk, bits, name in BAD_SCALES:
            path = tmp_path / f"{kind}-{row}.gguf"
            _write_gguf(gguf, path, kind, _with_scale(raw, bb, row, blk, bits))
            with pytest.raises(ArgumentError,
                               match=rf"^tensor 'w': ggml Q{kind[1]}_0 block {row * 3 + blk} "
                                     rf"\(row {row}, block {blk} of the row\) has a non-finite "
                                     rf"f16 scale \({name}"):
                load_tensor(path, "w")
        path = tmp_path / f"{kind}-ok.gguf"
        _write_gguf(gguf, path, kind, raw)
        assert (load_tensor(path, "w").n, load_tensor(path, "w").k) == (6, 96)


# ---------------------------------------------------------------------------------------
# bf16 weights adopted at another SVL / on a CPU without bf16 (item 8)
# ---------------------------------------------------------------------------------------
# (CPU model, SME vector length, environment) -> the layout adopt gives there
ADOPTERS = {
    ("max", 128, "sme"): "bf16p8x2b",          # SME2 at another SVL
    ("max", 2048, "sme"): "bf16p128x2b",
    ("max", None, ""): "bf16p12x4b",           # SME off: the NEON BFMMLA kernels
    ("neoverse-n1", None, ""): "f32p16x1b",    # no bf16: the f32 kernels, bf16 widened
}


@pytest.mark.parametrize("kind", ("bf16", "f16"))
def test_bf16_weights_adopted_at_other_widths_and_cpus(kind, lib):
    """Weights packed for the SME2 bf16 kernels at SVL 512 (bf16p32x2b) are adopted at SVL 128
    and 2048, by the NEON bf16 kernels, and by the f32 kernels of a CPU without bf16 (kind
    "f16"), losslessly: the bytes and results of packing their bf16 values there, get_rows
    the bf16 values, results close to the float64 product."""
    rng = np.random.default_rng(12 if kind == "bf16" else 13)
    n, k = 37, 21
    w = rng.normal(size=(n, k)).astype(F)
    bias = rng.normal(size=n).astype(F) if kind == "bf16" else None
    x = rng.normal(size=(5, k)).astype(F)
    src = w.astype(np.float16) if kind == "f16" else w
    wb = _bf16(src.astype(F))
    pw = guest("max", None, 512, dict(SME_ON)).call("guest_weights:pack", lib, (src,),
                                                    dict(kind=kind, bias=bias))
    assert not isinstance(pw, str), pw
    assert pw.layout.name == "bf16p32x2b"
    ref = x.astype(np.float64) @ wb.T.astype(np.float64) + (0 if bias is None else bias)
    for (cpu, svl, env), want in ADOPTERS.items():
        sess = guest(cpu, None, svl, dict(SME_ON) if env == "sme" else None)
        native = "f32" if want.startswith("f32p") else "bf16"
        r = sess.call("guest_weights:adopt_run", lib, pw, x, native, wb, bias)
        assert isinstance(r, dict), (cpu, svl, r)
        assert r["layout"] == r["native_layout"] == want, (cpu, svl, r["layout"])
        assert r["kind"] == ("f16" if native == "f32" else kind)
        assert r["has_bias"] == (bias is not None)
        assert np.array_equal(r["data"], r["native_data"]), (cpu, svl)
        for got, nat in (("y", "native_y"), ("y1", "native_y1"), ("y_pw", "native_y")):
            assert np.array_equal(r[got], r[nat]), (cpu, svl, got)
        assert np.array_equal(r["rows"], wb), (cpu, svl)
        assert np.allclose(r["y"], ref, rtol=2e-2, atol=2e-2 * np.sqrt(k)), (cpu, svl)


def test_weights_doc_names_every_ggml_kind():
    """docs/weights.md's from_ggml= rule once listed q4_0, q4_0_dx and q8_0 only: it names every
    kind whose family's RHS layout reads ggml blocks, with its block type."""
    from pathlib import Path
    from tilegen.layout.registry import layout_class
    from tilegen.families import FAMILIES
    text = (Path(__file__).resolve().parents[1] / "docs" / "weights.md").read_text()
    rule = re.search(r"^- `from_ggml=` is for .*?(?=^- )", text, flags=re.M | re.S)
    assert rule, "docs/weights.md: no '- `from_ggml=` is for ...' rule"
    rule = " ".join(rule.group(0).split())
    kinds = {k: layout_class("rhs", f.rhs).ggml_block for f in FAMILIES.values() for k in f.kinds}
    assert {k for k, b in kinds.items() if b} >= {"q4_0", "q4_0_dx", "q8_0", "q4_K", "q6_K"}
    for kind, blk in kinds.items():
        if blk is not None:
            assert f'`"{kind}"`' in rule, (kind, rule)
            # ggml's struct names: lower case but for the K-quants' "_K" (block_q4_K, block_iq4_xs)
            struct = re.sub(r"_k$", "_K", blk[0].lower())
            assert f"block_{struct}" in rule, (kind, blk, rule)
