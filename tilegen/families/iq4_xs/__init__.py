"""The ``iq4_xs`` family: ggml's IQ4_XS weights (issue #32) against Q8_K-style activations.

Everything that is IQ4_XS's own: its record (NEON, SVE and SME2 realisations on the K-quant
skeletons: templates ``iq4xs_neon`` (on q4_K's), ``iq4xs_sve``, ``iq4xs_sme2*``), its ggml block codec (``block_iq4_xs``: split / join / dequantise,
the scale check, seeded random valid blocks), its packed RHS layout ``iq4xsp``
(:class:`IQ4XSP` on the shared :class:`~tilegen.layout.kquant.KQuantRhs`, with the hooks the
references read), its C packer, its llama.cpp mapping, its default kernels and the packing
protocol; and, as this package's submodules (the regalloc stage: only the allocator registry
imports them), its register allocators :mod:`.regalloc` (NEON, SVE) and :mod:`.regalloc_sme2`.

block_iq4_xs (136 bytes):  f16 d | u16 scales_h | 4 bytes scales_l | 128 bytes of 4-bit
indices.  Sub-block j < 8 of 32 values: ls_j = (scales_l[j // 2] >> 4 * (j % 2)) & 15 |
((scales_h >> 2j) & 3) << 4 (6 bits), its scale sc_j = ls_j - 32 (-32..31); index byte
16j + b (b < 16) holds value 32j + b in its low and 32j + 16 + b in its high nibble;
w = (f32(d) * sc_j) * kvalues[idx] (f32 steps), kvalues the 16 int8 of ``KVALUES``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from ...callconv import Q8
from ...layout.base import checked_c_expr
from ...layout.ggml import (QK_K, check_block_scales, check_superblocks, f16_bits_to_f32,
                           kquant_blocks, random_f16_scales)
from ...layout.kquant import U16, KQuantRhs, KQuantTerms
from ...records import (KQUANT_LLAMA_KERNELS, FamilyInfo, kquant_default_kernels, kquant_impls,
                         kquant_sme2_impls, kquant_sve_impls)
from ...reference.f32 import fma_f32
from ...reference.kquant import matmul_kernel, quantize_q8_k

# the plugin's declarations (tilegen.families): the NEON, SVE and SME2 realisations every
# K-quant family has, its default kernels and the llama.cpp patch's tiles
ORDER = 45
RECORDS = (FamilyInfo(name="iq4_xs", lhs="q8kp", rhs="iq4xsp",
                      impls={**kquant_impls("iq4xs"), **kquant_sve_impls("iq4xs"),
                             **kquant_sme2_impls("iq4xs", ("4vlx1vl",), large=True)},
                      kinds=("iq4_xs",), abi=Q8, quantized=True),)
ALLOCATOR_MODULES = (f"{__name__}.regalloc", f"{__name__}.regalloc_sme2")
GGML_TYPES = {"IQ4_XS": "iq4_xs"}
#: ggml's Arm repack has no IQ4_XS kernels
GGML_REPACK = ()
#: what ggml runs for IQ4_XS instead (bench/vs_ggml.py measures tilegen's against it): the NEON
#: vec_dot of ggml-cpu/arch/arm/quants.c on block_q8_K activations, (regime, function,
#: instruction it multiplies with, nrc); its type traits have nrows 1 (no i8mm form), so
#: mul_mat calls it once per output for m > 1 as for m = 1
GGML_VEC_DOT = (("gemm", "ggml_vec_dot_iq4_xs_q8_K", "sdot", 1),
                ("gemv", "ggml_vec_dot_iq4_xs_q8_K", "sdot", 1))
DEFAULT_KERNELS = kquant_default_kernels("iq4_xs", RECORDS[0].impls["sme2"].large_gemm)
LLAMA_KERNELS = KQUANT_LLAMA_KERNELS
#: llama-quantize's IQ4_XS of the check's synthetic model runs on the patched llama.cpp within
#: this tolerance (docs/llama_cpp_check.md: Q4_K_M's derivation, the same Q8_K activations)
LLAMA_QUANTIZE = {"iq4_xs": 0.08}
#: and llama-quantize's IQ4_XS of the MoE model (moe_iq4_xs), with the same tolerance
LLAMA_MOE = {"iq4_xs": None}

BLOCK_IQ4_XS_BYTES = 136
# byte offsets of the fields inside one block (the C packer of the export reads them too)
IQ4_XS_D, IQ4_XS_SCALES_H, IQ4_XS_SCALES_L, IQ4_XS_QS = 0, 2, 4, 8
#: ggml's kvalues_iq4nl: the int8 value of each 4-bit index
KVALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
SCALE_BIAS = 32                 # sc = ls - 32


def split_iq4_xs(raw, n: int, k: int) -> tuple[np.ndarray, ...]:
    """block_iq4_xs rows -> (d f16 bits uint16 (n, S), sc int8 (n, S, 8) = ls - 32, idx uint8
    (n, k) 0..15 in k order; the weight is (d*sc)*KVALUES[idx])."""
    b = kquant_blocks(raw, n, k, BLOCK_IQ4_XS_BYTES, "IQ4_XS")
    n, S = b.shape[:2]
    d = np.ascontiguousarray(b[..., IQ4_XS_D:IQ4_XS_D + 2]).view("<u2").reshape(n, S)
    sh = np.ascontiguousarray(b[..., IQ4_XS_SCALES_H:IQ4_XS_SCALES_L]).view("<u2").reshape(n, S, 1)
    sl = b[..., IQ4_XS_SCALES_L:IQ4_XS_QS]
    lo = np.stack([sl & 15, sl >> 4], axis=-1).reshape(n, S, 8)
    hi = (sh >> (2 * np.arange(8, dtype=np.uint16))) & 3
    sc = (lo.astype(np.int16) | (hi.astype(np.int16) << 4)) - SCALE_BIAS
    qs = b[..., IQ4_XS_QS:].reshape(n, S, 8, 1, 16)
    idx = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k)
    return d, sc.astype(np.int8), idx.astype(np.uint8)


def join_iq4_xs(d, sc, idx) -> np.ndarray:
    """Inverse of :func:`split_iq4_xs`: uint8 (n, k/256*136) block_iq4_xs rows."""
    idx = np.asarray(idx, dtype=np.uint8)
    n, k = idx.shape
    S = check_superblocks(k)
    ls = (np.asarray(sc, dtype=np.int16).reshape(n, S, 8) + SCALE_BIAS).astype(np.uint16)
    sl = ((ls[..., 0::2] & 15) | ((ls[..., 1::2] & 15) << 4)).astype(np.uint8)
    sh = (((ls >> 4) & 3) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=-1).astype("<u2")
    qq = idx.reshape(n, S, 8, 2, 16)
    qs = (qq[..., 0, :] & 15) | ((qq[..., 1, :] & 15) << 4)
    dd = np.ascontiguousarray(np.asarray(d, dtype="<u2").reshape(n, S)).view(np.uint8)
    return np.concatenate([dd.reshape(n, S, 2), np.ascontiguousarray(sh).view(np.uint8).reshape(n, S, 2),
                           sl, qs.reshape(n, S, 128).astype(np.uint8)], axis=-1).reshape(n, -1)


def iq4_xs_values(d, sc, idx) -> np.ndarray:
    """float32 (R, k) weights of split IQ4_XS fields, gguf.quants' order:
    ``(f32(d) * sc) * KVALUES[idx]`` (each step one f32 rounding)."""
    idx = np.asarray(idx)
    R, k = idx.shape
    S = k // QK_K
    df = f16_bits_to_f32(d).reshape(R, S, 1, 1)
    kv = np.asarray(KVALUES, dtype=np.float32)[idx].reshape(R, S, 8, 32)
    with np.errstate(invalid="ignore", over="ignore"):
        dl = (df * np.asarray(sc).reshape(R, S, 8, 1).astype(np.float32)).astype(np.float32)
        return (dl * kv).astype(np.float32).reshape(R, k)


def dequantize_iq4_xs(raw, n: int, k: int) -> np.ndarray:
    """block_iq4_xs rows -> float32 (n, k), bit for bit ``gguf.quants.dequantize``."""
    return iq4_xs_values(*split_iq4_xs(raw, n, k))


def random_iq4_xs(n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid block_iq4_xs rows (uint8 (n, k/256*136)): positive finite d, every
    6-bit scale ls (sc = ls - 32, -32..31) and 4-bit index drawn uniformly."""
    rng = np.random.default_rng(seed)
    S = check_superblocks(k)
    return join_iq4_xs(random_f16_scales(rng, (n, S), 1e-3), rng.integers(-32, 32, (n, S, 8)),
                       rng.integers(0, 16, (n, k)))


