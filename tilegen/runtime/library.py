"""ctypes runtime: load a built library via its manifest, check arguments, call kernels."""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import struct
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..generator.spec import ISAS, KernelSpec, parse_spec
from ..layout import LayoutError, StridedF32, lhs_layout_for, rhs_layout_for
from ..layout.base import same_rhs
from .cpu import CpuInfo, detect
from .integrity import check_entries, check_image
from .select import KIND_FAMILY, KernelPair, build_table
from .threads import default_threads, run_parallel, split

__all__ = ["ArgumentError", "LoadError", "PackedWeights", "Kernel", "Packer", "Library", "load"]

MANIFEST_NAME = "manifest.json"
_CTYPES = {"size_t": ctypes.c_size_t, "float": ctypes.c_float, "const void*": ctypes.c_void_p,
           "void*": ctypes.c_void_p}
FLT_MAX = float(np.finfo(np.float32).max)


class ArgumentError(TypeError, ValueError):
    """A kernel or op was called with an argument it cannot take (dtype, shape, size, ...)."""


class LoadError(RuntimeError):
    """The library directory is missing, does not match its manifest, or cannot run here."""


@lru_cache(maxsize=None)
def _kernel_spec(text: str) -> KernelSpec:
    return parse_spec(text)


@lru_cache(maxsize=None)
def _packer_spec(text: str):
    from ..generator.manifest import parse_packer_spec
    return parse_packer_spec(text)


