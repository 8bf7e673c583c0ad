"""Kernel bindings: one ctypes function of a loaded library, its geometry and checked calls.

A kernel binds its descriptor (:func:`tilegen.generator.descriptor.descriptor`, which the
loader derived once from the manifest's spec string and checked against the entry): name,
features, vector-length kind, calling convention and C parameters; sizes and offsets at run
time come from the layout objects of the kernel's formats (at the call's bl and this CPU's
vector length).  A packer binds its :class:`~tilegen.generator.packers.PackerSpec`.  Every
foreign call first checks that the CPU has the routine's features (ArgumentError, never an
illegal instruction)."""
from __future__ import annotations

import copy
import ctypes
import math

import numpy as np

from ..callconv import Param
from ..generator.descriptor import KernelDescriptor
from ..generator.packers import PackerSpec
from ..layout import LayoutError, StridedF32, lhs_layout_for, rhs_layout_for
from ..records import ISAS
from .checks import check_bytes, check_matrix, clamp_bounds, positive_int, require_features, row_stride
from .cpu import CpuInfo
from .errors import ArgumentError
from .packed import PackedWeights

__all__ = ["Kernel", "Packer", "CTYPES"]

CTYPES = {"size_t": ctypes.c_size_t, "float": ctypes.c_float, "const void*": ctypes.c_void_p,
          "void*": ctypes.c_void_p}
INF = math.inf