@dataclass(frozen=True)
class IQ4XSP(KQuantRhs):
    """``iq4xsp<nr>x<kr>`` from ggml block_iq4_xs (docs/layouts.md#iq4xsp).

    Column group of nr columns = k/256 SB records of ``138*nr`` bytes::

        +0        nr x f16 d
        +2*nr     scales 8 x nr int8 sc = ls - 32, [j][c]
        +10*nr    indices: 8 sub-blocks of 16*nr bytes; in sub-block j, 32/kr chunks of
                  nr*kr/2 bytes; chunk i, column c, byte b < L: low nibble = idx[32j + kr*i + b],
                  high nibble = idx[32j + kr*i + b + L]   (idx: 4-bit index into KVALUES)
    """

    nr: int
    kr: int

    format = "iq4xsp"
    random_ggml = staticmethod(random_iq4_xs)   # seeded random valid block_iq4_xs rows
    label_prefix = "iq4xsp"
    kvalues = KVALUES           # the decode table (the kernels' LUTI4 / TBL table)
    ggml_d_offset = IQ4_XS_D    # where a block_iq4_xs holds its f16 d (the scale checks' field)

    def __post_init__(self) -> None:
        self.check_kquant(nr=self.nr)

    # -- geometry (generator) ------------------------------------------------------------
    d_bytes = 2                 # f16 d
    subblocks = 8               # sub-blocks of 32 per SB (one signed int8 scale each)
    # an SB record of a group, per column: d, 8 int8 scales ([j][c]), the indices of 256
    # values; d_offset, scales_offset, nibbles_offset and sb_record_bytes (138*nr) derive
    sb_parts = (("d", "d_bytes"), ("scales", "subblocks"), ("nibbles", QK_K // 2))

    @property
    def subblock_bytes(self) -> int:
        """Index bytes of one sub-block of 32 (16*nr)."""
        return self.nr * self.sub_k // 2

    @property
    def chunks_per_subblock(self) -> int:
        return self.sub_k // self.kr

    def nibble_offset(self, c: int, t: int) -> tuple[int, int]:
        """(offset inside an SB record, 0 low / 1 high nibble) of column slot c, value t < 256."""
        j, u = divmod(t, self.sub_k)
        i, r = divmod(u, self.kr)
        return (self.nibbles_offset + j * self.subblock_bytes + i * self.chunk_bytes
                + c * self.L + r % self.L, r // self.L)

    # -- the family's hooks on KQuantRhs: its ggml codec and integer terms ---------------
    kind = "iq4_xs"

    @staticmethod
    def split_blocks(raw, n: int, k: int) -> tuple:
        d, sc, idx = split_iq4_xs(raw, n, k)
        check_block_scales(d, "IQ4_XS", "d")
        return d, sc, idx

    values = staticmethod(iq4_xs_values)

    @staticmethod
    def terms(d, sc, idx) -> KQuantTerms:
        """w = d * sc * KVALUES[idx]: one signed scale per sub-block of 32, no min term."""
        return KQuantTerms(d, sc, np.asarray(KVALUES, dtype=np.int16)[np.asarray(idx)], 32)

    # -- packers -------------------------------------------------------------------------
    def pack_split(self, d, sc, idx) -> np.ndarray:
        """Pack split IQ4_XS fields (as :func:`split_iq4_xs` gives them: d f16 bits (n, S),
        sc int8 (n, S, 8), idx uint8 (n, k) 0..15)."""
        idx, n, S, G = self._split_geometry(idx)
        nr = self.nr
        dd = self._padded(np.asarray(d, dtype=U16).reshape(n, S), n)
        scp = self._padded(np.asarray(sc, dtype=np.int8).reshape(n, S, 8), n).view(np.uint8)
        qp = self._padded(idx.reshape(n, S, QK_K), n)
        scales = scp.reshape(G, nr, S, 8).transpose(0, 2, 3, 1).reshape(G, S, 8 * nr)
        nib = self._interleave(qp.reshape(G * nr, S * 8, self.sub_k), G, S * 8, self.sub_k)
        out = np.concatenate([self._f16_columns(dd, G, S), scales, nib.reshape(G, S, -1)], axis=2)
        return out.astype(np.uint8).reshape(-1)

    # -- readers -------------------------------------------------------------------------
    def unpack(self, packed, n: int, k: int, rows=None) -> tuple[np.ndarray, ...]:
        """(d uint16 (R, S), sc int8 (R, S, 8), idx uint8 (R, k)) of ``rows`` (default all n)."""
        rec, g, i = self._records(packed, n, k, rows)
        G, S = rec.shape[:2]
        d = np.ascontiguousarray(rec[..., :self.scales_offset]).view(U16)          # (G, S, nr)
        sc = np.ascontiguousarray(rec[..., self.scales_offset:self.nibbles_offset])
        sc = sc.view(np.int8).reshape(G, S, 8, self.nr)
        nib = self._deinterleave(rec[..., self.nibbles_offset:].reshape(G, S * 8, -1), self.sub_k)
        idx = nib[g, :, :, i].reshape(g.size, k)
        return d[g, :, i], sc[g, :, :, i], idx.astype(np.uint8)


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of iq4xsp (template ``export/pack/iq4xsp.c.j2``): its layout banner
    and the expressions the template fills in, each checked against :class:`IQ4XSP` at the
    K-quant geometries ``geo`` (dicts of nr, kr, k) the export gives."""
    ref = IQ4XSP(4, 8)
    qk, db, sbk, nsb = ref.qk, ref.d_bytes, ref.sub_k, ref.subblocks
    lay = lambda nr, kr, **_: IQ4XSP(nr, kr)  # noqa: E731
    per = f"({db} + {nsb} + {nsb} * {sbk} // 2)"
    rec = checked_c_expr(f"nr * {per}", lambda k, **g: lay(**g).sb_record_bytes, geo)
    stride = checked_c_expr(f"(k // {qk}) * nr * {per}", lambda k, **g: lay(**g).group_stride(k), geo)
    cgeo = [dict(g, c=c, j=j) for g in geo for c in (0, g["nr"] - 1) for j in (0, 5)]
    d_f = checked_c_expr(f"c * {db}", lambda c, j, **g: lay(**g).d_offset + c * db, cgeo)
    sc_f = checked_c_expr(f"nr * {db} + j * nr + c", lambda c, j, **g: lay(**g).scale_offset(j, c), cgeo)
    tgeo = [dict(g, c=c, t=t) for g in geo for c in (0, g["nr"] - 1) for t in (0, 3, 37, 255)]
    nib = checked_c_expr(f"nr * ({db} + {nsb}) + (t // {sbk}) * (nr * {sbk} // 2) + "
                         f"(t % {sbk}) // kr * (nr * kr // 2) + c * (kr // 2) + (t % kr) % (kr // 2)",
                         lambda c, t, **g: lay(**g).nibble_offset(c, t)[0], tgeo)
    shift = checked_c_expr("(t % kr) // (kr // 2) * 4", lambda c, t, **g: 4 * lay(**g).nibble_offset(c, t)[1],
                           tgeo)
    return dict(layout=f"iq4xsp<nr>x<kr/2> ({IQ4XSP.__module__}.{IQ4XSP.__name__})", anchor="iq4xsp",
                template="iq4xsp.c.j2",
                context=dict(stride=stride, rec=rec, d_f=d_f, sc_f=sc_f, nib=nib, shift=shift,
                             qk=qk, nsb=nsb, sbk=sbk, kvalues=", ".join(map(str, KVALUES)),
                             bias=SCALE_BIAS, blk=BLOCK_IQ4_XS_BYTES, b_d=IQ4_XS_D,
                             b_sh=IQ4_XS_SCALES_H, b_sl=IQ4_XS_SCALES_L, b_qs=IQ4_XS_QS))


def matmul_ggml(x, raw, n: int, *, generic: bool = False, contract: bool = False) -> np.ndarray:
    """float32 (m, n): ggml's IQ4_XS x Q8_K dot product in numpy (the error table's ggml column,
    bench/kquant_error.py): :func:`~tilegen.reference.kquant.quantize_q8_k` of ``x``, then per
    output in ggml's float order.  The Arm NEON ``vec_dot_iq4_xs_q8_K`` (what llama.cpp runs on
    Arm; ``generic`` False): per super-block the exact int S = sum_j (ls_j - 32) * dot_j, then
    ``sumf += (f32(d) * d_a) * f32(S)``.  The generic C (``generic``): per sub-block
    ``d_j = (f32(d) * d_a) * (ls_j - 32)`` and ``sumf += d_j * f32(dot_j)``.  Every step is one
    f32 rounding (``contract``: the ``sumf +=`` fused, as compilers allowed to contract do)."""
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    S = check_superblocks(k)
    qa, da, _ = quantize_q8_k(x)
    d, sc, idx = IQ4XSP.split_blocks(raw, n, k)
    w = np.asarray(KVALUES, dtype=np.int64)[idx].reshape(n, S, 8, 32)
    a = qa.astype(np.int64).reshape(m, S, 8, 32)
    dots = np.einsum("msjt,nsjt->mnsj", a, w)                          # exact, (m, n, S, 8)
    df = f16_bits_to_f32(d)                                            # (n, S)
    sumf = np.zeros((m, n), np.float32)

    def add(acc, f, v):
        return fma_f32(f, v, acc) if contract else (acc + (f * v).astype(np.float32)).astype(np.float32)

    for s in range(S):
        fac = (df[None, :, s] * da[:, s:s + 1]).astype(np.float32)     # (m, n)
        if generic:
            for j in range(8):
                dj = (fac * np.float32(sc[:, s, j])[None, :]).astype(np.float32)
                sumf = add(sumf, dj, dots[:, :, s, j].astype(np.float32))
        else:
            tot = (dots[:, :, s, :] * sc[None, :, s, :].astype(np.int64)).sum(axis=-1)
            sumf = add(sumf, fac, tot.astype(np.float32))
    return sumf


LAYOUTS = (IQ4XSP,)
C_PACKERS = {"kai_rhs_pack_nxk_iq4xsp_iq4xs": c_packer}   # the export's (tilegen.export.packers_c)
pack = IQ4XSP.pack_weights           # the packing protocol every K-quant shares
gguf_layout = IQ4XSP.gguf_layout
#: dst float32 (m, n) of an iq4_xs kernel reading ``q8kp<mr>x<kr>`` and ``iq4xsp<nr>x<kr>``
#: (lhs_packed, rhs_packed, m, n, k, mr, nr, kr, clamp_min, clamp_max): tilegen's kernel
#: arithmetic, bit exact (:func:`tilegen.reference.kquant.matmul_kernel`)
matmul_q8kp_iq4xsp = partial(matmul_kernel, IQ4XSP)
