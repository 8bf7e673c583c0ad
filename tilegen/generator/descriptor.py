"""One client-neutral description of a kernel, computed once per spec: what every client renders.

:func:`descriptor` turns a :class:`~tilegen.generator.spec.KernelSpec` into a frozen
:class:`KernelDescriptor`: its name, ISA and CPU features, which vector length scales its tile
(and the tile in those units), the KleidiAI-style getters as C expressions, its calling
convention (:mod:`tilegen.callconv`), the LHS packer it reads and its RHS layout.  The C header
and getters of a library (:mod:`tilegen.build.cheader`), the manifest
(:mod:`tilegen.generator.manifest`), the runtime binding (:mod:`tilegen.runtime.binding`) and the
KleidiAI export's ukernel getters and the llama.cpp patch's table (:mod:`tilegen.export.kleidiai`)
render it; none of them
computes a getter or an argument list of its own.

The getters' bodies are C over KleidiAI's parameter names (``m_idx``, ``n_idx``, ``k``, ``bl``,
``stride`` for the row stride of a plain f32 LHS, ``dst_stride``); a client whose interface
spells a parameter otherwise renders :meth:`Getter.spelled`.  The packed offsets and strides
come from the layout objects (``stride_expr``, :func:`tilegen.layout.base.c_expr`), the same
expressions the Python layouts evaluate.  A tile in vector-length units reads the vector length
in bytes through the C call :attr:`KernelDescriptor.vl_call` (``tg_svl_bytes()`` for SME,
``tg_vl_bytes()`` for SVE: the export defines both); each such per-row-block stride is checked
to be linear in the vector length over every VL (:func:`check_vl_scaling`) by the clients
that emit it as C.

Computing a descriptor needs the records and the layouts only: no register allocation and no
rendering (a library loads without either).  It checks what those give (the records'
preconditions, the layouts' rules: :class:`SpecError`), not the register file: whether the
registers hold the tile is :func:`tilegen.generator.validate.validate`'s question.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from ..callconv import Abi, Param
from ..layout import lhs_layout_for, rhs_layout_for
from ..layout.base import c_expr, eval_expr
from ..families import abi_for
from ..records import SpecError
from .packers import packer_for, streaming_packer_for
from .spec import KernelSpec
from .tile_layouts import check_packing
from .validate import check_records

__all__ = ["Getter", "PackerRef", "KernelDescriptor", "descriptor", "check_vl_scaling",
           "GETTER_SLOTS"]

#: the getters' slots in KleidiAI's order (the fields of its ukernel structs); a plain-f32-LHS
#: kernel has ``get_lhs_offset`` in place of ``get_lhs_packed_offset``
GETTER_SLOTS = ("get_m_step", "get_n_step", "get_mr", "get_nr", "get_kr", "get_sr",
                "get_lhs_packed_offset", "get_rhs_packed_offset", "get_dst_offset",
                "get_dst_size")

_VLS = tuple(range(16, 257, 16))
_VL = "{vl}"        # placeholder of the vector-length call while expressions are built


@dataclass(frozen=True)
class Getter:
    """One getter: its slot (``get_mr``, ...), its C parameter list (``"void"`` or
    ``"size_t m_idx, size_t k"``) and the C expression it returns."""

    slot: str
    params: str
    body: str

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.split()[-1].lstrip("*") for p in self.params.split(",")
                     if p.strip() != "void")

    def spelled(self, **names: str) -> "Getter":
        """This getter with parameters renamed (``stride="dst_stride"``), in the parameter
        list and the body alike."""
        params, body = self.params, self.body
        for old, new in names.items():
            params = re.sub(rf"\b{old}\b", new, params)
            body = re.sub(rf"\b{old}\b", new, body)
        return replace(self, params=params, body=body)


@dataclass(frozen=True)
class PackerRef:
    """The generated LHS packer a kernel reads: name, packer spec string (the manifest's
    ``lhs:...``), calling convention and its parameters."""

    name: str
    spec: str
    abi: str
    params: tuple[Param, ...]


@dataclass(frozen=True)
class KernelDescriptor:
    """Everything a client of one kernel needs, computed once (:func:`descriptor`)."""

    spec: KernelSpec
    name: str
    spec_string: str
    family: str
    isa: str
    features: tuple[str, ...]       # CPU features the kernel needs
    vl_kind: str | None             # "sve", "sme" or None: which vector length scales the tile
    vl_call: str | None             # the C call giving that vector length in bytes
    tile: str                       # "MRxNR" as spec strings write it ("1vlx4vl")
    mr: int                         # in VL units where mr_vl
    nr: int                         # in VL units where nr_vl
    mr_vl: bool
    nr_vl: bool
    kr: int
    sr: int
    is_gemv: bool
    abi: Abi                        # the kernel's calling convention
    lhs_format: str                 # packed-LHS label ("f32": plain rows)
    rhs_format: str                 # packed-RHS label
    lhs_layout_format: str | None   # the packed-LHS layout's format key (its packer's), None
                                    # for plain f32 rows
    rhs_layout_format: str          # the packed-RHS layout's format key
    rhs_layout: str                 # the RHS layout's name (its format key where VL-scaled)
    lhs_packer: PackerRef | None    # the generated NEON packer of its LHS
    lhs_packer_sme: PackerRef | None  # the streaming twin (SME kernels' k-major LHS)
    getters: tuple[Getter, ...]     # in GETTER_SLOTS order

    @property
    def params(self) -> tuple[Param, ...]:
        """The kernel's C parameters (its calling convention's)."""
        return self.abi.params

    def prototype(self, symbol: str | None = None) -> str:
        """``void <symbol>(size_t m, ...)``, the kernel's own name by default."""
        return self.abi.prototype(symbol or self.name)

    def getter(self, slot: str) -> Getter:
        for g in self.getters:
            if g.slot == slot:
                return g
        raise KeyError(slot)

    def getter_functions(self, name: str | None = None, prefix: str = "") -> dict[str, str]:
        """The getters' C function names by slot, ``<prefix><slot>_<name>`` (the kernel's own
        name by default): ``prefix="kai_"`` and the exported name are KleidiAI's."""
        return {g.slot: f"{prefix}{g.slot}_{name or self.name}" for g in self.getters}

    def for_interface(self, n_step_tiles: int = 1, sr: int | None = None) -> "KernelDescriptor":
        """The descriptor as an interface that steps over n in ``n_step_tiles`` tiles and
        states ``sr`` in get_sr (KleidiAI's names that unroll n, or whose RHS packer takes
        another sr than the kernel's layout reads)."""
        if n_step_tiles == 1 and sr is None:
            return self
        over = {"get_n_step": _units(n_step_tiles * self.nr, self.nr_vl, self.vl_call),
                "get_sr": str(sr if sr is not None else self.sr)}
        return replace(self, getters=tuple(replace(g, body=over.get(g.slot, g.body))
                                           for g in self.getters))

    def manifest_fields(self) -> dict:
        """The descriptor as a manifest entry carries it (JSON types only)."""
        return {"isa": self.isa, "features": list(self.features), "vl_kind": self.vl_kind,
                "tile": {"mr": self.mr, "nr": self.nr, "mr_vl": self.mr_vl,
                         "nr_vl": self.nr_vl, "kr": self.kr, "sr": self.sr},
                "lhs": self.lhs_format, "rhs": self.rhs_format,
                "lhs_packer": self.lhs_packer.name if self.lhs_packer else None,
                "lhs_packer_sme": self.lhs_packer_sme.name if self.lhs_packer_sme else None,
                "getters": {g.slot: {"params": g.params, "body": g.body} for g in self.getters}}


