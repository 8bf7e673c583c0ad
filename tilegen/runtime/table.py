"""A library's kernel table: which kernel runs a matmul on which packed weights.

One ordered table of :class:`~tilegen.runtime.select.KernelPair` per weight kind (default
order: :mod:`tilegen.runtime.select`; ``set_table`` replaces it), the gemv threshold, and what
they decide: the runnable entries (:meth:`KernelTable.pairs`), the best kernels, the kernel
(and packing) of a matmul (:meth:`KernelTable.route`, :meth:`KernelTable.select`) and the
layout weights must be in (:meth:`KernelTable.adopt`).  :class:`tilegen.runtime.library.Library`
owns one and forwards its methods; a plan takes its routes from it when it is made."""
from __future__ import annotations

from ..layout import LayoutError
from ..layout.api import can_repack, repack_rhs
from ..layout.base import same_rhs
from .binding import Kernel
from .cpu import CpuInfo
from .errors import ArgumentError
from .packed import OPS, PackedLayouts, PackedWeights
from .select import KIND_FAMILIES, KIND_FAMILY, KernelPair, gemv_families, kind_table

__all__ = ["KernelTable"]


class KernelTable:
    """The kernels of one library on one CPU, ordered per weight kind.

    ``gemv_threshold``: matmuls of at most this many rows run a pair's gemv kernel (default
    1).  ``name`` (the library file) names the library in errors."""

    def __init__(self, kernels: dict[str, Kernel], cpu: CpuInfo, name: str) -> None:
        self.kernels = kernels
        self.cpu = cpu
        self.name = name
        self.gemv_threshold = 1
        self._tables: dict[str, list[KernelPair]] = {}

    def runnable(self, kernel: Kernel) -> bool:
        return kernel.features <= self.cpu.features and (
            not kernel.spec.vl_scaled or kernel.vl_bytes is not None)

    def kernel(self, name: str) -> Kernel:
        """The kernel ``name`` (KeyError: no such kernel; ArgumentError: the CPU cannot run it)."""
        try:
            k = self.kernels[name]
        except KeyError:
            raise KeyError(f"no kernel {name!r} in {self.name}; it has: "
                           f"{', '.join(sorted(self.kernels))}") from None
        if not self.runnable(k):
            missing = sorted(k.features - self.cpu.features)
            raise ArgumentError(f"kernel {name} needs {', '.join(missing)}, which this CPU lacks")
        return k

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
            for kern in p.kernels:
                if id(kern) not in mine:
                    raise ArgumentError(f"{kern!r} is not a kernel of {self.name}")
                ok = (kern.family in fams or kern is p.gemv and p.gemm.family in fams
                      and kern.family in gemv_families(p.gemm.family))
                if not ok:
                    raise ArgumentError(f"{kern.name} is not a {' or '.join(fams)} kernel "
                                        f"({kind} weights need the {' or '.join(fams)} family)")
            for role in ("gemv", "large"):
                kern = getattr(p, role)
                if kern is not None and not same_rhs(p.gemm.spec, kern.spec):
                    raise ArgumentError(f"{role} {kern.name} does not read the packed weights "
                                        f"of gemm {p.gemm.name}")
            if p.large is not None and (p.large.spec.is_gemv or p.large.family != p.gemm.family):
                raise ArgumentError(f"large-m gemm {p.large.name} must be a gemm of "
                                    f"{p.gemm.name}'s family")
            if isinstance(p.large_after, bool) or not isinstance(p.large_after, int) \
                    or p.large_after < 0:
                raise ArgumentError(f"large_after must be an int >= 0, got {p.large_after!r}")
        self._tables[kind] = pairs

    def pairs(self, kind: str, nr: int | None = None) -> list[KernelPair]:
        """Runnable table entries for ``kind`` (with ``nr``: those whose gemm has that nr)."""
        pairs = [p for p in self.table(kind) if p.features <= self.cpu.features
                 and all(self.runnable(k) for k in p.kernels)]
        if not pairs:
            raise ArgumentError(f"no kernel for {kind} weights in {self.name} runs on this "
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
        top = self.pairs(kind)[0]
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

    def kernel_for(self, pw: PackedWeights, op: str) -> Kernel:
        """The kernel ``op`` uses on packing ``pw``: the best one if it reads pw's layout, else
        the first runnable table entry's that does."""
        cands = [self.best_kernels(pw.kind)[op]]
        for p in self.pairs(pw.kind):
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
            return pw, self.kernel_for(pw, op)
        return packed, self.select(packed, m)

    def entry(self, packed: PackedWeights) -> KernelPair:
        """The first runnable table entry whose gemm reads ``packed`` (PackedWeights)."""
        for p in self.pairs(packed.kind):
            if p.gemm.rhs_matches(packed):
                return p
        raise ArgumentError(f"no runnable kernel reads {packed.layout.name} nr={packed.nr} "
                            f"kr={packed.kr} sr={packed.sr}; lib.adopt(weights) repacks them "
                            f"for this library")

    def row_class(self, packed, m: int) -> str:
        """Which kernel of its entry m rows on ``packed`` run ("gemv", "gemm" or "large",
        :meth:`KernelPair.op`); PackedLayouts: "gemv" or "gemm" by the gemv threshold."""
        if isinstance(packed, PackedLayouts):
            return "gemv" if m <= self.gemv_threshold else "gemm"
        return self.entry(packed).op(m, self.gemv_threshold)

    def large_from(self, packed) -> int | None:
        """The fewest rows that run the large-m gemm on ``packed`` (None: its entry has none;
        PackedLayouts: None)."""
        if isinstance(packed, PackedLayouts):
            return None
        return self.entry(packed).large_from

    def select(self, packed: PackedWeights, m: int) -> Kernel:
        """Kernel for an (m x k) @ packed matmul: first runnable table entry that reads the
        packed layout; its gemv kernel when m <= gemv_threshold, its large-m gemm from the
        entry's ``large_from`` rows on (:meth:`KernelPair.op`).  (PackedLayouts: see
        :meth:`route`.)"""
        if isinstance(packed, PackedLayouts):
            return self.route(packed, m)[1]
        return self.entry(packed).pick(m, self.gemv_threshold)

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
        (ArgumentError otherwise: pack them again with this library).  An expert stack is
        returned as it is, or each expert repacked into a new stack."""
        if isinstance(packed, PackedLayouts):
            for op in OPS:
                self.kernel_for(packed.for_op(op), op)
            return packed
        if not isinstance(packed, PackedWeights):
            raise ArgumentError(f"weights must be PackedWeights, got {type(packed).__name__}")
        kind = packed.kind
        if kind == "bf16":
            try:
                self.pairs(kind)
            except ArgumentError:   # no bf16 kernel runs here: f16's table (its f32 kernels)
                kind = "f16"
        pairs = self.pairs(kind, nr)
        if any(p.gemm.rhs_matches(packed) for p in pairs):
            return packed
        if packed.experts is not None:      # an expert stack: each expert repacked
            return PackedWeights.stack(self.adopt(packed.expert(e), nr)
                                       for e in range(packed.experts))
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
