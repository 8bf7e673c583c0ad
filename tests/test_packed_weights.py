"""PackedWeights files and the host side of weight packing (no Arm code runs here)."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.layout.f32 import F32PackedRHS
from tilegen.runtime import LoadError

ROOT = Path(__file__).resolve().parent.parent


def _f32_weights(n: int = 24, k: int = 3, seed: int = 21) -> tilegen.PackedWeights:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(n, k)).astype(np.float32)
    lay = F32PackedRHS(16)
    return tilegen.PackedWeights(lay, n, k, lay.pack(w), False, "f32")


def test_every_flipped_bit_is_a_load_error(tmp_path):
    pw = _f32_weights()
    p = tmp_path / "w.tgpw"
    pw.save(p)
    blob = p.read_bytes()
    again = tilegen.PackedWeights.load(p)
    assert np.array_equal(again.data, pw.data) and (again.n, again.k, again.nr) == (24, 3, 16)
    bad = tmp_path / "bad.tgpw"
    data_start = len(blob) - pw.nbytes
    for i in range(len(blob)):
        # every bit of each byte before the data, one bit (cycling) of each data byte
        for bit in (range(8) if i < data_start else (i % 8,)):
            flipped = bytearray(blob)
            flipped[i] ^= 1 << bit
            bad.write_bytes(bytes(flipped))
            with pytest.raises(LoadError):
                tilegen.PackedWeights.load(bad)


def test_edited_header_is_a_load_error(tmp_path):
    p = tmp_path / "w.tgpw"
    _f32_weights().save(p)
    blob = p.read_bytes()
    assert blob.count(b'"n": 24') == 1
    # n=25 fits the same two 16-column panels: only a checksum over the header catches it
    p.write_bytes(blob.replace(b'"n": 24', b'"n": 25'))
    with pytest.raises(LoadError, match="checksum"):
        tilegen.PackedWeights.load(p)


def test_extra_trailing_byte_is_not_called_truncated(tmp_path):
    p = tmp_path / "w.tgpw"
    _f32_weights().save(p)
    blob = p.read_bytes()
    p.write_bytes(blob + b"\x01")
    with pytest.raises(LoadError, match="1 extra byte") as e:
        tilegen.PackedWeights.load(p)
    assert "truncated" not in str(e.value)
    p.write_bytes(blob[:-1])
    with pytest.raises(LoadError, match="truncated"):
        tilegen.PackedWeights.load(p)


def test_old_version_file_is_a_clear_load_error(tmp_path):
    """A file in the version-1 format (no header checksum) is refused by version."""
    pw = _f32_weights()
    import hashlib
    meta = {"format": pw.format, "n": pw.n, "k": pw.k, "nr": pw.nr, "kr": pw.kr, "sr": pw.sr,
            "bl": pw.bl, "has_bias": pw.has_bias, "kind": pw.kind, "nbytes": pw.nbytes,
            "sha256": hashlib.sha256(pw.data.tobytes()).hexdigest()}
    hdr = json.dumps(meta, sort_keys=True).encode()
    p = tmp_path / "v1.tgpw"
    p.write_bytes(b"TILEGENPW" + struct.pack("<II", 1, len(hdr)) + hdr + pw.data.tobytes())
    with pytest.raises(LoadError, match=r"version 1 .*pack the weights again"):
        tilegen.PackedWeights.load(p)


def test_file_recording_a_layout_name_loads(tmp_path):
    """Files saved before formats were stems record f32 weights by the layout's full name
    (``f32p16x1b``); loading resolves either through layout_for."""
    from tilegen.layout.api import layout_for
    pw = _f32_weights()
    assert pw.format == "f32p"
    p = tmp_path / "old.tgpw"
    pw.save(p)
    blob = p.read_bytes()      # the same file with the full name in its header (and checksum)
    import hashlib
    import json
    import struct
    pre = len(pw.MAGIC) + 8
    hlen = struct.unpack("<I", blob[pre - 4:pre])[0]
    meta = json.loads(blob[pre:pre + hlen])
    meta["format"] = "f32p16x1b"
    hdr = json.dumps(meta, sort_keys=True).encode()
    head = pw.MAGIC + struct.pack("<II", pw.VERSION, len(hdr)) + hdr
    p.write_bytes(head + hashlib.sha256(head).digest() + blob[pre + hlen + 32:])
    got = tilegen.PackedWeights.load(p)
    assert np.array_equal(got.data, pw.data) and got.layout == pw.layout == layout_for("f32p", nr=16)


_RSS_CHILD = """
import sys
import numpy as np
import tilegen
from tilegen.layout.api import layout_for


