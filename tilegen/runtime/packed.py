"""Packed weights: the bytes of one RHS layout, their file format, and row dequantisation."""
from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass, field

import numpy as np

from ..layout import LayoutError
from .errors import ArgumentError, LoadError

__all__ = ["PackedWeights", "PackedLayouts", "OPS", "dequantize_packed_rows"]

_CHUNK = 1 << 24


def _chunks(a: np.ndarray):
    """The bytes of array ``a`` as buffers of at most 16 MiB (no copy of a contiguous array)."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    for i in range(0, flat.size, _CHUNK):
        yield flat[i:i + _CHUNK]


def _sha256(a: np.ndarray):
    h = hashlib.sha256()
    for part in _chunks(a):
        h.update(part)
    return h


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """Weights packed once in a KleidiAI layout, ready for the kernels that read it.

    ``layout`` is the RHS layout object (:mod:`tilegen.layout`) the bytes are in; format,
    nr, kr, sr and bl are its geometry.

    ``experts``: None for one weight matrix; E for a stack of E expert matrices of one shape
    (``pack_weights`` of (E, n, k) weights, for ``lib.matmul_experts``): expert e's packing is
    ``data[e * expert_stride:][:layout.packed_size(n, k)]`` (:meth:`expert`), each starting on
    a 64-byte boundary."""

    layout: object
    n: int
    k: int
    data: np.ndarray = field(repr=False)
    has_bias: bool = False
    kind: str = "f32"
    experts: int | None = None

    #: alignment of each expert's packing in a stack
    EXPERT_ALIGN = 64

    format = property(lambda self: self.layout.format)
    nr = property(lambda self: self.layout.nr)
    kr = property(lambda self: self.layout.kr)
    sr = property(lambda self: getattr(self.layout, "sr", 1))
    bl = property(lambda self: getattr(self.layout, "bl", None))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    # -- expert stacks ----------------------------------------------------------------
    @property
    def expert_stride(self) -> int:
        """Bytes from one expert's packing to the next in a stack: the layout's packed size
        of one (n, k) matrix, rounded up to :attr:`EXPERT_ALIGN`."""
        a = self.EXPERT_ALIGN
        return -(-self.layout.packed_size(self.n, self.k) // a) * a

    def expert(self, e: int) -> "PackedWeights":
        """Expert ``e`` of a stack as PackedWeights of one matrix (a view of its bytes, no
        copy): what ``lib.matmul`` takes."""
        if self.experts is None:
            raise ArgumentError("these weights are one matrix, not an expert stack (pack (E, n, "
                                "k) weights for one)")
        if isinstance(e, bool) or not isinstance(e, (int, np.integer)) or not 0 <= e < self.experts:
            raise ArgumentError(f"expert must be an int in 0..{self.experts - 1}, got {e!r}")
        off = int(e) * self.expert_stride
        size = self.layout.packed_size(self.n, self.k)
        return PackedWeights(self.layout, self.n, self.k, self.data[off:off + size],
                             self.has_bias, self.kind)

    @classmethod
    def stack(cls, parts) -> "PackedWeights":
        """One expert stack from the packings of E matrices of one layout, shape, kind and
        bias presence (each copied into one buffer, at :attr:`expert_stride` apart)."""
        parts = list(parts)
        if not parts:
            raise ArgumentError("an expert stack needs at least one expert")
        first = parts[0]
        for i, p in enumerate(parts):
            if not isinstance(p, PackedWeights) or p.experts is not None:
                raise ArgumentError(f"expert {i} must be PackedWeights of one matrix, got "
                                    f"{p!r:.80}")
            if (p.layout, p.n, p.k, p.kind, p.has_bias) != (first.layout, first.n, first.k,
                                                            first.kind, first.has_bias):
                raise ArgumentError(f"expert {i} is {p.kind} {p.layout.name} (kr={p.kr}, sr="
                                    f"{p.sr}) n={p.n} k={p.k}, expert 0 {first.kind} "
                                    f"{first.layout.name} (kr={first.kr}, sr={first.sr}) "
                                    f"n={first.n} k={first.k}: an expert stack holds one layout "
                                    f"and shape")
        st = cls(first.layout, first.n, first.k, np.zeros(0, np.uint8), first.has_bias,
                 first.kind, len(parts))
        stride, size = st.expert_stride, first.layout.packed_size(first.n, first.k)
        data = np.zeros(stride * len(parts), np.uint8)
        for e, p in enumerate(parts):
            if p.data.nbytes != size:
                raise ArgumentError(f"expert {e} holds {p.data.nbytes} bytes, its layout "
                                    f"{size}")
            data[e * stride:e * stride + size] = p.data
        return cls(first.layout, first.n, first.k, data, first.has_bias, first.kind, len(parts))

    @property
    def packed_size(self) -> int:
        """The bytes ``data`` must hold: one matrix's packed size, or E expert strides."""
        if self.experts is None:
            return self.layout.packed_size(self.n, self.k)
        return self.experts * self.expert_stride

    @classmethod
    def from_q4_0(cls, raw, n: int, k: int, nr: int = 4, kr: int = 16, sr: int = 2) -> "PackedWeights":
        """Repack raw ggml block_q4_0 bytes (n rows x k/32 blocks) for the q4_0 kernels with
        this (nr, kr, sr) -- llama.cpp's i8mm/dotprod pair uses nr=4, kr=16, sr=2."""
        from ..layout.rhs_int4 import QSI4C32PScaleF16
        try:
            lay = QSI4C32PScaleF16(nr, kr, sr, 32)
            data = lay.pack_from_ggml(raw, n, k)
        except LayoutError as e:
            raise ArgumentError(str(e)) from None
        return cls(lay, n, k, data, False, "q4_0")

    # -- persistence: pack once, load per run ---------------------------------------
    MAGIC = b"TILEGENPW"
    VERSION = 2       # version 1 files have no header checksum

    def _meta(self) -> dict:
        meta = {"format": self.format, "n": self.n, "k": self.k, "nr": self.nr, "kr": self.kr,
                "sr": self.sr, "bl": self.bl, "has_bias": self.has_bias, "kind": self.kind,
                "nbytes": self.nbytes, "sha256": _sha256(self.data).hexdigest()}
        if self.experts is not None:        # an expert stack (one matrix: no key)
            meta["experts"] = self.experts
        return meta

    def save(self, path: str | os.PathLike) -> None:
        """Write ``MAGIC, u32 version, u32 header length, JSON header, sha256 of all the bytes
        before it, data`` to ``path``; the header holds the data's size and sha256."""
        hdr = json.dumps(self._meta(), sort_keys=True).encode()
        head = self.MAGIC + struct.pack("<II", self.VERSION, len(hdr)) + hdr
        # written beside the target, then renamed over it: weights loaded (memory-mapped) from
        # the old file keep reading the old file
        tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(head + hashlib.sha256(head).digest())
                for part in _chunks(self.data):
                    f.write(part)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PackedWeights":
        """Read a file written by :meth:`save`; any mismatch raises :class:`LoadError`.

        The data is a read-only memory map of the file (verified against its checksum once);
        the file must not be changed in place while the weights are in use."""
        pre = len(cls.MAGIC) + 8
        try:
            size = os.stat(path).st_size
            with open(path, "rb") as f:
                head = f.read(pre)
                if len(head) < pre or not head.startswith(cls.MAGIC):
                    raise LoadError(f"{path} is not a tilegen packed-weights file")
                version, hlen = struct.unpack("<II", head[len(cls.MAGIC):])
                if version < cls.VERSION:
                    raise LoadError(f"{path}: packed-weights file format version {version} (written "
                                    f"by an older tilegen); this tilegen reads version {cls.VERSION}: "
                                    f"pack the weights again and save them")
                if version != cls.VERSION:
                    raise LoadError(f"{path}: packed-weights file format version {version}, this "
                                    f"tilegen reads version {cls.VERSION}")
                if pre + hlen + 32 > size:
                    raise LoadError(f"{path} is truncated: {size} bytes, its header alone needs "
                                    f"{pre + hlen + 32}")
                hdr = f.read(hlen)
                digest = f.read(32)
                if hashlib.sha256(head + hdr).digest() != digest:
                    raise LoadError(f"{path}: header does not match its checksum (corrupted file)")
                data_off = pre + hlen + 32
                try:
                    meta = json.loads(hdr)
                    nbytes = int(meta["nbytes"])
                except (ValueError, KeyError, TypeError) as e:
                    raise LoadError(f"{path}: bad packed-weights header ({e})") from None
                have = size - data_off
                if have < nbytes:
                    raise LoadError(f"{path} is truncated: {have} of {nbytes} data bytes")
                if have > nbytes:
                    extra = have - nbytes
                    raise LoadError(f"{path} has {extra} extra byte{'s' if extra > 1 else ''} "
                                    f"after its {nbytes} data bytes")
            # read-only memory map: the file's pages are the data (no copy)
            data = (np.asarray(np.memmap(path, np.uint8, "r", offset=data_off, shape=(nbytes,)))
                    if nbytes else np.zeros(0, np.uint8))
        except OSError as e:
            raise LoadError(f"cannot read {path}: {e}") from None
        if _sha256(data).hexdigest() != meta.get("sha256"):      # hashed in 16 MiB chunks
            raise LoadError(f"{path}: data does not match its checksum (corrupted file)")
        try:
            from ..layout.api import layout_for
            lay = layout_for(meta["format"], nr=meta["nr"], kr=meta["kr"], sr=meta["sr"],
                             bl=meta["bl"] or 32)
            experts = meta.get("experts")
            if experts is not None and (type(experts) is not int or experts < 1):
                raise ValueError(f"experts must be a positive int, got {experts!r}")
            pw = cls(lay, meta["n"], meta["k"], data, meta["has_bias"], meta["kind"], experts)
            need = pw.packed_size
        except (ValueError, KeyError, TypeError) as e:
            raise LoadError(f"{path}: bad packed-weights header ({e})") from None
        if need != data.nbytes:
            stack = "" if pw.experts is None else f" x {pw.experts} experts"
            raise LoadError(f"{path}: {data.nbytes} bytes but {pw.format} n={pw.n} k={pw.k}{stack} needs "
                            f"{need}")
        return pw


