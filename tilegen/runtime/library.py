"""ctypes runtime: load a built library via its manifest, check arguments, call kernels."""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..generator.spec import KernelSpec
from ..layout import F32PackedRHS, LayoutError, StridedF32, lhs_layout_for, rhs_layout_for
from .cpu import CpuInfo, detect

__all__ = ["ArgumentError", "LoadError", "PackedWeights", "Kernel", "Library", "load", "pack_rhs"]

MANIFEST_NAME = "manifest.json"
_CTYPES = {"size_t": ctypes.c_size_t, "float": ctypes.c_float, "const void*": ctypes.c_void_p,
           "void*": ctypes.c_void_p}
FLT_MAX = float(np.finfo(np.float32).max)


class ArgumentError(TypeError, ValueError):
    """A kernel or op was called with an argument it cannot take (dtype, shape, size, ...)."""


class LoadError(RuntimeError):
    """The library directory is missing, does not match its manifest, or cannot run here."""


@dataclass(frozen=True, eq=False)
class PackedWeights:
    """Weights packed once in a KleidiAI layout, ready for the kernels that read it."""

    format: str
    n: int
    k: int
    nr: int
    kr: int
    sr: int
    data: np.ndarray = field(repr=False)
    has_bias: bool = False
    bl: int | None = None

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def pack_rhs(fmt: str, w: np.ndarray, *, nr: int, bias: np.ndarray | None = None,
             layout: str = "nk") -> np.ndarray:
    """Pack weights into KleidiAI layout ``fmt`` ("f32p") and return the bytes (uint8)."""
    if fmt in ("f32p", f"f32p{nr}x1b"):
        return F32PackedRHS(nr=nr).pack(w, bias=bias, layout=layout)
    raise LayoutError(f"unknown RHS format {fmt!r}; known: f32p")


def _check_matrix(name: str, a, rows: int | None = None, cols: int | None = None,
                  writeable: bool = False) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise ArgumentError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != np.float32:
        raise ArgumentError(f"{name} must be float32, got {a.dtype}")
    if a.ndim != 2:
        raise ArgumentError(f"{name} must be 2-D, got shape {a.shape}")
    if rows is not None and a.shape[0] != rows:
        raise ArgumentError(f"{name} has {a.shape[0]} rows, expected {rows}")
    if cols is not None and a.shape[1] != cols:
        raise ArgumentError(f"{name} has {a.shape[1]} columns, expected {cols}")
    if a.shape[0] < 1 or a.shape[1] < 1:
        raise ArgumentError(f"{name} must not be empty, got shape {a.shape}")
    if a.shape[1] > 1 and a.strides[1] != 4:
        raise ArgumentError(f"{name} rows must be contiguous (column stride 4 bytes), "
                            f"got strides {a.strides}")
    if a.shape[0] > 1 and (a.strides[0] < 4 * a.shape[1] or a.strides[0] % 4):
        raise ArgumentError(f"{name} row stride {a.strides[0]} must be a positive multiple of 4 "
                            f">= {4 * a.shape[1]} bytes")
    if not a.flags.aligned:
        raise ArgumentError(f"{name} is not 4-byte aligned")
    if writeable and not a.flags.writeable:
        raise ArgumentError(f"{name} is read-only")
    return a


def _row_stride(a: np.ndarray) -> int:
    return int(a.strides[0]) if a.shape[0] > 1 else 4 * a.shape[1]


def _check_bytes(name: str, buf, need: int) -> np.ndarray:
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
            or not buf.flags.c_contiguous:
        raise ArgumentError(f"{name} must be a contiguous 1-D uint8 array (or PackedWeights)")
    if buf.nbytes < need:
        raise ArgumentError(f"{name} has {buf.nbytes} bytes, the call needs {need}")
    return buf


def _clamps(clamp_min, clamp_max) -> tuple[float, float]:
    try:
        cmin, cmax = float(clamp_min), float(clamp_max)
    except (TypeError, ValueError):
        raise ArgumentError(f"clamp values must be numbers, got {clamp_min!r}, {clamp_max!r}") from None
    if math.isnan(cmin) or math.isnan(cmax):
        raise ArgumentError("clamp values must not be NaN")
    return cmin, cmax


