"""The K-quant layouts (q8kp in tilegen.layout.kquant; q4kp, q6kp in the family plugins
tilegen.families.q4_k / q6_k) and ggml's Q4_K / Q6_K blocks (the plugins' codecs): bytes against the design's byte rules (docs/layouts.md#q8kp, #q4kp,
#q6kp, written here as plain loops) and against worked examples, round trips, dequantisation
equal to gguf.quants.dequantize bit for bit, and the refusals."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from tilegen.reference import kquant as RK
from tilegen.layout import LayoutError
from tilegen.layout.api import can_repack, layout_for, pack_lhs, pack_rhs, repack_rhs
from tilegen.layout.kquant import KQuantRhs, Q8KP, Q8KPI16
from tilegen.families import LAYOUTS, q4_k, q6_k, rhs_layout_class
from tilegen.families.q4_k import Q4KP
from tilegen.families.q6_k import Q6KP
from tilegen.reference.f32 import fma_f32

from q8kp_edges import KINDS as EDGE_KINDS, check_q8kp, edge_rows, expected_q8kp

KS = (256, 512, 768)
# kind -> its RHS layout class (the references' hooks): every K-quant family of the registry
# one per kind: the family record's RHS (q5_K's SME2 variant q5kps packs the same values)
RHS = {c.ggml_only: c for c in LAYOUTS if issubclass(c, KQuantRhs) and c is rhs_layout_class(c.ggml_only)}
GEOMS = [(4, 8), (4, 16), (8, 4), (3, 16), (1, 32), (12, 2)]


# ----------------------------------------------------------------------------------------
# the design's byte rules as loops (independent of the vectorised packers)
# ----------------------------------------------------------------------------------------
def loop_pack_q4kp(raw, n, k, nr, kr):
    d, dmin, sc, m, q = q4_k.split_q4_k(raw, n, k)
    L, S, G = kr // 2, k // 256, -(-n // nr)
    rec = 148 * nr
    out = bytearray(G * S * rec)
    for c_all in range(n):
        g, c = divmod(c_all, nr)
        for s in range(S):
            base = (g * S + s) * rec
            out[base + 2 * c:base + 2 * c + 2] = int(d[c_all, s]).to_bytes(2, "little")
            out[base + 2 * nr + 2 * c:base + 2 * nr + 2 * c + 2] = int(dmin[c_all, s]).to_bytes(2, "little")
            for j in range(8):
                out[base + 4 * nr + j * nr + c] = sc[c_all, s, j]
                out[base + 12 * nr + 8 * c + j] = m[c_all, s, j]
                for i in range(32 // kr):
                    for b in range(L):
                        t = 256 * s + 32 * j + kr * i + b
                        out[base + 20 * nr + 16 * nr * j + i * nr * kr // 2 + c * L + b] = \
                            q[c_all, t] | (q[c_all, t + L] << 4)
    return np.frombuffer(bytes(out), np.uint8)


def loop_pack_q6kp(raw, n, k, nr, kr):
    d, sc, q = q6_k.split_q6_k(raw, n, k)
    L, S, G = kr // 2, k // 256, -(-n // nr)
    rec = 210 * nr
    out = bytearray(G * S * rec)
    for c_all in range(n):
        g, c = divmod(c_all, nr)
        for s in range(S):
            base = (g * S + s) * rec
            out[base + 2 * c:base + 2 * c + 2] = int(d[c_all, s]).to_bytes(2, "little")
            for j in range(16):
                out[base + 2 * nr + j * nr + c] = int(sc[c_all, s, j]) & 0xFF
            low = {}
            for i in range(256 // kr):
                for b in range(L):
                    t = 256 * s + kr * i + b
                    p = i * nr * kr // 2 + c * L + b
                    out[base + 18 * nr + p] = (q[c_all, t] & 15) | ((q[c_all, t + L] & 15) << 4)
                    low[p] = ((q[c_all, t] >> 4) ^ 2, (q[c_all, t + L] >> 4) ^ 2)
            for p in low:
                if p < 64 * nr:
                    hv = low[p][0] | low[p][1] << 2 | low[p + 64 * nr][0] << 4 | low[p + 64 * nr][1] << 6
                    out[base + 146 * nr + p] = hv
    return np.frombuffer(bytes(out), np.uint8)


@pytest.mark.parametrize("nr,kr", GEOMS)
def test_q4kp_bytes_follow_the_byte_rules(nr, kr):
    n, k = 2 * nr + 1, 512
    raw = q4_k.random_q4_k(n, k, seed=nr * 100 + kr)
    lay = Q4KP(nr, kr)
    assert lay.pack_from_ggml(raw, n, k).tobytes() == loop_pack_q4kp(raw, n, k, nr, kr).tobytes()


@pytest.mark.parametrize("nr,kr", GEOMS)
def test_q6kp_bytes_follow_the_byte_rules(nr, kr):
    n, k = 2 * nr + 1, 512
    raw = q6_k.random_q6_k(n, k, seed=nr * 100 + kr)
    lay = Q6KP(nr, kr)
    assert lay.pack_from_ggml(raw, n, k).tobytes() == loop_pack_q6kp(raw, n, k, nr, kr).tobytes()


# ----------------------------------------------------------------------------------------
# worked examples (docs/layouts.md): specific bytes
# ----------------------------------------------------------------------------------------
def _q4k_example(n=5):
    """Column c: q[c][t] = (t + 3c) % 16, d = f16 bits 0x1400 + c, dmin = 0x1000 + c,
    sc[j] = j + 1, m[j] = 40 + j (6-bit values > 15 exercise the packed high bits)."""
    t = np.arange(256)
    q = np.stack([(t + 3 * c) % 16 for c in range(n)]).astype(np.uint8)
    d = (0x1400 + np.arange(n)).reshape(n, 1)
    dmin = (0x1000 + np.arange(n)).reshape(n, 1)
    sc = np.tile(np.arange(1, 9), (n, 1, 1))
    m = np.tile(40 + np.arange(8), (n, 1, 1))
    return q4_k.join_q4_k(d, dmin, sc, m, q), (d, dmin, sc, m, q)


def test_q4_k_block_bytes_worked_example():
    raw, _ = _q4k_example(1)
    blk = raw.reshape(-1)
    assert blk.size == 144
    assert blk[:4].tolist() == [0x00, 0x14, 0x00, 0x10]
    # scales/mins 6-bit packing: s[0..3] = sc_j | (sc_{j+4} >> 4) << 6 (sc <= 8: no high bits),
    # s[4..7] = m_j | (m_{j+4} >> 4) << 6 (m_{j+4} = 44..47: high bits 2), s[8..11] low nibbles
    assert blk[4:16].tolist() == [1, 2, 3, 4, 40 | 128, 41 | 128, 42 | 128, 43 | 128,
                                  5 | 12 << 4, 6 | 13 << 4, 7 | 14 << 4, 8 | 15 << 4]
    # nibble byte 32g + t: weight 64g + t (low), 64g + 32 + t (high); q = t % 16 for column 0
    assert blk[16:20].tolist() == [0x00, 0x11, 0x22, 0x33]


def test_q4kp_worked_example_nr4_kr8_and_kr16():
    raw, _ = _q4k_example(5)
    p8 = Q4KP(4, 8).pack_from_ggml(raw, 5, 256)
    assert p8.size == 2 * 148 * 4
    assert p8[0:8].tolist() == [0x00, 0x14, 0x01, 0x14, 0x02, 0x14, 0x03, 0x14]     # d
    assert p8[8:16].tolist() == [0x00, 0x10, 0x01, 0x10, 0x02, 0x10, 0x03, 0x10]    # dmin
    assert p8[16:24].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]                           # sc [j][c]
    assert p8[48:64].tolist() == list(range(40, 48)) * 2                            # mins [c][j]
    # nibbles at 20*nr = 80: chunk 0 of sub-block 0, columns 0 and 1, L = 4:
    # column 0: q = b | q(b + 4) << 4; column 1: q = (t + 3) % 16
    assert p8[80:88].tolist() == [0x40, 0x51, 0x62, 0x73, 0x73, 0x84, 0x95, 0xA6]
    # second chunk (k 8..15) starts nr*kr/2 = 16 bytes later
    assert p8[96:100].tolist() == [0xC8, 0xD9, 0xEA, 0xFB]
    # sub-block 1 (k 32..63) at 80 + 16*nr = 144
    assert p8[144:148].tolist() == [0x40, 0x51, 0x62, 0x73]
    # column 4 is alone in group 1; its padding columns 5..7 are zero
    g1 = p8[148 * 4:]
    assert g1[0:8].tolist() == [0x04, 0x14, 0, 0, 0, 0, 0, 0]
    assert not g1[80 + 4:80 + 16].any()
    p16 = Q4KP(4, 16).pack_from_ggml(raw, 5, 256)
    # L = 8: column 0 bytes b | (b + 8) << 4, column 1 ((t+3)%16) | ((t+11)%16) << 4
    assert p16[80:96].tolist() == [0x80, 0x91, 0xA2, 0xB3, 0xC4, 0xD5, 0xE6, 0xF7,
                                   0xB3, 0xC4, 0xD5, 0xE6, 0xF7, 0x08, 0x19, 0x2A]
    assert p16[:80].tobytes() == p8[:80].tobytes()        # scales do not depend on kr


def test_q6kp_worked_example_nr4_kr8():
    n, t = 5, np.arange(256)
    q = np.stack([(5 * t + c) % 64 for c in range(n)]).astype(np.uint8)
    sc = np.tile(np.arange(16) - 8, (n, 1, 1))
    d = (0x1800 + np.arange(n)).reshape(n, 1)
    raw = q6_k.join_q6_k(d, sc, q)
    assert raw.shape == (n, 210)
    assert raw[0, 208:210].tolist() == [0x00, 0x18]          # d last in ggml's block
    assert raw[0, 192:194].tolist() == [0xF8, 0xF9]          # scales -8, -7
    p = Q6KP(4, 8).pack_from_ggml(raw, n, 256)
    assert p.size == 2 * 210 * 4
    assert p[0:4].tolist() == [0x00, 0x18, 0x01, 0x18]
    assert p[8:16].tolist() == [0xF8] * 4 + [0xF9] * 4        # scales [j][c]
    # low plane at 18*nr = 72: column 0, chunk 0: ql(5b) | ql(5(b+4)) << 4
    assert p[72:76].tolist() == [0x40, 0x95, 0xEA, 0x3F]
    # high plane at 146*nr = 584, byte 0: h' of q[0][0] = 0 (2), q[0][4] = 20 (3),
    # q[0][128] = 0 (2), q[0][132] = 20 (3): 2 | 3 << 2 | 2 << 4 | 3 << 6
    assert p[584] == 0xEE
    # padding columns of group 1 are zero, high bits included (h' = 0 reads as q>>4 = 2, v = 0)
    g1 = p[210 * 4:]
    assert not g1[2:8].any() and not g1[584 + 4:584 + 16].any() and g1[584] == 0xEE


def test_q8kp_worked_example_mr4_kr8():
    t = np.arange(256)
    x = np.stack([(((7 * t + r) % 255) - 127) * 0.5 for r in range(3)]).astype(np.float32)
    lay = Q8KP(4, 8)
    p = lay.pack(x)
    assert p.size == 276 * 4
    # amax = 63.5, d = 0.5, inv = 2: q = 2x exactly
    assert p[0:4].view(np.int8).tolist() == [-127, -120, -113, -106]     # row 0, k 0..3
    assert p[4:8].view(np.int8).tolist() == [-126, -119, -112, -105]     # row 1
    assert p[16:20].view(np.int8).tolist() == [-99, -92, -85, -78]       # chunk 1 (k 4..7)
    assert p[1024:1028].tolist() == [0x00, 0x00, 0x00, 0x3F]             # d[0] = 0.5
    assert not p[1036:1040].any()                                        # row 3: padding
    # sub-block 0 of row 0: sum(7t - 127, t < 32) = -592 = 128 * -5 + 48
    assert p[1040:1041].view(np.int8)[0] == -5 and p[1072] == 48
    assert lay.element_offset(1, 5) == 16 + 4 + 1
    assert lay.d_offset == 1024 and lay.bsum_hi_offset == 1040 and lay.bsum_lo_offset == 1072


def test_q8ki16p_worked_example_mr4_kr4():
    """docs/layouts.md#q8ki16p: q8kp's values in the same order as int16, then q8kp's d and
    bsum bytes (the record 532*mr bytes)."""
    t = np.arange(256)
    x = np.stack([(((7 * t + r) % 255) - 127) * 0.5 for r in range(3)]).astype(np.float32)
    lay = Q8KPI16(4, 4)
    p = lay.pack(x)
    assert lay.label == "q8ki16p4x2" and p.size == 532 * 4
    assert p[0:8].view("<i2").tolist() == [-127, -120, -126, -119]       # rows 0, 1: k 0, 1
    assert p[16:20].view("<i2").tolist() == [-113, -106]                 # chunk 1, row 0: k 2, 3
    assert lay.element_offset(1, 3) == 16 + 4 + 2
    assert lay.d_offset == 2048 and lay.bsum_hi_offset == 2064 and lay.bsum_lo_offset == 2096
    assert p[2048:2052].tolist() == [0x00, 0x00, 0x00, 0x3F]             # d[0] = 0.5
    assert p[2064:2065].view(np.int8)[0] == -5 and p[2096] == 48         # bsum of row 0, sub 0


@pytest.mark.parametrize("mr,start", [(4, 0), (4, 3), (16, 5), (64, 1)])
def test_q8ki16p_is_q8kp_widened(mr, start):
    """Every value of q8ki16p is q8kp's int8 value at the same element, sign-extended, at twice
    the offset within the values; d and the bsums are q8kp's bytes; unpack reads them back,
    from a region packed at m_idx_start too."""
    rng = np.random.default_rng(mr + start)
    m, k = 2 * mr + 3, 512
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 8, (m, 1))).astype(np.float32)
    x[1, :256] = 0                                      # a flushed super-block
    w, n = Q8KPI16(mr, 4), Q8KP(mr, 4)
    pw, pn = w.pack(x), n.pack(x)
    assert pw.size == w.packed_size(m, k) and w.row_block_stride(k) == 2 * 532 * mr
    for b in range(pw.size // w.row_block_stride(k)):
        for s in range(2):
            rw = pw.reshape(-1, 2, w.sb_record_bytes)[b, s]
            rn = pn.reshape(-1, 2, n.sb_record_bytes)[b, s]
            assert (rw[:w.d_offset].view("<i2") == rn[:n.d_offset].view(np.int8)).all()
            assert (rw[w.d_offset:] == rn[n.d_offset:]).all()
    for r, t in ((0, 0), (1, 5), (mr - 1, 255), (2, 300)):
        assert w.element_offset(r, t) == (n.element_offset(r, t) % n.sb_record_bytes) * 2 + \
            (t // 256) * w.sb_record_bytes
    got, want = w.unpack(pw, m, k), n.unpack(pn, m, k)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and (a == b).all()
    region = w.pack(x[start:], start)
    assert region.size == w.region_size(m - start, k, start)
    for a, b in zip(w.unpack(region, m - start, k, start), n.unpack(pn, m, k)):
        assert (a == b[start:]).all()


# ----------------------------------------------------------------------------------------
# dequantisation, round trips, repacking
# ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("n", [1, 5, 13])
def test_ggml_dequantize_is_gguf_bit_for_bit(n, k):
    r4, r6 = q4_k.random_q4_k(n, k, n + k), q6_k.random_q6_k(n, k, n * k)
    ref4 = dequantize(r4, GGMLQuantizationType.Q4_K).astype(np.float32)
    ref6 = dequantize(r6, GGMLQuantizationType.Q6_K).astype(np.float32)
    assert ref4.shape == ref6.shape == (n, k)
    assert q4_k.dequantize_q4_k(r4, n, k).tobytes() == ref4.tobytes()
    assert q6_k.dequantize_q6_k(r6, n, k).tobytes() == ref6.tobytes()
    assert (q4_k.join_q4_k(*q4_k.split_q4_k(r4, n, k)) == r4).all()
    assert (q6_k.join_q6_k(*q6_k.split_q6_k(r6, n, k)) == r6).all()
    for nr, kr in GEOMS[:3]:
        for lay, raw, ref in ((Q4KP(nr, kr), r4, ref4), (Q6KP(nr, kr), r6, ref6)):
            p = lay.pack_from_ggml(raw, n, k)
            assert p.size == lay.packed_size(n, k) == -(-n // nr) * lay.group_stride(k)
            rows = np.arange(n)[::-1]
            assert lay.dequantize_rows(p, n, k, rows).tobytes() == ref[rows].tobytes()


def test_random_bytes_blocks_also_dequantize_like_gguf():
    """Any bytes with finite f16 fields are a valid block (every 6-bit field and nibble)."""
    rng = np.random.default_rng(3)
    n, k = 4, 512
    r4 = rng.integers(0, 256, (n, k // 256 * 144), dtype=np.uint8)
    r4.reshape(n, -1, 144)[..., 1] &= 0x3B          # d, dmin exponents below 31: finite
    r4.reshape(n, -1, 144)[..., 3] &= 0x3B
    r6 = rng.integers(0, 256, (n, k // 256 * 210), dtype=np.uint8)
    r6.reshape(n, -1, 210)[..., 209] &= 0x3B
    for lay, raw, t in ((Q4KP(4, 16), r4, GGMLQuantizationType.Q4_K),
                        (Q6KP(4, 8), r6, GGMLQuantizationType.Q6_K)):
        p = lay.pack_from_ggml(raw, n, k)
        assert lay.dequantize_rows(p, n, k, range(n)).tobytes() == dequantize(raw, t).tobytes()


@pytest.mark.parametrize("cls,rand,join", [(Q4KP, q4_k.random_q4_k, q4_k.join_q4_k),
                                           (Q6KP, q6_k.random_q6_k, q6_k.join_q6_k)])
def test_rhs_unpack_gives_ggml_fields_and_repacks(cls, rand, join):
    n, k = 11, 768
    raw = rand(n, k, 42)
    src = cls(4, 16)
    p = src.pack_from_ggml(raw.reshape(-1), n, k)          # flat bytes are taken too
    assert (join(*src.unpack(p, n, k)) == raw).all()
    assert (join(*src.unpack(p, n, k, rows=[10, 0])) == raw[[10, 0]]).all()
    for nr, kr in ((8, 8), (3, 4), (4, 16)):
        dst = cls(nr, kr)
        assert can_repack(src, dst)
        assert repack_rhs(p, src, dst, n, k).tobytes() == dst.pack_from_ggml(raw, n, k).tobytes()
    assert not can_repack(Q4KP(4, 16), Q6KP(4, 16))


def test_api_dispatch_and_names():
    raw = q4_k.random_q4_k(6, 256, 1)
    lay = layout_for("q4kp", nr=4, kr=16, sr=2)
    assert lay == Q4KP(4, 16) and lay.name == "q4kp4x8" and lay.sr == 2 and lay.L == 8
    assert layout_for("q4kp4x8", kr=16) == lay
    assert layout_for("q8kp8x4", kr=8) == Q8KP(8, 8)
    assert pack_rhs("q4kp", ggml=raw, n=6, k=256, nr=4, kr=16).tobytes() == \
        lay.pack_from_ggml(raw, 6, 256).tobytes()
    x = np.random.default_rng(2).standard_normal((3, 256)).astype(np.float32)
    assert pack_lhs("q8kp", x, mr=4, kr=8, sr=2, m_idx_start=1).tobytes() == \
        Q8KP(4, 8).pack(x, 1).tobytes()
    assert Q6KP(4, 8).stride_expr == "840 * (k // 256)"
    assert Q8KP(4, 8).row_block_stride(512) == 2 * 276 * 4


def test_offset_methods_agree_with_the_packed_bytes():
    n, k = 9, 512
    raw4, raw6 = q4_k.random_q4_k(n, k, 5), q6_k.random_q6_k(n, k, 6)
    for nr, kr in GEOMS:
        l4, l6 = Q4KP(nr, kr), Q6KP(nr, kr)
        assert l4.sb_record_bytes == 148 * nr and l6.sb_record_bytes == 210 * nr
        d, dmin, sc, m, q = q4_k.split_q4_k(raw4, n, k)
        p4 = l4.pack_from_ggml(raw4, n, k)
        _, s6, q6 = q6_k.split_q6_k(raw6, n, k)
        p6 = l6.pack_from_ggml(raw6, n, k)
        for c in range(min(n, nr)):
            assert p4[l4.scale_offset(5, c)] == sc[c, 0, 5] and p4[l4.min_offset(c, 6)] == m[c, 0, 6]
            assert p6[l6.scale_offset(13, c)].view(np.int8) == s6[c, 0, 13]
            for t in (0, 1, kr // 2, kr - 1, kr, 37, 128, 131, 255):
                off, hi = l4.nibble_offset(c, t)
                assert (p4[off] >> (4 * hi)) & 15 == q[c, t]
                pb, h6 = l6.low_offset(c, t)
                assert (p6[l6.low_plane_offset + pb] >> (4 * h6)) & 15 == q6[c, t] & 15
                hb, bit = l6.high_field(c, t)
                assert ((p6[l6.high_plane_offset + hb] >> bit) & 3) ^ 2 == q6[c, t] >> 4


# ----------------------------------------------------------------------------------------
# Q8KP quantisation and m_idx_start
# ----------------------------------------------------------------------------------------
def test_q8kp_quantisation_properties():
    rng = np.random.default_rng(7)
    m, k = 7, 768
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 100, (m, 1))).astype(np.float32)
    x[2, 256:512] = 0.0                                    # an all-zero super-block
    lay = Q8KP(4, 16)
    q, d, hi, lo = lay.unpack(lay.pack(x), m, k)
    assert q.shape == (m, k) and d.shape == (m, 3) and hi.shape == lo.shape == (m, 3, 8)
    assert np.abs(q.astype(int)).max() <= 127
    assert d[2, 1] == 0 and not q[2, 256:512].any()
    xb = x.reshape(m, 3, 256)
    amax = np.abs(xb).max(axis=2)
    nz = amax > 0
    inv = (np.float32(127) / amax[nz]).astype(np.float32)
    assert (d[nz] == (np.float32(1) / inv).astype(np.float32)).all()      # ggml's |1/iscale|
    # every row/SB reaches +-127 at its largest |x|, and q*d is within half a step (plus f32)
    assert (np.abs(q.reshape(m, 3, 256)).max(axis=2)[nz] == 127).all()
    err = np.abs(q.reshape(m, 3, 256) * d[..., None].astype(np.float64) - xb)
    assert (err <= 0.5 * d[..., None] * (1 + 1e-5) + 1e-30).all()
    assert ((lo >= 0) & (lo <= 127)).all()
    bs = q.astype(np.int32).reshape(m, 3, 8, 32).sum(axis=3)
    assert (hi.astype(np.int32) * 128 + lo == bs).all()


def test_q8kp_rounds_ties_to_even():
    """As ggml's Q8_K (nearest_int): ties to even (it was ties away: 3, -3, 1, -1 below)."""
    x = np.zeros((1, 256), np.float32)
    x[0, :6] = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5]
    x[0, 6:] = 0.25
    q, d, _, _ = Q8KP(1, 8).unpack(Q8KP(1, 8).pack(x), 1, 256)
    assert d[0, 0] == 1.0
    assert q[0, :7].tolist() == [127, 2, -2, 0, 0, 2, 0]


