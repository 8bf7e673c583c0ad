"""A loaded tilegen library: manifest and image checks, kernel bindings, selection, packing.

The pieces live in their own modules: :mod:`.packed` (PackedWeights and its file format),
:mod:`.binding` (Kernel, Packer), :mod:`.abi` (the ABI probe harness), :mod:`.ops` (matmul,
workspace), :mod:`.plan` (prepared matmuls on the native driver), :mod:`.checks` (argument
rules), :mod:`.errors`."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import threading
import weakref
from pathlib import Path

import numpy as np

from ..layout import LayoutError
from ..layout.base import same_rhs
from .abi import check_abi
from .binding import Kernel, Packer, kernel_spec
from .cpu import CpuInfo, detect
from .errors import ArgumentError, LoadError
from .integrity import check_entries, check_image
from .ops import matmul, workspace_size
from .packed import OPS, PackedLayouts, PackedWeights, dequantize_packed_rows
from .select import KIND_FAMILIES, KIND_FAMILY, KernelPair, kind_table
from .threads import Workers

__all__ = ["ArgumentError", "LoadError", "PackedWeights", "PackedLayouts", "Kernel", "Packer", "Library", "load",
           "dequantize_packed_rows", "MANIFEST_NAME"]

MANIFEST_NAME = "manifest.json"

# live libraries: a forked child resets their locks (tilegen.runtime.threads, .plan: the pools'
# and plans' own)
_LIBRARIES: weakref.WeakSet = weakref.WeakSet()


def _after_fork() -> None:
    for lib in list(_LIBRARIES):
        lib._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


# manifest fields: (JSON type, Python types, required); the entries of kernels/packers are
# checked against their spec strings (integrity.check_entries)
_MANIFEST_FIELDS = {"library": ("a string", (str,), True), "sha256": ("a string", (str,), True),
                    "kernels": ("a list", (list,), True), "packers": ("a list", (list,), False),
                    "format": ('"elf" or "macho"', (str,), False),
                    "abi_probe": ("a string or null", (str, type(None)), False)}


def read_manifest(directory: str | os.PathLike) -> dict:
    """The manifest of a library directory, its top-level fields checked (LoadError naming the
    field and what it must be): a JSON object with library, sha256, kernels (and optionally
    packers, format, abi_probe) of the right types."""
    mpath = Path(directory) / MANIFEST_NAME
    try:
        manifest = json.loads(mpath.read_text())
    except FileNotFoundError:
        raise LoadError(f"no {MANIFEST_NAME} in {directory} (build one with `tilegen build`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LoadError(f"cannot read {mpath}: {e}") from None
    except ValueError as e:       # JSONDecodeError
        raise LoadError(f"{mpath} is not valid JSON: {e}") from None
    if not isinstance(manifest, dict):
        raise LoadError(f"{mpath} must hold a JSON object (the fields library, sha256, kernels, "
                        f"...; `tilegen build` writes it), got a JSON {_json_type(manifest)}")
    for field, (what, types, required) in _MANIFEST_FIELDS.items():
        if field not in manifest:
            if required:
                raise LoadError(f"{mpath} lacks field {field!r} ({what})")
            continue
        v = manifest[field]
        if not isinstance(v, types) or (field == "format" and v not in ("elf", "macho")) or (
                field == "library" and (Path(v).name != v or v in ("", ".", ".."))):
            raise LoadError(f"{mpath}: field {field!r} must be {what}"
                            f"{': a file name in that directory' if field == 'library' else ''}, "
                            f"got {v!r:.60}")
    return manifest


def _json_type(v) -> str:
    return {list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(v), type(v).__name__)


class Library:
    """A built tilegen library: its manifest, its kernels, and the ops over them.

    Its threads (``matmul``'s pool and the plans' driver workers) end when the library and
    every plan of it are gone, or at ``close()`` (also ``with tilegen.load(d) as lib:``)."""

    def __init__(self, directory: str | os.PathLike, cpu: CpuInfo | None = None) -> None:
        self.closed = False
        # close() and what registers with the library (the plan driver, plans) take it: a
        # plan made while the library closes is closed with it, or refused
        self._lifetime = threading.Lock()
        _LIBRARIES.add(self)
        self.workers = Workers()
        self._plans: weakref.WeakSet = weakref.WeakSet()
        self.directory = Path(directory)
        self.manifest = read_manifest(self.directory)
        self.path = self.directory / self.manifest["library"]
        want = self.manifest["sha256"]
        entries = self.manifest["kernels"]
        packers = self.manifest.get("packers", [])
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
            kind = kernel_spec(e["spec"]).vl_kind
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
        state = " (closed)" if self.closed else ""
        return f"<tilegen.Library {self.path} with {len(self.kernels)} kernels{state}>"

    # -- lifetime -----------------------------------------------------------------------
    def close(self) -> None:
        """End the library's threads (joined) and every plan of it.  Afterwards ``matmul``,
        ``plan`` and calls of its plans raise ArgumentError; packing and ``get_rows`` (no
        kernels) still work.  Closing twice is a no-op."""
        with self._lifetime:
            if self.closed:
                return
            self.closed = True
            plans = list(self._plans)
            drv = self.__dict__.get("_plan_driver")
        for p in plans:
            p.close()
        if drv:
            drv.close()
        self.workers.close()

    def __enter__(self) -> "Library":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def ensure_open(self) -> None:
        if self.closed:
            raise self._closed_error()

    def _closed_error(self) -> ArgumentError:
        return ArgumentError(f"library {self.path.name} is closed (lib.close()); load it again")

    def _after_fork(self) -> None:
        self._lifetime = threading.Lock()   # another thread may have held it at the fork

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
    def check_abi(self) -> dict[str, list[str]]:
        """Every kernel and packer the CPU supports once through the ABI probe: per routine,
        the callee-saved state it failed to preserve (see :mod:`tilegen.runtime.abi`)."""
        return check_abi(self)

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
            self._tables[kind] = kind_table(self.kernels.values(), kind)
        return self._tables[kind]

    def set_table(self, kind: str, pairs: list[KernelPair]) -> None:
        """Replace the ordered kernel table of weight ``kind``: pairs of this library's kernels
        (e.g. entries of :meth:`table`, or ``KernelPair(lib.kernels[gemm], lib.kernels[gemv])``
        with ``KernelPair`` from ``tilegen.runtime.select``).  The first entry the CPU runs is
        what pack_weights, adopt and workspace_size use; select (so matmul) uses the first
        runnable entry that reads the weights' layout.  f32 and f16 have separate tables (f16:
        bf16 and f32 kernels)."""
        self.table(kind)
        pairs = list(pairs)
        if not pairs:
            raise ArgumentError(f"the {kind} kernel table must not be empty")
        fams = KIND_FAMILIES[kind]
        mine = set(map(id, self.kernels.values()))
        for p in pairs:
            if not isinstance(p, KernelPair):
                raise ArgumentError(f"table entries must be KernelPair, got {type(p).__name__}")
            for kern in (p.gemm, p.gemv):
                if kern is None:
                    continue
                if id(kern) not in mine:
                    raise ArgumentError(f"{kern!r} is not a kernel of {self.path.name}")
                if kern.family not in fams:
                    raise ArgumentError(f"{kern.name} is not a {' or '.join(fams)} kernel "
                                        f"({kind} weights need the {' or '.join(fams)} family)")
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

    def best_kernels(self, kind: str) -> dict[str, Kernel]:
        """op ("gemm", "gemv") -> the best kernel of any layout for ``kind`` on this CPU: the
        runnable kernels the build marked best (manifest ``"best"``, from the tuned preset's
        best_gemm / best_gemv) of the family the default pair is of; where there is none, the
        default pair's kernel (its gemm for gemv when the pair has no gemv)."""
        top = self._pairs(kind)[0]
        fam = top.gemm.family
        out = {"gemm": top.gemm, "gemv": top.gemv or top.gemm}
        found: set[str] = set()
        for kern in sorted(self.kernels.values(), key=lambda k: k.name):
            op = kern.entry.get("best")
            if op in OPS and op not in found and kern.family == fam and self.runnable(kern) \
                    and (op == "gemv") == kern.spec.is_gemv:
                out[op] = kern
                found.add(op)
        return out

    def _kernel_for(self, pw: PackedWeights, op: str) -> Kernel:
        """The kernel ``op`` uses on packing ``pw``: the best one if it reads pw's layout, else
        the first runnable table entry's that does."""
        cands = [self.best_kernels(pw.kind)[op]]
        for p in self._pairs(pw.kind):
            cands += [p.gemv, p.gemm] if op == "gemv" else [p.gemm]
        for kern in cands:
            if kern is not None and self.runnable(kern) and kern.rhs_matches(pw):
                return kern
        raise ArgumentError(f"no runnable {op} kernel reads {pw.layout.name} nr={pw.nr} "
                            f"kr={pw.kr} sr={pw.sr}; pack the weights again with this library "
                            f"(lib.pack_weights(..., for_ops=...))")

    def route(self, packed, m: int) -> tuple[PackedWeights, Kernel]:
        """(packing, kernel) for an (m x k) @ packed matmul.  PackedLayouts: its gemv packing
        with the gemv kernel for m <= gemv_threshold, else its gemm packing with the gemm
        kernel; PackedWeights: ``(packed, select(packed, m))``."""
        if isinstance(packed, PackedLayouts):
            op = "gemv" if m <= self.gemv_threshold else "gemm"
            pw = packed.for_op(op)
            return pw, self._kernel_for(pw, op)
        return packed, self.select(packed, m)

    def select(self, packed: PackedWeights, m: int) -> Kernel:
        """Kernel for an (m x k) @ packed matmul: first runnable table entry that reads the
        packed layout; its gemv kernel when m <= gemv_threshold.  (PackedLayouts: see
        :meth:`route`.)"""
        if isinstance(packed, PackedLayouts):
            return self.route(packed, m)[1]
        for p in self._pairs(packed.kind):
            if p.gemm.rhs_matches(packed):
                return p.pick(m, self.gemv_threshold)
        raise ArgumentError(f"no runnable kernel reads {packed.layout.name} nr={packed.nr} "
                            f"kr={packed.kr} sr={packed.sr}; lib.adopt(weights) repacks them "
                            f"for this library")

    def adopt(self, packed: PackedWeights, nr: int | None = None) -> PackedWeights:
        """``packed`` in a layout a kernel of this library reads on this CPU.

        Returned as it is when a runnable table entry reads it (with ``nr``: one of that nr).
        Otherwise repacked, without loss, from any layout of its format (f32p: other nr;
        qsi4c32p / qsi4c32pscalef16: other nr, kr, sr; bf16 layouts: any bf16 layout or f32p)
        into the layout of the first runnable entry that holds its values (with ``nr``: of that
        nr): new PackedWeights, the bytes ``pack_weights`` gives for the values they hold.
        "f16" and "bf16" weights in a bf16 layout become f32p weights (kind "f16") where the
        CPU runs no bf16 kernel: bf16 values widen to f32 exactly.  The repack costs about one
        pack_weights call.

        PackedLayouts are returned as they are when a runnable kernel reads each packing
        (ArgumentError otherwise: pack them again with this library)."""
        if isinstance(packed, PackedLayouts):
            for op in OPS:
                self._kernel_for(packed.for_op(op), op)
            return packed
        if not isinstance(packed, PackedWeights):
            raise ArgumentError(f"weights must be PackedWeights, got {type(packed).__name__}")
        kind = packed.kind
        if kind == "bf16":
            try:
                self._pairs(kind)
            except ArgumentError:   # no bf16 kernel runs here: f16's table (its f32 kernels)
                kind = "f16"
        pairs = self._pairs(kind, nr)
        if any(p.gemm.rhs_matches(packed) for p in pairs):
            return packed
        from ..layout.api import can_repack, repack_rhs
        bl = packed.bl or 32
        kern = next((p.gemm for p in pairs if can_repack(packed.layout, p.gemm.rhs_layout(bl))),
                    pairs[0].gemm)
        try:
            dst = kern.rhs_layout(bl)
            data = repack_rhs(packed.data, packed.layout, dst, packed.n, packed.k)
        except LayoutError as e:
            raise ArgumentError(f"{packed.kind} weights in {packed.format} nr={packed.nr} "
                                f"kr={packed.kr} sr={packed.sr}: {e} (kernel {kern.name})") from None
        return PackedWeights(dst, packed.n, packed.k, data, packed.has_bias, kind)

    # -- packing ----------------------------------------------------------------------
    def pack_weights(self, w=None, kind: str = "f32", bias: np.ndarray | None = None,
                     layout: str = "nk", nr: int | None = None, *, from_ggml=None,
                     n: int | None = None, k: int | None = None,
                     for_ops=None) -> PackedWeights | PackedLayouts:
        """Pack weights once for this library's preferred kernel of ``kind``.

        ``layout="kn"``: ``w`` is (k, n) instead of (n, k), for every kind (not with
        ``from_ggml=``: ggml blocks are always n rows of k/32 blocks).
        kind "f32" / "f16": (n, k) weights, f16 converted to f32.
        kind "f16" packs for the bf16 kernels where the CPU has bf16 (weights rounded to bf16,
        2 bytes each; activations rounded to bf16 per matmul), for the f32 kernels elsewhere.
        kind "bf16": float32 or float16 weights for the bf16 kernels, whatever the CPU (no
        bf16 kernel runnable: ArgumentError); kind "f32" keeps f32 kernels (f16 weights
        converted by the caller, ``w.astype(np.float32)``).
        kind "q4_0" / "q4_0_dx": float32 (n, k) weights quantised like ggml's Q4_0, or raw ggml
        block_q4_0 data via ``from_ggml=`` (bytes-like or a uint8 array; with n, k).
        kind "q8_0": float32 (n, k) weights quantised per channel (tilegen.runtime.q8), or raw
        ggml block_q8_0 bytes via ``from_ggml=`` (with n, k), requantised per channel.
        ``nr``: pack for the preferred kernel with that nr instead (:meth:`set_table` chooses
        any kernel).

        ``for_ops=("gemm", "gemv")``: PackedLayouts instead, the weights packed once per
        distinct layout the best gemm and the best gemv (:meth:`best_kernels`) read -- two
        packings, twice the memory, when their layouts differ; matmul then runs the gemm on
        its packing for m > 1 and the gemv on its own for m = 1.  Without it: one packing for
        the default pair, which shares one layout."""
        if for_ops is not None:
            ops = _check_ops(for_ops)
            if nr is not None:
                raise ArgumentError("nr= and for_ops= do not combine (for_ops packs for the "
                                    "best kernels of each op)")
            best = self.best_kernels(kind)
            by_layout: dict = {}
            by_op = {}
            for op in ops:
                kern = best[op]
                lay = kern.rhs_layout()
                if lay not in by_layout:
                    by_layout[lay] = self._pack_for(kern, w, kind, bias, layout, from_ggml, n, k)
                by_op[op] = by_layout[lay]
            return PackedLayouts(by_op)
        return self._pack_for(self._pairs(kind, nr)[0].gemm, w, kind, bias, layout, from_ggml,
                              n, k)

    def _pack_for(self, kern: Kernel, w, kind: str, bias, layout: str, from_ggml, n, k
                  ) -> PackedWeights:
        """The weights packed in the layout ``kern`` reads."""
        _check_source(kind, w, layout, from_ggml, n, k)
        if from_ggml is None and kind not in _FLOAT_KINDS:
            w = np.asarray(w)           # the quantisers take (n, k)
            if w.ndim != 2:
                raise ArgumentError(f"weights must be 2-D ({layout[0]}, {layout[1]}), got shape "
                                    f"{w.shape}")
            if layout == "kn":
                w = np.ascontiguousarray(w.T)
        try:
            if kind == "q8_0":      # per-channel int8 (tilegen.runtime.q8)
                from .q8 import pack_q8_0
                return pack_q8_0(kern, w, bias, from_ggml, n, k)
            if kind in ("f32", "f16", "bf16"):
                w = np.asarray(w)
                if kind == "f16":
                    if w.dtype != np.float16:
                        raise ArgumentError(f"f16 weights must be float16, got {w.dtype}")
                    w = w.astype(np.float32)
                elif kind == "bf16":     # rounded to bf16 (nearest even) by the layout
                    if w.dtype not in (np.float32, np.float16):
                        raise ArgumentError(f"bf16 weights must be float32 or float16, got "
                                            f"{w.dtype}")
                    w = w.astype(np.float32)
                lay = kern.rhs_layout()
                data = lay.pack(w, bias=bias, layout=layout)
                n_, k_ = (w.shape if layout == "nk" else w.shape[::-1])
                return PackedWeights(lay, n_, k_, data, bias is not None, kind)
            lay = kern.rhs_layout(32)
            if from_ggml is not None:
                data = lay.pack_from_ggml(from_ggml, n, k, bias=bias)
            else:
                n, k = w.shape
                data = lay.pack_from_float(w, bias=bias)
        except LayoutError as e:
            raise ArgumentError(str(e)) from None
        return PackedWeights(lay, int(n), int(k), data, bias is not None, kind)

    def packer(self, fmt: str, mr: int, kr: int, sr: int, rounding: str = "away") -> Packer | None:
        """The library's NEON packer for this LHS format and geometry (same L = kr/sr; None
        when there is none, or the geometry is not one of the format's): one of that mr, else
        a VL-scaled packer accepting ``mr`` rows at run time (bound to it, :meth:`Packer.at`;
        the one with the most rows per VL unit, an SME kernel's mr is units x SVL/32)."""
        from ..layout.api import layout_for
        try:
            layout_for(fmt, mr=mr, kr=kr, sr=sr)     # the format's rules on the geometry
        except LayoutError:
            return None
        L = kr // sr
        scaled = []
        for p in self.packers.values():
            sp = p.spec
            if (sp.fmt, sp.L, sp.rounding) != (fmt, L, rounding):
                continue
            if not sp.mr_vl and sp.mr == mr:
                return p
            if sp.mr_vl and sp.accepts_mr(mr):
                scaled.append(p)
        if not scaled:
            return None
        return max(scaled, key=lambda p: (p.spec.mr, p.name)).at(mr)

    def lhs_packer(self, kern: Kernel, bl: int = 32) -> Packer | None:
        """The generated packer that writes the packed LHS ``kern`` reads on this CPU (bound
        to its row count; None: the kernel reads f32 rows, or the library lacks the packer)."""
        from ..generator.packers import packer_for
        want = packer_for(kern.spec)
        if want is None:
            return None
        mr = kern.lhs_layout(bl).mr
        p = self.packers.get(want.name)
        if p is not None and p.spec.accepts_mr(mr):
            return p.at(mr)
        return self.packer(want.fmt, mr, want.kr, want.sr, want.rounding)

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

    # -- ops (tilegen.runtime.ops) -----------------------------------------------------
    def workspace_size(self, op: str, m: int, n: int, k: int) -> int:
        """Bytes of packed activations a matmul on ``op`` weights ("f32", "f16", "q4_0",
        "q4_0_dx", "q8_0") of shape (n, k) needs for m rows (0 for f32: its LHS is not packed)."""
        return workspace_size(self, op, m, n, k)

    def matmul(self, x: np.ndarray, packed: PackedWeights, bias: np.ndarray | None = None,
               clamp: tuple[float, float] | None = None, threads: int | None = None,
               out: np.ndarray | None = None) -> np.ndarray:
        """``clamp(x @ W.T + bias)`` for x of shape (m, k) or (..., m, k); float32 result.

        A bias packed with the weights is applied inside the kernel; ``bias=`` given here is
        added to the kernel's result (one f32 add) before the clamp.  ``out`` may share memory
        with x or bias: the result is then computed apart and copied into it.  Weights in a
        layout no runnable kernel reads are repacked by :meth:`adopt` on every call (nothing is
        cached): call ``packed = lib.adopt(packed)`` once to pay that once."""
        return matmul(self, x, packed, bias, clamp, threads, out)

    def plan(self, weights: PackedWeights, m: int, bias: np.ndarray | None = None,
             clamp: tuple[float, float] | None = None, threads: int | None = None):
        """A prepared ``matmul(x, weights, bias, clamp, threads)`` for x of up to m rows:
        ``plan(x)`` or ``plan(x, out)``, bit-identical to :meth:`matmul`.  Checks, ``adopt``,
        kernel selection, the thread split and the workspace are done here, once; a call of
        the planned shape is one native call (see :mod:`tilegen.runtime.plan`)."""
        from .plan import Plan
        plan = Plan(self, weights, m, bias, clamp, threads)
        with self._lifetime:
            if not self.closed:
                self._plans.add(plan)
                return plan
        plan.close()         # the library closed while the plan was made: refused
        raise self._closed_error()

    def get_rows(self, packed: PackedWeights, rows) -> np.ndarray:
        """Dequantise rows of packed weights (get_rows: an embedding lookup)."""
        return dequantize_packed_rows(packed, rows)


