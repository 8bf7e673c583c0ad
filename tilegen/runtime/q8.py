"""Runtime packing of the q8_0 family's weights (qai8dxp x qsi8cxp kernels) into
:class:`~tilegen.runtime.packed.PackedWeights`.

Weights arrive as float (n, k), quantised per output channel by the layout
(:meth:`tilegen.layout.rhs_int8.QSI8CXP.pack_per_channel`), or as ggml Q8_0 bytes, requantised
per channel as llama.cpp does (:meth:`~tilegen.layout.rhs_int8.QSI8CXP.pack_from_ggml`).
"""
from __future__ import annotations

import numpy as np

from .errors import ArgumentError
from .packed import PackedWeights

__all__ = ["pack_q8_0"]


def pack_q8_0(kern, w=None, bias=None, from_ggml=None, n=None, k=None):
    """PackedWeights for kernel ``kern`` (its qsi8cxp layout) from float or Q8_0 weights."""
    lay = kern.rhs_layout()
    if bias is not None:
        bias = np.asarray(bias)
    if from_ggml is not None:
        if n is None or k is None:
            raise ArgumentError("from_ggml= needs n and k")
        data = lay.pack_from_ggml(from_ggml, int(n), int(k), bias)
    else:
        data = lay.pack_per_channel(w, bias)
        n, k = np.shape(w)
    return PackedWeights(lay, int(n), int(k), data, bias is not None, "q8_0")