@pytest.mark.parametrize("mr,kr", [(1, 8), (4, 16), (3, 2)])
def test_q8kp_is_ggml_q8_k_at_the_edges(mr, kr):
    """Issue #30 items 2 and 9: per super-block, Q8KP holds ggml's Q8_K values (in its sign
    convention, d >= 0) for 1e-38, subnormal and zero blocks (flushed: d = 0, every q = 0; they
    were +-127), both sides of the flush threshold 127/amax = +inf, 1e-36 (d subnormal), exact
    ties (to even) and ordinary control blocks; quantize_rows and pack/unpack alike."""
    rng = np.random.default_rng(3000 + 10 * mr + kr)
    for first in range(0, len(EDGE_KINDS), 3):
        x = edge_rows(rng, 5, 256 * len(EDGE_KINDS), first)
        want = expected_q8kp(x)
        q, d, bsum = Q8KP.quantize_rows(x)
        check_q8kp((q, d, *Q8KP.split_bsum(bsum)), want, f"quantize_rows first={first}")
        lay = Q8KP(mr, kr)
        check_q8kp(lay.unpack(lay.pack(x, 1), 5, x.shape[1], 1), want, f"pack first={first}")
    # the flushed blocks really are zero bytes, d included
    x = edge_rows(rng, 1, 256 * len(EDGE_KINDS))
    q, d, bsum = Q8KP.quantize_rows(x)
    for s, kind in enumerate(EDGE_KINDS):
        flushed = kind in ("1e-38", "denormal", "zero", "flushed_edge")
        assert (d[0, s] == 0) == flushed and (not q[0, 256 * s:256 * s + 256].any()) == flushed, kind
        assert d[0, s].view(np.uint32) != 0x80000000, kind


