"""The ``bf16`` family: f32 activations and weights rounded to bf16, f32 accumulation
(KleidiAI matmul_clamp_f32_bf16p<mr>x4_bf16p<nr>x4b): BFMMLA gemm and BFDOT gemv on one RHS
(NEON), BFMOPA on KleidiAI's bf16p<vl>x2 / bf16p<vl>x2b layouts (SME2).  Weight kind ``bf16``;
it also serves ``f16`` weights first where the CPU has bf16 (as llama.cpp does).
"""
from __future__ import annotations

import numpy as np

from ..callconv import BF16
from ..layout.base import LayoutError
from ..layout.bf16 import BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B
from ..records import FamilyInfo, IsaImpl

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS",
           "SERVES_FIRST", "pack"]

ORDER = 50

RECORDS = (
    FamilyInfo(
        name="bf16", lhs="bf16px4", rhs="bf16px4b", kinds=("bf16",), abi=BF16, packs_lhs=True,
        impls={"bf16": IsaImpl("neon_mmla", "bf16_neon", "bf16_neon", kr=4, sr=1,
                               gemv_op="neon_dot", fixed_kr="the bf16 NEON layouts "
                               "(bf16p<mr>x4 / bf16p<nr>x4b) read k-chunks of 4"),
               # BFMOPA into ZA f32 tiles on KleidiAI's bf16p<vl>x2 / bf16p<vl>x2b layouts
               "sme2": IsaImpl("sme2_mopa", "bf16_sme", "bf16_sme2", kr=2, sr=1,
                               lhs="bf16px2", rhs="bf16px2b",
                               fixed_kr="BFMOPA reads bf16 pairs")},
    ),
)
LAYOUTS = (BF16PRhs4B, BF16PRhs2B, BF16PLhs4, BF16PLhs2)
ALLOCATOR_MODULES = ("bf16",)
# f16 weights use the bf16 kernels where the CPU has bf16, the f32 kernels elsewhere
SERVES_FIRST = {"f16": ("bf16",)}

DEFAULT_KERNELS = (
    # bf16 (bf16p8x4 x bf16p12x4b): KleidiAI's BFMMLA 8x12 and a BFDOT gemv on the same RHS
    "bf16:bf16:8x12", "bf16:bf16:1x12",
    # bf16 on SME2 (bf16p2vlx2 x bf16p2vlx2b): KleidiAI's BFMOPA 2vlx2vl, which also serves m = 1
    # (no gemv reads that RHS; opt-in at run time)
    "bf16:sme2:2vlx2vl",
)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol: float32 or float16 weights, rounded to bf16 (nearest even) by
    the layout; f16 weights (kind "f16") as float16 only."""
    w = np.asarray(w)
    if kind == "f16":
        if w.dtype != np.float16:
            raise LayoutError(f"f16 weights must be float16, got {w.dtype}")
    elif w.dtype not in (np.float32, np.float16):
        raise LayoutError(f"bf16 weights must be float32 or float16, got {w.dtype}")
    return lay.pack(w.astype(np.float32), bias=bias, layout=layout)
