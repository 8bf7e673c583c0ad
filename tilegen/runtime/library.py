"""A loaded tilegen library: manifest and image checks, loading, the kernel bindings; the
methods of the public API, forwarded to the modules that own them.

The pieces live in their own modules: :mod:`.integrity` (image and manifest-entry checks),
:mod:`.binding` (Kernel, Packer), :mod:`.table` (KernelTable: selection, routes, adopt),
:mod:`.packing` (weights and activations), :mod:`.packed` (PackedWeights and its file format),
:mod:`.abi` (the ABI probe harness), :mod:`.ops` (matmul, workspace), :mod:`.experts`
(mixture-of-experts matmuls), :mod:`.request` (the
checked arguments of matmul and plan), :mod:`.plan` (prepared matmuls on the native driver,
:mod:`.driver`), :mod:`.checks` (argument rules), :mod:`.errors`."""
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

from ..generator.manifest import DIGEST_SYMBOL, MANIFEST_NAME, table_digest
from .abi import check_abi
from .binding import Kernel, Packer
from .cpu import CpuInfo, detect
from .driver import Driver
from .errors import ArgumentError, LoadError
from .experts import ExpertsPlan, matmul_experts
from .integrity import check_entries, check_image
from .ops import matmul, workspace_size
from .packed import PackedLayouts, PackedWeights, dequantize_packed_rows
from .packing import find_packer, lhs_packer, pack_lhs, pack_weights
from .plan import Plan
from .select import KernelPair
from .table import KernelTable
from .threads import Workers, reset_after_fork

__all__ = ["ArgumentError", "LoadError", "PackedWeights", "PackedLayouts", "Kernel", "Packer", "Library", "load",
           "dequantize_packed_rows", "MANIFEST_NAME"]

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


_UNSET = object()