class Kernel:
    """One kernel of a loaded library; calling it checks every argument first.

    Sizes and offsets come from the layout objects of the kernel's formats.
    """

    def __init__(self, entry: dict, fn) -> None:
        self.entry = entry
        self.name: str = entry["name"]
        t = entry["tile"]
        self.spec = KernelSpec(entry["family"], entry["isa"], t["mr"], t["nr"], t["kr"], t["sr"])
        self.family = self.spec.family
        self.features = frozenset(entry["features"])
        self.rhs_format: str = entry["rhs_format"]
        self._fn = fn
        fn.restype = None
        fn.argtypes = [_CTYPES[p["ctype"]] for p in entry["params"]]

    mr = property(lambda self: self.spec.mr)
    nr = property(lambda self: self.spec.nr)
    kr = property(lambda self: self.spec.kr)
    sr = property(lambda self: self.spec.sr)
    m_step = property(lambda self: self.spec.m_step)
    n_step = property(lambda self: self.spec.n_step)

    def __repr__(self) -> str:
        return f"<Kernel {self.name}>"

    # -- geometry (KleidiAI getters) -------------------------------------------------
    def rhs_layout(self, bl: int = 32):
        return rhs_layout_for(self.spec, bl)

    def lhs_layout(self, bl: int = 32):
        return lhs_layout_for(self.spec, bl)

    def rhs_packed_size(self, n: int, k: int, bl: int = 32) -> int:
        return self.rhs_layout(bl).packed_size(n, k)

    def rhs_packed_offset(self, n_idx: int, k: int, bl: int = 32) -> int:
        return self.rhs_layout(bl).packed_offset(n_idx, k)

    def lhs_packed_size(self, m: int, k: int, bl: int = 32) -> int:
        lay = self.lhs_layout(bl)
        return StridedF32().size(m, k, 4 * k) if lay is None else lay.packed_size(m, k)

    def lhs_packed_offset(self, m_idx: int, k: int, bl: int = 32) -> int:
        lay = self.lhs_layout(bl)
        return 4 * k * m_idx if lay is None else lay.packed_offset(m_idx, k)

    def dst_offset(self, m_idx: int, n_idx: int, dst_stride: int) -> int:
        return StridedF32().offset(m_idx, n_idx, dst_stride)

    def dst_size(self, m: int, n: int) -> int:
        return 4 * m * n

    def rhs_matches(self, packed: "PackedWeights") -> bool:
        return (packed.format, packed.nr, packed.kr, packed.sr) == (
            self.rhs_layout(packed.bl or 32).format if self.family != "f32" else self.rhs_format,
            self.nr, self.kr if self.family != "f32" else packed.kr, self.sr if self.family != "f32" else packed.sr)

    # -- calls --------------------------------------------------------------------------
    def __call__(self, lhs: np.ndarray, rhs_packed, dst: np.ndarray,
                 clamp_min: float = -FLT_MAX, clamp_max: float = FLT_MAX, *,
                 k: int | None = None, bl: int | None = None) -> np.ndarray:
        """f32: dst = clamp(lhs @ W + bias), lhs (m, k) f32 rows.
        q4: dst = clamp(dequant(lhs_packed) @ dequant(W)), lhs = packed LHS bytes, with k and
        bl taken from PackedWeights (or given)."""
        if self.family == "f32":
            return self._call_f32(lhs, rhs_packed, dst, clamp_min, clamp_max)
        return self._call_q4(lhs, rhs_packed, dst, clamp_min, clamp_max, k, bl)

    def _call_f32(self, lhs, rhs_packed, dst, clamp_min, clamp_max):
        lhs = _check_matrix("lhs", lhs)
        m, k = lhs.shape
        dst = _check_matrix("dst", dst, rows=m, writeable=True)
        n = dst.shape[1]
        if isinstance(rhs_packed, PackedWeights):
            if rhs_packed.format != self.rhs_format:
                raise ArgumentError(f"packed weights are {rhs_packed.format}, kernel {self.name} "
                                    f"reads {self.rhs_format}")
            if (rhs_packed.n, rhs_packed.k) != (n, k):
                raise ArgumentError(f"packed weights are n={rhs_packed.n}, k={rhs_packed.k}; "
                                    f"the call needs n={n}, k={k}")
            rhs_packed = rhs_packed.data
        buf = _check_bytes("rhs_packed", rhs_packed, self.rhs_packed_size(n, k))
        cmin, cmax = _clamps(clamp_min, clamp_max)
        self._fn(m, n, k, lhs.ctypes.data, _row_stride(lhs), buf.ctypes.data,
                 dst.ctypes.data, _row_stride(dst), 4, cmin, cmax)
        return dst

    def _call_q4(self, lhs_packed, rhs_packed, dst, clamp_min, clamp_max, k, bl):
        dst = _check_matrix("dst", dst, writeable=True)
        m, n = dst.shape
        if isinstance(rhs_packed, PackedWeights):
            if not self.rhs_matches(rhs_packed):
                raise ArgumentError(
                    f"packed weights are {rhs_packed.format} nr={rhs_packed.nr} kr={rhs_packed.kr} "
                    f"sr={rhs_packed.sr}; kernel {self.name} reads {self.rhs_layout().format} "
                    f"nr={self.nr} kr={self.kr} sr={self.sr}")
            if rhs_packed.n != n:
                raise ArgumentError(f"packed weights have n={rhs_packed.n}, dst has {n} columns")
            if k is not None and k != rhs_packed.k:
                raise ArgumentError(f"k={k} but the packed weights have k={rhs_packed.k}")
            if bl is not None and bl != rhs_packed.bl:
                raise ArgumentError(f"bl={bl} but the packed weights have bl={rhs_packed.bl}")
            k, bl = rhs_packed.k, rhs_packed.bl
            rhs_packed = rhs_packed.data
        if k is None or bl is None:
            raise ArgumentError("k and bl are needed when rhs_packed is raw bytes")
        for name, v in (("k", k), ("bl", bl)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ArgumentError(f"{name} must be a positive int, got {v!r}")
        k, bl = int(k), int(bl)
        if bl % 32 or k % bl:
            raise ArgumentError(f"need bl a multiple of 32 and k a multiple of bl; got k={k}, bl={bl}")
        rbuf = _check_bytes("rhs_packed", rhs_packed, self.rhs_packed_size(n, k, bl))
        lbuf = _check_bytes("lhs_packed", lhs_packed, self.lhs_packed_size(m, k, bl))
        cmin, cmax = _clamps(clamp_min, clamp_max)
        self._fn(m, n, k, bl, lbuf.ctypes.data, rbuf.ctypes.data, dst.ctypes.data,
                 _row_stride(dst), 4, cmin, cmax)
        return dst


class Library:
    """A built tilegen library: its manifest, its kernels, and the ops over them."""

    def __init__(self, directory: str | os.PathLike, cpu: CpuInfo | None = None) -> None:
        self.directory = Path(directory)
        mpath = self.directory / MANIFEST_NAME
        try:
            self.manifest = json.loads(mpath.read_text())
        except FileNotFoundError:
            raise LoadError(f"no {MANIFEST_NAME} in {self.directory} (build one with `tilegen build`)") from None
        except json.JSONDecodeError as e:
            raise LoadError(f"{mpath} is not valid JSON: {e}") from None
        try:
            self.path = self.directory / self.manifest["library"]
            want = self.manifest["sha256"]
            entries = self.manifest["kernels"]
        except (KeyError, TypeError) as e:
            raise LoadError(f"{mpath} lacks field {e}") from None
        if not self.path.exists():
            raise LoadError(f"library {self.path} named by the manifest does not exist")
        got = hashlib.sha256(self.path.read_bytes()).hexdigest()
        if got != want:
            raise LoadError(f"{self.path.name} does not match its manifest (sha256 {got[:16]}… "
                            f"!= {want[:16]}…): rebuild it or use the matching manifest")
        self.cpu = cpu or detect()
        fmt = self.manifest.get("format", "elf")
        here = "macho" if sys.platform == "darwin" else "elf"
        if fmt != here or not self.cpu.is_arm64:
            raise LoadError(f"{self.path.name} is an aarch64 {fmt} library; this is "
                            f"{sys.platform}/{self.cpu.machine}. Run under `tilegen emulate` "
                            f"on x86-64 hosts")
        try:
            self._dll = ctypes.CDLL(str(self.path.resolve()))
        except OSError as e:
            raise LoadError(f"cannot load {self.path}: {e}") from None
        self.kernels: dict[str, Kernel] = {}
        for e in entries:
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LoadError(f"kernel {e['name']} is in the manifest but not in {self.path.name}") from None
            self.kernels[e["name"]] = Kernel(e, fn)

    def __repr__(self) -> str:
        return f"<tilegen.Library {self.path} with {len(self.kernels)} kernels>"

    # -- kernels --------------------------------------------------------------------
    def runnable(self, kernel: Kernel) -> bool:
        return kernel.features <= self.cpu.features

    def kernel(self, name: str) -> Kernel:
        try:
            k = self.kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self.path.name}; it has: "
                           f"{', '.join(sorted(self.kernels))}") from None
        if not self.runnable(k):
            missing = sorted(k.features - self.cpu.features)
            raise ArgumentError(f"kernel {name} needs {', '.join(missing)}, which this CPU lacks")
        return k

    def _candidates(self, family: str) -> list[Kernel]:
        return [k for k in self.kernels.values() if k.spec.family == family and self.runnable(k)]

    # -- ops ------------------------------------------------------------------------
    def pack_weights(self, w: np.ndarray, kind: str = "f32", bias: np.ndarray | None = None,
                     layout: str = "nk", nr: int | None = None) -> PackedWeights:
        """Pack weights (n, k) (or (k, n) with ``layout="kn"``) for this library's kernels."""
        if kind != "f32":
            raise ArgumentError(f"unknown weights kind {kind!r}; supported: f32")
        cands = self._candidates("f32")
        if not cands:
            raise ArgumentError("this library has no runnable f32 kernel")
        if nr is None:  # the panel width of the biggest gemm tile
            nr = max(cands, key=lambda k: (k.mr * k.nr, k.nr)).nr
        elif not any(k.nr == nr for k in cands):
            raise ArgumentError(f"no f32 kernel with nr={nr}; available nr: "
                                f"{sorted({k.nr for k in cands})}")
        w = np.asarray(w)
        try:
            data = F32PackedRHS(nr=nr).pack(w, bias=bias, layout=layout)
        except LayoutError as e:
            raise ArgumentError(str(e)) from None
        n, k = (w.shape if layout == "nk" else w.shape[::-1])
        return PackedWeights(f"f32p{nr}x1b", n, k, nr, 1, 1, data, bias is not None)

    def select(self, packed: PackedWeights, m: int) -> Kernel:
        """The kernel for an (m x k) @ packed matmul: gemv tile for m == 1, else the largest mr."""
        cands = [k for k in self._candidates("f32") if k.rhs_format == packed.format]
        if not cands:
            raise ArgumentError(f"no runnable kernel reads {packed.format} in {self.path.name}")
        if m == 1:
            gemv = [k for k in cands if k.mr == 1]
            if gemv:
                return gemv[0]
        return max(cands, key=lambda k: (min(k.mr, m), k.mr))

    def matmul(self, x: np.ndarray, packed: PackedWeights, clamp: tuple[float, float] | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
        """``clamp(x @ W.T + bias)`` for x of shape (m, k) or (..., m, k); float32 result."""
        if not isinstance(packed, PackedWeights):
            raise ArgumentError(f"weights must be PackedWeights (see lib.pack_weights), "
                                f"got {type(packed).__name__}")
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise ArgumentError(f"x must be a float32 numpy array, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
        if x.ndim < 2:
            raise ArgumentError(f"x must have shape (m, k) or (..., m, k), got {x.shape}")
        if x.shape[-1] != packed.k:
            raise ArgumentError(f"x has k={x.shape[-1]}, packed weights have k={packed.k}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, packed.k))
        if x2.shape[0] == 0:
            raise ArgumentError(f"x has no rows (shape {x.shape})")
        shape = (*lead, packed.n)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.float32 \
                or not out.flags.c_contiguous:
            raise ArgumentError(f"out must be a C-contiguous float32 array of shape {shape}")
        cmin, cmax = (-FLT_MAX, FLT_MAX) if clamp is None else clamp
        kern = self.select(packed, x2.shape[0])
        kern(x2, packed, out.reshape(-1, packed.n), cmin, cmax)
        return out


def load(directory: str | os.PathLike, cpu: CpuInfo | None = None) -> Library:
    """Load the library built into ``directory`` (verifies manifest and hash)."""
    return Library(directory, cpu=cpu)
