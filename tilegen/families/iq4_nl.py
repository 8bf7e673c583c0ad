"""The ``iq4_nl`` family: llama.cpp's IQ4_NL weights (block_iq4_nl: f16 d, 32 4-bit indices
into the non-linear int8 table ``kvalues_iq4nl``; w = d * kvalues[i]) against int8
activations quantised per 32-block with an f16 scale (``qsi8d32p``, as ggml's q8_0).

Design (docs/layouts.md#iq4nlp): a block_iq4_nl is a block_q4_0 byte for byte except for the
meaning of a nibble (an index into ``kvalues_iq4nl`` instead of ``u - 8``), so the family is
q4_0's int4 x int8 kernels with the weight decode replaced:

* **layout** ``iq4nlp<nr>x<kr/sr>`` (:class:`IQ4NLP`): q4_0's ``qsi4c32pscalef16`` geometry
  (per block: nr f16 scales, then bl/kr segments of nr*kr/2 index bytes) on the same shared
  class, with the index bytes copied as they are (no XOR 0x88: they are table indices, not
  offset integers) and the table :data:`KVALUES_IQ4NL` as a layout fact the kernels and the
  references read;
* **kernels**: ``templates/iq4nl_neon.S.j2`` extends q4_0's NEON skeleton
  ``q4_neon.S.j2`` (every strategy: SMULL/SADALP on plain NEON, SDOT by lane, SMMLA, the SDOT
  gemvs) and re-defines its override points: ``decode_setup`` (a 0x0f mask and the table in a
  vector register the allocator gives, ``Q4Regs.table``, because the layout asks for one:
  :attr:`IQ4NLP.table_vectors`), ``decode`` (USHR #4 / AND for the two nibbles, two TBL
  lookups: the int8 weight values themselves, not 16 x v as q4_0's SHL/AND), and
  ``SCVTF_FRAC`` (the integer sums are S, not 16 S, so no fixed-point SCVTF); on SVE
  ``templates/iq4nl_sve.S.j2`` alike; on SME2 q4_0's SMOPA gemm (``iq4nl_sme2.S.j2`` extends
  ``q4_sme.S.j2``) and ZA-array SDOT gemv (``iq4nl_sme2_gemv.S.j2`` extends ``q4_sve.S.j2``),
  the table in ZT0: LUTI4 turns a vector of index bytes into two int8 vectors in nibble order
  and UZP splits them into the low and high nibbles' values (q4_0's two operand vectors);
* **arithmetic** (:func:`matmul_qsi8d32p_iq4nlp`): per block S = sum q_lhs * kvalues[i]
  exactly in int32; a = fma(f32(S), f32(dr) * f32(dl), a); clamp.  The same order as q4_0's.

Float weights are refused (pass ggml blocks through ``from_ggml=`` or a GGUF file): ggml's
``quantize_row_iq4_nl_ref`` (its scale search) is not ported.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..callconv import Q4
from ..layout.base import LayoutError
from ..layout.ggml import (as_bytes, check_block_scales, f16_bits_to_f32, join_q4_0,
                           random_f16_scales, split_q4_0)
from ..layout.rhs_int4 import QSI4C32PScaleF16
from ..reference.q4 import matmul_qsi8d32p_qsi4c32pscalef16
from ..records import TABLE32_LLAMA_KERNELS, FamilyInfo, table32_default_kernels, table32_impls

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS", "GGML_TYPES",
           "KVALUES_IQ4NL", "QK_IQ4NL", "IQ4NL_BLOCK_BYTES", "split_iq4_nl", "join_iq4_nl",
           "dequantize_iq4_nl", "random_iq4_nl", "IQ4NLP", "matmul_qsi8d32p_iq4nlp",
           "gguf_layout", "pack", "c_packer", "C_PACKERS"]

ORDER = 25

#: ggml's ``kvalues_iq4nl``: the 16 int8 values a 4-bit index selects
KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
QK_IQ4NL = 32                   # k values per block
IQ4NL_BLOCK_BYTES = 18          # f16 d + 16 index bytes


# ----------------------------------------------------------------------------------------
# ggml block_iq4_nl codec (the byte structure of block_q4_0: f16 d, byte j = index j (low
# nibble) | index j + 16 (high nibble))
# ----------------------------------------------------------------------------------------
def split_iq4_nl(raw, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """block_iq4_nl bytes (n rows, or flat) -> (indices uint8 (n, k) in k order, f16 d bits
    uint16 (n, k/32))."""
    return split_q4_0(raw, n, k)


def join_iq4_nl(idx: np.ndarray, d_f16: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_iq4_nl`: indices (n, k) + f16 bits (n, k/32) -> uint8 rows."""
    return join_q4_0(idx, d_f16)


