"""The ``q5_K`` family: ggml's Q5_K weights (issue #32) against Q8_K-style activations.

Q5_K is Q4_K plus one high-bit plane: the same f16 d and dmin, the same 12 bytes of 6-bit
scales and mins, 32 bytes ``qh`` of fifth bits and 128 bytes of low nibbles; q in 0..31 and
w = (f32(d)*sc)*q - f32(dmin)*m.  Everything that is Q5_K's own lives here: its record (NEON,
SVE and SME2 realisations, from ``kquant_manifest``, on the templates ``q5k_*``, which extend
q4_K's), its codec (``block_q5_K``: split / join / dequantise, scale checks, seeded random
valid blocks), its packed RHS layout ``q5kp`` (:class:`Q5KP`: q4kp's record with the high-bit
plane before the nibbles, docs/layouts.md#q5kp), the references' hooks, its C packer, its
llama.cpp mapping, default kernels and the packing protocol; and its allocators in the
submodules :mod:`.regalloc` (NEON, SVE: q4_K's with the decode's extra registers) and
:mod:`.regalloc_sme2` (the SME2 gemm and gemv).

block_q5_K (176 bytes):  f16 d | f16 dmin | 12 bytes of scales and mins (as block_q4_K) |
32 bytes qh | 128 bytes of nibbles.  Weight t: low 4 bits from nibble byte 32(t//64) + t%32
(low nibble if t%64 < 32, else high), fifth bit = bit t//32 of qh[t % 32].
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ...layout.base import LayoutError, checked_c_expr, rows_index
from ...layout.ggml import QK_K, check_block_scales, check_superblocks, kquant_blocks, random_f16_scales
from ...layout.kquant import KQuantRhs, KQuantTerms
from ...records import kquant_manifest
from ...reference.kquant import matmul_kernel
from ..q4_k import Q4KP, join_q4_k, q4_k_values, split_q4_k

ORDER = 31
RECORDS, ALLOCATOR_MODULES, GGML_TYPES, DEFAULT_KERNELS, LLAMA_KERNELS = kquant_manifest(
    "q5_K", "q5kp", "q5k", __name__, i16_tiles=("4vlx1vl",),
    # the sme2 4vl x 1vl gemm reads its own variant of the packing (Q5KPS, docs/layouts.md#q5kps)
    rhs_tiles=(("4vlx1vl", "q5kps"),))
#: issue #32's targets against ggml's repack (bench/vs_ggml.py: tilegen / ggml MAC per cycle)
VS_GGML_TARGETS = {"gemm": 1.8, "gemv": 1.3}
#: llama-quantize's Q5_K_M of the check's synthetic model (Q5_K, Q6_K for some tensors) runs on
#: the patched llama.cpp within this tolerance (docs/llama_cpp_check.md: Q4_K_M's derivation)
LLAMA_QUANTIZE = {"q5_k_m": 0.08}
#: and llama-quantize's Q5_K_M of the MoE model (moe_q5_k_m), with the same tolerance
LLAMA_MOE = {"q5_k_m": None}

BLOCK_Q5_K_BYTES = 176
# byte offsets of the fields inside one block (the C packer of the export reads them too)
Q5_K_D, Q5_K_DMIN, Q5_K_SCALES, Q5_K_QH, Q5_K_QS = 0, 2, 4, 16, 48


def split_q5_k(raw, n: int, k: int) -> tuple[np.ndarray, ...]:
    """block_q5_K rows -> (d f16 bits uint16 (n, S), dmin f16 bits uint16 (n, S),
    sc uint8 (n, S, 8), m uint8 (n, S, 8), q uint8 (n, k) 0..31 in k order), S = k/256:
    block_q4_K's fields of the block without its qh (:func:`~tilegen.families.q4_k.split_q4_k`),
    the fifth bits added."""
    b = kquant_blocks(raw, n, k, BLOCK_Q5_K_BYTES, "Q5_K")
    n, S = b.shape[:2]
    q4 = np.concatenate([b[..., :Q5_K_QH], b[..., Q5_K_QS:]], axis=-1)
    d, dmin, sc, m, low = split_q4_k(q4, n, k)
    qh = b[..., Q5_K_QH:Q5_K_QS].reshape(n, S, 1, 32)
    high = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1
    return d, dmin, sc, m, (low | (high.reshape(n, k) << 4)).astype(np.uint8)


def join_q5_k(d, dmin, sc, m, q) -> np.ndarray:
    """Inverse of :func:`split_q5_k`: uint8 (n, k/256*176) block_q5_K rows (block_q4_K's bytes of
    the low 4 bits, :func:`~tilegen.families.q4_k.join_q4_k`, with qh inserted)."""
    q = np.asarray(q, dtype=np.uint8)
    n, k = q.shape
    S = check_superblocks(k)
    b4 = join_q4_k(d, dmin, sc, m, q & 15).reshape(n, S, -1)
    hb = ((q.reshape(n, S, 8, 32) >> 4) & 1).astype(np.uint8)
    qh = (hb << np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)).sum(axis=2, dtype=np.uint8)
    return np.concatenate([b4[..., :Q5_K_QH], qh, b4[..., Q5_K_QH:]], axis=-1).reshape(n, -1)


#: float32 (R, k) weights of split Q5_K fields, gguf.quants' float order (that of Q4_K:
#: (f32(d) * sc) * q - f32(dmin) * m, each step one f32 rounding; q in 0..31)
q5_k_values = q4_k_values


def dequantize_q5_k(raw, n: int, k: int) -> np.ndarray:
    """block_q5_K rows -> float32 (n, k), bit for bit ``gguf.quants.dequantize``."""
    return q5_k_values(*split_q5_k(raw, n, k))


def check_q5_k_scales(d, dmin) -> None:
    """LayoutError naming the first block/row whose f16 d or dmin is NaN or Inf."""
    check_block_scales(d, "Q5_K", "d")
    check_block_scales(dmin, "Q5_K", "dmin")


def random_q5_k(n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid block_q5_K rows (uint8 (n, k/256*176)): positive finite d and dmin,
    every 6-bit scale/min and 5-bit value drawn uniformly."""
    rng = np.random.default_rng(seed)
    S = check_superblocks(k)
    return join_q5_k(random_f16_scales(rng, (n, S), 2e-3), random_f16_scales(rng, (n, S), 1e-3),
                     rng.integers(0, 64, (n, S, 8)), rng.integers(0, 64, (n, S, 8)),
                     rng.integers(0, 32, (n, k)))


