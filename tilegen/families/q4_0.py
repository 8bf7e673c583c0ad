"""The ``q4_0`` family and its layout variants: llama.cpp's Q4_0 weights (int4, f16 block
scales) against int8 activations.

* ``q4_0``: LHS per-32-block symmetric int8 (f16 scale), RHS int4 from ggml block_q4_0 with
  f16 scales (KleidiAI matmul_clamp_f32_qsi8d32p_qsi4c32p);
* ``q4_0_dx``: LHS per-row asymmetric int8, RHS int4 per 32-block with bf16 scales, row sums
  and bias (KleidiAI matmul_clamp_f32_qai8dxp_qsi4c32p);
* ``q4_0_s1s0``: KleidiAI's SME2 layouts (llama.cpp's SME2 gemv operands): LHS qsi8d32p with
  the scales behind the values, RHS qsi4c32ps1s0scalef16 (k-adjacent nibble pairs, zero point
  8: the LUTI4 unpack); no runtime weight kind of its own;
* ``q4_0_f16``: llama.cpp's SME2 Q4_0 gemm (KleidiAI matmul_clamp_f32_f16p_qsi4c32p): f32
  activations rounded to f16 (LHS f16p<mr>x2), the q4_0_s1s0 RHS; the LUTI4 unpack gives
  (u - 8) as f16, each product with the block scale is rounded to f16 (FMUL) and FMOPA (f16
  pairs into f32) accumulates in ZA over all of k.  kr = 4, sr = 2 are KleidiAI's getters
  (the RHS packer's arguments); the layouts read pairs (L = 2).  Its gemm pairs with the
  q4_0_s1s0 gemv on one packing (llama.cpp's SME2 Q4_0 entry); the runtime's q4_0 weights use
  the pair where the CPU runs it (:data:`SERVES_FIRST`).

The ggml block codec (``block_q4_0``) is :mod:`tilegen.layout.ggml`'s ``*_q4_0``: the int4
layouts (:mod:`tilegen.layout.rhs_int4`) read it.
"""
from __future__ import annotations

from ..callconv import Q4
from ..layout.f16 import F16PLhs2
from ..layout.lhs_int8 import QAI8DXP, QSI8D32P, QSI8D32PScaleTail
from ..layout.rhs_int4 import QSI4C32P, QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from ..records import FamilyInfo, IsaImpl

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS",
           "SERVES_FIRST", "GGML_TYPES", "gguf_layout", "pack"]

ORDER = 10


def _q4_family(name: str, lhs: str, rhs: str) -> FamilyInfo:
    """The int4 x int8 families share ISAs, templates, allocators and default interleave."""
    def q4(op: str, strategy: str, kr: int, allocator: str | None = None,
           fixed_L: str | None = None) -> IsaImpl:
        return IsaImpl(op, strategy, allocator or strategy, kr=kr, sr=2, fixed_L=fixed_L)
    return FamilyInfo(
        name=name, lhs=lhs, rhs=rhs, kinds=(name,), abi=Q4, quantized=True, acc_mem=True,
        impls={"neon": q4("neon", "q4_neon", 8), "dotprod": q4("neon_dotprod", "q4_neon", 8),
               "i8mm": q4("neon_i8mm", "q4_neon", 16),
               "sve_dotprod": q4("sve_dotprod", "q4_sve", 8),
               "sve_i8mm": q4("sve_i8mm", "q4_sve", 16),
               "sme": q4("sme_mopa", "q4_sme", 8, fixed_L="SMOPA reads 4-byte groups"),
               "sme2": q4("sme2_sdot", "q4_sve", 8, allocator="q4_sme2",
                          fixed_L="sme2 q4 gemv reads 4-byte groups (SDOT by lane)")},
    )


