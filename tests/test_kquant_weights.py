"""K-quant weights (every K-quant kind of the registry: "q4_K", "q5_K", "q6_K") on the host, no
Arm code: GGUF K-quant tensors
through ``tilegen.gguf.load_tensor``, ``get_rows`` against ``gguf.quants.dequantize`` bit for
bit, packed-weights files, the lossless repack between nr / kr that ``lib.adopt`` runs, and the
refusals (k not a multiple of 256, truncated blocks, non-finite d / dmin, float weights).
The library side (pack_weights, matmul, plan) runs in the guest: tests/test_exec_kquant_runtime.py."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import tilegen
from tilegen.layout import LayoutError
from tilegen.layout.api import can_repack, layout_for, repack_rhs
from tilegen.families import LAYOUTS, rhs_layout_class
from tilegen.layout.kquant import KQuantRhs
from tilegen.runtime.errors import ArgumentError
from tilegen.runtime.packed import dequantize_packed_rows

T = gguf.GGMLQuantizationType

# kind -> (packed RHS format, ggml type, random valid blocks, bytes per block): every layout of
# the registry that is a K-quant (KQuantRhs: 256-k super-blocks; the block-32 formats iq4_nl
# and mxfp4 have their own tests), the family record's (q5_K's SME2 4vl x 1vl variant q5kps
# is tested with its kernel)
KQ = {c.ggml_only: (c.format, T[c.ggml_block[0]], c.random_ggml,
                    gguf.GGML_QUANT_SIZES[T[c.ggml_block[0]]][1])
      for c in LAYOUTS if issubclass(c, KQuantRhs) and c is rhs_layout_class(c.ggml_only)}
N, K = 13, 512          # n not a multiple of any nr: padding columns


def write_gguf(path, tensors: dict) -> None:
    """A GGUF file holding raw ggml blocks: name -> (ggml type, uint8 (n, row bytes))."""
    wr = gguf.GGUFWriter(str(path), "llama")
    for name, (typ, raw) in tensors.items():
        wr.add_tensor(name, raw, raw_dtype=typ)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(path, {kind: raw blocks (N, row bytes)}) of a GGUF file with one tensor per kind."""
    raws = {kind: rand(N, K, 240 + i).reshape(N, -1)
            for i, (kind, (_, _, rand, _)) in enumerate(KQ.items())}
    path = tmp_path_factory.mktemp("kq") / "kq.gguf"
    write_gguf(path, {kind: (KQ[kind][1], raw) for kind, raw in raws.items()})
    return path, raws


@pytest.mark.parametrize("kind", KQ)
def test_load_tensor_packs_the_blocks_and_get_rows_equals_gguf(kind, model):
    from tilegen.gguf import load_tensor
    path, raws = model
    fmt, typ, _, _ = KQ[kind]
    pw = load_tensor(path, kind)
    assert (pw.kind, pw.format, pw.n, pw.k, pw.nr, pw.kr, pw.sr) == (kind, fmt, N, K, 4, 16, 2)
    assert np.array_equal(pw.data, layout_for(fmt, nr=4, kr=16).pack_from_ggml(raws[kind], N, K))
    want = gguf.quants.dequantize(raws[kind], typ).astype(np.float32)
    assert want.shape == (N, K) and np.isfinite(want).all() and np.abs(want).max() > 0
    rows = np.array([12, 0, 7, 7, 3])
    got = dequantize_packed_rows(pw, rows)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want[rows].view(np.uint32))     # bit for bit
    assert dequantize_packed_rows(pw, np.array([], np.int64)).shape == (0, K)
    with pytest.raises(ArgumentError, match="out of range"):
        dequantize_packed_rows(pw, [N])
    p8 = load_tensor(path, kind, nr=8)
    assert p8.nr == 8 and np.array_equal(dequantize_packed_rows(p8, rows), got)


@pytest.mark.parametrize("kind", KQ)
def test_packed_file_round_trip(kind, model, tmp_path):
    from tilegen.gguf import load_tensor
    pw = load_tensor(model[0], kind, nr=8)
    p = tmp_path / f"{kind}.tgpw"
    pw.save(p)
    again = tilegen.PackedWeights.load(p)
    assert again.layout == pw.layout and (again.kind, again.n, again.k) == (kind, N, K)
    assert np.array_equal(again.data, pw.data)


@pytest.mark.parametrize("kind", KQ)
def test_repack_between_nr_and_kr_is_lossless(kind, model):
    """What lib.adopt runs for K-quant weights of another layout: the bytes packing the blocks
    for the destination layout gives, for every (nr, kr) pair the kernels use."""
    fmt = KQ[kind][0]
    raw = model[1][kind]
    geoms = [(4, 16), (8, 8), (4, 8), (16, 16), (12, 8)]
    for a in geoms:
        src = layout_for(fmt, nr=a[0], kr=a[1])
        packed = src.pack_from_ggml(raw, N, K)
        for b in geoms:
            dst = layout_for(fmt, nr=b[0], kr=b[1])
            assert can_repack(src, dst)
            assert np.array_equal(repack_rhs(packed, src, dst, N, K),
                                  dst.pack_from_ggml(raw, N, K)), (a, b)
    other = layout_for("q6kp" if fmt == "q4kp" else "q4kp", nr=4, kr=16)
    assert not can_repack(layout_for(fmt, nr=4, kr=16), other)


@pytest.mark.parametrize("kind", KQ)
def test_bad_blocks_are_clear_errors(kind, tmp_path):
    """k not a multiple of 256, truncated or overlong blocks, a non-finite d (or dmin) and float
    weights: LayoutError from the layout (ArgumentError through pack_weights and load_tensor)."""
    from tilegen.gguf import load_tensor
    fmt, typ, rand, bb = KQ[kind]
    lay = layout_for(fmt, nr=4, kr=16)
    raw = rand(3, 512, 7)
    with pytest.raises(LayoutError, match="multiple of 256"):
        lay.pack_from_ggml(raw, 3, 384)
    with pytest.raises(LayoutError, match="truncated"):
        lay.pack_from_ggml(raw.reshape(-1)[:-1], 3, 512)
    with pytest.raises(LayoutError, match="must hold"):
        lay.pack_from_ggml(np.concatenate([raw.reshape(-1), raw.reshape(-1)[:bb]]), 3, 512)
    with pytest.raises(LayoutError, match="from_ggml="):
        lay.pack_from_float(np.ones((3, 512), np.float32))
    # f16 fields: with a min term (Q4_K, Q5_K) d at byte 0 and dmin at 2; Q6_K d last (208)
    fields = [(0, "d"), (2, "dmin")] if hasattr(lay, "dmin_offset") else \
        [(getattr(lay, "ggml_d_offset", bb - 2), "d")]        # (IQ4_XS: d first, no dmin)
    for off, field in fields:
        for bits, name in ((0x7C00, r"\+Inf"), (0xFC00, "-Inf"), (0x7E01, "NaN")):
            bad = raw.reshape(3, 2, bb).copy()
            bad[2, 1, off:off + 2] = np.array([bits], "<u2").view(np.uint8)
            pat = rf"block 5 \(row 2, block 1 of the row\) has a non-finite f16 {field} \({name}"
            with pytest.raises(LayoutError, match=pat):
                lay.pack_from_ggml(bad, 3, 512)
        path = tmp_path / f"{kind}-{field}.gguf"
        write_gguf(path, {"w": (typ, bad.reshape(3, -1))})
        with pytest.raises(ArgumentError, match=rf"tensor 'w': .*non-finite f16 {field}"):
            load_tensor(path, "w")