@pytest.mark.parametrize("start", [0, 1, 3, 4, 6])
def test_q8kp_m_idx_start_region(start):
    rng = np.random.default_rng(start)
    mr, kr, m, k = 4, 8, 6, 512
    full = rng.standard_normal((start + m, k)).astype(np.float32)
    lay = Q8KP(mr, kr)
    region = lay.pack(full[start:], start)
    assert region.size == lay.region_size(m, k, start)
    whole = lay.pack(full)
    off = lay.packed_offset(start, k)
    S = lay.row_block_stride(k)
    blocks = region.reshape(-1, S)
    want = whole[off:off + region.size].reshape(-1, S)
    # slots of packed rows equal the whole-matrix packing; slots outside are zero
    for b in range(blocks.shape[0]):
        for slot in range(mr):
            g = (start // mr + b) * mr + slot
            sel = [lay.element_offset(slot, t) for t in range(0, k, 37)]
            if start <= g < start + m:
                assert (blocks[b, sel] == want[b, sel]).all()
            else:
                assert not blocks[b, sel].any()
    q, d, hi, lo = lay.unpack(region, m, k, start)
    q0, d0, hi0, lo0 = lay.unpack(whole, start + m, k)
    assert (q == q0[start:]).all() and (d == d0[start:]).all() and (lo == lo0[start:]).all()


# ----------------------------------------------------------------------------------------
# refusals
# ----------------------------------------------------------------------------------------
def test_refusals():
    raw = q4_k.random_q4_k(2, 512, 0)
    with pytest.raises(LayoutError, match="k must be a multiple of 256"):
        Q4KP(4, 8).pack_from_ggml(raw, 2, 300)
    with pytest.raises(LayoutError, match="k must be a multiple of 256"):
        Q8KP(4, 8).pack(np.ones((2, 300), np.float32))
    with pytest.raises(LayoutError, match="k must be a multiple of 256"):
        Q6KP(4, 8).group_stride(300)
    with pytest.raises(LayoutError, match="truncated"):
        Q4KP(4, 8).pack_from_ggml(raw.reshape(-1)[:-1], 2, 512)
    with pytest.raises(LayoutError, match="truncated"):
        Q6KP(4, 8).pack_from_ggml(q6_k.random_q6_k(2, 256, 0).reshape(-1)[:-10], 2, 256)
    bad = raw.copy()
    bad.reshape(2, 2, 144)[1, 1, 0:2] = [0x01, 0x7E]       # d of row 1, block 1: NaN
    with pytest.raises(LayoutError, match=r"Q4_K block 3 \(row 1, block 1.*NaN"):
        Q4KP(4, 8).pack_from_ggml(bad, 2, 512)
    bad = raw.copy()
    bad.reshape(2, 2, 144)[0, 1, 2:4] = [0x00, 0xFC]       # dmin of row 0, block 1: -Inf
    with pytest.raises(LayoutError, match=r"row 0, block 1.*f16 dmin \(-Inf"):
        Q4KP(4, 8).pack_from_ggml(bad, 2, 512)
    r6 = q6_k.random_q6_k(3, 256, 0)
    r6[2, 208:210] = [0x00, 0x7C]
    with pytest.raises(LayoutError, match=r"Q6_K block 2 \(row 2.*\+Inf"):
        Q6KP(4, 8).pack_from_ggml(r6, 3, 256)
    with pytest.raises(LayoutError, match="only as ggml q4_K blocks"):
        pack_rhs("q4kp", np.ones((4, 256), np.float32), nr=4, kr=8)
    with pytest.raises(LayoutError, match="only as ggml q6_K blocks"):
        Q6KP(4, 8).pack_from_float(np.ones((4, 256), np.float32))
    with pytest.raises(LayoutError, match="no bias"):
        Q4KP(4, 8).pack_from_ggml(raw, 2, 512, np.zeros(2, np.float32))
    for kr in (6, 64, 3):
        with pytest.raises(LayoutError):
            Q4KP(4, kr)
    with pytest.raises(LayoutError, match="fixed sr"):
        layout_for("q8kp", mr=4, kr=8, sr=1)
    with pytest.raises(LayoutError, match="float32"):
        Q8KP(4, 8).pack(np.ones((2, 256), np.float64))


# ----------------------------------------------------------------------------------------
# reference arithmetic (tilegen.reference.kquant)
# ----------------------------------------------------------------------------------------
RAND = {kind: cls.random_ggml for kind, cls in RHS.items()}


def _loop_tilegen(kind, x, raw, n, k):
    """The design's kernel arithmetic for every output, as scalar loops over the split ggml
    fields and Q8KP.quantize_rows (no packing)."""
    m = x.shape[0]
    qa, da, bsum = Q8KP.quantize_rows(x)
    hi, lo = Q8KP.split_bsum(bsum)
    out = np.zeros((m, n), np.float32)
    for r in range(m):
        for c in range(n):
            acc = np.float32(0)
            for s in range(k // 256):
                if hasattr(RHS[kind], "dmin_offset"):      # Q4_K, Q5_K: a min term
                    d, dmin, sc, mins, q = RHS[kind].split_blocks(raw, n, k)
                    S1 = sum(int(sc[c, s, j]) * sum(int(q[c, 256 * s + t]) * int(qa[r, 256 * s + t])
                                                    for t in range(32 * j, 32 * j + 32)) for j in range(8))
                    S2 = 128 * sum(int(mins[c, s, j]) * int(hi[r, s, j]) for j in range(8)) + \
                        sum(int(mins[c, s, j]) * int(lo[r, s, j]) for j in range(8))
                    xv = np.float32(np.float32(S1) * np.float32(np.uint16(d[c, s]).view(np.float16)))
                    xv = fma_f32(-np.float32(np.uint16(dmin[c, s]).view(np.float16)), np.float32(S2), xv)
                else:                       # Q6_K, IQ4_XS: no min term, the family's terms
                    t = RHS[kind].terms(*RHS[kind].split_blocks(raw, n, k))
                    S1 = sum(int(t.sc[c, s, j]) * sum(int(t.w[c, 256 * s + u]) * int(qa[r, 256 * s + u])
                                                      for u in range(t.sub * j, t.sub * j + t.sub))
                             for j in range(256 // t.sub))
                    xv = np.float32(np.float32(S1) * np.float32(np.uint16(t.d[c, s]).view(np.float16)))
                acc = fma_f32(da[r, s], xv, acc)
            out[r, c] = acc
    return out


@pytest.mark.parametrize("kind", tuple(RHS))
def test_tilegen_reference_is_the_design_arithmetic(kind):
    rng = np.random.default_rng(11)
    m, n, k = 2, 3, 512
    x = (rng.standard_normal((m, k)) * 3).astype(np.float32)
    raw = RAND[kind](n, k, 12)
    want = _loop_tilegen(kind, x, raw, n, k)
    got = RK.matmul_tilegen(RHS[kind], x, raw, n, mr=4, nr=4, kr=8)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("kind", tuple(RHS))
def test_tilegen_reference_does_not_depend_on_the_geometry(kind):
    """Every (mr, nr, kr) packs the same values: the results are bit-identical."""
    rng = np.random.default_rng(5)
    m, n, k = 7, 10, 768
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw = RAND[kind](n, k, 6)
    base = RK.matmul_tilegen(RHS[kind], x, raw, n, mr=4, nr=4, kr=16)
    for mr, nr, kr in ((8, 4, 8), (1, 12, 4), (3, 8, 32), (16, 1, 2)):
        assert RK.matmul_tilegen(RHS[kind], x, raw, n, mr=mr, nr=nr, kr=kr).tobytes() == base.tobytes()
    lo, hi = float(np.quantile(base, 0.25)), float(np.quantile(base, 0.75))
    clamped = RK.matmul_tilegen(RHS[kind], x, raw, n, clamp_min=lo, clamp_max=hi)
    assert (clamped == np.clip(base, np.float32(lo), np.float32(hi))).all()


@pytest.mark.parametrize("kind", tuple(RHS))
@pytest.mark.parametrize("m,n,k", [(1, 5, 256), (5, 7, 512), (13, 9, 768), (4, 6, 2048)])
def test_tilegen_and_ggml_against_float64_within_the_derived_bound(kind, m, n, k):
    rng = np.random.default_rng(m * 1000 + k)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 10, (m, 1))).astype(np.float32)
    x[0, 5] = 40.0                                       # an outlier: one large step
    raw = RAND[kind](n, k, n + m)
    ref = RK.matmul_f64_kquant(RHS[kind], x, raw, n)
    bound = RK.error_bound(RHS[kind], x, raw, n)
    ours, theirs = RK.matmul_tilegen(RHS[kind], x, raw, n), RK.matmul_ggml(RHS[kind], x, raw, n)
    assert (np.abs(ours - ref) <= bound).all()
    assert (np.abs(theirs - ref) <= bound).all()
    assert (np.abs(ours.astype(np.float64) - theirs) <= 2 * bound).all()
    assert (np.abs(RK.matmul_ggml(RHS[kind], x, raw, n, contract=True) - ref) <= bound).all()
    # the activation rounding dominates: a few tenths of a percent, never zero
    for got in (ours, theirs):
        e = RK.error_summary(got, ref)
        assert 0 < e["rms_rel"] < 0.05


def test_ggml_q8_k_quantisation():
    x = np.full((1, 256), 0.25, np.float32)
    x[0, :6] = [-127.0, 2.5, 3.5, -0.5, 127.0, -1.5]     # max: the first of largest |x| (-127)
    q, d, bsums = RK.quantize_q8_k(x)
    assert d[0, 0] == 1.0                                # 1 / (-127 / -127)
    assert q[0, :7].tolist() == [-127, 2, 4, 0, 127, -2, 0]   # ties to even
    assert bsums.shape == (1, 1, 16) and bsums[0, 0, 0] == q[0, :16].astype(int).sum()
    x[0, 0] = 127.0
    q, d, _ = RK.quantize_q8_k(x)
    assert d[0, 0] == -1.0 and q[0, :3].tolist() == [-127, -2, -4]    # signed max: q flips sign
    q, d, _ = RK.quantize_q8_k(np.zeros((2, 256), np.float32))
    assert not q.any() and not d.any()
    # a tiny block: iscale = -127/max = -inf, nearest_int(+-inf) = -2^22 and nearest_int(NaN)
    # = 0 (low byte 0), d = 1/-inf = -0: ggml flushes it too
    x = np.full((1, 256), 1e-38, np.float32)
    x[0, 1] = 0
    q, d, bsums = RK.quantize_q8_k(x)
    assert not q.any() and not bsums.any() and d[0, 0] == 0 and np.signbit(d[0, 0])
    assert RK.nearest_int(np.array([np.inf, -np.inf, np.nan, 2.5, -2.5, 3.5], np.float32)).tolist() \
        == [-(1 << 22), -(1 << 22), 0, 2, -2, 4]


@pytest.mark.parametrize("kind", tuple(RHS))
def test_blocks_reference_is_the_packed_reference_and_sees_the_packer(kind):
    """matmul_blocks (from x and the ggml blocks) equals the packed-buffer references bit for
    bit; with two sub-block scales swapped in the packed RHS (a packer/kernel byte-order
    disagreement) the packed reference follows the bytes, matmul_blocks does not (issue #30
    item 8: what lets the kernel tests see such a swap)."""
    rng = np.random.default_rng(31)
    m, n, k = 5, 9, 512
    x = (rng.standard_normal((m, k)) * rng.uniform(0.1, 8, (m, 1))).astype(np.float32)
    raw = RAND[kind](n, k, 32)
    cls = RHS[kind]
    want = RK.matmul_blocks(cls, x, raw, n)
    for mr, nr, kr in ((4, 4, 16), (1, 8, 8), (3, 12, 4)):
        assert RK.matmul_tilegen(cls, x, raw, n, mr=mr, nr=nr, kr=kr).tobytes() == want.tobytes()
    lo, hi = (float(v) for v in np.quantile(want, [0.3, 0.7]))
    assert np.array_equal(RK.matmul_blocks(cls, x, raw, n, lo, hi),
                          np.clip(want, np.float32(lo), np.float32(hi)))
    lay = cls(4, 16)
    vals = list(lay.packed_values(lay.pack_from_ggml(raw, n, k), n, k))
    i = 2 if hasattr(cls, "dmin_offset") else 1     # (d, dmin, sc, m, q) / (d, sc, q)
    sc = vals[i].copy()                              # (n, S, sub-blocks): swap sub-blocks 0, 1
    sc[:, :, [0, 1]] = sc[:, :, [1, 0]]
    assert (sc != vals[i]).any()
    vals[i] = sc
    swapped = lay.pack_values(tuple(vals), n, k)
    lhs = Q8KP(4, 16).pack(x)
    read = RK.matmul_kernel(cls, lhs, swapped, m, n, k, 4, 4, 16)
    assert not np.array_equal(read, want)


def test_sb_record_parts_derive_every_offset():
    """#31: each K-quant layout lists its SB-record parts once (``sb_parts``); every part's
    offset, the parts' sizes and the record size derive from that list, as the layouts' docs
    draw the records (Q4_K 148*nr, Q6_K 210*nr, q8kp 276*mr bytes)."""
    from tilegen.families.q4_k import Q4KP
    from tilegen.families.q6_k import Q6KP
    want = {Q4KP: ({"d": 0, "dmin": 2, "scales": 4, "mins": 12, "nibbles": 20}, 148),
            Q6KP: ({"d": 0, "scales": 2, "low_plane": 18, "high_plane": 146}, 210),
            Q8KP: ({"values": 0, "d": 256, "bsum_hi": 260, "bsum_lo": 268}, 276)}
    for cls, (starts, total) in want.items():
        assert [name for name, _ in cls.sb_parts] == list(starts)
        for n in (1, 3, 4, 8, 16):
            lay = cls(**{cls.sb_slots: n, "kr": 8})
            ends = [getattr(lay, f"{name}_offset") for name in starts][1:] + [lay.sb_record_bytes]
            for (name, per), end in zip(cls.sb_parts, ends):
                per = getattr(lay, per) if isinstance(per, str) else per
                assert getattr(lay, f"{name}_offset") == starts[name] * n, (cls, name, n)
                assert getattr(lay, f"{name}_offset") + per * n == end, (cls, name, n)
            assert lay.sb_record_bytes == total * n
    assert Q6KP(nr=4, kr=8).high_plane_bytes == 64 * 4 and Q8KP(mr=4, kr=8).values_bytes == 1024


def test_q6kp_high_table_rebuilds_every_value():
    """Q6KP.high_table (the SME2 4vl x 1vl gemm's LUTI2 table) added to the low nibble gives
    q - 32 for every 6-bit q, from the stored field h' = (q >> 4) ^ h_xor; a padding column's
    h' = 0 adds 0."""
    lay = Q6KP(4, 4)
    for q in range(64):
        assert lay.high_table[((q >> 4) ^ lay.h_xor) & 3] + (q & 15) == q - 32, q
    assert lay.high_table[0] == 0