OPS = ("gemm", "gemv")


class PackedLayouts:
    """One weight matrix packed once per RHS layout its kernels read (``pack_weights(...,
    for_ops=("gemm", "gemv"))``): the best gemm (m > 1) and the best gemv (m = 1) may read
    different layouts, at the cost of one packing each.

    The layout objects are the identity: ``packings`` maps each distinct layout to its
    :class:`PackedWeights` (one entry when both ops read one layout: packed once, stored once);
    ``layout_of`` maps each op to its layout.  ``for_op(op)`` is the packing an op reads.
    Build one from packings made elsewhere (e.g. each loaded with :meth:`PackedWeights.load`)
    with ``PackedLayouts({"gemm": a, "gemv": b})``."""

    def __init__(self, by_op: dict) -> None:
        if not isinstance(by_op, dict) or set(by_op) != set(OPS):
            raise ArgumentError(f"PackedLayouts needs a packing for each of {', '.join(OPS)}, "
                                f"got {sorted(by_op) if isinstance(by_op, dict) else by_op!r}")
        packings: dict = {}
        layout_of: dict = {}
        first = None
        for op in OPS:
            pw = by_op[op]
            if not isinstance(pw, PackedWeights):
                raise ArgumentError(f"the {op} packing must be PackedWeights, got "
                                    f"{type(pw).__name__}")
            if pw.experts is not None:
                raise ArgumentError(f"the {op} packing is an expert stack ({pw.experts} experts)"
                                    f": PackedLayouts holds one matrix")
            if first is None:
                first = pw
            elif (pw.n, pw.k, pw.kind, pw.has_bias) != (first.n, first.k, first.kind, first.has_bias):
                raise ArgumentError(f"the {op} packing is {pw.kind} n={pw.n} k={pw.k} bias="
                                    f"{pw.has_bias}, the gemm packing {first.kind} n={first.n} "
                                    f"k={first.k} bias={first.has_bias}: not one weight matrix")
            packings.setdefault(pw.layout, pw)      # equal layouts: the first packing serves
            layout_of[op] = pw.layout
        self.packings = packings
        self.layout_of = layout_of
        self.n, self.k, self.kind, self.has_bias = first.n, first.k, first.kind, first.has_bias

    def for_op(self, op: str) -> PackedWeights:
        if op not in OPS:
            raise ArgumentError(f"unknown op {op!r}; known: {', '.join(OPS)}")
        return self.packings[self.layout_of[op]]

    @property
    def layouts(self) -> tuple:
        return tuple(self.packings)

    @property
    def nbytes(self) -> int:
        """Bytes of all packings (each distinct layout once)."""
        return sum(p.nbytes for p in self.packings.values())

    @property
    def datas(self) -> tuple:
        return tuple(p.data for p in self.packings.values())

    def __repr__(self) -> str:
        ops = ", ".join(f"{op}={self.layout_of[op]!r}" for op in OPS)
        return (f"<PackedLayouts {self.kind} n={self.n} k={self.k} {len(self.packings)} "
                f"layout(s), {self.nbytes} bytes: {ops}>")

    def save(self, path) -> None:
        """Not supported: the packed-weights file holds one layout.  Save each packing
        (``w.for_op("gemm").save(a)``, ``w.for_op("gemv").save(b)``) and rebuild with
        ``PackedLayouts({"gemm": PackedWeights.load(a), "gemv": PackedWeights.load(b)})``."""
        raise ArgumentError("PackedLayouts cannot be saved as one file (the packed-weights file "
                            "format holds one layout): save each packing, w.for_op('gemm')"
                            ".save(a) and w.for_op('gemv').save(b), and rebuild with "
                            "PackedLayouts({'gemm': PackedWeights.load(a), 'gemv': "
                            "PackedWeights.load(b)})")