def _require_features(what: str, name: str, features: frozenset, cpu: CpuInfo | None) -> None:
    """ArgumentError unless the CPU (after TILEGEN_ISA / TILEGEN_SME) has ``features``."""
    have = (cpu or detect()).features
    missing = sorted(features - have)
    if missing:
        raise ArgumentError(f"{what} {name} needs {', '.join(missing)}, which this CPU lacks "
                            f"(features: {', '.join(sorted(have)) or 'none'}; TILEGEN_ISA and "
                            f"TILEGEN_SME restrict them)")


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
    kind: str = "f32"

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    # -- persistence: pack once, load per run ---------------------------------------
    MAGIC = b"TILEGENPW"
    VERSION = 2       # version 1 files have no header checksum

    def _meta(self) -> dict:
        return {"format": self.format, "n": self.n, "k": self.k, "nr": self.nr, "kr": self.kr,
                "sr": self.sr, "bl": self.bl, "has_bias": self.has_bias, "kind": self.kind,
                "nbytes": self.nbytes, "sha256": _sha256(self.data).hexdigest()}

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
            pw = cls(meta["format"], meta["n"], meta["k"], meta["nr"], meta["kr"], meta["sr"], data,
                     meta["has_bias"], meta["bl"], meta["kind"])
            from ..layout.api import layout_for
            lay = layout_for(pw.format, nr=pw.nr, kr=pw.kr, sr=pw.sr, bl=pw.bl or 32)
            need = lay.packed_size(pw.n, pw.k)
        except (ValueError, KeyError, TypeError) as e:
            raise LoadError(f"{path}: bad packed-weights header ({e})") from None
        if need != data.nbytes:
            raise LoadError(f"{path}: {data.nbytes} bytes but {pw.format} n={pw.n} k={pw.k} needs "
                            f"{need}")
        return pw

    @classmethod
    def from_q4_0(cls, raw, n: int, k: int, nr: int = 4, kr: int = 16, sr: int = 2) -> "PackedWeights":
        """Repack raw ggml block_q4_0 bytes (n rows x k/32 blocks) for the q4_0 kernels with
        this (nr, kr, sr) -- llama.cpp's i8mm/dotprod pair uses nr=4, kr=16, sr=2."""
        from ..layout.q4 import QSI4C32PScaleF16
        lay = QSI4C32PScaleF16(nr, kr, sr, 32)
        try:
            data = lay.pack_from_ggml(raw, n, k)
        except LayoutError as e:
            raise ArgumentError(str(e)) from None
        return cls(lay.format, n, k, nr, kr, sr, data, False, 32, "q4_0")


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

    Sizes and offsets come from the layout objects of the kernel's formats; tile, features
    and formats from ``parse_spec(entry["spec"])``.  A call on a CPU without the kernel's
    features (``cpu``, default: :func:`tilegen.runtime.cpu.detect`) raises ArgumentError.
    """

    def __init__(self, entry: dict, fn, vl_bytes: int | None = None,
                 cpu: CpuInfo | None = None) -> None:
        self.entry = entry
        self.spec = _kernel_spec(entry["spec"])
        self.name: str = self.spec.name
        # the CPU's vector length for this kernel's ISA (None: the CPU lacks it)
        self.vl_bytes = vl_bytes if self.spec.vl_scaled else None
        self.family = self.spec.family
        self.features = frozenset(self.spec.features)
        self.rhs_format: str = self.spec.rhs_format
        self._cpu = cpu
        self._fn = fn
        self._probe = None        # set by Library.check_abi: route calls through the ABI probe
        fn.restype = None
        fn.argtypes = [_CTYPES[p["ctype"]] for p in entry["params"]]

    def _require_cpu(self) -> None:
        _require_features(type(self).__name__.lower(), self.name, self.features, self._cpu)

    def _invoke(self, *args) -> None:
        self._require_cpu()       # every foreign call: never an illegal instruction
        if self._probe is None:
            self._fn(*args)
        else:
            self._probe(self, args)

    def _vl(self) -> int | None:
        if self.spec.vl_scaled and self.vl_bytes is None:
            raise ArgumentError(f"kernel {self.name} has a tile in {self.spec.vl_kind} vector-"
                                f"length units and this CPU has no {self.spec.vl_kind.upper()} "
                                f"(or it is disabled)")
        return self.vl_bytes

    # geometry on this CPU (VL-scaled tiles resolved with the vector length read at load)
    mr = property(lambda self: self.spec.mr_at(self._vl()))
    nr = property(lambda self: self.spec.nr_at(self._vl()))
    kr = property(lambda self: self.spec.kr)
    sr = property(lambda self: self.spec.sr)
    m_step = mr
    n_step = nr

    def __repr__(self) -> str:
        return f"<Kernel {self.name}>"

    # -- geometry (KleidiAI getters) -------------------------------------------------
    def rhs_layout(self, bl: int = 32):
        return rhs_layout_for(self.spec, bl, self._vl())

    def lhs_layout(self, bl: int = 32):
        return lhs_layout_for(self.spec, bl, self._vl())

    def rhs_packed_size(self, n: int, k: int, bl: int = 32) -> int:
        return self.rhs_layout(bl).packed_size(n, k)

    def rhs_packed_offset(self, n_idx: int, k: int, bl: int = 32) -> int:
        return self.rhs_layout(bl).packed_offset(n_idx, k)

    def lhs_packed_size(self, m: int, k: int, bl: int = 32) -> int:
        lay = self.lhs_layout(bl)
        return StridedF32().size(m, k, 4 * k) if lay is None else lay.packed_size(m, k)

    def lhs_packed_offset(self, m_idx: int, k: int, bl: int = 32) -> int:
        lay = self.lhs_layout(bl)
        return StridedF32().offset(m_idx, 0, 4 * k) if lay is None else lay.packed_offset(m_idx, k)

    def dst_offset(self, m_idx: int, n_idx: int, dst_stride: int) -> int:
        return StridedF32().offset(m_idx, n_idx, dst_stride)

    def dst_size(self, m: int, n: int) -> int:
        return 4 * m * n

    def rhs_matches(self, packed: "PackedWeights") -> bool:
        """Whether ``packed`` is in the RHS layout (format and nr/kr/sr) this kernel reads."""
        if self.spec.vl_scaled and self.vl_bytes is None:
            return False
        fmt = self.rhs_layout(packed.bl or 32).format
        return (packed.format, packed.nr, packed.kr, packed.sr) == (fmt, self.nr, self.kr, self.sr)

    # -- calls --------------------------------------------------------------------------
    def __call__(self, lhs: np.ndarray, rhs_packed, dst: np.ndarray,
                 clamp_min: float = -FLT_MAX, clamp_max: float = FLT_MAX, *,
                 k: int | None = None, bl: int | None = None) -> np.ndarray:
        """f32: dst = clamp(lhs @ W + bias), lhs (m, k) f32 rows (packed-LHS kernels: rows,
        packed here, or bytes from ``lhs_layout().pack``).
        q4: dst = clamp(dequant(lhs_packed) @ dequant(W)), lhs = packed LHS bytes, with k and
        bl taken from PackedWeights (or given)."""
        self._require_cpu()
        if self.family == "f32":
            return self._call_f32(lhs, rhs_packed, dst, clamp_min, clamp_max, k)
        return self._call_q4(lhs, rhs_packed, dst, clamp_min, clamp_max, k, bl)

    def _call_f32(self, lhs, rhs_packed, dst, clamp_min, clamp_max, k=None):
        packed_lhs = self.spec.packs_f32_lhs
        if packed_lhs and isinstance(lhs, np.ndarray) and lhs.dtype == np.uint8:
            dst = _check_matrix("dst", dst, writeable=True)   # already packed: m from dst
            m = dst.shape[0]
            if k is None:
                if not isinstance(rhs_packed, PackedWeights):
                    raise ArgumentError("k is needed when both lhs and rhs_packed are raw bytes")
                k = rhs_packed.k
            lbuf = _check_bytes("lhs", lhs, self.lhs_packed_size(m, k))
        else:
            lhs = _check_matrix("lhs", lhs)
            m, k = lhs.shape
            dst = _check_matrix("dst", dst, rows=m, writeable=True)
            lbuf = self.lhs_layout().pack(lhs) if packed_lhs else lhs
        n = dst.shape[1]
        lay = self.rhs_layout()
        if isinstance(rhs_packed, PackedWeights):
            if (rhs_packed.format, rhs_packed.nr) != (lay.format, self.nr):
                raise ArgumentError(f"packed weights are {rhs_packed.format}, kernel {self.name} "
                                    f"reads {lay.format} on this CPU")
            if (rhs_packed.n, rhs_packed.k) != (n, k):
                raise ArgumentError(f"packed weights are n={rhs_packed.n}, k={rhs_packed.k}; "
                                    f"the call needs n={n}, k={k}")
            rhs_packed = rhs_packed.data
        buf = _check_bytes("rhs_packed", rhs_packed, self.rhs_packed_size(n, k))
        cmin, cmax = _clamps(clamp_min, clamp_max)
        stride = 4 * k if packed_lhs else _row_stride(lbuf)
        self._invoke(m, n, k, lbuf.ctypes.data, stride, buf.ctypes.data,
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
        self._invoke(m, n, k, bl, lbuf.ctypes.data, rbuf.ctypes.data, dst.ctypes.data,
                     _row_stride(dst), 4, cmin, cmax)
        return dst


class Packer:
    """A generated NEON LHS quantise-and-pack routine (byte-identical to the numpy packer)."""

    def __init__(self, entry: dict, fn, cpu: CpuInfo | None = None) -> None:
        self.entry = entry
        self.spec = _packer_spec(entry["spec"])
        self.name: str = self.spec.name
        self.features = frozenset(ISAS[self.spec.isa].features)
        self._cpu = cpu
        self._fn = fn
        self._probe = None
        fn.restype = None
        fn.argtypes = [_CTYPES[p["ctype"]] for p in entry["params"]]

    _require_cpu = Kernel._require_cpu
    _invoke = Kernel._invoke

    def __repr__(self) -> str:
        return f"<Packer {self.name}>"

    def __call__(self, x: np.ndarray, bl: int = 32, m_idx_start: int = 0,
                 out: np.ndarray | None = None) -> np.ndarray:
        """Pack rows ``x`` (global row index of x[0] = m_idx_start); returns the touched region
        (``out`` if given: the bytes of the row block holding row m_idx_start onwards)."""
        self._require_cpu()
        x = _check_matrix("x", x)
        m, k = x.shape
        if isinstance(m_idx_start, bool) or not isinstance(m_idx_start, (int, np.integer)) \
                or m_idx_start < 0:
            raise ArgumentError(f"m_idx_start must be a non-negative int, got {m_idx_start!r}")
        sp = self.spec
        try:
            lay = sp.layout(bl)
            if sp.fmt == "qsi8d32p" and k % bl:
                raise LayoutError(f"k={k} must be a multiple of bl={bl}")
        except (LayoutError, ValueError) as e:
            raise ArgumentError(str(e)) from None
        need = lay.region_size(m, k, int(m_idx_start))
        if out is None:
            out = np.zeros(need, np.uint8)
        else:
            out = _check_bytes("out", out, need)
            if not out.flags.writeable:
                raise ArgumentError("out is read-only")
        stride = _row_stride(x)
        src = x.ctypes.data
        args = [m, k] + ([bl] if sp.fmt == "qsi8d32p" else []) + [sp.mr, sp.kr, sp.sr, int(m_idx_start)]
        if sp.fmt == "qsi8d32p":   # KleidiAI convention: lhs = row 0 of the whole matrix
            src -= int(m_idx_start) * stride
        self._invoke(*args, src, stride, out.ctypes.data)
        return out


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
            packers = self.manifest.get("packers", [])
        except (KeyError, TypeError) as e:
            raise LoadError(f"{mpath} lacks field {e}") from None
        if not self.path.exists():
            raise LoadError(f"library {self.path} named by the manifest does not exist")
        blob = self.path.read_bytes()
        got = hashlib.sha256(blob).hexdigest()
        if got != want:
            raise LoadError(f"{self.path.name} does not match its manifest (sha256 {got[:16]}… "
                            f"!= {want[:16]}…): rebuild it or use the matching manifest")
        fmt = self.manifest.get("format", "elf")
        self.cpu = cpu or detect()
        here = "macho" if sys.platform == "darwin" else "elf"
        if fmt == "macho" and here != "macho":
            raise LoadError(f"{self.path.name} is a Mach-O library (apple-* targets build "
                            f"Mach-O), which only macOS loads; for Linux (and `tilegen "
                            f"emulate`) build an ELF one: tilegen build --format elf")
        if fmt != here or not self.cpu.is_arm64:
            raise LoadError(f"{self.path.name} is an aarch64 {fmt} library; this is "
                            f"{sys.platform}/{self.cpu.machine}. Run under `tilegen emulate` "
                            f"on x86-64 hosts")
        check_image(blob, fmt, self.path.name)
        check_entries(entries, packers, fmt, self.path.name)
        try:
            self._dll = ctypes.CDLL(str(self.path.resolve()))
        except OSError as e:
            raise LoadError(f"cannot load {self.path}: {e}") from None
        self._check_digest(entries, packers, fmt)
        self.kernels: dict[str, Kernel] = {}
        self._tables: dict[str, list[KernelPair]] = {}
        self.gemv_threshold = 1
        self.vl_bytes = self._read_vls()
        for e in entries:
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LoadError(f"kernel {e['name']} is in the manifest but not in {self.path.name}") from None
            kind = _kernel_spec(e["spec"]).vl_kind
            self.kernels[e["name"]] = Kernel(e, fn, self.vl_bytes.get(kind) if kind else None,
                                             cpu=self.cpu)
        self._abi = getattr(self._dll, self.manifest.get("abi_probe") or "tilegen_abi_call", None)
        if self._abi is not None:
            self._abi.restype = ctypes.c_uint64
            self._abi.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.packers: dict[str, Packer] = {}
        for e in packers:
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LoadError(f"packer {e['name']} is in the manifest but not in {self.path.name}") from None
            self.packers[e["name"]] = Packer(e, fn, cpu=self.cpu)

    def _check_digest(self, entries: list, packers: list, fmt: str) -> None:
        """LoadError unless the manifest's kernel table is the one the library was built with
        (the library carries its digest, see :mod:`tilegen.generator.manifest`)."""
        from ..generator.manifest import DIGEST_SYMBOL, table_digest
        try:
            carried = (ctypes.c_char * 64).in_dll(self._dll, DIGEST_SYMBOL).raw.decode("ascii")
        except (ValueError, UnicodeDecodeError):
            raise LoadError(f"{self.path.name} carries no kernel-table digest ({DIGEST_SYMBOL}); "
                            f"rebuild it with this tilegen") from None
        have = table_digest(entries, packers, fmt, self.manifest.get("abi_probe"))
        if have != carried:
            raise LoadError(f"the manifest's kernel table is not the one {self.path.name} was "
                            f"built with (sha256 {have[:16]}… != {carried[:16]}…): kernels or "
                            f"packers were added, removed or edited; rebuild the library or use "
                            f"its manifest")

    def __repr__(self) -> str:
        return f"<tilegen.Library {self.path} with {len(self.kernels)} kernels>"

    def _query(self, name: str):
        fn = getattr(self._dll, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = ctypes.c_uint64, []
        return fn

    def _read_vls(self) -> dict[str, int]:
        """Vector lengths in bytes, read once through the library (cntb; rdsvl), for the
        scalable ISAs this CPU has (and, for SME, has enabled)."""
        vls: dict[str, int] = {}
        for kind, fname in (("sve", "tilegen_sve_vl_bytes"), ("sme", "tilegen_sme_svl_bytes")):
            if kind in self.cpu.features:
                fn = self._query(fname)
                if fn is None:
                    continue      # library built before VL-scaled kernels existed
                vls[kind] = int(fn())
                os_bits = self.cpu.sve_vl if kind == "sve" else self.cpu.sme_vl
                if os_bits is not None and os_bits != 8 * vls[kind]:
                    raise LoadError(f"{kind.upper()} vector length: the library reads "
                                    f"{8 * vls[kind]} bits, the OS reports {os_bits}")
        return vls

    def svcr(self) -> int:
        """PSTATE.SM | PSTATE.ZA << 1 as the SVCR register reads now (SME CPUs only)."""
        if "sme" not in self.cpu.features:
            raise ArgumentError("SVCR exists only on SME CPUs (with SME enabled: TILEGEN_SME=1)")
        fn = self._query("tilegen_svcr")
        if fn is None:
            raise LoadError(f"{self.path.name} has no SVCR query (rebuild it with this tilegen)")
        return int(fn())

    # -- ABI conformance --------------------------------------------------------------
    ABI_BITS = ([f"x{19 + i}" for i in range(10)] + [f"d{8 + i}" for i in range(8)] +
                ["sp", "fpcr", "svcr"])

    def _probe_call(self, obj, args) -> int:
        block = np.zeros(15, np.uint64)
        ints, floats, stack = [], [], []
        for p, v in zip(obj.entry["params"], args):
            if p["ctype"] == "float":
                floats.append(int(np.float32(v).view(np.uint32)))
            else:
                (ints if len(ints) < 8 else stack).append(int(v) & (2**64 - 1))
        if len(floats) > 2 or len(stack) > 4:
            raise ArgumentError(f"{obj.name}: signature does not fit the ABI probe")
        block[:len(ints)] = ints
        block[8:8 + len(floats)] = floats
        block[10:10 + len(stack)] = stack
        block[14] = 1 if "sme" in self.cpu.features else 0     # SVCR readable: check it
        fnptr = ctypes.cast(obj._fn, ctypes.c_void_p).value
        return int(self._abi(fnptr, block.ctypes.data))

    def check_abi(self) -> dict[str, list[str]]:
        """Run every kernel and packer the CPU supports once through the ABI probe; return,
        per routine, the callee-saved state it failed to preserve (empty list = conforms)."""
        if self._abi is None:
            raise LoadError(f"{self.path.name} has no ABI probe (rebuild it with this tilegen)")
        rng = np.random.default_rng(0)
        results: dict[str, list[str]] = {}
        for obj in [*self.kernels.values(), *self.packers.values()]:
            if not (self.runnable(obj) if isinstance(obj, Kernel) else obj.features <= self.cpu.features):
                continue
            masks: list[int] = []
            obj._probe = lambda o, a: masks.append(self._probe_call(o, a))
            try:
                self._exercise(obj, rng)
            finally:
                obj._probe = None
            bad = 0
            for mk in masks:
                bad |= mk
            results[obj.name] = [b for i, b in enumerate(self.ABI_BITS) if bad >> i & 1]
        return results

    def _exercise(self, obj, rng) -> None:
        m, n, k = 5, 7, 64
        x = rng.normal(size=(m, k)).astype(np.float32)
        if isinstance(obj, Packer):
            obj(x, bl=32, m_idx_start=1)
            return
        w = rng.normal(size=(n, k)).astype(np.float32)
        dst = np.zeros((m, n), np.float32)
        if obj.family == "f32":
            obj(x, obj.rhs_layout().pack(w), dst)
        else:
            rhs = obj.rhs_layout(32).pack_from_float(w)
            lhs = obj.lhs_layout(32).pack(x)
            obj(lhs, rhs, dst, k=k, bl=32)

    # -- kernels --------------------------------------------------------------------
    def runnable(self, kernel: Kernel) -> bool:
        return kernel.features <= self.cpu.features and (
            not kernel.spec.vl_scaled or kernel.vl_bytes is not None)

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

    # -- selection ------------------------------------------------------------------
    def table(self, kind: str) -> list[KernelPair]:
        """The ordered kernel table for weight ``kind`` (replace with ``set_table``)."""
        if kind not in KIND_FAMILY:
            raise ArgumentError(f"unknown weights kind {kind!r}; known: {', '.join(KIND_FAMILY)}")
        if kind not in self._tables:
            self._tables[kind] = build_table(self.kernels.values(), KIND_FAMILY[kind])
        return self._tables[kind]

    def set_table(self, kind: str, pairs: list[KernelPair]) -> None:
        """Replace the ordered kernel table of weight ``kind``: pairs of this library's kernels
        (e.g. entries of :meth:`table`, or ``KernelPair(lib.kernels[gemm], lib.kernels[gemv])``
        with ``KernelPair`` from ``tilegen.runtime.select``).  The first entry the CPU runs is
        what pack_weights, adopt and workspace_size use; select (so matmul) uses the first
        runnable entry that reads the weights' layout.  f32 and f16 have separate tables."""
        self.table(kind)
        pairs = list(pairs)
        if not pairs:
            raise ArgumentError(f"the {kind} kernel table must not be empty")
        fam = KIND_FAMILY[kind]
        mine = set(map(id, self.kernels.values()))
        for p in pairs:
            if not isinstance(p, KernelPair):
                raise ArgumentError(f"table entries must be KernelPair, got {type(p).__name__}")
            for kern in (p.gemm, p.gemv):
                if kern is None:
                    continue
                if id(kern) not in mine:
                    raise ArgumentError(f"{kern!r} is not a kernel of {self.path.name}")
                if kern.family != fam:
                    raise ArgumentError(f"{kern.name} is not a {fam} kernel ({kind} weights "
                                        f"need the {fam} family)")
            if p.gemv is not None and not same_rhs(p.gemm.spec, p.gemv.spec):
                raise ArgumentError(f"gemv {p.gemv.name} does not read the packed weights of "
                                    f"gemm {p.gemm.name}")
        self._tables[kind] = pairs

    def _pairs(self, kind: str, nr: int | None = None) -> list[KernelPair]:
        """Runnable table entries for ``kind`` (with ``nr``: those whose gemm has that nr)."""
        pairs = [p for p in self.table(kind) if p.features <= self.cpu.features
                 and all(self.runnable(k) for k in (p.gemm, p.gemv) if k is not None)]
        if not pairs:
            raise ArgumentError(f"no kernel for {kind} weights in {self.path.name} runs on this "
                                f"CPU (features: {', '.join(sorted(self.cpu.features))})")
        if nr is not None:
            some = [p for p in pairs if p.gemm.nr == nr]
            if not some:
                raise ArgumentError(f"no {kind} kernel with nr={nr}; available nr: "
                                    f"{sorted({p.gemm.nr for p in pairs})}")
            pairs = some
        return pairs

    def select(self, packed: PackedWeights, m: int) -> Kernel:
        """Kernel for an (m x k) @ packed matmul: first runnable table entry that reads the
        packed layout; its gemv kernel when m <= gemv_threshold."""
        for p in self._pairs(packed.kind):
            if p.gemm.rhs_matches(packed):
                return p.pick(m, self.gemv_threshold)
        raise ArgumentError(f"no runnable kernel reads {packed.format} nr={packed.nr} "
                            f"kr={packed.kr} sr={packed.sr}; lib.adopt(weights) repacks them "
                            f"for this library")

    def adopt(self, packed: PackedWeights, nr: int | None = None) -> PackedWeights:
        """``packed`` in a layout a kernel of this library reads on this CPU.

        Returned as it is when a runnable table entry reads it (with ``nr``: one of that nr).
        Otherwise repacked, without loss, from any layout of its format (f32p: other nr;
        qsi4c32p / qsi4c32pscalef16: other nr, kr, sr) into the layout of the first runnable
        entry (with ``nr``: of that nr): new PackedWeights, the bytes ``pack_weights`` gives
        for the same weights.  The repack costs about one pack_weights call."""
        if not isinstance(packed, PackedWeights):
            raise ArgumentError(f"weights must be PackedWeights, got {type(packed).__name__}")
        pairs = self._pairs(packed.kind, nr)
        if any(p.gemm.rhs_matches(packed) for p in pairs):
            return packed
        from ..layout.api import layout_for, repack_rhs
        kern = pairs[0].gemm
        bl = packed.bl or 32
        try:
            src = layout_for(packed.format, nr=packed.nr, kr=packed.kr, sr=packed.sr, bl=bl)
            dst = kern.rhs_layout(bl)
            data = repack_rhs(packed.data, src, dst, packed.n, packed.k)
        except LayoutError as e:
            raise ArgumentError(f"{packed.kind} weights in {packed.format} nr={packed.nr} "
                                f"kr={packed.kr} sr={packed.sr}: {e} (kernel {kern.name})") from None
        return PackedWeights(dst.format, packed.n, packed.k, kern.nr, kern.kr, kern.sr, data,
                             packed.has_bias, packed.bl, packed.kind)

    # -- packing ----------------------------------------------------------------------
    def pack_weights(self, w=None, kind: str = "f32", bias: np.ndarray | None = None,
                     layout: str = "nk", nr: int | None = None, *, from_ggml=None,
                     n: int | None = None, k: int | None = None) -> PackedWeights:
        """Pack weights once for this library's preferred kernel of ``kind``.

        kind "f32" / "f16": (n, k) weights (or (k, n) with layout="kn"), f16 converted to f32.
        kind "q4_0" / "q4_0_dx": float32 (n, k) weights quantised like ggml's Q4_0, or raw ggml
        block_q4_0 data via ``from_ggml=`` (bytes-like or a uint8 array; with n, k).
        ``nr``: pack for the preferred kernel with that nr instead (:meth:`set_table` chooses
        any kernel)."""
        kern = self._pairs(kind, nr)[0].gemm
        try:
            if kind in ("f32", "f16"):
                w = np.asarray(w)
                if kind == "f16":
                    if w.dtype != np.float16:
                        raise ArgumentError(f"f16 weights must be float16, got {w.dtype}")
                    w = w.astype(np.float32)
                lay = kern.rhs_layout()
                data = lay.pack(w, bias=bias, layout=layout)
                n_, k_ = (w.shape if layout == "nk" else w.shape[::-1])
                return PackedWeights(lay.format, n_, k_, kern.nr, kern.kr, kern.sr, data,
                                     bias is not None, None, kind)
            lay = kern.rhs_layout(32)
            if from_ggml is not None:
                if n is None or k is None:
                    raise ArgumentError("from_ggml= needs n and k")
                data = lay.pack_from_ggml(from_ggml, n, k, **({"bias": bias} if kind == "q4_0_dx" else {}))
            else:
                w = np.asarray(w)
                if w.ndim != 2:
                    raise ArgumentError(f"weights must be 2-D (n, k), got shape {w.shape}")
                n, k = w.shape
                data = lay.pack_from_float(w, **({"bias": bias} if kind == "q4_0_dx" else {}))
        except LayoutError as e:
            raise ArgumentError(str(e)) from None
        return PackedWeights(lay.format, int(n), int(k), kern.nr, kern.kr, kern.sr, data,
                             bias is not None, 32, kind)

    def packer(self, fmt: str, mr: int, kr: int, sr: int, rounding: str = "away") -> Packer | None:
        """The library's NEON packer for this LHS format and geometry (same L = kr/sr)."""
        for p in self.packers.values():
            sp = p.spec
            if (sp.fmt, sp.mr, sp.L, sp.rounding) == (fmt, mr, kr // sr, rounding) and kr % sr == 0:
                return p
        return None

    def pack_lhs(self, fmt: str, x: np.ndarray, *, mr: int, kr: int, sr: int, bl: int = 32,
                 m_idx_start: int = 0, rounding: str = "away") -> np.ndarray:
        """Quantise and pack activation rows with the library's generated NEON packer (same
        arguments and bytes as ``tilegen.pack_lhs``)."""
        p = self.packer(fmt, mr, kr, sr, rounding)
        if p is None:
            raise ArgumentError(f"no {fmt} packer with mr={mr}, kr/sr={kr // max(sr, 1)} "
                                f"({rounding}) in {self.path.name}; it has: "
                                f"{', '.join(sorted(self.packers)) or 'none'}")
        return p(x, bl=bl, m_idx_start=m_idx_start)

    # -- ops ----------------------------------------------------------------------------
    def workspace_size(self, op: str, m: int, n: int, k: int) -> int:
        """Bytes of packed activations a matmul on ``op`` weights ("f32", "f16", "q4_0",
        "q4_0_dx") of shape (n, k) needs for m rows (0 for f32: its LHS is not packed)."""
        for v, nm in ((m, "m"), (n, "n"), (k, "k")):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ArgumentError(f"{nm} must be a positive int, got {v!r}")
        kern = self._pairs(op)[0].pick(m, self.gemv_threshold)
        if kern.family == "f32" and not kern.spec.packs_f32_lhs:
            return 0
        return kern.lhs_packed_size(m, k, 32)

    def matmul(self, x: np.ndarray, packed: PackedWeights, bias: np.ndarray | None = None,
               clamp: tuple[float, float] | None = None, threads: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
        """``clamp(x @ W.T + bias)`` for x of shape (m, k) or (..., m, k); float32 result.

        A bias packed with the weights is applied inside the kernel; ``bias=`` given here is
        added to the kernel's result (one f32 add) before the clamp.  Weights in a layout no
        runnable kernel reads are repacked by :meth:`adopt` on every call (nothing is cached):
        call ``packed = lib.adopt(packed)`` once to pay that once."""
        if bias is not None:
            b = np.asarray(bias)
            if b.dtype != np.float32 or b.shape != (getattr(packed, "n", -1),):
                raise ArgumentError(f"bias must be float32 of shape ({getattr(packed, 'n', '?')},), "
                                    f"got {b.dtype} {b.shape}")
            y = self.matmul(x, packed, None, None, threads, out)
            y += b
            if clamp is not None:
                cmin, cmax = _clamps(*clamp)
                np.minimum(np.maximum(y, np.float32(cmin), out=y), np.float32(cmax), out=y)
            return y
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
        nthreads = default_threads() if threads is None else threads
        if isinstance(nthreads, bool) or not isinstance(nthreads, int) or nthreads < 1:
            raise ArgumentError(f"threads must be a positive int, got {threads!r}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, packed.k))
        m = x2.shape[0]
        if m == 0:
            raise ArgumentError(f"x has no rows (shape {x.shape})")
        shape = (*lead, packed.n)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.float32 \
                or not out.flags.c_contiguous or not out.flags.writeable:
            raise ArgumentError(f"out must be a writeable C-contiguous float32 array of shape {shape}")
        cmin, cmax = (-FLT_MAX, FLT_MAX) if clamp is None else _clamps(*clamp)
        packed = self.adopt(packed)       # a repack per call when no kernel reads its layout
        kern = self.select(packed, m)
        dst = out.reshape(m, packed.n)
        k, bl = packed.k, packed.bl
        lay = kern.lhs_layout(bl or 32)
        if lay is None:     # f32 rows as they are
            lhs = x2
        else:   # packed activations (q4: quantised), split over m in multiples of m_step
            lhs = np.zeros(lay.packed_size(m, k), np.uint8)
            neon = (self.packer(kern.spec.info.lhs, lay.mr, kern.kr, kern.sr)
                    if kern.spec.info.quantized else None)

            def pack_part(m0, m1):    # m0 is a multiple of m_step (and so of the LHS mr)
                off = lay.packed_offset(m0, k)
                if neon is not None:
                    neon(x2[m0:m1], bl=bl, out=lhs[off:])
                else:
                    lhs[off:off + lay.region_size(m1 - m0, k)] = lay.pack(x2[m0:m1])
            run_parallel([lambda a=a, b=b: pack_part(a, b)
                          for a, b in split(m, kern.m_step, nthreads)])
        rhs = packed.data

        def part(n0, n1):
            roff = kern.rhs_packed_offset(n0, k, bl or 32)
            sub = PackedWeights(packed.format, n1 - n0, k, packed.nr, packed.kr, packed.sr,
                                rhs[roff:], packed.has_bias, bl, packed.kind)
            kern(lhs, sub, dst[:, n0:n1], cmin, cmax)
        run_parallel([lambda a=a, b=b: part(a, b) for a, b in split(packed.n, kern.n_step, nthreads)])
        return out

    def get_rows(self, packed: PackedWeights, rows) -> np.ndarray:
        """Dequantise rows of packed weights (get_rows: an embedding lookup)."""
        return dequantize_packed_rows(packed, rows)


def dequantize_packed_rows(packed: PackedWeights, rows) -> np.ndarray:
    idx = np.asarray(rows)
    if idx.size == 0 and idx.ndim == 1:      # [] and () come out as float64
        idx = idx.astype(np.int64)
    if idx.dtype.kind not in "iu" or idx.ndim != 1:
        raise ArgumentError(f"rows must be a 1-D integer array, got {idx.dtype} {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= packed.n):
        raise ArgumentError(f"row index out of range 0..{packed.n - 1}: "
                            f"{int(idx.min())}..{int(idx.max())}")
    from ..layout.api import layout_for
    lay = layout_for(packed.format, nr=packed.nr, kr=packed.kr, sr=packed.sr, bl=packed.bl or 32)
    if packed.format.startswith("f32p"):
        w, _ = lay.unpack(packed.data, packed.n, packed.k)
        return w[idx]
    return lay.dequantize_rows(packed.data, packed.n, packed.k, idx)


def load(directory: str | os.PathLike, cpu: CpuInfo | None = None) -> Library:
    """Load the library built into ``directory`` (verifies manifest and hash)."""
    return Library(directory, cpu=cpu)
