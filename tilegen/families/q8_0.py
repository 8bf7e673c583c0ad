"""The ``q8_0`` family: ggml Q8_0 weights requantised per output channel — LHS per-row
asymmetric int8 (``qai8dxp``), RHS int8 with an f32 scale, row sum and bias per column
(``qsi8cxp``; KleidiAI matmul_clamp_f32_qai8dxp_qsi8cxp).  Weight kind ``q8_0``: float
weights quantised per channel, or ggml block_q8_0 bytes (its codec:
:mod:`tilegen.layout.ggml`'s ``*_q8_0``, which the qsi8cxp layout reads).
"""
from __future__ import annotations

import numpy as np

from ..callconv import Q8
from ..layout.lhs_int8 import QAI8DXP
from ..layout.rhs_int8 import QSI8CXP
from ..records import FamilyInfo, IsaImpl

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS", "GGML_TYPES", "gguf_layout",
           "pack"]

ORDER = 20


def _q8(op: str, template: str, allocator: str, kr: int, fixed_kr: str | None = None) -> IsaImpl:
    return IsaImpl(op, template, allocator, kr=kr, sr=1, fixed_kr=fixed_kr)


RECORDS = (
    FamilyInfo(
        name="q8_0", lhs="qai8dxp", rhs="qsi8cxp", kinds=("q8_0",), abi=Q8, quantized=True,
        impls={"neon": _q8("neon", "q8_neon", "q8_neon", 8),
               "dotprod": _q8("neon_dotprod", "q8_neon", "q8_neon", 4),
               "i8mm": _q8("neon_i8mm", "q8_neon", "q8_neon", 8),
               "sve_dotprod": _q8("sve_dotprod", "q8_sve", "q8_sve", 4),
               "sve_i8mm": _q8("sve_i8mm", "q8_sve", "q8_sve", 8),
               "sme": _q8("sme_mopa", "q8_sme", "q8_sme", 4,
                          "q8_0 sme kernels read 4-byte k groups (SMOPA)"),
               "sme2": IsaImpl("sme2_mopa", "q8_sme", "q8_sme2", kr=4, sr=1,
                               gemv_op="sme2_sdot", gemv_template="q8_sve",
                               fixed_kr="q8_0 sme2 kernels read 4-byte k groups (SMOPA, "
                                        "SDOT by lane)")},
    ),
)
LAYOUTS = (QSI8CXP, QAI8DXP)
ALLOCATOR_MODULES = ("q8", "q8_sme")
GGML_TYPES = {"Q8_0": "q8_0"}
#: the llama.cpp check runs the MoE model in Q8_0 (the synthetic model writes it; tolerance Q8_0's)
LLAMA_MOE = {"q8_0": None}

DEFAULT_KERNELS = (
    # q8_0 on SVE (VL units; at 128 bits the layouts of KleidiAI's 16x4 i8mm / dotprod pairs)
    "q8_0:sve_i8mm:16x1vl", "q8_0:sve_dotprod:1x1vl:k8:s1",
    "q8_0:sve_dotprod:16x1vl", "q8_0:sve_dotprod:1x1vl",
    # q8_0 on SME: SMOPA gemm (int32 sums in the four ZA tiles) + SME2 ZA-array SDOT gemv on
    # one packed RHS (opt-in at run time)
    "q8_0:sme:1vlx4vl", "q8_0:sme2:1x4vl",
    # q8_0 (qai8dxp x qsi8cxp): KleidiAI's pairs, i8mm 16x4 kr8 + dotprod 1x4 kr8 and
    # dotprod 16x4 kr4 + 1x4 kr4; plain NEON 4x4 + 1x4 (kr8) last
    "q8_0:i8mm:16x4", "q8_0:dotprod:1x4:k8:s1",
    "q8_0:dotprod:16x4", "q8_0:dotprod:1x4",
    "q8_0:neon:4x4", "q8_0:neon:1x4",
)


def gguf_layout(kind: str, nr: int | None):
    """The layout of Q8_0 GGUF tensors read without a library: qsi8cxp nr 4, kr 8."""
    return QSI8CXP(nr or 4, 8)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol: float (n, k) weights quantised per channel by the layout, or ggml
    Q8_0 bytes requantised per channel as llama.cpp does."""
    if bias is not None:
        bias = np.asarray(bias)
    if from_ggml is not None:
        return lay.pack_from_ggml(from_ggml, n, k, bias)
    return lay.pack_per_channel(w, bias)
