"""The ``f32`` family: f32 GEMM (NEON/SVE FMLA, SME FMOPA outer products; SME2 multi-vector
loads and the ZA-array FMLA gemv) on the ``f32p`` layouts.  Weight kinds ``f32`` and ``f16``
(f16 weights are widened to f32 here; where the CPU has bf16 the registry lets the bf16
family serve them first: its ``SERVES_FIRST``).
"""
from __future__ import annotations

import numpy as np

from ..callconv import F32
from ..layout.base import LayoutError
from ..layout.f32 import F32PackedLHS, F32PackedRHS
from ..records import FamilyInfo, IsaImpl

__all__ = ["ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS",
           "GGML_TYPES", "gguf_layout", "pack"]

ORDER = 0


def _f32(op: str, template: str, allocator: str, **kw) -> IsaImpl:
    return IsaImpl(op, template, allocator, fixed_kr="the f32 family reads f32p panels", **kw)


RECORDS = (
    FamilyInfo(
        name="f32", lhs="f32p", rhs="f32p", kinds=("f32", "f16"), abi=F32,
        impls={"neon": _f32("neon_mla", "f32_neon", "f32_neon"),
               "sve": _f32("sve_mla", "f32_sve", "f32_sve"),
               "sme": _f32("sme_mopa", "f32_sme", "f32_sme"),
               "sme2": _f32("sme2_mopa", "f32_sme", "f32_sme2", gemv_op="sme2_mla",
                            gemv_template="f32_sme2_gemv")},
    ),
)
LAYOUTS = (F32PackedRHS, F32PackedLHS)
ALLOCATOR_MODULES = ("f32",)         # tilegen.generator.regalloc.<module>
GGML_TYPES = {"F32": "f32", "F16": "f16"}

DEFAULT_KERNELS = (
    "f32:neon:6x16", "f32:neon:4x16", "f32:neon:8x8", "f32:neon:4x24",
    "f32:neon:5x12", "f32:neon:1x16", "f32:neon:1x4",
    # scalable f32: SVE FMLA gemm + gemv pairs (panel width in VL units), SME2/SME outer products
    "f32:sve:3x8vl", "f32:sve:1x8vl", "f32:sve:6x4vl", "f32:sve:1x4vl",
    "f32:sme2:1vlx4vl", "f32:sme2:1x4vl", "f32:sme2:2vlx2vl", "f32:sme:2vlx2vl",
)


def gguf_layout(kind: str, nr: int | None):
    """The layout of F32/F16 GGUF tensors read without a library: f32p, nr 16 by default."""
    return F32PackedRHS(nr or 16)


def pack(lay, kind: str, w, from_ggml, n: int, k: int, bias, layout: str):
    """The packing protocol (:func:`tilegen.families.pack`): float weights ``w`` in
    ``layout`` ("nk"/"kn"), f16 weights as float16 only."""
    w = np.asarray(w)
    if kind == "f16":
        if w.dtype != np.float16:
            raise LayoutError(f"f16 weights must be float16, got {w.dtype}")
        w = w.astype(np.float32)
    return lay.pack(w, bias=bias, layout=layout)