RECORDS = (
    _q4_family("q4_0", "qsi8d32p", "qsi4c32pscalef16"),
    FamilyInfo(
        name="q4_0_s1s0", lhs="qsi8d32pscaletail", rhs="qsi4c32ps1s0scalef16", kinds=(),
        abi=Q4, quantized=True,
        impls={"sme2": IsaImpl("sme2_mopa", "q4_sme2_luti4_mopa", "q4_sme2_luti4", kr=4, sr=1,
                               gemv_op="sme2_luti4", gemv_template="q4_sme2_luti4",
                               fixed_kr="the LUTI4 q4 kernels read 4-byte groups")}),
    FamilyInfo(
        name="q4_0_f16", lhs="f16px2", rhs="qsi4c32ps1s0scalef16", kinds=(), abi=Q4,
        quantized=True, gemv_family="q4_0_s1s0",
        impls={"sme2": IsaImpl("sme2_mopa", "q4_sme2_f16_mopa", "q4_sme2_f16", kr=4, sr=2,
                               fixed_kr="the f16 x q4 SME2 kernel reads k-pairs of 4-nibble "
                                        "chunks (KleidiAI's kr = 4, sr = 2)")}),
    _q4_family("q4_0_dx", "qai8dxp", "qsi4c32p"),
)
LAYOUTS = (QSI4C32P, QSI4C32PScaleF16, QSI4C32PS1S0ScaleF16, QAI8DXP, QSI8D32P,
           QSI8D32PScaleTail, F16PLhs2)
ALLOCATOR_MODULES = ("q4", "q4_sme", "q4_luti4", "q4_f16")
# q4_0 weights: llama.cpp's SME2 pair where the CPU runs it (the f16-activation gemm, FMOPA
# into ZA over all of k, with the int8 LUTI4 gemv on the same qsi4c32ps1s0scalef16 packing),
# the int8 kernels of q4_0 elsewhere
SERVES_FIRST = {"q4_0": ("q4_0_f16",)}
GGML_TYPES = {"Q4_0": "q4_0"}
#: the llama.cpp check runs the MoE model in Q4_0 (the synthetic model writes it; tolerance Q4_0's)
LLAMA_MOE = {"q4_0": None}

# q4 gemm kernels come with the gemv partner that reads the same packed weights (llama.cpp's
# pairs: i8mm 16x4 kr16 + dotprod 1x4 kr16; dotprod 16x4 kr8 + 1x4 kr8), NEON fallback last.
DEFAULT_KERNELS = (
    # SVE (VL units; at 256 bits these are llama.cpp's 16x8 sve_i8mm + 1x8 sve_dotprod)
    "q4_0:sve_i8mm:16x1vl", "q4_0:sve_dotprod:1x1vl:k16:s2",
    "q4_0:sve_dotprod:8x1vl", "q4_0:sve_dotprod:1x1vl",
    "q4_0_dx:sve_i8mm:8x1vl", "q4_0_dx:sve_dotprod:1x1vl:k16:s2",
    # SME: SMOPA gemm + SME2 ZA-array SDOT gemv on one packed RHS (opt-in at run time)
    "q4_0:sme:1vlx2vl", "q4_0:sme2:1x2vl", "q4_0_dx:sme:1vlx2vl", "q4_0_dx:sme2:1x2vl",
    # SME2, llama.cpp's Q4_0 pair (q4_0 weights take it first): the f16-activation FMOPA gemm
    # (ZA accumulates over all of k) + the int8 LUTI4 gemv, one qsi4c32ps1s0scalef16 packing
    "q4_0_f16:sme2:1vlx4vl", "q4_0_s1s0:sme2:1x4vl",
    "q4_0:i8mm:16x4", "q4_0:dotprod:1x4:k16:s2",
    "q4_0:dotprod:16x4", "q4_0:dotprod:1x4",
    "q4_0:neon:4x4", "q4_0:neon:1x4",
    "q4_0_dx:i8mm:4x8", "q4_0_dx:dotprod:1x8:k16:s2",
    "q4_0_dx:dotprod:16x4", "q4_0_dx:dotprod:1x4",
    "q4_0_dx:neon:4x4", "q4_0_dx:neon:1x4",
)


def gguf_layout(kind: str, nr: int | None):
    """The layout of Q4_0 GGUF tensors read without a library: llama.cpp's i8mm/dotprod pair
    (nr 4, kr 16, sr 2)."""
    return QSI4C32PScaleF16(nr or 4, 16, 2, 32)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol: ggml block_q4_0 bytes repacked, or float (n, k) weights quantised
    as ggml's Q4_0 by the layout (it refuses what a block scale cannot hold)."""
    if from_ggml is not None:
        return lay.pack_from_ggml(from_ggml, n, k, bias=bias)
    return lay.pack_from_float(w, bias=bias)