class Library:
    """A built tilegen library: its manifest, its kernels, and the ops over them.

    Its threads (``matmul``'s pool and the plans' driver workers) end when the library and
    every plan of it are gone, or at ``close()`` (also ``with tilegen.load(d) as lib:``)."""

    def __init__(self, directory: str | os.PathLike, cpu: CpuInfo | None = None) -> None:
        self.closed = False
        # close() and what registers with the library (its plan driver, its plans) take this
        # lock: a plan made while the library closes is closed with it, or refused
        self._lifetime = threading.Lock()
        reset_after_fork(self)
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
        # each spec string parsed once: the kernels' descriptors and the packers' specs
        descriptors, packer_specs = check_entries(entries, packers, fmt, self.path.name)
        try:
            self._dll = ctypes.CDLL(str(self.path.resolve()))
        except OSError as e:
            raise LoadError(f"cannot load {self.path}: {e}") from None
        self._check_digest(entries, packers, fmt)
        self.kernels: dict[str, Kernel] = {}
        self.vl_bytes = self._read_vls()
        for e, d in zip(entries, descriptors):
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LoadError(f"kernel {e['name']} is in the manifest but not in {self.path.name}") from None
            self.kernels[e["name"]] = Kernel(d, e, fn, self.vl_bytes.get(d.vl_kind)
                                             if d.vl_kind else None, cpu=self.cpu)
        # the kernels on this CPU, ordered per weight kind: selection, routes, adopt
        self.kernel_table = KernelTable(self.kernels, self.cpu, self.path.name)
        # the ABI probe trampoline (tilegen.runtime.abi), None in libraries built before it
        self.abi_probe = getattr(self._dll, self.manifest.get("abi_probe") or "tilegen_abi_call",
                                 None)
        if self.abi_probe is not None:
            self.abi_probe.restype = ctypes.c_uint64
            self.abi_probe.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        self.packers: dict[str, Packer] = {}
        for e, p in zip(packers, packer_specs):
            try:
                fn = getattr(self._dll, e["name"])
            except AttributeError:
                raise LoadError(f"packer {e['name']} is in the manifest but not in {self.path.name}") from None
            self.packers[e["name"]] = Packer(p, e, fn, cpu=self.cpu,
                                             svl_bytes=self.vl_bytes.get("sme"))

    def _check_digest(self, entries: list, packers: list, fmt: str) -> None:
        """LoadError unless the manifest's kernel table is the one the library was built with
        (the library carries its digest, see :mod:`tilegen.generator.manifest`)."""
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
            drv = self.__dict__.get("_driver")      # loaded, or set
        for p in plans:
            p.close()
        if drv:
            drv.close()
        self.workers.close()

    def after_fork(self) -> None:
        """In a forked child (:func:`tilegen.runtime.threads.reset_after_fork`): another
        thread may have held the lifetime lock at the fork."""
        self._lifetime = threading.Lock()

    def __enter__(self) -> "Library":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def driver(self) -> Driver | None:
        """The library's plan driver (:mod:`tilegen.runtime.driver`), loaded when first used
        (under the lifetime lock: a closed library gets none, ArgumentError); None for a
        library built before it (or with another driver ABI): plans then run through
        :mod:`tilegen.runtime.ops`."""
        drv = self.__dict__.get("_driver", _UNSET)
        if drv is _UNSET:
            with self._lifetime:
                drv = self.__dict__.get("_driver", _UNSET)
                if drv is _UNSET:
                    self.ensure_open()
                    drv = self._driver = Driver.load(self._dll)
        return drv

    @driver.setter
    def driver(self, drv: Driver | None) -> None:
        """Replace the driver (None: plans run through :mod:`tilegen.runtime.ops`)."""
        self._driver = drv

    def ensure_open(self) -> None:
        if self.closed:
            raise self._closed_error()

    def _closed_error(self) -> ArgumentError:
        return ArgumentError(f"library {self.path.name} is closed (lib.close()); load it again")

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

    # -- kernels and selection (tilegen.runtime.table) -------------------------------------
    def runnable(self, kernel: Kernel) -> bool:
        return self.kernel_table.runnable(kernel)

    def kernel(self, name: str) -> Kernel:
        return self.kernel_table.kernel(name)

    @property
    def gemv_threshold(self) -> int:
        """Matmuls of at most this many rows run a pair's gemv kernel (default 1)."""
        return self.kernel_table.gemv_threshold

    @gemv_threshold.setter
    def gemv_threshold(self, rows: int) -> None:
        self.kernel_table.gemv_threshold = rows

    def table(self, kind: str) -> list[KernelPair]:
        """The ordered kernel table for weight ``kind`` (:meth:`KernelTable.table`)."""
        return self.kernel_table.table(kind)

    def set_table(self, kind: str, pairs: list[KernelPair]) -> None:
        """Replace the ordered kernel table of weight ``kind`` with ``pairs`` of this library's
        kernels (:meth:`KernelTable.set_table`)."""
        self.kernel_table.set_table(kind, pairs)

    def best_kernels(self, kind: str) -> dict[str, Kernel]:
        """op ("gemm", "gemv") -> the best kernel of any layout for ``kind`` on this CPU
        (:meth:`KernelTable.best_kernels`)."""
        return self.kernel_table.best_kernels(kind)

    def route(self, packed, m: int) -> tuple[PackedWeights, Kernel]:
        """(packing, kernel) for an (m x k) @ packed matmul (:meth:`KernelTable.route`)."""
        return self.kernel_table.route(packed, m)

    def select(self, packed: PackedWeights, m: int) -> Kernel:
        """Kernel for an (m x k) @ packed matmul (:meth:`KernelTable.select`)."""
        return self.kernel_table.select(packed, m)

    def adopt(self, packed: PackedWeights, nr: int | None = None) -> PackedWeights:
        """``packed`` in a layout a kernel of this library reads on this CPU: as it is, or
        repacked without loss (:meth:`KernelTable.adopt`)."""
        return self.kernel_table.adopt(packed, nr)

    # -- packing ----------------------------------------------------------------------
    def pack_weights(self, w=None, kind: str = "f32", bias: np.ndarray | None = None,
                     layout: str = "nk", nr: int | None = None, *, from_ggml=None,
                     n: int | None = None, k: int | None = None,
                     for_ops=None) -> PackedWeights | PackedLayouts:
        """Pack weights once for this library's preferred kernel of ``kind``.

        ``layout="kn"``: ``w`` is (k, n) instead of (n, k), for every kind (not with
        ``from_ggml=``: ggml blocks are always n rows of blocks, k/32 per row (Q4_0, Q8_0) or
        k/256 (Q4_K, Q6_K)).
        kind "f32" / "f16": (n, k) weights, f16 converted to f32.
        kind "f16" packs for the bf16 kernels where the CPU has bf16 (weights rounded to bf16,
        2 bytes each; activations rounded to bf16 per matmul), for the f32 kernels elsewhere.
        kind "bf16": float32 or float16 weights for the bf16 kernels, whatever the CPU (no
        bf16 kernel runnable: ArgumentError); kind "f32" keeps f32 kernels (f16 weights
        converted by the caller, ``w.astype(np.float32)``).
        kind "q4_0" / "q4_0_dx": float32 (n, k) weights quantised like ggml's Q4_0, or raw ggml
        block_q4_0 data via ``from_ggml=`` (bytes-like or a uint8 array; with n, k).
        kind "q8_0": float32 (n, k) weights quantised per channel (tilegen.families.q8_0), or raw
        ggml block_q8_0 bytes via ``from_ggml=`` (with n, k), requantised per channel.
        kind "q4_K" / "q6_K": raw ggml block_q4_K / block_q6_K bytes via ``from_ggml=`` only
        (with n, k; k a multiple of 256), repacked without loss.
        ``nr``: pack for the preferred kernel with that nr instead (:meth:`set_table` chooses
        any kernel).

        Expert stacks (mixture-of-experts, :meth:`matmul_experts`): ``w`` of shape (E, n, k)
        (layout "kn": (E, k, n)), or ``from_ggml=`` a uint8 array (E, n, row bytes) with n and
        k, for every kind: one PackedWeights with ``experts`` = E, each expert packed as one
        matrix is, in one buffer (``.expert(e)``: one expert's packing); ``bias`` then float32
        (E, n); not with ``for_ops``.

        ``for_ops=("gemm", "gemv")``: PackedLayouts instead, the weights packed once per
        distinct layout the best gemm and the best gemv (:meth:`best_kernels`) read -- two
        packings, twice the memory, when their layouts differ; matmul then runs the gemm on
        its packing for m > 1 and the gemv on its own for m = 1.  Without it: one packing for
        the default pair, which shares one layout."""
        return pack_weights(self.kernel_table, w, kind, bias, layout, nr, from_ggml, n, k,
                            for_ops)

    def packer(self, fmt: str, mr: int, kr: int, sr: int, rounding: str = "away") -> Packer | None:
        """The library's NEON packer for this LHS format and geometry (same L = kr/sr; None
        when there is none, or the geometry is not one of the format's): one of that mr, else
        a VL-scaled packer accepting ``mr`` rows at run time (bound to it, :meth:`Packer.at`;
        the one with the most rows per VL unit, an SME kernel's mr is units x SVL/32)."""
        return find_packer(self.packers, fmt, mr, kr, sr, rounding)

    def lhs_packer(self, kern: Kernel, bl: int = 32) -> Packer | None:
        """The generated packer that writes the packed LHS ``kern`` reads on this CPU (bound
        to its row count; None: the kernel reads f32 rows, or the library lacks the packer):
        for an SME kernel the streaming twin (``..._f32_sme``) when the library has it, else
        the NEON packer."""
        return lhs_packer(self.packers, kern, bl)

    def pack_lhs(self, fmt: str, x: np.ndarray, *, mr: int, kr: int, sr: int, bl: int = 32,
                 m_idx_start: int = 0, rounding: str = "away") -> np.ndarray:
        """Quantise and pack activation rows with the library's generated NEON packer (same
        arguments and bytes as ``tilegen.pack_lhs``); a format with no generated packer
        (q8ki16p, the ``:i16`` gemms' LHS) through its layout object's numpy packer, as
        :meth:`matmul` packs it."""
        return pack_lhs(self.packers, self.path.name, fmt, x, mr=mr, kr=kr, sr=sr, bl=bl,
                        m_idx_start=m_idx_start, rounding=rounding)

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
        plan = Plan(self, weights, m, bias, clamp, threads)
        with self._lifetime:
            if not self.closed:
                self._plans.add(plan)
                return plan
        plan.close()         # the library closed while the plan was made: refused
        raise self._closed_error()

    def matmul_experts(self, x: np.ndarray, experts: PackedWeights, ids: np.ndarray,
                       weights: np.ndarray | None = None,
                       threads: int | None = None) -> np.ndarray:
        """What ggml's MUL_MAT_ID computes, on an expert stack (``pack_weights`` of (E, n, k)
        weights or ggml blocks (E, n, row bytes)).

        x float32 (tokens, k), or (tokens, slots, k) with slots dividing n_used (pick u reads
        slot u % slots); ids integer (tokens, n_used): the experts each token picked, distinct
        within a token.  Returns float32 (tokens, n_used, n), row (t, u) =
        x[t, u % slots] @ W[ids[t, u]].T; with ``weights`` float32 (tokens, n_used) the
        weighted sum over the picks instead, (tokens, n) (float32, products first, added in
        slot order).  Bit-identical to ``lib.matmul`` per expert on the rows gathered for it
        (:mod:`tilegen.runtime.experts`), for every thread count."""
        return matmul_experts(self, x, experts, ids, weights, threads)

    def plan_experts(self, experts: PackedWeights, tokens: int, n_used: int,
                     slots: int | None = None, threads: int | None = None) -> ExpertsPlan:
        """A prepared :meth:`matmul_experts` for x of shape (tokens, k) (``slots=None``) or
        (tokens, slots, k) and ids (tokens, n_used): ``plan(x, ids)`` or
        ``plan(x, ids, weights)``, bit-identical to :meth:`matmul_experts`.  Checks of the
        stack, ``adopt`` and the kernel choice are done here, once."""
        return ExpertsPlan(self, experts, tokens, n_used, slots, threads)

    def get_rows(self, packed: PackedWeights, rows) -> np.ndarray:
        """Dequantise rows of packed weights (get_rows: an embedding lookup).  An expert stack
        takes (expert, row) pairs, ``rows`` of shape (r, 2)."""
        return dequantize_packed_rows(packed, rows)


def load(directory: str | os.PathLike, cpu: CpuInfo | None = None) -> Library:
    """Load the library built into ``directory`` (verifies manifest and hash)."""
    return Library(directory, cpu=cpu)