def _kv() -> np.ndarray:
    return np.array(KVALUES_IQ4NL, np.int8)


def dequantize_iq4_nl(raw, n: int, k: int) -> np.ndarray:
    """float32 (n, k) = f32(d) * kvalues_iq4nl[i] (ggml's dequantize_row_iq4_nl; every
    product is exact in f32: 11 x 8 significant bits)."""
    i, d = split_iq4_nl(raw, n, k)
    v = _kv()[i].astype(np.float32).reshape(n, k // QK_IQ4NL, QK_IQ4NL)
    with np.errstate(invalid="ignore"):
        return (f16_bits_to_f32(d)[..., None] * v).astype(np.float32).reshape(n, k)


def random_iq4_nl(n: int, k: int, seed: int) -> np.ndarray:
    """Seeded random valid block_iq4_nl rows (uint8 (n, k/32*18)): positive finite f16 d,
    every index drawn uniformly from 0..15."""
    if k < 1 or k % QK_IQ4NL:
        raise LayoutError(f"k={k} must be a positive multiple of {QK_IQ4NL}")
    rng = np.random.default_rng(seed)
    return join_iq4_nl(rng.integers(0, 16, (n, k)).astype(np.uint8),
                       random_f16_scales(rng, (n, k // QK_IQ4NL), 1e-2))


# ----------------------------------------------------------------------------------------
# the packed RHS: iq4nlp<nr>x<kr/sr>
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IQ4NLP(QSI4C32PScaleF16):
    """``iq4nlp<nr>x<kr/sr>``: block_iq4_nl rows repacked in q4_0's qsi4c32pscalef16 geometry
    (docs/layouts.md#iq4nlp).  Group of ``nr`` rows, per 32-block ``b`` (stride
    ``nr * 18``)::

        +b*18*nr            nr x f16 d (raw copies)
        +b*18*nr + 2*nr     32/kr segments of nr*kr/2 bytes: [slot 0: kr/2 bytes]..., the
                            source index bytes s*kr/2 .. (s+1)*kr/2 - 1 unchanged

    A byte holds index q (low nibble) and index q + 16 (high nibble) of its block; the weight
    is d * KVALUES_IQ4NL[index] (the kernels look the index up with TBL).  As q4_0's, the
    geometry (and the kernels, which take bl as an argument) serve any block length bl; ggml's
    blocks (``pack_from_ggml``) are bl = 32."""

    format = "iq4nlp"
    label_prefix = "iq4nlp"
    name_suffix = ""
    ggml_block = ("IQ4_NL", QK_IQ4NL)
    ggml_only = "iq4_nl"
    random_ggml = staticmethod(random_iq4_nl)
    data_xor = 0                        # index bytes are copied as they are
    #: the int8 values an index selects (the kernels' TBL table, the references' lookup)
    table = KVALUES_IQ4NL
    #: vector registers the kernels' decode holds the table in (the q4 allocator reads it)
    table_vectors = 1
    #: NEON gemvs: every 2nd RHS vector's nibbles split on the integer pipes, not the vector
    #: pipes (regalloc.q4._gpr_split; the split is this family's decode (templates/iq4nl_neon.S.j2))
    gpr_split_every = 2

    def pack(self, raw, n: int | None = None, k: int | None = None, *,
             finite_scales: bool = True) -> np.ndarray:
        """Pack block_iq4_nl rows (uint8 (n, k/32*18), or flat with n and k); the block
        scales must be finite (``finite_scales``)."""
        return super().pack(raw, n, k, finite_scales=finite_scales)

    def pack_from_ggml(self, raw, n: int | None = None, k: int | None = None,
                       bias: None = None) -> np.ndarray:
        """:meth:`pack` for ggml block_iq4_nl bytes; ``bias`` must be None (matmul(bias=))."""
        self.require_no_bias(bias)
        if self.bl != QK_IQ4NL:
            raise LayoutError(f"ggml block_iq4_nl data has bl={QK_IQ4NL}, this layout has "
                              f"bl={self.bl}")
        raw = as_bytes(raw)
        if n is not None and k is not None:
            check_block_scales(split_iq4_nl(np.ascontiguousarray(raw).reshape(-1), int(n),
                                            int(k))[1], "IQ4_NL")
        return self.pack(raw, n, k)

    def pack_from_float(self, w, bias: None = None) -> np.ndarray:
        raise LayoutError("iq4_nl weights are taken only as ggml IQ4_NL blocks (from_ggml= / "
                          "pack_from_ggml, e.g. from a GGUF file): tilegen does not quantise "
                          "float weights to IQ4_NL (ggml's quantize_row_iq4_nl_ref is not "
                          "ported)")

    @staticmethod
    def require_no_bias(bias) -> None:
        if bias is not None:
            raise LayoutError("iq4nlp weights carry no bias: pass the bias to matmul(bias=)")

    def unpack_values(self, packed: np.ndarray, n: int, k: int, rows=None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weight values kvalues[i] (R, k) in k order, f16 scale bits (R, k/bl))."""
        src = self.unpack(packed, n, k, rows)
        i, d = split_q4_0(src, src.shape[0], k, bl=self.bl)
        return _kv()[i], d

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k) = f32(d) * kvalues[index]: for bl = 32 ggml's dequantisation
        of the source rows, bit for bit."""
        v, d = self.unpack_values(packed, n, k, rows)
        R = v.shape[0]
        vals = v.astype(np.float32).reshape(R, k // self.bl, self.bl)
        with np.errstate(invalid="ignore"):
            return (f16_bits_to_f32(d)[..., None] * vals).astype(np.float32).reshape(R, k)


def matmul_qsi8d32p_iq4nlp(lhs_packed, rhs_packed, m: int, n: int, k: int, bl: int,
                           mr: int, nr: int, kr: int, sr: int,
                           clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of the iq4_nl kernels, bit for bit: per 32-block b,
    S = sum q[i, t] * kvalues[idx[j, t]] (exact int32); a = fma(f32(S), f32(dr) * f32(dl), a)
    from a = +0 in block order; then a = min(max(a, clamp_min), clamp_max)."""
    return matmul_qsi8d32p_qsi4c32pscalef16(lhs_packed, rhs_packed, m, n, k, bl, mr, nr, kr, sr,
                                            clamp_min, clamp_max, rhs_layout=IQ4NLP)


RECORDS = (FamilyInfo(
    name="iq4_nl", lhs="qsi8d32p", rhs="iq4nlp", kinds=("iq4_nl",), abi=Q4, quantized=True,
    acc_mem=True,
    impls=table32_impls()),)
LAYOUTS = (IQ4NLP,)
ALLOCATOR_MODULES = ("q4", "q4_sme")
GGML_TYPES = {"IQ4_NL": "iq4_nl"}
#: ggml's repack kernels for IQ4_NL on Arm (bench/vs_ggml.py measures tilegen's against them):
#: (regime, function, instruction it multiplies with, columns of its group), on q8_0 blocks
GGML_REPACK = (("gemm", "ggml_gemm_iq4_nl_4x4_q8_0", "sdot", 4),
               ("gemv", "ggml_gemv_iq4_nl_4x4_q8_0", "sdot", 4))
#: issue #32's targets against ggml's best (tilegen / ggml MAC per cycle)
VS_GGML_TARGETS = {"gemm": 1.8, "gemv": 1.3}
DEFAULT_KERNELS = table32_default_kernels("iq4_nl")   # records.table32_default_kernels


def gguf_layout(kind: str, nr: int | None):
    """The layout of IQ4_NL GGUF tensors read without a library: the i8mm/dotprod pair's
    (nr 4, kr 16, sr 2)."""
    return IQ4NLP(nr or 4, 16, 2, QK_IQ4NL)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol: ggml block_iq4_nl bytes repacked (lossless); float weights are
    refused (LayoutError naming from_ggml=)."""
    if from_ggml is not None:
        return lay.pack_from_ggml(from_ggml, n, k, bias=bias)
    return lay.pack_from_float(w, bias=bias)


# ----------------------------------------------------------------------------------------
# the export's C packer (tilegen.export.packers_c): block_iq4_nl rows -> iq4nlp, and the row
# dequantiser of llama.cpp's GET_ROWS, on the RHS packer skeleton export/pack/kquant_rhs.c.j2
# ----------------------------------------------------------------------------------------
def _marked_block(nr: int, c: int, q: int) -> np.ndarray:
    """nr block_iq4_nl rows of one block (d = 1.0, f16 0x3c00) whose only 0xa5 byte is index
    byte q of column c (IQ4NLP.c_repack_exprs finds where the layout's packer puts it)."""
    raw = np.zeros((nr, IQ4NL_BLOCK_BYTES), np.uint8)
    raw[:, 1] = 0x3c
    raw[c, 2 + q] = 0xa5
    return raw


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of iq4nlp (template ``export/pack/iq4nlp.c.j2``): its layout banner
    and the expressions the template fills in, each checked against :class:`IQ4NLP` at the
    geometries ``geo`` (dicts of nr, kr, k) the export gives, but those the layout refuses
    (kr > 16; the shared base's ``c_repack_exprs``).  A record is one 32-k block (its nr f16 d,
    then the index bytes)."""
    return dict(layout=f"iq4nlp<nr>x<kr/2> ({IQ4NLP.__module__}.{IQ4NLP.__name__})",
                anchor="iq4nlp", template="iq4nlp.c.j2",
                context=dict(IQ4NLP.c_repack_exprs(geo, _marked_block), blk=IQ4NL_BLOCK_BYTES,
                             b_d=0, b_qs=IQ4NLP(4, 16).scale_bytes, table=list(KVALUES_IQ4NL)))


C_PACKERS = {"kai_rhs_pack_nxk_iq4nlp_iq4nl": c_packer}   # the export's (tilegen.export.packers_c)

#: the (gemm, gemv) pairs the llama.cpp patch wires for IQ4_NL, per ISA slot (isa, gemm tile,
#: gemv tile, how each multiplies): the sme2, i8mm and dotprod gemms of DEFAULT_KERNELS, each with
#: the gemv of its own ISA on its packing (the table's entry is one ISA)
LLAMA_KERNELS = TABLE32_LLAMA_KERNELS
#: llama-quantize's IQ4_NL files run on the patched build, tolerance as Q4_0's (0.06 of the logit
#: rms, docs/llama_cpp_check.md#tolerances): the activations are q8_0-like int8 32-blocks with an
#: f16 scale (qsi8d32p), the weights exact table values (no second rounding)
LLAMA_QUANTIZE = {"iq4_nl": 0.06}
#: and llama-quantize's IQ4_NL of the MoE model (moe_iq4_nl), with the same tolerance
LLAMA_MOE = {"iq4_nl": None}
