"""Packed data layouts (KleidiAI's, byte for byte).

A layout object is the single source of truth for a format: the generator takes its
byte offsets and strides from it, the runtime its packed sizes and numpy packers.  Its class
owns the format's names (``format``, ``label``, ``name``; docs/layouts.md#names) and is found
through :mod:`tilegen.layout.registry`.
"""
from .f32 import F32PackedLHS, F32PackedRHS, StridedF32
from .base import LayoutError, PackedLayout, lhs_layout_for, rhs_layout_for
from .rhs_int8 import QSI8CXP
from .bf16 import BF16PLhs2, BF16PLhs4, BF16PRhs2B, BF16PRhs4B

__all__ = ["F32PackedLHS", "F32PackedRHS", "StridedF32", "LayoutError", "PackedLayout",
           "rhs_layout_for", "lhs_layout_for",
           "QSI8CXP", "BF16PLhs4", "BF16PRhs4B", "BF16PLhs2", "BF16PRhs2B"]