class _Routine:
    """What kernels and packers share: the ctypes function, its CPU gate, the ABI-probe hook."""

    name: str
    features: frozenset

    def __init__(self, entry: dict, fn, params: tuple[Param, ...], cpu: CpuInfo | None) -> None:
        self.entry = entry
        self._cpu = cpu
        self._fn = fn
        # probe(routine, args): set by tilegen.runtime.abi to route calls through the ABI probe
        self.probe = None
        fn.restype = None
        fn.argtypes = [CTYPES[p.ctype] for p in params]

    @property
    def address(self) -> int:
        """The routine's address (for the ABI probe and the plan driver)."""
        return ctypes.cast(self._fn, ctypes.c_void_p).value

    def require_cpu(self) -> None:
        """ArgumentError unless the CPU has the routine's features."""
        require_features(type(self).__name__.lower(), self.name, self.features, self._cpu)

    def _invoke(self, *args) -> None:
        self.require_cpu()        # every foreign call: never an illegal instruction
        if self.probe is None:
            self._fn(*args)
        else:
            self.probe(self, args)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class Kernel(_Routine):
    """One kernel of a loaded library; calling it checks every argument first.

    A call on a CPU without the kernel's features (``cpu``, default:
    :func:`tilegen.runtime.cpu.detect`) raises ArgumentError."""

    def __init__(self, descriptor: KernelDescriptor, entry: dict, fn,
                 vl_bytes: int | None = None, cpu: CpuInfo | None = None) -> None:
        self.descriptor = descriptor
        self.spec = descriptor.spec
        self.name: str = descriptor.name
        # the CPU's vector length for this kernel's ISA (None: the CPU lacks it)
        self.vl_bytes = vl_bytes if descriptor.vl_kind else None
        self.family = descriptor.family
        self.abi = descriptor.abi            # its calling convention (tilegen.callconv)
        self.features = frozenset(descriptor.features)
        super().__init__(entry, fn, descriptor.params, cpu)

    def _vl(self) -> int | None:
        if self.descriptor.vl_kind and self.vl_bytes is None:
            kind = self.descriptor.vl_kind
            raise ArgumentError(f"kernel {self.name} has a tile in {kind} vector-"
                                f"length units and this CPU has no {kind.upper()} "
                                f"(or it is disabled)")
        return self.vl_bytes

    # geometry on this CPU (VL-scaled tiles resolved with the vector length read at load)
    mr = property(lambda self: self.spec.mr_at(self._vl()))
    nr = property(lambda self: self.spec.nr_at(self._vl()))
    kr = property(lambda self: self.spec.kr)
    sr = property(lambda self: self.spec.sr)
    m_step = mr
    n_step = nr

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

    def rhs_matches(self, packed: PackedWeights) -> bool:
        """Whether ``packed`` is in the RHS layout this kernel reads (equal layout objects)."""
        if self.spec.vl_scaled and self.vl_bytes is None:
            return False
        return packed.layout == self.rhs_layout(packed.bl or 32)

    def _weights(self, rhs_packed, n: int, k: int | None) -> tuple:
        """(bytes, k, bl) of ``rhs_packed``: PackedWeights in this kernel's layout with n
        columns (and k, if given), or raw bytes (k, bl: None)."""
        if not isinstance(rhs_packed, PackedWeights):
            return rhs_packed, k, None
        if rhs_packed.experts is not None:
            raise ArgumentError(f"packed weights are an expert stack ({rhs_packed.experts} "
                                f"experts): pass one expert, weights.expert(e)")
        if not self.rhs_matches(rhs_packed):
            lay, want = rhs_packed.layout, self.rhs_layout(rhs_packed.bl or 32)
            raise ArgumentError(f"packed weights are {lay.name} (kr={lay.kr}, sr={getattr(lay, 'sr', 1)}); "
                                f"kernel {self.name} reads {want.name} (kr={want.kr}, "
                                f"sr={getattr(want, 'sr', 1)}) on this CPU")
        if rhs_packed.n != n:
            raise ArgumentError(f"packed weights have n={rhs_packed.n}, dst has {n} columns")
        if k is not None and k != rhs_packed.k:
            raise ArgumentError(f"k={k} but the packed weights have k={rhs_packed.k}")
        return rhs_packed.data, rhs_packed.k, rhs_packed.bl

    # -- calls --------------------------------------------------------------------------
    def __call__(self, lhs: np.ndarray, rhs_packed, dst: np.ndarray,
                 clamp_min: float = -INF, clamp_max: float = INF, *,
                 k: int | None = None, bl: int | None = None) -> np.ndarray:
        """f32: dst = clamp(lhs @ W + bias), lhs (m, k) f32 rows (packed-LHS kernels: rows,
        packed here, or bytes from ``lhs_layout().pack``).
        q4: dst = clamp(dequant(lhs_packed) @ dequant(W)), lhs = packed LHS bytes, with k and
        bl taken from PackedWeights (or given); q8_0 likewise, without bl.
        bf16: dst = clamp(bf16(lhs) @ W + bias), lhs packed bytes (bf16p<mr>x4) or f32 rows
        (packed here by the layout object).

        The arguments are passed as the kernel's calling convention (``self.abi``) orders
        them: rows with a stride (f32), or a packed LHS with (q4) or without the block length."""
        self.require_cpu()
        cmin, cmax = clamp_bounds(clamp_min, clamp_max)
        if self.abi.lhs_rows:
            return self._call_rows(lhs, rhs_packed, dst, cmin, cmax, k)
        if self.abi.packs_rows and isinstance(lhs, np.ndarray) and lhs.dtype == np.float32:
            lhs = self.lhs_layout().pack(check_matrix("lhs", lhs, rows=dst.shape[0] if
                                                      isinstance(dst, np.ndarray) else None))
        return self._call_packed(lhs, rhs_packed, dst, cmin, cmax, k, bl)

    def _run(self, lhs, stride, rhs, dst, cmin, cmax, k, bl) -> np.ndarray:
        """The foreign call on checked arguments, in the convention's order."""
        m, n = dst.shape
        self._invoke(*self.abi.arguments({
            "m": m, "n": n, "k": k, "bl": bl, "lhs": lhs.ctypes.data, "lhs_stride": stride,
            "rhs": rhs.ctypes.data, "dst": dst.ctypes.data, "dst_stride_row": row_stride(dst),
            "dst_stride_col": 4, "min": cmin, "max": cmax}))
        return dst

    def _call_rows(self, lhs, rhs_packed, dst, cmin, cmax, k):
        packed_lhs = self.spec.packs_f32_lhs
        if packed_lhs and isinstance(lhs, np.ndarray) and lhs.dtype == np.uint8:
            dst = check_matrix("dst", dst, writeable=True)       # already packed: m from dst
            m, n = dst.shape
            rbytes, k, _ = self._weights(rhs_packed, n, k)
            if k is None:
                raise ArgumentError("k is needed when both lhs and rhs_packed are raw bytes")
            k = positive_int("k", k)
            lbuf = check_bytes("lhs", lhs, self.lhs_packed_size(m, k))
        else:
            lhs = check_matrix("lhs", lhs)
            m, k = lhs.shape
            dst = check_matrix("dst", dst, rows=m, writeable=True)
            n = dst.shape[1]
            rbytes, k, _ = self._weights(rhs_packed, n, k)
            lbuf = self.lhs_layout().pack(lhs) if packed_lhs else lhs
        buf = check_bytes("rhs_packed", rbytes, self.rhs_packed_size(n, k))
        stride = 4 * k if packed_lhs else row_stride(lbuf)
        return self._run(lbuf, stride, buf, dst, cmin, cmax, k, None)

    def _call_packed(self, lhs_packed, rhs_packed, dst, cmin, cmax, k, bl):
        """A packed LHS: q4 (k and bl from the weights, or given), q8_0 and bf16 (no block
        length: a bl= argument is ignored; any k >= 1)."""
        dst = check_matrix("dst", dst, writeable=True)
        m, n = dst.shape
        given_bl = bl
        rbytes, k, bl = self._weights(rhs_packed, n, k)
        if not self.abi.takes_bl:
            if k is None:
                raise ArgumentError("k is needed when rhs_packed is raw bytes")
            k = positive_int("k", k)
            rsize, lsize = self.rhs_packed_size(n, k), self.lhs_packed_size(m, k)
        else:
            if isinstance(rhs_packed, PackedWeights):
                if given_bl is not None and given_bl != bl:
                    raise ArgumentError(f"bl={given_bl} but the packed weights have bl={bl}")
            else:
                bl = given_bl
            if k is None or bl is None:
                raise ArgumentError("k and bl are needed when rhs_packed is raw bytes")
            k, bl = positive_int("k", k), positive_int("bl", bl)
            try:        # the layouts' rules on bl and k (bl a multiple of 32, k of bl)
                rsize, lsize = self.rhs_packed_size(n, k, bl), self.lhs_packed_size(m, k, bl)
            except LayoutError as e:
                raise ArgumentError(f"k={k}, bl={bl}: {e}") from None
        rbuf = check_bytes("rhs_packed", rbytes, rsize)
        lbuf = check_bytes("lhs_packed", lhs_packed, lsize)
        return self._run(lbuf, None, rbuf, dst, cmin, cmax, k, bl)


