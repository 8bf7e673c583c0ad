"""The q5_K family's codec and layout (tilegen.families.q5_k): block_q5_K split / join /
dequantise equal to gguf.quants bit for bit (random valid blocks and random bytes), the q5kp
bytes against the design's rules written as plain loops (docs/layouts.md#q5kp: q4kp's record,
the quarter-ordered high-bit plane) and against the worked example, round trips and repacks.
The generic K-quant tests (tests/test_layout_kquant.py, test_kquant_weights.py,
test_exec_kquant_runtime.py) take q5_K from the registry too."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tilegen.families import q5_k
from tilegen.families.q4_k import Q4KP
from tilegen.families.q5_k import Q5KP
from tilegen.layout import LayoutError
from tilegen.layout.api import can_repack, layout_for, repack_rhs

GEOMS = [(4, 8), (4, 16), (8, 4), (3, 16), (1, 32), (12, 2)]


@pytest.mark.parametrize("n,k", [(1, 256), (5, 512), (13, 768)])
def test_dequantize_is_gguf_bit_for_bit(n, k):
    raw = q5_k.random_q5_k(n, k, n * k)
    ref = dequantize(raw, GGMLQuantizationType.Q5_K).astype(np.float32)
    assert ref.shape == (n, k) and np.abs(ref).max() > 0
    assert q5_k.dequantize_q5_k(raw, n, k).tobytes() == ref.tobytes()
    assert (q5_k.join_q5_k(*q5_k.split_q5_k(raw, n, k)) == raw).all()
    q = q5_k.split_q5_k(raw, n, k)[4]
    assert q.max() == 31 and (q >= 16).any() and (q < 16).any()
    for nr, kr in GEOMS:
        lay = Q5KP(nr, kr)
        p = lay.pack_from_ggml(raw, n, k)
        assert p.size == lay.packed_size(n, k) == -(-n // nr) * 180 * nr * (k // 256)
        rows = np.arange(n)[::-1]
        assert lay.dequantize_rows(p, n, k, rows).tobytes() == ref[rows].tobytes()


def test_random_bytes_blocks_also_dequantize_like_gguf():
    """Any bytes with finite f16 d and dmin are a valid block_q5_K."""
    rng = np.random.default_rng(4)
    n, k = 4, 512
    raw = rng.integers(0, 256, (n, k // 256 * 176), dtype=np.uint8)
    raw.reshape(n, -1, 176)[..., 1] &= 0x3B
    raw.reshape(n, -1, 176)[..., 3] &= 0x3B
    want = dequantize(raw, GGMLQuantizationType.Q5_K).astype(np.float32).tobytes()
    assert q5_k.dequantize_q5_k(raw, n, k).tobytes() == want
    for nr, kr in ((4, 16), (8, 8)):
        lay = Q5KP(nr, kr)
        assert lay.dequantize_rows(lay.pack_from_ggml(raw, n, k), n, k, range(n)).tobytes() == want


def _loop_pack(nr, kr, raw, n, k):
    """q5kp bytes by the design's rules, one value at a time (docs/layouts.md#q5kp)."""
    d, dmin, sc, m, q = q5_k.split_q5_k(raw, n, k)
    S, L = k // 256, kr // 2
    G = -(-n // nr)
    out = np.zeros((G, S, 180 * nr), np.uint8)
    for c in range(n):
        g, cc = divmod(c, nr)
        for s in range(S):
            r = out[g, s]
            r[2 * cc:2 * cc + 2] = np.array([d[c, s]], "<u2").view(np.uint8)
            r[2 * nr + 2 * cc:2 * nr + 2 * cc + 2] = np.array([dmin[c, s]], "<u2").view(np.uint8)
            for j in range(8):
                r[4 * nr + j * nr + cc] = sc[c, s, j]
                r[12 * nr + 8 * cc + j] = m[c, s, j]
            for t in range(256):
                v = int(q[c, 256 * s + t])
                j, u = divmod(t, 32)
                i, b = divmod(u, kr)
                o = 16 * nr * j + i * nr * kr // 2 + cc * L + b % L      # from the nibbles' start
                half = b // L
                r[52 * nr + o] |= (v & 15) << (4 * half)
                quarter, qo = divmod(o, 32 * nr)
                r[20 * nr + qo] |= (v >> 4) << (2 * quarter + half)
    return out.reshape(-1)


@pytest.mark.parametrize("nr,kr", GEOMS)
def test_bytes_follow_the_design_rules(nr, kr):
    n, k = 2 * nr + 1, 512
    raw = q5_k.random_q5_k(n, k, nr * 100 + kr)
    lay = Q5KP(nr, kr)
    p = lay.pack_from_ggml(raw, n, k)
    assert p.tobytes() == _loop_pack(nr, kr, raw, n, k).tobytes()
    assert (lay.qh_offset, lay.nibbles_offset, lay.sb_record_bytes) == (20 * nr, 52 * nr, 180 * nr)
    # q4kp's record without the plane: the low 4 bits as q4kp packs them
    low = Q4KP(nr, kr).pack_split(*q5_k.split_q5_k(raw, n, k)[:4], q5_k.split_q5_k(raw, n, k)[4] & 15)
    rec = p.reshape(-1, lay.sb_record_bytes)
    assert np.concatenate([rec[:, :lay.qh_offset], rec[:, lay.nibbles_offset:]], axis=1).tobytes() \
        == low.tobytes()
    for c, t in ((0, 0), (nr - 1, 37), (nr // 2, 200), (0, 255)):
        off, half = lay.nibble_offset(c, t)
        byte, bit = lay.high_bit(c, t)
        qv = int(q5_k.split_q5_k(raw, n, k)[4][c, t])
        assert (rec[0, off] >> (4 * half)) & 15 == qv & 15
        assert (rec[0, byte] >> bit) & 1 == qv >> 4


def test_worked_example():
    """docs/layouts.md#q5kp: nr = 4, five columns, q[c][t] = (t + 3c) mod 32."""
    n, k = 5, 256
    q = np.array([[(t + 3 * c) % 32 for t in range(256)] for c in range(n)], np.uint8)
    d = np.array([[0x1400 + c] for c in range(n)], np.uint16)
    dm = np.array([[0x1000 + c] for c in range(n)], np.uint16)
    sc = np.tile(np.arange(1, 9), (n, 1, 1))
    mm = np.tile(np.arange(40, 48), (n, 1, 1))
    raw = q5_k.join_q5_k(d, dm, sc, mm, q)
    p = Q5KP(4, 8).pack_from_ggml(raw, n, k)
    h = lambda o, nb: bytes(p[o:o + nb]).hex(" ")  # noqa: E731
    assert h(80, 16) == "00 " * 15 + "aa"
    assert h(96, 16) == "00 00 00 00 00 aa aa aa aa aa ff ff ff ff ff ff"
    assert h(208, 8) == "40 51 62 73 73 84 95 a6"
    assert Q5KP(4, 8).nibble_offset(1, 200) == (612, 0) and Q5KP(4, 8).high_bit(1, 200) == (100, 6)
    p16 = Q5KP(4, 16).pack_from_ggml(raw, n, k)
    assert bytes(p16[208:224]).hex(" ") == "80 91 a2 b3 c4 d5 e6 f7 b3 c4 d5 e6 f7 08 19 2a"
    assert Q5KP(4, 16).nibble_offset(1, 200) == (600, 1) and Q5KP(4, 16).high_bit(1, 200) == (88, 7)
    assert p.size == 2 * 720


def test_unpack_round_trip_and_repacks():
    n, k = 11, 768
    raw = q5_k.random_q5_k(n, k, 42)
    src = Q5KP(4, 16)
    p = src.pack_from_ggml(raw.reshape(-1), n, k)
    assert (q5_k.join_q5_k(*src.unpack(p, n, k)) == raw).all()
    assert (q5_k.join_q5_k(*src.unpack(p, n, k, rows=[10, 0])) == raw[[10, 0]]).all()
    for nr, kr in ((8, 8), (3, 4), (4, 16)):
        dst = Q5KP(nr, kr)
        assert can_repack(src, dst)
        assert repack_rhs(p, src, dst, n, k).tobytes() == dst.pack_from_ggml(raw, n, k).tobytes()
    assert not can_repack(Q5KP(4, 16), Q4KP(4, 16))
    assert layout_for("q5kp", nr=4, kr=16) == src and src.name == "q5kp4x8"


def test_refusals():
    lay = Q5KP(4, 16)
    with pytest.raises(LayoutError, match="only as ggml q5_K blocks"):
        lay.pack_from_float(np.ones((4, 256), np.float32))
    with pytest.raises(LayoutError, match="no bias"):
        lay.pack_from_ggml(q5_k.random_q5_k(2, 256, 1), 2, 256, bias=np.zeros(2, np.float32))
    with pytest.raises(LayoutError, match="kr even"):
        Q5KP(4, 6)


def _q5kps_by_loops(raw, n: int, k: int, nr: int) -> np.ndarray:
    """q5kps<nr>x2 written from docs/layouts.md#q5kps as plain loops: q5kp's header, then per
    sub-block the fifth bits and the low nibbles of slot P = 8*nr*g + 2*nr*v + 2c + e (value
    k = 32j + 8g + 2v + e of column c)."""
    d, dmin, sc, m, q = q5_k.split_q5_k(raw, n, k)
    low = Q4KP(nr, 4)
    head = low.pack_split(d, dmin, sc, m, q & 15)
    G, S, rec = -(-n // nr), k // 256, 180 * nr
    out = np.zeros(G * S * rec, np.uint8)
    for gi in range(G):
        for s in range(S):
            base = (gi * S + s) * rec
            lbase = (gi * S + s) * low.sb_record_bytes
            out[base:base + 20 * nr] = head[lbase:lbase + 20 * nr]
            for c in range(nr):
                col = gi * nr + c
                if col >= n:
                    continue
                for t in range(256):
                    j, g, v, e = t // 32, t % 32 // 8, t % 8 // 2, t % 2
                    P = 8 * nr * g + 2 * nr * v + 2 * c + e
                    val = int(q[col, 256 * s + t])
                    out[base + 52 * nr + 16 * nr * j + P // 2] |= (val & 15) << (4 * (P % 2))
                    out[base + 20 * nr + 4 * nr * j + P // 8] |= (val >> 4) << (P % 8)
    return out


@pytest.mark.parametrize("nr", [4, 8, 16, 64])
def test_q5kps_is_the_documented_order_and_round_trips(nr):
    """q5kps (the SME2 4vl x 1vl gemm's variant): its bytes are the documented order's, the
    same size as q5kp's, its offsets (nibble_offset / high_bit) point at each value, it
    unpacks and dequantises to the blocks (any rows), and it refuses kr != 4."""
    n, k = 2 * nr + 3, 512
    raw = q5_k.random_q5_k(n, k, nr)
    lay = q5_k.Q5KPS(nr, 4)
    p = lay.pack_from_ggml(raw, n, k)
    assert p.size == lay.packed_size(n, k) == Q5KP(nr, 4).packed_size(n, k)
    assert (p == _q5kps_by_loops(raw, n, k, nr)).all()
    q = q5_k.split_q5_k(raw, n, k)[4]
    for c in (0, 1, nr - 1):
        for t in (0, 1, 2, 9, 10, 37, 100, 255):
            (off, half), (bo, bit) = lay.nibble_offset(c, t), lay.high_bit(c, t)
            rec = lay.sb_record_bytes
            got = ((p[rec + off] >> (4 * half)) & 15) | (((p[rec + bo] >> bit) & 1) << 4)
            assert got == q[c, 256 + t]
    for a, b in zip(lay.unpack(p, n, k), q5_k.split_q5_k(raw, n, k)):
        assert np.array_equal(a, b)
    rows = [n - 1, 0, nr]
    ref = dequantize(raw, GGMLQuantizationType.Q5_K).astype(np.float32)
    assert lay.dequantize_rows(p, n, k, rows).tobytes() == ref[rows].tobytes()
    with pytest.raises(LayoutError, match="kr = 4"):
        q5_k.Q5KPS(nr, 8)