def dequantize_packed_rows(packed, rows) -> np.ndarray:
    """float32 (len(rows), k): the exact weights rows of ``packed`` represent (get_rows).
    An expert stack takes (expert, row) pairs: ``rows`` of shape (r, 2)."""
    if isinstance(packed, PackedLayouts):
        packed = packed.for_op("gemm")
    if packed.experts is not None:
        return _expert_rows(packed, rows)
    idx = np.asarray(rows)
    if idx.size == 0 and idx.ndim == 1:      # [] and () come out as float64
        idx = idx.astype(np.int64)
    if idx.dtype.kind not in "iu" or idx.ndim != 1:
        raise ArgumentError(f"rows must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= packed.n):
        raise ArgumentError(f"row index out of range 0..{packed.n - 1}: "
                            f"{int(idx.min())}..{int(idx.max())}")
    return packed.layout.dequantize_rows(packed.data, packed.n, packed.k, idx)


def _expert_rows(packed: PackedWeights, rows) -> np.ndarray:
    """get_rows of an expert stack: ``rows`` (r, 2) integer (expert, row) pairs."""
    pairs = np.asarray(rows)
    if pairs.size == 0 and pairs.ndim <= 2 and pairs.shape[-1:] in ((0,), (2,)):
        pairs = np.zeros((0, 2), np.int64)
    if pairs.dtype.kind not in "iu" or pairs.ndim != 2 or pairs.shape[1] != 2:
        raise ArgumentError(f"rows of an expert stack ({packed.experts} experts) must be an "
                            f"integer array of (expert, row) pairs, shape (r, 2); got "
                            f"{pairs.dtype} {pairs.shape}")
    out = np.empty((pairs.shape[0], packed.k), np.float32)
    for col, what, top in ((0, "expert", packed.experts), (1, "row", packed.n)):
        v = pairs[:, col]
        if v.size and (v.min() < 0 or v.max() >= top):
            raise ArgumentError(f"{what} index out of range 0..{top - 1}: "
                                f"{int(v.min())}..{int(v.max())}")
    for e in np.unique(pairs[:, 0]):
        sel = pairs[:, 0] == e
        one = packed.expert(int(e))
        out[sel] = one.layout.dequantize_rows(one.data, one.n, one.k, pairs[sel, 1])
    return out