def peak_kib():
    with open("/proc/self/status") as f:
        return int(next(l for l in f if l.startswith("VmHWM")).split()[1])


with open("/proc/self/clear_refs", "w") as f:    # reset the peak RSS (the fork copied ours)
    f.write("5")
base = peak_kib()
pw = tilegen.PackedWeights.load(sys.argv[1])
probe = int(pw.data[::4096].astype(np.int64).sum())
print(base, peak_kib(), probe, pw.nbytes)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_loading_a_large_file_costs_its_size_once(tmp_path):
    n, k = 16384, 4095                   # 1024 panels of 16 x (1 + 4095) f32: 256 MiB
    lay = F32PackedRHS(16)
    size = lay.packed_size(n, k)
    assert size == 256 << 20
    rng = np.random.default_rng(13)
    data = rng.integers(1, 256, size=size, dtype=np.uint8)
    p = tmp_path / "big.tgpw"
    tilegen.PackedWeights(lay, n, k, data, False, "f32").save(p)
    want_probe = int(data[::4096].astype(np.int64).sum())
    del data
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(p)], capture_output=True, text=True,
                         env=env, cwd=ROOT, check=True).stdout.split()
    base, peak, probe, nbytes = (int(v) for v in out)
    assert (probe, nbytes) == (want_probe, size)
    grew = (peak - base) * 1024
    assert grew <= 1.1 * size, f"peak RSS grew by {grew / size:.2f}x the file size"


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_ggml_bytes_like_inputs(wrap):
    from tilegen.layout.ggml import quantize_q4_0
    rng = np.random.default_rng(31)
    n, k = 10, 64
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
    want = tilegen.PackedWeights.from_q4_0(raw, n, k)
    got = tilegen.PackedWeights.from_q4_0(wrap(raw.tobytes()), n, k)
    assert np.array_equal(got.data, want.data)
    for fmt in ("qsi4c32p", "qsi4c32pscalef16"):
        ref = tilegen.pack_rhs(fmt, nr=4, kr=8, sr=2, ggml=raw, n=n, k=k)
        assert np.array_equal(tilegen.pack_rhs(fmt, nr=4, kr=8, sr=2, ggml=wrap(raw.tobytes()),
                                               n=n, k=k), ref)


