"""The ``mxfp4`` family: ggml's MXFP4 weights (block_mxfp4, 17 bytes per 32 k: one E8M0 byte
e, then 16 bytes of 4-bit E2M1 codes, byte j = code j (low nibble) | code j + 16 (high
nibble)) against int8 activations quantised per 32-block with an f16 scale (``qsi8d32p``).

ggml computes with the int8 table ``kvalues_mxfp4`` (twice the E2M1 values) and the scale
GGML_E8M0_TO_FP32_HALF(e) = 2^(e - 128) (half of 2^(e - 127), subnormal f32 for e < 2), so
w = 2^(e - 128) * KVALUES_MXFP4[code].

Design (docs/layouts.md#mxfp4p): the family is iq4_nl's (:mod:`tilegen.families.iq4_nl`)
with another table and another scale format:

* **layout** ``mxfp4p<nr>x<kr/sr>`` (:class:`MXFP4P`): q4_0's ``qsi4c32pscalef16`` geometry
  on the same shared class (per block: nr 2-byte scales, then bl/kr segments of nr*kr/2 code
  bytes, copied as they are), the scale carried as **bf16** bits: every 2^(e - 128),
  e = 0..255, subnormals included, is a float32 whose low 16 bits are zero, so bf16 holds it
  exactly (``scale_format = "bf16"`` on the shared base, which the kernels read); the table
  :data:`KVALUES_MXFP4` is a layout fact as iq4_nl's;
* **kernels**: iq4_nl's templates (NEON, SVE and the SME2 pair: TBL, or LUTI4 through ZT0,
  reading :attr:`MXFP4P.table`), the bf16 column scales widened by the q4 skeletons from
  ``scale_format`` (SHLL / LSL #16 of the halfword: exact);
* **arithmetic** (:func:`matmul_qsi8d32p_mxfp4p`): per block S = sum q_lhs * kvalues[code]
  exactly in int32; a = fma(f32(S), f32(dr) * f32(dl), a) (dr the bf16 scale, dl the f16 LHS
  scale; the product is exact unless it falls below the f32 normal range, where it rounds
  as IEEE f32); clamp.

Float weights are refused (pass ggml blocks through ``from_ggml=`` or a GGUF file): the
family does not quantise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..callconv import Q4
from ..layout.base import LayoutError
from ..layout.ggml import as_bytes
from ..layout.rhs_int4 import QSI4C32PScaleF16
from ..reference.q4 import matmul_qsi8d32p_qsi4c32pscalef16
from ..records import TABLE32_LLAMA_KERNELS, FamilyInfo, table32_default_kernels, table32_impls

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS", "GGML_TYPES",
           "KVALUES_MXFP4", "QK_MXFP4", "MXFP4_BLOCK_BYTES", "E8M0_HALF_BF16", "split_mxfp4",
           "join_mxfp4", "dequantize_mxfp4", "random_mxfp4", "MXFP4P",
           "matmul_qsi8d32p_mxfp4p", "gguf_layout", "pack", "c_packer", "C_PACKERS"]

ORDER = 26

#: ggml's ``kvalues_mxfp4``: twice the E2M1 value of each 4-bit code
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
QK_MXFP4 = 32                   # k values per block
MXFP4_BLOCK_BYTES = 17          # E8M0 e + 16 code bytes


def _e8m0_half_f32_bits(e: np.ndarray) -> np.ndarray:
    """float32 bits of 2^(e - 128) (GGML_E8M0_TO_FP32_HALF): subnormal for e < 2."""
    e = np.asarray(e, np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e,
                    (np.maximum(e, 1) - np.uint32(1)) << np.uint32(23)).astype(np.uint32)


#: bf16 bits of the scale of every E8M0 byte (index e): the f32 bits' high half, exact
E8M0_HALF_BF16 = (_e8m0_half_f32_bits(np.arange(256)) >> np.uint32(16)).astype(np.uint16)
assert not (_e8m0_half_f32_bits(np.arange(256)) & 0xFFFF).any()
assert (np.diff(E8M0_HALF_BF16.astype(np.int64)) > 0).all()


def _bf16_to_e8m0(bits: np.ndarray) -> np.ndarray:
    """Inverse of :data:`E8M0_HALF_BF16` (LayoutError for bits no E8M0 byte gives)."""
    bits = np.asarray(bits, np.uint16)
    e = np.minimum(np.searchsorted(E8M0_HALF_BF16, bits), 255)
    if not np.array_equal(E8M0_HALF_BF16[e], bits):
        raise LayoutError("mxfp4p scales must be bf16 powers of two 2^(e-128), e = 0..255")
    return e.astype(np.uint8)


# ----------------------------------------------------------------------------------------
# ggml block_mxfp4 codec
# ----------------------------------------------------------------------------------------
def _blocks(raw, n: int, k: int) -> np.ndarray:
    raw = as_bytes(raw)
    if raw.dtype != np.uint8:
        raise LayoutError(f"MXFP4 data must be uint8 bytes, got {raw.dtype}")
    if k < 1 or k % QK_MXFP4 or n < 1:
        raise LayoutError(f"MXFP4 needs n >= 1 and k a positive multiple of {QK_MXFP4}, "
                          f"got n={n}, k={k}")
    if raw.size != n * k // QK_MXFP4 * MXFP4_BLOCK_BYTES:
        raise LayoutError(f"MXFP4 data for n={n}, k={k} must hold "
                          f"{n * k // QK_MXFP4 * MXFP4_BLOCK_BYTES} bytes, got shape {raw.shape}")
    return np.ascontiguousarray(raw).reshape(n, k // QK_MXFP4, MXFP4_BLOCK_BYTES)


def split_mxfp4(raw, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """block_mxfp4 bytes (n rows, or flat) -> (codes uint8 (n, k) in k order, E8M0 bytes
    uint8 (n, k/32))."""
    b = _blocks(raw, n, k)
    qs = b[..., 1:]
    codes = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)
    return codes.reshape(n, k), b[..., 0].copy()


def join_mxfp4(codes: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_mxfp4`: codes (n, k) + E8M0 bytes (n, k/32) -> uint8 rows."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    c = codes.reshape(n, k // QK_MXFP4, QK_MXFP4)
    qs = (c[..., :16] & 0x0F) | ((c[..., 16:] & 0x0F) << 4)
    e = np.asarray(e, np.uint8).reshape(n, k // QK_MXFP4, 1)
    return np.concatenate([e, qs], axis=-1).reshape(n, -1).astype(np.uint8)


def _kv() -> np.ndarray:
    return np.array(KVALUES_MXFP4, np.int8)


def dequantize_mxfp4(raw, n: int, k: int) -> np.ndarray:
    """float32 (n, k) = 2^(e - 128) * kvalues_mxfp4[code] (ggml's dequantize_row_mxfp4; every
    product is exact or an IEEE-rounded f32 subnormal)."""
    c, e = split_mxfp4(raw, n, k)
    v = _kv()[c].astype(np.float32).reshape(n, k // QK_MXFP4, QK_MXFP4)
    d = _e8m0_half_f32_bits(e).view(np.float32)
    with np.errstate(over="ignore"):                   # 12 * 2^127 is inf, as in ggml
        return (d[..., None] * v).astype(np.float32).reshape(n, k)


def random_mxfp4(n: int, k: int, seed: int, e_range: tuple[int, int] = (118, 130)
                 ) -> np.ndarray:
    """Seeded random valid block_mxfp4 rows (uint8 (n, k/32*17)): E8M0 bytes drawn from
    ``e_range`` (inclusive; every byte 0..255 is a valid scale), every code from 0..15."""
    if k < 1 or k % QK_MXFP4:
        raise LayoutError(f"k={k} must be a positive multiple of {QK_MXFP4}")
    rng = np.random.default_rng(seed)
    lo, hi = e_range
    return join_mxfp4(rng.integers(0, 16, (n, k)).astype(np.uint8),
                      rng.integers(lo, hi + 1, (n, k // QK_MXFP4)).astype(np.uint8))


# ----------------------------------------------------------------------------------------
# the packed RHS: mxfp4p<nr>x<kr/sr>
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MXFP4P(QSI4C32PScaleF16):
    """``mxfp4p<nr>x<kr/sr>``: block_mxfp4 rows repacked in q4_0's qsi4c32pscalef16 geometry
    (docs/layouts.md#mxfp4p).  Group of ``nr`` rows, per 32-block ``b`` (stride ``nr * 18``)::

        +b*18*nr            nr x bf16 scale 2^(e - 128) (E8M0_HALF_BF16[e], exact)
        +b*18*nr + 2*nr     32/kr segments of nr*kr/2 bytes: [slot 0: kr/2 bytes]..., the
                            source code bytes s*kr/2 .. (s+1)*kr/2 - 1 unchanged

    The packer reads ggml's 17-byte blocks: it turns each into the shared class's source block
    (2-byte scale + 16 code bytes, the scale as bf16) and packs that; :meth:`unpack` gives the
    17-byte blocks back (lossless)."""

    format = "mxfp4p"
    label_prefix = "mxfp4p"
    name_suffix = ""
    ggml_block = ("MXFP4", QK_MXFP4)
    ggml_only = "mxfp4"
    random_ggml = staticmethod(random_mxfp4)
    data_xor = 0                        # code bytes are copied as they are
    scale_format = "bf16"               # the block scales' format (the kernels' widening)
    #: the int8 values a code selects (the kernels' TBL table, the references' lookup)
    table = KVALUES_MXFP4
    #: vector registers the kernels' decode holds the table in (the q4 allocator reads it)
    table_vectors = 1
    #: NEON gemvs: every 2nd RHS vector's nibbles split on the integer pipes, not the vector
    #: pipes (regalloc.q4._gpr_split; the split is iq4_nl's decode template, which this family uses)
    gpr_split_every = 2

    def _check_bl32(self) -> None:
        if self.bl != QK_MXFP4:
            raise LayoutError(f"ggml block_mxfp4 data has bl={QK_MXFP4}, this layout has "
                              f"bl={self.bl}")

    def pack(self, raw, n: int | None = None, k: int | None = None, **_) -> np.ndarray:
        """Pack block_mxfp4 rows (uint8 (n, k/32*17), or flat with n and k)."""
        self._check_bl32()
        raw = as_bytes(raw)
        if n is None and k is None:
            if raw.ndim != 2 or raw.shape[1] == 0 or raw.shape[1] % MXFP4_BLOCK_BYTES:
                raise LayoutError(f"MXFP4 rows must be 2-D (n, k/32*17) bytes, or pass n and "
                                  f"k; got shape {raw.shape}")
            n, k = raw.shape[0], raw.shape[1] // MXFP4_BLOCK_BYTES * QK_MXFP4
        elif n is None or k is None:
            raise LayoutError("pass both n and k (or neither, with 2-D source rows)")
        n, k = int(n), int(k)
        b = _blocks(raw, n, k)
        d = E8M0_HALF_BF16[b[..., 0]].astype("<u2").view(np.uint8).reshape(b.shape[:2] + (2,))
        return super().pack(np.concatenate([d, b[..., 1:]], axis=-1).reshape(n, -1), n, k)

    def pack_from_ggml(self, raw, n: int | None = None, k: int | None = None,
                       bias: None = None) -> np.ndarray:
        """:meth:`pack` for ggml block_mxfp4 bytes; ``bias`` must be None (matmul(bias=))."""
        self.require_no_bias(bias)
        return self.pack(raw, n, k)

    def pack_from_float(self, w, bias: None = None) -> np.ndarray:
        raise LayoutError("mxfp4 weights are taken only as ggml MXFP4 blocks (from_ggml= / "
                          "pack_from_ggml, e.g. from a GGUF file): tilegen does not quantise "
                          "float weights to MXFP4")

    @staticmethod
    def require_no_bias(bias) -> None:
        if bias is not None:
            raise LayoutError("mxfp4p weights carry no bias: pass the bias to matmul(bias=)")

    def unpack(self, packed: np.ndarray, n: int, k: int, rows=None) -> np.ndarray:
        """block_mxfp4 bytes of ``rows`` (uint8 (R, k/32*17)): the inverse of :meth:`pack`."""
        src = super().unpack(packed, n, k, rows)
        R = src.shape[0]
        b = src.reshape(R, k // self.bl, self.src_block_bytes)
        e = _bf16_to_e8m0(np.ascontiguousarray(b[..., :2]).view("<u2")[..., 0])
        return np.concatenate([e[..., None], b[..., 2:]], axis=-1).reshape(R, -1)

    def unpack_values(self, packed: np.ndarray, n: int, k: int, rows=None
                      ) -> tuple[np.ndarray, np.ndarray]:
        """(int8 weight values kvalues[code] (R, k) in k order, bf16 scale bits (R, k/32))."""
        src = self.unpack(packed, n, k, rows)
        c, e = split_mxfp4(src, src.shape[0], k)
        return _kv()[c], E8M0_HALF_BF16[e]

    def dequantize_rows(self, packed: np.ndarray, n: int, k: int, rows) -> np.ndarray:
        """float32 (len(rows), k): ggml's dequantisation of the source rows, bit for bit."""
        src = self.unpack(packed, n, k, rows)
        return dequantize_mxfp4(src, src.shape[0], k)


def matmul_qsi8d32p_mxfp4p(lhs_packed, rhs_packed, m: int, n: int, k: int, bl: int,
                           mr: int, nr: int, kr: int, sr: int,
                           clamp_min: float, clamp_max: float) -> np.ndarray:
    """dst float32 (m, n) of the mxfp4 kernels, bit for bit: per 32-block b,
    S = sum q[i, t] * kvalues[code[j, t]] (exact int32); a = fma(f32(S), f32(dr) * f32(dl), a)
    from a = +0 in block order (dr bf16, dl f16); then a = min(max(a, clamp_min), clamp_max)."""
    return matmul_qsi8d32p_qsi4c32pscalef16(lhs_packed, rhs_packed, m, n, k, bl, mr, nr, kr, sr,
                                            clamp_min, clamp_max, rhs_layout=MXFP4P)


RECORDS = (FamilyInfo(
    name="mxfp4", lhs="qsi8d32p", rhs="mxfp4p", kinds=("mxfp4",), abi=Q4, quantized=True,
    acc_mem=True,
    impls=table32_impls()),)
LAYOUTS = (MXFP4P,)
ALLOCATOR_MODULES = ("q4", "q4_sme")
GGML_TYPES = {"MXFP4": "mxfp4"}
#: ggml's repack kernels for MXFP4 on Arm (bench/vs_ggml.py measures tilegen's against them):
#: (regime, function, instruction it multiplies with, columns of its group), on q8_0 blocks
GGML_REPACK = (("gemm", "ggml_gemm_mxfp4_4x4_q8_0", "sdot", 4),
               ("gemv", "ggml_gemv_mxfp4_4x4_q8_0", "sdot", 4))
#: issue #32's targets against ggml's best (tilegen / ggml MAC per cycle)
VS_GGML_TARGETS = {"gemm": 1.8, "gemv": 1.3}
DEFAULT_KERNELS = table32_default_kernels("mxfp4")   # records.table32_default_kernels


def gguf_layout(kind: str, nr: int | None):
    """The layout of MXFP4 GGUF tensors read without a library: the dotprod pair's
    (nr 4, kr 8, sr 2)."""
    return MXFP4P(nr or 4, 8, 2, QK_MXFP4)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol: ggml block_mxfp4 bytes repacked (lossless); float weights are
    refused (LayoutError naming from_ggml=)."""
    if from_ggml is not None:
        return lay.pack_from_ggml(from_ggml, n, k, bias=bias)
    return lay.pack_from_float(w, bias=bias)


# ----------------------------------------------------------------------------------------
# the export's C packer (tilegen.export.packers_c) and the llama.cpp mapping: block_mxfp4 rows
# -> mxfp4p, and the row dequantiser of llama.cpp's GET_ROWS, on the RHS packer skeleton
# export/pack/kquant_rhs.c.j2 (its pack_d / read_d blocks carry the E8M0 -> bf16 scale)
# ----------------------------------------------------------------------------------------
def _marked_block(nr: int, c: int, q: int) -> np.ndarray:
    """nr block_mxfp4 rows of one block (e = 127: bf16 0x3f00, no 0xa5 byte) whose only 0xa5
    byte is code byte q of column c (MXFP4P.c_repack_exprs finds where the layout puts it)."""
    raw = np.zeros((nr, MXFP4_BLOCK_BYTES), np.uint8)
    raw[:, 0] = 127
    raw[c, 1 + q] = 0xa5
    return raw


def c_packer(geo: list[dict]) -> dict:
    """The export's C packer of mxfp4p (template ``export/pack/mxfp4p.c.j2``): its layout banner
    and the expressions the template fills in, each checked against :class:`MXFP4P` at the
    geometries ``geo`` (dicts of nr, kr, k) the export gives, but those the layout refuses
    (kr > 16; the shared base's ``c_repack_exprs``), and the E8M0 -> bf16 scale table
    :data:`E8M0_HALF_BF16`.  A record is one 32-k block (its nr bf16 scales, then the code
    bytes)."""
    return dict(layout=f"mxfp4p<nr>x<kr/2> ({MXFP4P.__module__}.{MXFP4P.__name__})",
                anchor="mxfp4p", template="mxfp4p.c.j2",
                context=dict(MXFP4P.c_repack_exprs(geo, _marked_block), blk=MXFP4_BLOCK_BYTES,
                             b_d=0, b_qs=1, table=list(KVALUES_MXFP4),
                             scales=[f"0x{int(v):04x}" for v in E8M0_HALF_BF16]))


C_PACKERS = {"kai_rhs_pack_nxk_mxfp4p_mxfp4": c_packer}   # the export's (tilegen.export.packers_c)

#: the (gemm, gemv) pairs the llama.cpp patch wires for MXFP4, per ISA slot (isa, gemm tile,
#: gemv tile, how each multiplies), each gemv on its gemm's packing (iq4_nl's pairs: the SME2
#: SMOPA 1vlx2vl with the ZA-array SDOT 1x2vl, the I8MM SMMLA 12x4 with the SDOT-on-pairs 1x4,
#: the DOTPROD 16x4 with its 1x4)
LLAMA_KERNELS = TABLE32_LLAMA_KERNELS
#: the llama.cpp check's dense MXFP4 model (docs/llama_cpp_check.md#mxfp4): llama-quantize has no
#: MXFP4 ftype for a dense model, so every weight matrix is overridden to MXFP4 on a Q8_0 base
#: (token_embd too: GET_ROWS through the C packer's row dequantiser); tolerance Q4_0's (0.06 of
#: the logit rms): ggml and the patch both quantise the activations per 32-block to int8 with an
#: f16 scale (q8_0 / qsi8d32p), the weights are the file's values exactly (no second rounding)
LLAMA_QUANTIZE = {"mxfp4": 0.06}
LLAMA_QUANTIZE_ARGS = {"mxfp4": ("Q8_0", ("--tensor-type", "weight=mxfp4"))}
#: and llama-quantize's MXFP4_MOE of the MoE model (moe_mxfp4_moe: MXFP4 experts, every other
#: matrix Q8_0): tolerance Q8_0's (0.08), as most of its MUL_MATs take KleidiAI's Q8_0 path
#: (activations per row, weights requantised per channel)
LLAMA_MOE = {"mxfp4_moe": 0.08}