_FLOAT_KINDS = ("f32", "f16", "bf16")
_GGML_KINDS = ("q4_0", "q4_0_dx", "q8_0")      # kinds with a ggml block form (from_ggml=)
_LAYOUTS = ("nk", "kn")


def _check_source(kind: str, w, layout, from_ggml, n, k) -> None:
    """ArgumentError unless pack_weights got one weight source that fits ``kind``: ``w`` in
    ``layout`` "nk" or "kn", or (q4_0, q4_0_dx, q8_0) ggml blocks ``from_ggml`` with n and k,
    always n rows of k/32 blocks (ggml's (n, k) order: layout "nk")."""
    if not isinstance(layout, str) or layout not in _LAYOUTS:
        raise ArgumentError(f"layout must be 'nk' ((n, k) weights) or 'kn' ((k, n) weights), "
                            f"got {layout!r}")
    if from_ggml is None:
        if w is None:
            raise ArgumentError("no weights: pass w (or ggml blocks via from_ggml= with n and "
                                f"k, for kinds {', '.join(_GGML_KINDS)})")
        return
    if kind not in _GGML_KINDS:
        raise ArgumentError(f"from_ggml= takes ggml Q4_0/Q8_0 blocks, for kinds "
                            f"{', '.join(_GGML_KINDS)}; kind {kind!r} has no ggml block form: "
                            f"pass its weights as w")
    if w is not None:
        raise ArgumentError("pass either w or from_ggml=, not both")
    if layout != "nk":
        raise ArgumentError("from_ggml= blocks are always n rows of k/32 blocks (ggml's (n, k) "
                            "order): layout must be 'nk' with from_ggml=, got 'kn'")
    if n is None or k is None:
        raise ArgumentError("from_ggml= needs n and k")


def _check_ops(for_ops) -> tuple[str, ...]:
    """``for_ops`` as a tuple: both of "gemm" and "gemv", each once, in any order."""
    if isinstance(for_ops, str) or not isinstance(for_ops, (tuple, list)):
        raise ArgumentError(f"for_ops must be a tuple of op names, e.g. ('gemm', 'gemv'), "
                            f"got {for_ops!r}")
    ops = tuple(for_ops)
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise ArgumentError(f"unknown op {bad[0]!r} in for_ops; known: {', '.join(OPS)}")
    if len(set(ops)) != len(ops):
        raise ArgumentError(f"for_ops names an op twice: {ops!r}")
    if set(ops) != set(OPS):
        raise ArgumentError(f"for_ops must name both ops, ('gemm', 'gemv'), got {ops!r} (without "
                            f"for_ops the weights are packed once for the default pair)")
    return tuple(OPS)


def load(directory: str | os.PathLike, cpu: CpuInfo | None = None) -> Library:
    """Load the library built into ``directory`` (verifies manifest and hash)."""
    return Library(directory, cpu=cpu)