def test_truncated_gguf_is_a_load_error(tmp_path):
    import gguf  # the `test` extra (pyproject.toml) installs it
    from tilegen.gguf import load_tensor
    rng = np.random.default_rng(32)
    w = rng.normal(size=(24, 96)).astype(np.float32)
    path = tmp_path / "t.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_tensor("q4", gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0),
                  raw_dtype=gguf.GGMLQuantizationType.Q4_0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    assert load_tensor(path, "q4").n == 24
    blob = path.read_bytes()
    for cut in (20, 100, len(blob) // 2):       # the last 16 bytes are alignment padding
        path.write_bytes(blob[:-cut])
        with pytest.raises(LoadError, match="is truncated") as e:
            load_tensor(path, "q4")
        assert "reshape" not in str(e.value)


def test_load_tensor_nr_must_be_a_positive_int(tmp_path):
    """load_tensor(nr=0) used to pack with the default nr (``nr or 4``): nr < 1 and non-ints are
    an ArgumentError, as for pack_weights, with or without a library."""
    import gguf
    from tilegen.gguf import load_tensor
    from tilegen.runtime import ArgumentError
    rng = np.random.default_rng(34)
    w = rng.normal(size=(16, 64)).astype(np.float32)
    path = tmp_path / "t.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    Q = gguf.GGMLQuantizationType
    for name, q in (("q4", Q.Q4_0), ("q8", Q.Q8_0)):
        wr.add_tensor(name, gguf.quants.quantize(w, q), raw_dtype=q)
    wr.add_tensor("f32", w)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()

    class NoLib:        # a library whose pack_weights must not be reached
        def pack_weights(self, *a, **k):
            raise AssertionError("nr not checked before pack_weights")

    for name in ("q4", "q8", "f32"):
        assert load_tensor(path, name, nr=8).nr == 8
        for bad in (0, -4, True, 4.0, "4"):
            for lib in (None, NoLib()):
                with pytest.raises(ArgumentError, match=f"nr must be a positive int, got {bad!r}"):
                    load_tensor(path, name, lib=lib, nr=bad)


@pytest.mark.parametrize("kind", ["f32", "q4_0", "q4_0_dx"])
def test_get_rows_of_no_rows(kind):
    from tilegen.layout.rhs_int4 import QSI4C32P
    from tilegen.runtime.packed import dequantize_packed_rows
    rng = np.random.default_rng(33)
    n, k = 9, 64
    w = rng.normal(size=(n, k)).astype(np.float32)
    if kind == "f32":
        pw = _f32_weights(n, k)
    elif kind == "q4_0":
        from tilegen.layout.ggml import quantize_q4_0
        pw = tilegen.PackedWeights.from_q4_0(quantize_q4_0(w), n, k)
    else:
        lay = QSI4C32P(4, 8, 2)
        pw = tilegen.PackedWeights(lay, n, k, lay.pack_from_float(w), False, kind)
    for rows in ([], (), np.array([], np.int64)):
        got = dequantize_packed_rows(pw, rows)
        assert got.shape == (0, k) and got.dtype == np.float32
    assert dequantize_packed_rows(pw, [n - 1]).shape == (1, k)


_REPACK_GEOMETRIES = {
    "f32p": [(4, 1, 1), (16, 1, 1), (20, 1, 1)],
    "qsi4c32pscalef16": [(4, 16, 2), (4, 8, 2), (8, 4, 2), (16, 16, 2), (12, 2, 2)],
    "qsi4c32p": [(4, 8, 2), (4, 16, 2), (8, 8, 1), (12, 4, 2), (16, 16, 4)],
}


@pytest.mark.parametrize("fmt", sorted(_REPACK_GEOMETRIES))
def test_repack_between_layouts_of_a_format(fmt):
    """Repacking is lossless: the bytes equal packing the same weights for the target."""
    from tilegen.layout.api import layout_for, repack_rhs
    rng = np.random.default_rng(51)
    n, k = 13, 128
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32) if fmt != "qsi4c32pscalef16" else None
    lays = [layout_for(fmt, nr=nr, kr=kr, sr=sr, bl=32) for nr, kr, sr in _REPACK_GEOMETRIES[fmt]]
    packed = [tilegen.pack_rhs(fmt, w, nr=lay.nr, kr=lay.kr, sr=getattr(lay, "sr", 1), bias=bias)
              for lay in lays]
    for src, ps in zip(lays, packed):
        for dst, pd in zip(lays, packed):
            assert np.array_equal(repack_rhs(ps, src, dst, n, k), pd), (src, dst)


