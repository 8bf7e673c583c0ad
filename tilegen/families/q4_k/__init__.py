"""The ``q4_K`` family: ggml's Q4_K weights (issue #24) against Q8_K-style activations.

Everything that is Q4_K's own: its record (NEON, SVE and SME2 realisations on the K-quant
templates ``q4k_*``), its ggml block codec (``block_q4_K``: split / join / dequantise, the
scale checks, seeded random valid blocks), its packed RHS layout ``q4kp`` (:class:`Q4KP` on
the shared :class:`~tilegen.layout.kquant.KQuantRhs`, with the hooks the references read),
its C packer, its llama.cpp mapping, its default kernels and the packing protocol; and, as
this package's submodules (the regalloc stage: only the allocator registry imports them),
its register allocators :mod:`.regalloc` (NEON, SVE) and :mod:`.regalloc_sme2`.

block_q4_K (144 bytes):  f16 d | f16 dmin | 12 bytes of 6-bit scales and mins for the 8
sub-blocks of 32 | 128 bytes of nibbles.  Nibble byte 32g + t (g < 4, t < 32) holds weight
64g + t in its low and weight 64g + 32 + t in its high nibble.  Scale bytes s[0..11]:
sub-block j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4,
m = (s[j+4] >> 4) | (s[j] >> 6) << 4.  w = (f32(d)*sc)*q - f32(dmin)*m   (f32 steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ...layout.base import checked_c_expr
from ...layout.ggml import (QK_K, check_block_scales, check_superblocks, f16_bits_to_f32,
                           kquant_blocks, random_f16_scales)
from ...layout.kquant import U16, KQuantRhs, KQuantTerms
from ...reference.kquant import matmul_kernel
from ...records import kquant_manifest

# the plugin's declarations (tilegen.families): its record, allocator modules, GGUF type,
# default kernels and the llama.cpp patch's tiles are those every K-quant family has
ORDER = 30
RECORDS, ALLOCATOR_MODULES, GGML_TYPES, DEFAULT_KERNELS, LLAMA_KERNELS = kquant_manifest(
    "q4_K", "q4kp", "q4k", __name__, i16_tiles=("4vlx1vl",), large=True)

#: llama-quantize's Q4_K_M of the check's synthetic model (Q4_K, Q6_K for some tensors) runs on
#: the patched llama.cpp within this tolerance (docs/llama_cpp_check.md#k-quants derives it)
LLAMA_QUANTIZE = {"q4_k_m": 0.08}
#: and llama-quantize's Q4_K_M of the MoE model (moe_q4_k_m), with the same tolerance
LLAMA_MOE = {"q4_k_m": None}

BLOCK_Q4_K_BYTES = 144
# byte offsets of the fields inside one block (the C packer of the export reads them too)
Q4_K_D, Q4_K_DMIN, Q4_K_SCALES, Q4_K_QS = 0, 2, 4, 16


def split_q4_k(raw, n: int, k: int) -> tuple[np.ndarray, ...]:
    """block_q4_K rows -> (d f16 bits uint16 (n, S), dmin f16 bits uint16 (n, S),
    sc uint8 (n, S, 8), m uint8 (n, S, 8), q uint8 (n, k) 0..15 in k order), S = k/256."""
    b = kquant_blocks(raw, n, k, BLOCK_Q4_K_BYTES, "Q4_K")
    n, S = b.shape[:2]
    d = np.ascontiguousarray(b[..., Q4_K_D:Q4_K_D + 2]).view("<u2").reshape(n, S)
    dmin = np.ascontiguousarray(b[..., Q4_K_DMIN:Q4_K_DMIN + 2]).view("<u2").reshape(n, S)
    s = b[..., Q4_K_SCALES:Q4_K_QS].astype(np.uint8)
    lo4, mid4, hi4 = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo4 & 63, (hi4 & 15) | ((lo4 >> 6) << 4)], axis=-1)
    m = np.concatenate([mid4 & 63, (hi4 >> 4) | ((mid4 >> 6) << 4)], axis=-1)
    qs = b[..., Q4_K_QS:].reshape(n, S, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q.astype(np.uint8)


def join_q4_k(d, dmin, sc, m, q) -> np.ndarray:
    """Inverse of :func:`split_q4_k`: uint8 (n, k/256*144) block_q4_K rows."""
    q = np.asarray(q, dtype=np.uint8)
    n, k = q.shape
    S = check_superblocks(k)
    sc = np.asarray(sc, dtype=np.uint8).reshape(n, S, 8)
    m = np.asarray(m, dtype=np.uint8).reshape(n, S, 8)
    s = np.concatenate([(sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6),
                        (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6),
                        (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)], axis=-1)
    qq = q.reshape(n, S, 4, 2, 32)
    qs = (qq[:, :, :, 0] & 15) | ((qq[:, :, :, 1] & 15) << 4)
    dd = np.ascontiguousarray(np.asarray(d, dtype="<u2").reshape(n, S)).view(np.uint8)
    dm = np.ascontiguousarray(np.asarray(dmin, dtype="<u2").reshape(n, S)).view(np.uint8)
    return np.concatenate([dd.reshape(n, S, 2), dm.reshape(n, S, 2), s.astype(np.uint8),
                           qs.reshape(n, S, 128).astype(np.uint8)], axis=-1).reshape(n, -1)


def q4_k_values(d, dmin, sc, m, q) -> np.ndarray:
    """float32 (R, k) weights of split Q4_K fields, in gguf.quants' float32 order:
    ``(f32(d) * sc) * q - f32(dmin) * m`` (each step one f32 rounding)."""
    q = np.asarray(q)
    R, k = q.shape
    S = k // QK_K
    df = f16_bits_to_f32(d).reshape(R, S, 1, 1)
    mf = f16_bits_to_f32(dmin).reshape(R, S, 1, 1)
    with np.errstate(invalid="ignore", over="ignore"):
        ds = (df * np.asarray(sc).reshape(R, S, 8, 1).astype(np.float32)).astype(np.float32)
        dm = (mf * np.asarray(m).reshape(R, S, 8, 1).astype(np.float32)).astype(np.float32)
        w = (ds * q.reshape(R, S, 8, 32).astype(np.float32)).astype(np.float32) - dm
    return w.astype(np.float32).reshape(R, k)


def dequantize_q4_k(raw, n: int, k: int) -> np.ndarray:
    """block_q4_K rows -> float32 (n, k), bit for bit ``gguf.quants.dequantize``."""
    return q4_k_values(*split_q4_k(raw, n, k))


def check_q4_k_scales(d, dmin) -> None:
    """LayoutError naming the first block/row whose f16 d or dmin is NaN or Inf."""
    check_block_scales(d, "Q4_K", "d")
    check_block_scales(dmin, "Q4_K", "dmin")



def random_q4_k(n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid block_q4_K rows (uint8 (n, k/256*144)): positive finite d and dmin,
    every 6-bit scale/min and nibble drawn uniformly (no value fixed to zero)."""
    rng = np.random.default_rng(seed)
    S = check_superblocks(k)
    return join_q4_k(random_f16_scales(rng, (n, S), 2e-3), random_f16_scales(rng, (n, S), 1e-3),
                     rng.integers(0, 64, (n, S, 8)), rng.integers(0, 64, (n, S, 8)),
                     rng.integers(0, 16, (n, k)))