@dataclass(frozen=True)
class Q5KP(KQuantRhs):
    """``q5kp<nr>x<kr>`` from ggml block_q5_K (docs/layouts.md#q5kp): q4kp's SB record
    (:class:`~tilegen.families.q4_k.Q4KP`, the low 4 bits of each value in its nibbles) with
    a high-bit plane of ``32*nr`` bytes before the nibbles.

    Column group of nr columns = k/256 SB records of ``180*nr`` bytes::

        +0        nr x f16 d                      +2*nr   nr x f16 dmin
        +4*nr     scales 8 x nr uint8, [j][c]     +12*nr  mins nr x 8 uint8, [c][j]
        +20*nr    qh: 32*nr bytes                 +52*nr  nibbles as q4kp's (128*nr bytes)

    The nibble bytes fall in four quarters of 32*nr bytes (sub-blocks 2s, 2s+1 in quarter s):
    the fifth bits of nibble byte o (offset from the nibbles' start) are bits 2s (its low
    nibble's value) and 2s + 1 (its high nibble's) of qh byte o - 32*nr*s, s = o // (32*nr).
    So any run of nibble bytes inside one quarter (a NEON or SVE vector of any length) finds
    its fifth bits in the run of qh bytes at the same distance, all at one bit pair.
    """

    nr: int
    kr: int

    format = "q5kp"
    random_ggml = staticmethod(random_q5_k)
    label_prefix = "q5kp"

    def __post_init__(self) -> None:
        self.check_kquant(nr=self.nr)

    d_bytes = 2
    subblocks = 8
    qh_per_column = QK_K // 8
    sb_parts = (("d", "d_bytes"), ("dmin", "d_bytes"), ("scales", "subblocks"),
                ("mins", "subblocks"), ("qh", "qh_per_column"), ("nibbles", QK_K // 2))

    @property
    def low(self) -> Q4KP:
        """The q4kp layout of the same nr, kr: this record without its qh plane."""
        return Q4KP(self.nr, self.kr)

    @property
    def subblock_bytes(self) -> int:
        return self.low.subblock_bytes

    @property
    def chunks_per_subblock(self) -> int:
        return self.low.chunks_per_subblock

    @property
    def quarter_bytes(self) -> int:
        """Nibble bytes whose fifth bits share one bit pair of the qh plane (32*nr)."""
        return self.qh_bytes

    def min_offset(self, c: int, j: int) -> int:
        return self.mins_offset + c * self.subblocks + j

    def nibble_offset(self, c: int, t: int) -> tuple[int, int]:
        """(offset inside an SB record, 0 low / 1 high nibble) of column slot c, value t."""
        off, half = self.low.nibble_offset(c, t)
        return off - self.low.nibbles_offset + self.nibbles_offset, half

    def qh_at(self, nib_off: int) -> tuple[int, int]:
        """(offset of the qh byte inside an SB record, bit of the low nibble's fifth bit; the
        high nibble's is the next) of the nibble byte at ``nib_off`` from the nibbles' start."""
        s, o = divmod(nib_off, self.quarter_bytes)
        return self.qh_offset + o, 2 * s

    def high_bit(self, c: int, t: int) -> tuple[int, int]:
        """(qh byte offset inside an SB record, bit) of column slot c, value t's fifth bit."""
        off, half = self.nibble_offset(c, t)
        byte, bit = self.qh_at(off - self.nibbles_offset)
        return byte, bit + half

    kind = "q5_K"

    @staticmethod
    def split_blocks(raw, n: int, k: int) -> tuple:
        d, dmin, sc, m, q = split_q5_k(raw, n, k)
        check_q5_k_scales(d, dmin)
        return d, dmin, sc, m, q

    values = staticmethod(q5_k_values)

    @staticmethod
    def terms(d, dmin, sc, m, q) -> KQuantTerms:
        """w = d * sc * q - dmin * m: q 0..31 per sub-block of 32, one min per sub-block."""
        return KQuantTerms(d, sc, q, 32, dmin, m)

    def _qh_from_nibbles(self, nib: np.ndarray) -> np.ndarray:
        """Nibble bytes (..., 128*nr) whose nibbles are 0/1 (the fifth bits) -> qh (..., 32*nr)."""
        quarters = nib.reshape(nib.shape[:-1] + (4, self.quarter_bytes)).astype(np.uint8)
        shift = 2 * np.arange(4, dtype=np.uint8).reshape(4, 1)
        return (((quarters & 1) << shift) | (((quarters >> 4) & 1) << (shift + 1))).sum(
            axis=-2, dtype=np.uint8)

    def _nibbles_from_qh(self, qh: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`_qh_from_nibbles`."""
        shift = 2 * np.arange(4, dtype=np.uint8).reshape(4, 1)
        q = qh[..., None, :]
        nib = ((q >> shift) & 1) | (((q >> (shift + 1)) & 1) << 4)
        return nib.reshape(qh.shape[:-1] + (4 * self.quarter_bytes,)).astype(np.uint8)

    def pack_split(self, d, dmin, sc, m, q) -> np.ndarray:
        """Pack split Q5_K fields (:func:`split_q5_k`'s: q uint8 (n, k) 0..31)."""
        q, n, S, G = self._split_geometry(q)
        low = self.low
        rec = low.pack_split(d, dmin, sc, m, q & 15).reshape(G, S, low.sb_record_bytes)
        z = np.zeros((n, S), np.uint16)
        hi = low.pack_split(z, z, np.zeros((n, S, 8), np.uint8), np.zeros((n, S, 8), np.uint8),
                            q >> 4).reshape(G, S, low.sb_record_bytes)[..., low.nibbles_offset:]
        out = np.concatenate([rec[..., :low.nibbles_offset], self._qh_from_nibbles(hi),
                              rec[..., low.nibbles_offset:]], axis=2)
        return out.reshape(-1)

    def unpack(self, packed, n: int, k: int, rows=None) -> tuple[np.ndarray, ...]:
        """(d, dmin, sc, m, q uint8 (R, k) 0..31) of ``rows`` (default all n)."""
        grp = self.column_groups(packed, n, k)
        S, low = self.num_superblocks(k), self.low
        rec = grp.reshape(grp.shape[0], S, self.sb_record_bytes)
        nb = rec[..., self.nibbles_offset:]
        lo_rec = np.concatenate([rec[..., :self.qh_offset], nb], axis=2).reshape(-1)
        d, dmin, sc, m, q = low.unpack(lo_rec, n, k, rows)
        hi_rec = np.concatenate([rec[..., :self.qh_offset],
                                 self._nibbles_from_qh(rec[..., self.qh_offset:self.nibbles_offset])],
                                axis=2).reshape(-1)
        h = low.unpack(hi_rec, n, k, rows)[4]
        return d, dmin, sc, m, (q | (h << 4)).astype(np.uint8)


@dataclass(frozen=True)
class Q5KPS(Q5KP):
    """``q5kps<nr>x2`` (kr = 4): the SME2 4vl x 1vl gemm's variant of :class:`Q5KP`
    (docs/layouts.md#q5kps), the same fields and bytes per SB record (``180*nr``), with the
    values of each 8-k group of a sub-block in the order LUTI4 lays them out and their fifth
    bits as predicate bits in that order.

    Column group of nr columns = k/256 SB records of ``180*nr`` bytes::

        +0        nr x f16 d                      +2*nr   nr x f16 dmin
        +4*nr     scales 8 x nr uint8, [j][c]     +12*nr  mins nr x 8 uint8, [c][j]
        +20*nr    fifth bits: 32*nr bytes         +52*nr  low nibbles: 128*nr bytes

    Value t (0..255) of column slot c: sub-block j = t // 32, group g = (t % 32) // 8, and in
    the group v = (t % 8) // 2, e = t % 2 (k = 8g + 2v + e); its slot in sub-block j is
    P = 8*nr*g + 2*nr*v + 2c + e (:meth:`slot`).  Its low 4 bits are nibble P of the sub-block's
    16*nr nibble bytes (low nibble first), its fifth bit is bit P of the sub-block's 4*nr bit
    bytes (bit 0 first).  So one group's 4*nr nibble bytes, looked up by one LUTI4 into four
    int16 vectors of 2*nr lanes, give vector v = the k pair (2v, 2v + 1) of chunk g's half v // 2
    with column c's pair in lanes 2c, 2c + 1 (the int16 SMOPA's operand, no UZP), and the
    group's nr bit bytes loaded as two predicates and unpacked (PUNPKLO / PUNPKHI) govern those
    lanes.  Not exported (no C packer): the llama.cpp patch's SME2 entries read ``q5kp``.
    """

    format = "q5kps"
    label_prefix = "q5kps"

    def __post_init__(self) -> None:
        self.check_kquant(nr=self.nr)
        if self.kr != 4:
            raise LayoutError(f"q5kps is the 4vl x 1vl SME2 gemm's layout: kr = 4 (its k pairs "
                              f"of 4-k chunks), got kr={self.kr}")

    def slot(self, c, t):
        """(sub-block j, slot P inside it) of column slot c, value t (ints or arrays)."""
        j, r = np.divmod(t, 32)
        g, r = np.divmod(r, 8)
        v, e = np.divmod(r, 2)
        return j, 8 * self.nr * g + 2 * self.nr * v + 2 * c + e

    def nibble_offset(self, c: int, t: int) -> tuple[int, int]:
        """(offset inside an SB record, 0 low / 1 high nibble) of column slot c, value t."""
        j, P = self.slot(c, t)
        return int(self.nibbles_offset + j * self.subblock_bytes + P // 2), int(P % 2)

    def high_bit(self, c: int, t: int) -> tuple[int, int]:
        """(byte offset inside an SB record, bit) of column slot c, value t's fifth bit."""
        j, P = self.slot(c, t)
        return int(self.qh_offset + j * self.subblock_bytes // 4 + P // 8), int(P % 8)

    def _order(self) -> tuple[np.ndarray, np.ndarray]:
        """(column, k in the sub-block) of slots P = 0 .. 32*nr - 1 (:meth:`slot` inverted)."""
        c, t = np.meshgrid(np.arange(self.nr), np.arange(32), indexing="ij")
        _, P = self.slot(c, t)
        col, ks = np.empty(32 * self.nr, np.intp), np.empty(32 * self.nr, np.intp)
        col[P.ravel()], ks[P.ravel()] = c.ravel(), t.ravel()
        return col, ks

    def pack_split(self, d, dmin, sc, m, q) -> np.ndarray:
        """Pack split Q5_K fields (:func:`split_q5_k`'s: q uint8 (n, k) 0..31)."""
        q, n, S, G = self._split_geometry(q)
        low = self.low
        head = low.pack_split(d, dmin, sc, m, q & 15).reshape(G, S, low.sb_record_bytes)
        col, ks = self._order()
        vals = self._padded(q, n).reshape(G, self.nr, S, 8, 32).transpose(0, 2, 3, 1, 4)
        vals = vals[..., col, ks]                                   # (G, S, 8, 32*nr) by slot
        nib = (vals[..., 0::2] & 15) | ((vals[..., 1::2] & 15) << 4)
        bits = np.packbits((vals >> 4) & 1, axis=-1, bitorder="little")
        out = np.concatenate([head[..., :self.qh_offset], bits.reshape(G, S, -1),
                              nib.reshape(G, S, -1).astype(np.uint8)], axis=2)
        return out.reshape(-1)

    def unpack(self, packed, n: int, k: int, rows=None) -> tuple[np.ndarray, ...]:
        """(d, dmin, sc, m, q uint8 (R, k) 0..31) of ``rows`` (default all n)."""
        grp = self.column_groups(packed, n, k)
        S, low, G = self.num_superblocks(k), self.low, grp.shape[0]
        rec = grp.reshape(G, S, self.sb_record_bytes)
        blank = np.zeros((G, S, low.sb_record_bytes - self.qh_offset), np.uint8)
        d, dmin, sc, m, _ = low.unpack(np.concatenate([rec[..., :self.qh_offset], blank],
                                                      axis=2).reshape(-1), n, k, rows)
        nib = rec[..., self.nibbles_offset:].reshape(G, S, 8, -1)
        lo = np.stack([nib & 15, nib >> 4], axis=-1).reshape(G, S, 8, -1)
        bits = np.unpackbits(rec[..., self.qh_offset:self.nibbles_offset].reshape(G, S, 8, -1),
                             axis=-1, bitorder="little")
        col, ks = self._order()
        q = np.empty((G, S, 8, self.nr, 32), np.uint8)
        q[..., col, ks] = lo | (bits << 4)
        q = q.transpose(0, 3, 1, 2, 4).reshape(G * self.nr, k)
        return d, dmin, sc, m, q[np.arange(n) if rows is None else rows_index(rows, n)]


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of q5kp (template ``export/pack/q5kp.c.j2``): its layout banner and
    the expressions the template fills in, each checked against :class:`Q5KP` at the
    K-quant geometries ``geo`` (dicts of nr, kr, k) the export gives."""
    ref = Q5KP(4, 8)
    qk, db, sbk, nsb, qhc = ref.qk, ref.d_bytes, ref.sub_k, ref.subblocks, ref.qh_per_column
    lay = lambda nr, kr, **_: Q5KP(nr, kr)  # noqa: E731
    per_col = f"(2 * {db} + 2 * {nsb} + {qhc} + {nsb} * {sbk} // 2)"
    rec = checked_c_expr(f"nr * {per_col}", lambda k, **g: lay(**g).sb_record_bytes, geo)
    stride = checked_c_expr(f"(k // {qk}) * nr * {per_col}", lambda k, **g: lay(**g).group_stride(k), geo)
    cgeo = [dict(g, c=c, j=j) for g in geo for c in (0, g["nr"] - 1) for j in (0, 5)]
    d_f = checked_c_expr(f"c * {db}", lambda c, j, **g: lay(**g).d_offset + c * db, cgeo)
    dmin_f = checked_c_expr(f"nr * {db} + c * {db}", lambda c, j, **g: lay(**g).dmin_offset + c * db, cgeo)
    sc_f = checked_c_expr(f"nr * 2 * {db} + j * nr + c", lambda c, j, **g: lay(**g).scale_offset(j, c), cgeo)
    m_f = checked_c_expr(f"nr * (2 * {db} + {nsb}) + c * {nsb} + j",
                         lambda c, j, **g: lay(**g).min_offset(c, j), cgeo)
    tgeo = [dict(g, c=c, t=t) for g in geo for c in (0, g["nr"] - 1) for t in (0, 3, 37, 100, 255)]
    # o: the value's nibble byte from the nibbles' start
    o = (f"((t // {sbk}) * (nr * {sbk} // 2) + (t % {sbk}) // kr * (nr * kr // 2) + c * (kr // 2)"
         f" + (t % kr) % (kr // 2))")
    nib = checked_c_expr(f"nr * (2 * {db} + 2 * {nsb} + {qhc}) + {o}",
                         lambda c, t, **g: lay(**g).nibble_offset(c, t)[0], tgeo)
    shift = checked_c_expr("(t % kr) // (kr // 2) * 4", lambda c, t, **g: 4 * lay(**g).nibble_offset(c, t)[1],
                           tgeo)
    qh_f = checked_c_expr(f"nr * (2 * {db} + 2 * {nsb}) + {o} % (nr * {qhc})",
                          lambda c, t, **g: lay(**g).high_bit(c, t)[0], tgeo)
    qh_bit = checked_c_expr(f"2 * ({o} // (nr * {qhc})) + (t % kr) // (kr // 2)",
                            lambda c, t, **g: lay(**g).high_bit(c, t)[1], tgeo)
    return dict(layout=f"q5kp<nr>x<kr/2> ({Q5KP.__module__}.{Q5KP.__name__})", anchor="q5kp",
                template="q5kp.c.j2",
                context=dict(stride=stride, rec=rec, d_f=d_f, dmin_f=dmin_f, sc_f=sc_f, m_f=m_f,
                             nib=nib, shift=shift, qh_f=qh_f, qh_bit=qh_bit, qk=qk, nsb=nsb,
                             sbk=sbk, blk=BLOCK_Q5_K_BYTES, b_d=Q5_K_D, b_dmin=Q5_K_DMIN,
                             b_sc=Q5_K_SCALES, b_qh=Q5_K_QH, b_qs=Q5_K_QS))


LAYOUTS = (Q5KP, Q5KPS)
C_PACKERS = {"kai_rhs_pack_nxk_q5kp_q5k": c_packer}
pack = Q5KP.pack_weights
gguf_layout = Q5KP.gguf_layout
#: dst float32 (m, n) of a q5_K kernel reading ``q8kp<mr>x<kr>`` and ``q5kp<nr>x<kr>``
matmul_q8kp_q5kp = partial(matmul_kernel, Q5KP)