def test_repack_refuses_another_format():
    from tilegen.layout import LayoutError
    from tilegen.layout.api import layout_for, repack_rhs
    rng = np.random.default_rng(52)
    w = rng.normal(size=(8, 64)).astype(np.float32)
    src = layout_for("qsi4c32pscalef16", nr=4, kr=16, sr=2)
    ps = tilegen.pack_rhs("qsi4c32pscalef16", w, nr=4, kr=16, sr=2)
    for dst in (layout_for("qsi4c32p", nr=4, kr=16, sr=2), layout_for("f32p", nr=4),
                layout_for("qsi4c32pscalef16", nr=4, kr=16, sr=2, bl=64)):
        with pytest.raises(LayoutError, match="cannot repack"):
            repack_rhs(ps, src, dst, 8, 64)


def test_repack_bf16_layouts_between_widths_and_into_f32p():
    """bf16 RHS layouts (SME x2b at any width, NEON x4b) repack into each other and into f32p
    losslessly: the bytes of packing the bf16 values there; f32p does not go back to bf16."""
    from tilegen.layout import LayoutError
    from tilegen.layout.api import can_repack, repack_rhs
    from tilegen.layout.bf16 import BF16PRhs2B, BF16PRhs4B, bf16_to_f32, f32_to_bf16_rne
    rng = np.random.default_rng(53)
    n, k = 37, 21
    w = rng.normal(size=(n, k)).astype(np.float32)
    wb = bf16_to_f32(f32_to_bf16_rne(w))
    bias = rng.normal(size=n).astype(np.float32)
    bf16 = [BF16PRhs2B.for_vl(svl, 2) for svl in (16, 64, 256)] + [BF16PRhs4B(12), BF16PRhs4B(8)]
    f32 = [F32PackedRHS(16), F32PackedRHS(4)]
    for src in bf16:
        ps = src.pack(w, bias)
        for dst in bf16 + f32:
            assert can_repack(src, dst)
            assert np.array_equal(repack_rhs(ps, src, dst, n, k), dst.pack(wb, bias)), (src, dst)
    for src in f32:
        for dst in bf16:
            assert not can_repack(src, dst)
            with pytest.raises(LayoutError, match="cannot repack"):
                repack_rhs(src.pack(wb, bias), src, dst, n, k)


def test_layout_packers_refuse_weights_beyond_their_format_without_warnings():
    """The numpy packers (tilegen.pack_rhs) refuse float weights their format cannot hold,
    naming the limit and row, and raw ggml blocks with a NaN/Inf scale, naming the block;
    tiny weights quantise without numpy warnings."""
    import warnings
    from tilegen.layout import LayoutError
    from tilegen.layout.ggml import quantize_q4_0, quantize_q8_0
    from tilegen.layout.rhs_int8 import quantize_per_channel
    rng = np.random.default_rng(54)
    w = rng.normal(size=(6, 64)).astype(np.float32)
    geo = dict(nr=4, kr=8, sr=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for fmt, limit in (("qsi4c32p", "524032"), ("qsi4c32pscalef16", "524032"),
                           ("qsi8cxp", "8.31901e\\+06")):
            g = dict(nr=4, kr=8) if fmt == "qsi8cxp" else geo
            for val in (1e7, np.nan, np.inf):
                bad = w.copy()
                bad[4, 9] = val
                with pytest.raises(LayoutError, match=rf"\|w\| <= {limit} .*row 4 of"):
                    tilegen.pack_rhs(fmt, bad, **g)
            raw, bb = (quantize_q8_0(w), 34) if fmt == "qsi8cxp" else (quantize_q4_0(w), 18)
            raw[3, bb:bb + 2] = np.array([0x7E00], "<u2").view(np.uint8)      # row 3, block 1
            with pytest.raises(LayoutError, match=r"block 7 \(row 3, block 1 of the row\) has "
                                                  r"a non-finite f16 scale \(NaN"):
                tilegen.pack_rhs(fmt, ggml=raw, n=6, k=64, **g)
            tilegen.pack_rhs(fmt, w * np.float32(1e-39), **g)
        q, s = quantize_per_channel(w * np.float32(1e-39))
        assert np.abs(q.astype(np.float64) * s[:, None] - w * 1e-39).max() <= s.max()