@dataclass(frozen=True)
class Q4KP(KQuantRhs):
    """``q4kp<nr>x<kr>`` from ggml block_q4_K (docs/layouts.md#q4kp).

    Column group of nr columns = k/256 SB records of ``148*nr`` bytes::

        +0        nr x f16 d                      +2*nr   nr x f16 dmin
        +4*nr     scales 8 x nr uint8, [j][c]     +12*nr  mins nr x 8 uint8, [c][j]
        +20*nr    nibbles: 8 sub-blocks of 16*nr bytes; in sub-block j, 32/kr chunks of
                  nr*kr/2 bytes; chunk i, column c, byte b < L: low nibble = q[32j + kr*i + b],
                  high nibble = q[32j + kr*i + b + L]
    """

    nr: int
    kr: int

    format = "q4kp"
    random_ggml = staticmethod(random_q4_k)     # seeded random valid block_q4_K rows
    label_prefix = "q4kp"

    def __post_init__(self) -> None:
        self.check_kquant(nr=self.nr)

    # -- geometry (generator) ------------------------------------------------------------
    d_bytes = 2                 # f16 d, f16 dmin
    subblocks = 8               # sub-blocks of 32 per SB (one scale, one min each)
    # an SB record of a group, per column: d, dmin, 8 scales ([j][c]), 8 mins ([c][j]), the
    # nibbles of 256 values; d_offset .. nibbles_offset and sb_record_bytes (148*nr) derive
    sb_parts = (("d", "d_bytes"), ("dmin", "d_bytes"), ("scales", "subblocks"),
                ("mins", "subblocks"), ("nibbles", QK_K // 2))

    @property
    def subblock_bytes(self) -> int:
        """Nibble bytes of one sub-block of 32 (16*nr)."""
        return self.nr * self.sub_k // 2

    @property
    def chunks_per_subblock(self) -> int:
        return self.sub_k // self.kr

    def min_offset(self, c: int, j: int) -> int:
        return self.mins_offset + c * self.subblocks + j

    def nibble_offset(self, c: int, t: int) -> tuple[int, int]:
        """(offset inside an SB record, 0 low / 1 high nibble) of column slot c, value t < 256."""
        j, u = divmod(t, self.sub_k)
        i, r = divmod(u, self.kr)
        return (self.nibbles_offset + j * self.subblock_bytes + i * self.chunk_bytes
                + c * self.L + r % self.L, r // self.L)

    # -- the family's hooks on KQuantRhs: its ggml codec and integer terms ---------------
    kind = "q4_K"

    @staticmethod
    def split_blocks(raw, n: int, k: int) -> tuple:
        d, dmin, sc, m, q = split_q4_k(raw, n, k)
        check_q4_k_scales(d, dmin)
        return d, dmin, sc, m, q

    values = staticmethod(q4_k_values)

    @staticmethod
    def terms(d, dmin, sc, m, q) -> KQuantTerms:
        """w = d * sc * q - dmin * m: q 0..15 per sub-block of 32, one min per sub-block."""
        return KQuantTerms(d, sc, q, 32, dmin, m)

    # -- packers -------------------------------------------------------------------------
    def pack_split(self, d, dmin, sc, m, q) -> np.ndarray:
        """Pack split Q4_K fields (as :func:`split_q4_k` gives them: d and
        dmin f16 bits (n, S), sc and m uint8 (n, S, 8), q uint8 (n, k) 0..15)."""
        q, n, S, G = self._split_geometry(q)
        nr = self.nr
        dd = self._padded(np.asarray(d, dtype=U16).reshape(n, S), n)
        dm = self._padded(np.asarray(dmin, dtype=U16).reshape(n, S), n)
        scp = self._padded(np.asarray(sc, dtype=np.uint8).reshape(n, S, 8), n)
        mp = self._padded(np.asarray(m, dtype=np.uint8).reshape(n, S, 8), n)
        qp = self._padded(q.reshape(n, S, QK_K), n)

        scales = scp.reshape(G, nr, S, 8).transpose(0, 2, 3, 1).reshape(G, S, 8 * nr)
        mins = mp.reshape(G, nr, S, 8).transpose(0, 2, 1, 3).reshape(G, S, 8 * nr)
        nib = self._interleave(qp.reshape(G * nr, S * 8, self.sub_k), G, S * 8, self.sub_k)
        out = np.concatenate([self._f16_columns(dd, G, S), self._f16_columns(dm, G, S), scales,
                              mins, nib.reshape(G, S, -1)], axis=2)
        return out.astype(np.uint8).reshape(-1)

    # -- readers -------------------------------------------------------------------------
    def unpack(self, packed, n: int, k: int, rows=None) -> tuple[np.ndarray, ...]:
        """(d uint16 (R, S), dmin uint16 (R, S), sc uint8 (R, S, 8), m uint8 (R, S, 8),
        q uint8 (R, k)) of ``rows`` (default all n): ggml's per-weight fields."""
        rec, g, i = self._records(packed, n, k, rows)
        G, S = rec.shape[:2]
        nr = self.nr
        d = np.ascontiguousarray(rec[..., :self.dmin_offset]).view(U16)            # (G, S, nr)
        dmin = np.ascontiguousarray(rec[..., self.dmin_offset:self.scales_offset]).view(U16)
        sc = rec[..., self.scales_offset:self.mins_offset].reshape(G, S, 8, nr)
        mins = rec[..., self.mins_offset:self.nibbles_offset].reshape(G, S, nr, 8)
        nib = self._deinterleave(rec[..., self.nibbles_offset:].reshape(G, S * 8, -1), self.sub_k)
        q = nib[g, :, :, i].reshape(g.size, k)          # (R, S*8, C, 2, L) -> k order
        return (d[g, :, i], dmin[g, :, i], sc[g, :, :, i].astype(np.uint8),
                mins[g, :, i].astype(np.uint8), q.astype(np.uint8))


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of q4kp (template ``export/pack/q4kp.c.j2``): its layout banner and
    the expressions the template fills in, each checked against :class:`Q4KP` at the
    K-quant geometries ``geo`` (dicts of nr, kr, k) the export gives."""
    ref = Q4KP(4, 8)
    qk, db, sbk, nsb = ref.qk, ref.d_bytes, ref.sub_k, ref.subblocks
    lay = lambda nr, kr, **_: Q4KP(nr, kr)  # noqa: E731
    rec = checked_c_expr(f"nr * (2 * {db} + 2 * {nsb} + {nsb} * {sbk} // 2)",
                         lambda k, **g: lay(**g).sb_record_bytes, geo)
    stride = checked_c_expr(f"(k // {qk}) * nr * (2 * {db} + 2 * {nsb} + {nsb} * {sbk} // 2)",
                            lambda k, **g: lay(**g).group_stride(k), geo)
    cgeo = [dict(g, c=c, j=j) for g in geo for c in (0, g["nr"] - 1) for j in (0, 5)]
    d_f = checked_c_expr(f"c * {db}", lambda c, j, **g: lay(**g).d_offset + c * db, cgeo)
    dmin_f = checked_c_expr(f"nr * {db} + c * {db}", lambda c, j, **g: lay(**g).dmin_offset + c * db, cgeo)
    sc_f = checked_c_expr(f"nr * 2 * {db} + j * nr + c", lambda c, j, **g: lay(**g).scale_offset(j, c), cgeo)
    m_f = checked_c_expr(f"nr * (2 * {db} + {nsb}) + c * {nsb} + j",
                         lambda c, j, **g: lay(**g).min_offset(c, j), cgeo)
    tgeo = [dict(g, c=c, t=t) for g in geo for c in (0, g["nr"] - 1) for t in (0, 3, 37, 255)]
    nib = checked_c_expr(f"nr * (2 * {db} + 2 * {nsb}) + (t // {sbk}) * (nr * {sbk} // 2) + "
                         f"(t % {sbk}) // kr * (nr * kr // 2) + c * (kr // 2) + (t % kr) % (kr // 2)",
                         lambda c, t, **g: lay(**g).nibble_offset(c, t)[0], tgeo)
    shift = checked_c_expr("(t % kr) // (kr // 2) * 4", lambda c, t, **g: 4 * lay(**g).nibble_offset(c, t)[1],
                           tgeo)
    return dict(layout=f"q4kp<nr>x<kr/2> ({Q4KP.__module__}.{Q4KP.__name__})", anchor="q4kp",
                template="q4kp.c.j2",
                context=dict(stride=stride, rec=rec, d_f=d_f, dmin_f=dmin_f, sc_f=sc_f, m_f=m_f,
                             nib=nib, shift=shift, qk=qk, nsb=nsb, sbk=sbk,
                             blk=BLOCK_Q4_K_BYTES, b_d=Q4_K_D, b_dmin=Q4_K_DMIN,
                             b_sc=Q4_K_SCALES, b_qs=Q4_K_QS))


LAYOUTS = (Q4KP,)
C_PACKERS = {"kai_rhs_pack_nxk_q4kp_q4k": c_packer}     # the export's (tilegen.export.packers_c)
pack = Q4KP.pack_weights             # the packing protocol every K-quant shares
gguf_layout = Q4KP.gguf_layout
#: dst float32 (m, n) of a q4_K kernel reading ``q8kp<mr>x<kr>`` and ``q4kp<nr>x<kr>``
#: (lhs_packed, rhs_packed, m, n, k, mr, nr, kr, clamp_min, clamp_max): tilegen's kernel
#: arithmetic, bit exact (:func:`tilegen.reference.kquant.matmul_kernel`)
matmul_q8kp_q4kp = partial(matmul_kernel, Q4KP)