class Packer(_Routine):
    """A generated LHS quantise-and-pack routine (byte-identical to the numpy packer): NEON,
    or the streaming twin of a VL-scaled one (``spec.streaming``: SME, this CPU's SVL only).

    A VL-scaled packer (``spec.mr_vl``: the SME kernels' row blocks of ``units`` x SVL/32 rows)
    takes the row count at run time: ``mr`` (None until bound with :meth:`at`, or passed to
    the call) is what it is called with."""

    def __init__(self, spec: PackerSpec, entry: dict, fn, cpu: CpuInfo | None = None,
                 svl_bytes: int | None = None) -> None:
        self.spec = spec
        self.name: str = self.spec.name
        self.features = frozenset(ISAS[self.spec.isa].features)
        self.mr: int | None = None if self.spec.mr_vl else self.spec.mr
        self._bound: dict[int, Packer] = {}
        # a streaming packer packs the row blocks of this CPU's SVL only
        self.svl_bytes = svl_bytes if self.spec.streaming else None
        super().__init__(entry, fn, spec.abi.params, cpu)

    def accepts_mr(self, mr) -> bool:
        """Whether a call with ``mr`` rows packs on this CPU (streaming packers: units x SVL/32
        of the running CPU only)."""
        if not self.spec.accepts_mr(mr):
            return False
        return not self.spec.streaming or (self.svl_bytes is not None
                                           and mr == self.spec.svl_rows(self.svl_bytes))

    def _rows(self) -> str:
        if self.spec.streaming:
            return (f"units x SVL/32 = {self.spec.svl_rows(self.svl_bytes)} rows (this CPU)"
                    if self.svl_bytes else "units x SVL/32 rows of an SME CPU")
        return f"{', '.join(map(str, self.spec.vl_rows))} rows"

    def at(self, mr: int) -> "Packer":
        """This packer called with row blocks of ``mr`` rows (one of ``spec.vl_rows``; a
        streaming packer: this CPU's units x SVL/32)."""
        if mr == self.mr:
            return self
        if not self.accepts_mr(mr):
            raise ArgumentError(f"{self.name} packs row blocks of {self._rows()}, not mr={mr!r}")
        b = self._bound.get(mr)
        if b is None:
            b = copy.copy(self)
            b.mr, b._bound = mr, {}
            self._bound[mr] = b
        return b

    def layout(self, bl: int = 32):
        """The layout this packer writes (at its bound mr)."""
        if self.mr is None:
            raise ArgumentError(f"{self.name} takes mr at run time ({self._rows()}): use "
                                f".at(mr) or pass mr=")
        return self.spec.layout(bl, self.mr)

    def __call__(self, x: np.ndarray, bl: int = 32, m_idx_start: int = 0,
                 out: np.ndarray | None = None, mr: int | None = None) -> np.ndarray:
        """Pack rows ``x`` (global row index of x[0] = m_idx_start); returns the touched region
        (``out`` if given: the bytes of the row block holding row m_idx_start onwards)."""
        self.require_cpu()
        x = check_matrix("x", x)
        m, k = x.shape
        start = positive_int("m_idx_start", m_idx_start, minimum=0)
        sp = self.spec
        if mr is None:
            mr = self.mr
        elif not self.accepts_mr(mr):
            raise ArgumentError(f"{self.name} packs row blocks of {self._rows()}, not mr={mr!r}")
        try:
            lay = self.layout(bl) if mr == self.mr else sp.layout(bl, mr)
            if sp.fmt == "qsi8d32p" and k % bl:
                raise LayoutError(f"k={k} must be a multiple of bl={bl}")
            need = lay.region_size(m, k, start)
        except (LayoutError, ValueError) as e:
            raise ArgumentError(str(e)) from None
        if out is None:
            out = np.zeros(need, np.uint8)
        else:
            out = check_bytes("out", out, need)
            if not out.flags.writeable:
                raise ArgumentError("out is read-only")
        stride = row_stride(x)
        src = x.ctypes.data
        if sp.abi.lhs_at_row0:     # KleidiAI convention (qsi8d32p): lhs = row 0 of the matrix
            src -= start * stride
        self._invoke(*sp.abi.arguments({
            "m": m, "k": k, "bl": bl, "mr": mr, "kr": sp.kr, "sr": sp.sr, "m_idx_start": start,
            "lhs": src, "lhs_stride": stride, "lhs_packed": out.ctypes.data}))
        return out
