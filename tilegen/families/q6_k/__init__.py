"""The ``q6_K`` family: ggml's Q6_K weights (issue #24) against Q8_K-style activations.

Everything that is Q6_K's own: its record (NEON, SVE and SME2 realisations on the K-quant
templates ``q6k_*``), its ggml block codec (``block_q6_K``: split / join / dequantise, the
scale checks, seeded random valid blocks), its packed RHS layout ``q6kp`` (:class:`Q6KP` on
the shared :class:`~tilegen.layout.kquant.KQuantRhs`, with the hooks the references read),
its C packer, its llama.cpp mapping, its default kernels and the packing protocol; and, as
this package's submodules (the regalloc stage: only the allocator registry imports them),
its register allocators :mod:`.regalloc` (NEON, SVE) and :mod:`.regalloc_sme2`.

block_q6_K (210 bytes):  ql 128 | qh 64 | int8 scales 16 | f16 d.  Weight v = 128h + u
(half h < 2, u < 128): low 4 bits in ql[64h + u % 64] (low nibble for u < 64, else high),
2 high bits in qh[32h + u % 32] at bit 2*(u // 32); q = 0..63, w = (f32(d)*sc[v // 16])*(q - 32).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ...layout.base import c_expr, checked_c_expr
from ...layout.ggml import (QK_K, check_block_scales, check_superblocks, f16_bits_to_f32,
                           kquant_blocks, random_f16_scales)
from ...layout.kquant import U16, KQuantRhs, KQuantTerms
from ...reference.kquant import matmul_kernel
from ...records import kquant_manifest

# the plugin's declarations (tilegen.families): its record, allocator modules, GGUF type,
# default kernels and the llama.cpp patch's tiles are those every K-quant family has
ORDER = 40
RECORDS, ALLOCATOR_MODULES, GGML_TYPES, DEFAULT_KERNELS, LLAMA_KERNELS = kquant_manifest(
    "q6_K", "q6kp", "q6k", __name__, i16_tiles=("4vlx1vl",), large=True)

BLOCK_Q6_K_BYTES = 210
# byte offsets of the fields inside one block (the C packer of the export reads them too)
Q6_K_QL, Q6_K_QH, Q6_K_SCALES, Q6_K_D = 0, 128, 192, 208


def split_q6_k(raw, n: int, k: int) -> tuple[np.ndarray, ...]:
    """block_q6_K rows -> (d f16 bits uint16 (n, S), sc int8 (n, S, 16), q uint8 (n, k)
    0..63 in k order; the weight is d*sc*(q - 32))."""
    b = kquant_blocks(raw, n, k, BLOCK_Q6_K_BYTES, "Q6_K")
    n, S = b.shape[:2]
    ql = b[..., Q6_K_QL:Q6_K_QH].reshape(n, S, 2, 64)
    qh = b[..., Q6_K_QH:Q6_K_SCALES].reshape(n, S, 2, 1, 32)
    sc = np.ascontiguousarray(b[..., Q6_K_SCALES:Q6_K_D]).view(np.int8).reshape(n, S, 16)
    d = np.ascontiguousarray(b[..., Q6_K_D:Q6_K_D + 2]).view("<u2").reshape(n, S)
    low = np.concatenate([ql & 15, ql >> 4], axis=-1)                          # (n, S, 2, 128)
    shifts = np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    high = ((qh >> shifts) & 3).reshape(n, S, 2, 128)
    q = (low | (high << 4)).astype(np.uint8).reshape(n, k)
    return d, sc, q


def join_q6_k(d, sc, q) -> np.ndarray:
    """Inverse of :func:`split_q6_k`: uint8 (n, k/256*210) block_q6_K rows."""
    q = np.asarray(q, dtype=np.uint8)
    n, k = q.shape
    S = check_superblocks(k)
    qq = q.reshape(n, S, 2, 128)
    low = qq & 15
    ql = low[..., :64] | (low[..., 64:] << 4)
    h = (qq >> 4).reshape(n, S, 2, 4, 32) & 3
    qh = h[..., 0, :] | (h[..., 1, :] << 2) | (h[..., 2, :] << 4) | (h[..., 3, :] << 6)
    s = np.ascontiguousarray(np.asarray(sc, dtype=np.int8).reshape(n, S, 16)).view(np.uint8)
    dd = np.ascontiguousarray(np.asarray(d, dtype="<u2").reshape(n, S)).view(np.uint8)
    return np.concatenate([ql.reshape(n, S, 128), qh.reshape(n, S, 64), s,
                           dd.reshape(n, S, 2)], axis=-1).astype(np.uint8).reshape(n, -1)


def q6_k_values(d, sc, q) -> np.ndarray:
    """float32 (R, k) weights of split Q6_K fields, gguf.quants' order: ``(f32(d)*sc)*(q-32)``."""
    q = np.asarray(q)
    R, k = q.shape
    S = k // QK_K
    df = f16_bits_to_f32(d).reshape(R, S, 1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = (df * np.asarray(sc).reshape(R, S, 16, 1).astype(np.float32)).astype(np.float32)
        v = (q.astype(np.int16) - 32).astype(np.float32).reshape(R, S, 16, 16)
        return (ds * v).astype(np.float32).reshape(R, k)


def dequantize_q6_k(raw, n: int, k: int) -> np.ndarray:
    """block_q6_K rows -> float32 (n, k), bit for bit ``gguf.quants.dequantize``."""
    return q6_k_values(*split_q6_k(raw, n, k))


def check_q6_k_scales(d) -> None:
    """LayoutError naming the first block/row whose f16 d is NaN or Inf."""
    check_block_scales(d, "Q6_K", "d")



def random_q6_k(n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid block_q6_K rows (uint8 (n, k/256*210)): positive finite d, int8
    scales in [-128, 127], 6-bit values uniform."""
    rng = np.random.default_rng(seed)
    S = check_superblocks(k)
    return join_q6_k(random_f16_scales(rng, (n, S), 1e-3), rng.integers(-128, 128, (n, S, 16)),
                     rng.integers(0, 64, (n, k)))



@dataclass(frozen=True)
class Q6KP(KQuantRhs):
    """``q6kp<nr>x<kr>`` from ggml block_q6_K (docs/layouts.md#q6kp).

    Column group = k/256 SB records of ``210*nr`` bytes::

        +0        nr x f16 d
        +2*nr     scales 16 x nr int8, [j][c] (j = sub-block of 16)
        +18*nr    low plane (128*nr): 256/kr chunks of nr*kr/2 bytes; chunk i, column c, byte
                  b: low nibble = ql of k = kr*i + b, high nibble = ql of k + L  (ql = q & 15)
        +146*nr   high plane (64*nr): byte p = h'(low nibble of low byte p) | h'(high nibble
                  of p) << 2 | h'(low of p + 64nr) << 4 | h'(high of p + 64nr) << 6,
                  h' = (q >> 4) ^ 2
    """

    nr: int
    kr: int

    format = "q6kp"
    random_ggml = staticmethod(random_q6_k)     # seeded random valid block_q6_K rows
    label_prefix = "q6kp"

    def __post_init__(self) -> None:
        self.check_kquant(nr=self.nr)

    # -- geometry (generator) ------------------------------------------------------------
    d_bytes = 2
    subblocks = 16              # sub-blocks of 16 per SB (one int8 scale each)
    sub_k6 = 16                 # k values per Q6_K scale
    h_xor = 2                   # stored high bits h' = (q >> 4) ^ h_xor (signed 2-bit q>>4 - 2)
    # an SB record of a group, per column: d, 16 int8 scales ([j][c]), the low plane (4 bits
    # of 256 values), the high plane (2 bits of 256); d_offset .. high_plane_offset, the
    # planes' _bytes and sb_record_bytes (210*nr) derive
    sb_parts = (("d", "d_bytes"), ("scales", "subblocks"), ("low_plane", QK_K // 2),
                ("high_plane", QK_K // 4))

    @property
    def high_pair_distance(self) -> int:
        """Low-plane distance between the bytes whose h' share one high-plane byte (fields
        0-1 and 2-3 come from byte p, fields 4-5 and 6-7 from byte p + high_pair_distance)."""
        return self.high_plane_bytes

    @property
    def high_table(self) -> tuple[int, ...]:
        """What each stored 2-bit field h' (0-3) adds to its value's low nibble, 16*(signed
        q >> 4 - 2) = 16*((h' ^ h_xor) - 2): the SME2 4vl x 1vl gemm's LUTI2 table."""
        return tuple(16 * ((h ^ self.h_xor) - 2) for h in range(4))

    def low_offset(self, c: int, t: int) -> tuple[int, int]:
        """(low-plane byte index p, 0 low / 1 high nibble) of column slot c, value t < 256."""
        i, r = divmod(t, self.kr)
        return i * self.chunk_bytes + c * self.L + r % self.L, r // self.L

    def high_field(self, c: int, t: int) -> tuple[int, int]:
        """(high-plane byte index, bit position of the 2-bit field) of column c, value t."""
        p, hi = self.low_offset(c, t)
        half, p = divmod(p, self.high_pair_distance)
        return p, 4 * half + 2 * hi

    # -- the family's hooks on KQuantRhs: its ggml codec and integer terms ---------------
    kind = "q6_K"

    @staticmethod
    def split_blocks(raw, n: int, k: int) -> tuple:
        d, sc, q = split_q6_k(raw, n, k)
        check_q6_k_scales(d)
        return d, sc, q

    values = staticmethod(q6_k_values)

    @staticmethod
    def terms(d, sc, q) -> KQuantTerms:
        """w = d * sc * (q - 32): one int8 scale per sub-block of 16, no min term."""
        return KQuantTerms(d, sc, np.asarray(q).astype(np.int16) - 32, 16)

    # -- packers -------------------------------------------------------------------------
    def pack_split(self, d, sc, q) -> np.ndarray:
        """Pack split Q6_K fields (as :func:`split_q6_k` gives them: d f16
        bits (n, S), sc int8 (n, S, 16), q uint8 (n, k) 0..63)."""
        q, n, S, G = self._split_geometry(q)
        nr = self.nr
        dd = self._padded(np.asarray(d, dtype=U16).reshape(n, S), n)
        scp = self._padded(np.asarray(sc, dtype=np.int8).reshape(n, S, 16), n).view(np.uint8)
        qp = q.reshape(n, S, QK_K)
        hp = self._padded(((qp >> 4) ^ self.h_xor) & 3, n)     # padding columns: h' = 0
        low = self._interleave(self._padded(qp & 15, n), G, S, QK_K)       # (G, S, 128nr)
        # the h' of each low-plane byte's two nibbles, in the low plane's byte order
        hb = self._interleave(hp, G, S, QK_K)
        hlo, hhi = hb & 3, hb >> 4
        half = self.high_pair_distance
        high = hlo[..., :half] | (hhi[..., :half] << 2) | (hlo[..., half:] << 4) | (hhi[..., half:] << 6)
        scales = scp.reshape(G, nr, S, 16).transpose(0, 2, 3, 1).reshape(G, S, 16 * nr)
        out = np.concatenate([self._f16_columns(dd, G, S), scales, low, high.astype(np.uint8)], axis=2)
        return out.astype(np.uint8).reshape(-1)

    # -- readers -------------------------------------------------------------------------
    def unpack(self, packed, n: int, k: int, rows=None) -> tuple[np.ndarray, ...]:
        """(d uint16 (R, S), sc int8 (R, S, 16), q uint8 (R, k) 0..63) of ``rows``."""
        rec, g, i = self._records(packed, n, k, rows)
        G, S = rec.shape[:2]
        nr = self.nr
        d = np.ascontiguousarray(rec[..., :self.scales_offset]).view(U16)          # (G, S, nr)
        sc = np.ascontiguousarray(rec[..., self.scales_offset:self.low_plane_offset])
        sc = sc.view(np.int8).reshape(G, S, 16, nr)
        low = rec[..., self.low_plane_offset:self.high_plane_offset]
        hp = rec[..., self.high_plane_offset:]
        hlo = np.concatenate([hp & 3, (hp >> 4) & 3], axis=2)
        hhi = np.concatenate([(hp >> 2) & 3, hp >> 6], axis=2)
        hbytes = (hlo | (hhi << 4)) ^ (self.h_xor * 0x11)       # (q >> 4) of both nibbles
        v = self._deinterleave(low, QK_K) | (self._deinterleave(hbytes, QK_K) << 4)
        q = v[g, :, :, i].reshape(g.size, k)
        return d[g, :, i], sc[g, :, :, i], q.astype(np.uint8)


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of q6kp (template ``export/pack/q6kp.c.j2``): its layout banner and
    the expressions the template fills in, each checked against :class:`Q6KP` at the
    K-quant geometries ``geo`` (dicts of nr, kr, k) the export gives."""
    ref = Q6KP(4, 8)
    qk, db, nsb = ref.qk, ref.d_bytes, ref.subblocks
    lay = lambda nr, kr, **_: Q6KP(nr, kr)  # noqa: E731
    rec = checked_c_expr(f"nr * ({db} + {nsb} + {qk} // 2 + {qk} // 4)",
                         lambda k, **g: lay(**g).sb_record_bytes, geo)
    stride = checked_c_expr(f"(k // {qk}) * nr * ({db} + {nsb} + {qk} // 2 + {qk} // 4)",
                            lambda k, **g: lay(**g).group_stride(k), geo)
    cgeo = [dict(g, c=c, j=j) for g in geo for c in (0, g["nr"] - 1) for j in (0, 11)]
    d_f = checked_c_expr(f"c * {db}", lambda c, j, **g: lay(**g).d_offset + c * db, cgeo)
    sc_f = checked_c_expr(f"nr * {db} + j * nr + c", lambda c, j, **g: lay(**g).scale_offset(j, c), cgeo)
    low_f = checked_c_expr(f"nr * ({db} + {nsb})", lambda c, j, **g: lay(**g).low_plane_offset, cgeo)
    high_f = checked_c_expr(f"nr * ({db} + {nsb} + {qk} // 2)",
                            lambda c, j, **g: lay(**g).high_plane_offset, cgeo)
    tgeo = [dict(g, c=c, t=t) for g in geo for c in (0, g["nr"] - 1) for t in (0, 3, 37, 130, 255)]
    lowp = checked_c_expr("t // kr * (nr * kr // 2) + c * (kr // 2) + (t % kr) % (kr // 2)",
                          lambda c, t, **g: lay(**g).low_offset(c, t)[0], tgeo)
    lows = checked_c_expr("(t % kr) // (kr // 2) * 4", lambda c, t, **g: 4 * lay(**g).low_offset(c, t)[1],
                          tgeo)
    half = f"(nr * {qk} // 4)"
    p_py = "t // kr * (nr * kr // 2) + c * (kr // 2) + (t % kr) % (kr // 2)"
    hs_py = "(t % kr) // (kr // 2) * 4"
    checked_c_expr(f"({p_py}) % {half}", lambda c, t, **g: lay(**g).high_field(c, t)[0], tgeo)
    checked_c_expr(f"({p_py}) // {half} * 4 + ({hs_py}) // 2",
                   lambda c, t, **g: lay(**g).high_field(c, t)[1], tgeo)
    hbyte, hbit = c_expr(f"p % {half}"), c_expr(f"p // {half} * 4 + hs // 2")
    return dict(layout=f"q6kp<nr>x<kr/2> ({Q6KP.__module__}.{Q6KP.__name__})", anchor="q6kp",
                template="q6kp.c.j2",
                context=dict(stride=stride, rec=rec, d_f=d_f, sc_f=sc_f, low_f=low_f, high_f=high_f,
                             lowp=lowp, lows=lows, hbyte=hbyte, hbit=hbit, qk=qk, nsb=nsb,
                             sub6=ref.sub_k6, hxor=ref.h_xor,
                             blk=BLOCK_Q6_K_BYTES, b_ql=Q6_K_QL, b_qh=Q6_K_QH,
                             b_sc=Q6_K_SCALES, b_d=Q6_K_D))


LAYOUTS = (Q6KP,)
C_PACKERS = {"kai_rhs_pack_nxk_q6kp_q6k": c_packer}     # the export's (tilegen.export.packers_c)
pack = Q6KP.pack_weights             # the packing protocol every K-quant shares
gguf_layout = Q6KP.gguf_layout
#: dst float32 (m, n) of a q6_K kernel reading ``q8kp<mr>x<kr>`` and ``q6kp<nr>x<kr>``
#: (lhs_packed, rhs_packed, m, n, k, mr, nr, kr, clamp_min, clamp_max): tilegen's kernel
#: arithmetic, bit exact (:func:`tilegen.reference.kquant.matmul_kernel`)
matmul_q8kp_q6kp = partial(matmul_kernel, Q6KP)
