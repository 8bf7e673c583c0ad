"""Read weight tensors from GGUF files (via the ``gguf`` package) as PackedWeights."""
from __future__ import annotations

import os
import struct

import numpy as np

from ..families import FLOAT_KINDS, GGML_TYPES, KIND_FAMILY, pack, plugin
from ..layout import LayoutError
from ..runtime.errors import ArgumentError, LoadError
from ..runtime.packed import PackedWeights

__all__ = ["load_tensor", "tensor_names"]


def _reader(path):
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF needs the gguf package: pip install gguf") from None
    try:
        size = os.stat(path).st_size
        return gguf, gguf.GGUFReader(os.fspath(path))
    except OSError as e:
        raise LoadError(f"cannot read GGUF file {path}: {e}") from None
    except (ValueError, IndexError, struct.error):
        # the reader slices a memory map of the file: a field or tensor cut off by the end of
        # the file comes out short, and numpy's reshape/view of it fails
        raise LoadError(f"GGUF file {path} is truncated or corrupt: a header field or tensor "
                        f"does not fit in its {size} bytes") from None


def _named(name: str, pack):
    """pack(), its ArgumentError (a bad block, say) prefixed with the tensor's name."""
    try:
        return pack()
    except ArgumentError as e:
        raise ArgumentError(f"tensor {name!r}: {e}") from None


def tensor_names(path) -> list[str]:
    _, r = _reader(path)
    return [t.name for t in r.tensors]


def load_tensor(path, name: str, lib=None, *, nr: int | None = None) -> PackedWeights:
    """Tensor ``name`` as PackedWeights: a 2-D weight (ne[0] = k, ne[1] = n), or a 3-D expert
    tensor (ne[2] = E experts, as llama.cpp's ``ffn_*_exps``) as an expert stack
    (``experts=E``, each expert's slice packed as a 2-D tensor of the same type would be).

    The tensor types are the family plugins' (``GGML_TYPES``, :mod:`tilegen.families`): Q4_0
    is repacked straight from its block_q4_0 bytes, the K-quants and IQ4/MXFP4 formats from
    their ggml blocks (lossless); Q8_0 is requantised per channel (qsi8cxp); F16/F32 are
    converted and packed for the f32 kernels.  With ``lib`` the layout of that library's
    preferred kernel is used (with ``nr``: its preferred kernel of that nr), otherwise
    llama.cpp's defaults (q4_0: nr 4, kr 16, sr 2; q8_0: nr 4, kr 8; f32: nr 16; q4_K / q6_K:
    nr 4, kr 16, the i8mm kernels' layouts) with ``nr`` replacing the default nr; ``lib.adopt``
    repacks such weights for a library's kernels."""
    if nr is not None:
        from ..runtime.checks import positive_int
        nr = positive_int("nr", nr)
    gguf, r = _reader(path)
    t = next((t for t in r.tensors if t.name == name), None)
    if t is None:
        raise KeyError(f"no tensor {name!r} in {path}; it has: {', '.join(x.name for x in r.tensors)}")
    dims = [int(d) for d in t.shape]
    if len(dims) not in (2, 3):
        raise ArgumentError(f"tensor {name!r} has shape {dims}; only 2-D weights and 3-D expert "
                            f"tensors (k, n, experts) are supported")
    k, n = dims[:2]
    E = dims[2] if len(dims) == 3 else None
    T = gguf.GGMLQuantizationType
    kind = GGML_TYPES.get(T(t.tensor_type).name)
    if kind is None:
        supported = ", ".join(sorted(GGML_TYPES, key=lambda ty: (ty.startswith("F"), ty)))
        raise ArgumentError(f"tensor {name!r} is {T(t.tensor_type).name}; supported: {supported}")
    data = np.asarray(t.data)
    lead = (n,) if E is None else (E, n)
    if kind in FLOAT_KINDS:         # F16/F32: converted and packed for the f32 kernels
        w, raw = data.reshape(*lead, k), None
        if lib is not None:
            return _named(name, lambda: lib.pack_weights(w, kind=kind, nr=nr))
    else:                           # ggml blocks: repacked (Q8_0: requantised per channel)
        w, raw = None, data.reshape(-1).view(np.uint8)
        if E is not None:           # (E, n, row bytes): what pack_weights takes as a stack
            raw = raw.reshape(E, n, -1)
        if lib is not None:
            return _named(name, lambda: lib.pack_weights(kind=kind, from_ggml=raw, n=n,
                                                         k=k, nr=nr))
    family = KIND_FAMILY[kind]
    lay = plugin(family).gguf_layout(kind, nr)      # llama.cpp's default geometry of the kind

    def one(w1, raw1, expert: int | None = None) -> PackedWeights:
        try:
            packed = pack(family, lay, kind, w1, raw1, n, k, None, "nk")
        except (LayoutError, ArgumentError) as err:     # e.g. a block whose f16 scale is NaN
            where = "" if expert is None else f"expert {expert} of {E}: "   # or Inf
            raise ArgumentError(f"tensor {name!r}: {where}{err}") from None
        return PackedWeights(lay, n, k, packed, False, kind)

    if E is None:
        return one(w, raw)
    return PackedWeights.stack(one(None if w is None else w[e],
                                   None if raw is None else raw[e].reshape(-1), e)
                               for e in range(E))