def _units(n: int, scaled: bool, vl_call: str | None) -> str:
    """C for ``n`` rows or columns, in VL units (x the 32-bit lanes of a vector) if scaled."""
    return f"({n} * ({vl_call} / 4))" if scaled else str(n)


def _vl_stride(fn) -> str:
    """C for a per-row-block byte count that scales with the vector length: ``fn(vl)`` gives
    the stride expression (in k, bl) at ``vl`` bytes; the C is ``vl/16`` times the one at 16
    bytes (:func:`check_vl_scaling` checks that this holds)."""
    return f"(({_VL} / 16) * ({c_expr(fn(16))}))"


def _vl_strides(spec: KernelSpec) -> list[tuple[str, object]]:
    """(what, stride expression at ``vl`` bytes) of the strides the getters scale with the VL."""
    out = []
    if spec.packs_lhs and spec.vl_scaled and spec.mr_vl:
        out.append((f"{spec.name} LHS", lambda v: lhs_layout_for(spec, 32, v).stride_expr))
    if spec.nr_vl:
        out.append((f"{spec.name} RHS", lambda v: rhs_layout_for(spec, 32, v).stride_expr))
    return out


@lru_cache(maxsize=None)
def check_vl_scaling(spec: KernelSpec) -> None:
    """SpecError unless every stride the getters of ``spec`` scale with the vector length is
    ``vl/16`` times the one at 16 bytes, at every VL (16..256 bytes) and a range of k: what the
    VL-scaled getters' C assumes.  Clients that emit those getters as C call it (the export);
    loading a library, which only compares them, does not."""
    for what, fn in _vl_strides(spec):
        e16 = fn(16)
        for k in (32, 64, 96, 128, 256, 4096, 1, 5, 33):
            try:
                b = eval_expr(e16, k=k, bl=32)
            except (ZeroDivisionError, ValueError):
                continue
            for vl in _VLS:
                e = fn(vl)
                try:
                    a = eval_expr(e, k=k, bl=32)
                except (ZeroDivisionError, ValueError):
                    continue
                if a != (vl // 16) * b:
                    raise SpecError(f"{what}: stride {e!r} at VL {vl} is not {vl // 16} x "
                                    f"{e16!r}")


def _packer_ref(p) -> PackerRef | None:
    return None if p is None else PackerRef(p.name, p.spec_string, p.abi.name, p.abi.params)


def _getters(spec: KernelSpec, vl_call: str | None) -> tuple[Getter, ...]:
    def units(n: int, scaled: bool) -> str:
        return _units(n, scaled, vl_call)

    if spec.packs_lhs:
        mr = units(spec.lhs_mr, spec.mr_vl)
        if spec.vl_scaled and spec.mr_vl:
            stride = _vl_stride(lambda v: lhs_layout_for(spec, 32, v).stride_expr)
            lay16 = lhs_layout_for(spec, 32, 16)
        else:       # fixed LHS rows (the RHS may be VL-scaled)
            lay16 = lhs_layout_for(spec, 32, 16 if spec.vl_scaled else None)
            stride = f"({c_expr(lay16.stride_expr)})"
        lhs = Getter("get_lhs_packed_offset",
                     "size_t m_idx, size_t k" + (", size_t bl" if "bl" in lay16.stride_expr
                                                  else ""),
                     f"(m_idx / {mr}) * {stride}")
        rhs_params = "size_t n_idx, size_t k, size_t bl"
    else:           # plain f32 rows
        mr = units(spec.mr, spec.mr_vl)
        lhs = Getter("get_lhs_offset", "size_t m_idx, size_t stride", "m_idx * stride")
        rhs_params = "size_t n_idx, size_t k"
    nr = units(spec.nr, spec.nr_vl)
    if spec.nr_vl:
        rstride = _vl_stride(lambda v: rhs_layout_for(spec, 32, v).stride_expr)
    else:
        rstride = f"({c_expr(rhs_layout_for(spec).stride_expr)})"
    consts = (("get_m_step", units(spec.mr, spec.mr_vl)), ("get_n_step", nr), ("get_mr", mr),
              ("get_nr", nr), ("get_kr", str(spec.kr)), ("get_sr", str(spec.sr)))
    out = [Getter(slot, "void", body) for slot, body in consts] + [
        lhs, Getter("get_rhs_packed_offset", rhs_params, f"(n_idx / {nr}) * {rstride}"),
        Getter("get_dst_offset", "size_t m_idx, size_t n_idx, size_t dst_stride",
               "m_idx * dst_stride + n_idx * sizeof(float)"),
        Getter("get_dst_size", "size_t m, size_t n", "m * n * sizeof(float)")]
    return tuple(replace(g, body=g.body.replace(_VL, vl_call or "")) for g in out)


@lru_cache(maxsize=None)
def descriptor(spec: KernelSpec) -> KernelDescriptor:
    """The descriptor of ``spec`` (cached).  SpecError when the records or the layouts refuse
    the spec (:func:`~tilegen.generator.validate.check_records`,
    :func:`~tilegen.generator.tile_layouts.check_packing`); the register file is not asked."""
    if not isinstance(spec, KernelSpec):
        raise SpecError(f"expected a KernelSpec, got {spec!r}")
    check_records(spec)
    check_packing(spec)
    vl_kind = spec.vl_kind
    vl_call = None if vl_kind is None else (
        "tg_svl_bytes()" if vl_kind == "sme" else "tg_vl_bytes()")
    rhs_layout = (spec.rhs_layout_class.format if spec.vl_scaled
                  else rhs_layout_for(spec).name)
    return KernelDescriptor(
        spec=spec, name=spec.name, spec_string=spec.spec_string, family=spec.family,
        isa=spec.isa, features=tuple(spec.features), vl_kind=vl_kind, vl_call=vl_call,
        tile=f"{spec.mr_str}x{spec.nr_str}", mr=spec.mr, nr=spec.nr, mr_vl=spec.mr_vl,
        nr_vl=spec.nr_vl, kr=spec.kr, sr=spec.sr, is_gemv=spec.is_gemv,
        abi=abi_for(spec.family), lhs_format=spec.lhs_format, rhs_format=spec.rhs_format,
        lhs_layout_format=spec.lhs_layout_class.format if spec.packs_lhs else None,
        rhs_layout_format=spec.rhs_layout_class.format,
        rhs_layout=rhs_layout, lhs_packer=_packer_ref(packer_for(spec)),
        lhs_packer_sme=_packer_ref(streaming_packer_for(spec)),
        getters=_getters(spec, vl_call))
