"""``tilegen export kleidiai``: a source tree that builds in place of KleidiAI v1.24.0.

llama.cpp's CPU backend adds KleidiAI with ``add_subdirectory`` and links a target
``kleidiai``; its ``kleidiai/kernels.cpp`` includes one header per micro-kernel and packer and
takes the address of ~300 ``kai_`` functions.  This module writes a tree with the same include
paths and C ABI whose implementations are tilegen's:

* every matmul micro-kernel llama.cpp names (:data:`KERNELS`) is a tilegen assembly kernel
  that reads the same packed layouts (rendered once per spec under a hidden symbol
  ``tilegen_<name>``; the ``kai_run_*`` function is a one-call C wrapper that adapts the
  argument list);
* the getters (m_step, n_step, mr, nr, kr, sr, packed offsets, dst offset/size) are generated
  C from the spec and its layout objects (``tilegen.layout``: the same stride expressions the
  Python runtime evaluates).  Tiles in vector-length units read the streaming vector length
  (``rdsvl``) at run time, as KleidiAI's SME getters do;
* the LHS/RHS packers come from :mod:`tilegen.export.packers_c` (:func:`packer_files`);
  :func:`missing_symbols` lists any llama.cpp function the tree does not define;
* ``kai/kai_common.h`` (+ ``kai_common.c``) provides what llama.cpp and the packers use from
  KleidiAI's common header, and ``CMakeLists.txt`` defines the static target ``kleidiai``.
* tilegen's K-quant kernels (no KleidiAI name: named as tilegen names the spec) in the same
  shape, one table of gemm + gemv entries (:func:`kquant_entries`: the default tiles, or the
  preset's tuned ones), and ``llama-kquants.patch``, the llama.cpp patch that wires that table
  into llama.cpp's KleidiAI backend, generated for it by :mod:`tilegen.export.llama` (its data
  from :func:`llama_entry`).

The C and CMake text is Jinja templates under ``templates/export/`` (``ukernel.h.j2``,
``ukernel.c.j2``, ``interface.h.j2``,
``kai_common.h.j2``/``.c.j2``, ``CMakeLists.txt.j2``), rendered by the kernels' environment
(:func:`tilegen.generator.render.render_template`); this module decides what each file holds
and computes the numbers in it.

Signatures are KleidiAI's public ones (facts of its headers); the code is tilegen's own.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .. import callconv
from ..build.targets import get_target
from ..build.tuned import read_tuned, tuned_path, tuned_targets
from ..callconv import Param
from ..families import FAMILIES, LLAMA_KERNELS
from ..records import SpecError, __version__
from ..generator.descriptor import check_vl_scaling, descriptor
from ..generator.render import render, render_template
from ..generator.spec import KernelSpec
from ..generator.validate import parse_spec
from ..layout import lhs_layout_for
from ..layout.base import same_rhs
from . import llama, packers_c
from .files import ExportFile

__all__ = ["KAI_VERSION", "Abi", "ABIS", "KaiKernel", "KERNELS", "kai_symbols", "export_files", "ExportFile",
           "write_tree", "is_export", "missing_symbols", "tuned_pair_overrides", "ENTRIES", "packer_files", "mapping_table", "tuned_overrides",
           "ExportError", "KQUANT_KERNELS", "KQUANT_ENTRIES", "KQUANT_DEFAULT", "KQuantEntry",
           "LLAMA_PATCH", "kquant_symbols", "kquant_entries", "llama_entry", "llama_patch"]

KAI_VERSION = "1.24.0"
MANIFEST = "TILEGEN_EXPORT.json"
_SYMBOLS_FILE = Path(__file__).resolve().parent / "kai_symbols.txt"


class ExportError(RuntimeError):
    """The export cannot be written as asked (the message names the kernel or file)."""


# -- KleidiAI interface families ----------------------------------------------------------

@dataclass(frozen=True)
class Abi:
    """One KleidiAI matmul interface: directory, getter parameter lists and run parameters
    (facts of KleidiAI's headers), and the tilegen calling convention (:mod:`tilegen.callconv`)
    its run function calls."""

    key: str
    directory: str              # under kai/ukernels/matmul/
    interface: str              # <...>_interface.h stem and ukernel struct name
    lhs_getter: str             # get_lhs_packed_offset, or get_lhs_offset (plain f32 rows)
    lhs_params: str
    rhs_params: str
    run: tuple[Param, ...]      # kai_run_matmul_<...>'s parameters
    calls: callconv.Abi         # the tilegen kernels' convention
    fill: tuple[tuple[str, str], ...] = ()   # (role, C expression): kernel arguments run lacks

    @property
    def run_params(self) -> str:
        return ", ".join(f"{p.ctype} {p.name}" for p in self.run)

    @property
    def tilegen_args(self) -> str:
        """The tilegen kernel's arguments, in terms of run_params."""
        return ", ".join(self.calls.arguments({**{p.role: p.name for p in self.run},
                                               **dict(self.fill)}))


# KleidiAI's quantised runs write float* dst; its packed-LHS f32 run is tilegen's f32
# convention with the LHS named lhs_packed and no lhs_stride (a packed LHS is one block of
# rows, 4k apart)
_Q4_RUN = callconv.Q4.spelled(dst="float*")
_F32P_RUN = tuple(replace(p, name="lhs_packed") if p.role == "lhs" else p
                  for p in callconv.F32.params if p.role != "lhs_stride")

def _llama_abi(fam: str) -> Abi:
    key = f"{FAMILIES[fam].lhs}_{FAMILIES[fam].rhs}"
    if FAMILIES[fam].abi is callconv.Q4:
        return Abi(key, f"matmul_clamp_f32_{key}", f"matmul_clamp_f32_{key}",
                   "get_lhs_packed_offset", "size_t m_idx, size_t k, size_t bl",
                   "size_t n_idx, size_t k, size_t bl", _Q4_RUN, callconv.Q4)
    if FAMILIES[fam].abi is not callconv.Q8:
        raise TypeError(f"{fam}: no KleidiAI interface shape for its calling convention")
    return Abi(key, f"matmul_clamp_f32_{key}", f"matmul_clamp_f32_{key}",
               "get_lhs_packed_offset", "size_t m_idx, size_t k", "size_t n_idx, size_t k",
               callconv.Q8.spelled(dst="float*"), callconv.Q8)


ABIS: dict[str, Abi] = {a.key: a for a in (
    Abi("qsi8d32p_qsi4c32p", "matmul_clamp_f32_qsi8d32p_qsi4c32p",
        "matmul_clamp_f32_qsi8d32p_qsi4c32p", "get_lhs_packed_offset",
        "size_t m_idx, size_t k, size_t bl", "size_t n_idx, size_t k, size_t bl", _Q4_RUN,
        callconv.Q4),
    Abi("f16p_qsi4c32p", "matmul_clamp_f32_f16p_qsi4c32p", "matmul_clamp_f32_f16p_qsi4c32p",
        "get_lhs_packed_offset", "size_t m_idx, size_t k, size_t bl",
        "size_t n_idx, size_t k, size_t bl", _Q4_RUN, callconv.Q4),
    Abi("qai8dxp_qsi8cxp", "matmul_clamp_f32_qai8dxp_qsi8cxp", "matmul_clamp_f32_qai8dxp_qsi8cxp",
        "get_lhs_packed_offset", "size_t m_idx, size_t k", "size_t n_idx, size_t k",
        callconv.Q8.spelled(dst="float*"), callconv.Q8),
    Abi("bf16p_bf16p", "matmul_clamp_fp32_bf16p_bf16p", "matmul_clamp_f32_bf16p_bf16p",
        "get_lhs_packed_offset", "size_t m_idx, size_t k", "size_t n_idx, size_t k",
        callconv.BF16.params, callconv.BF16),
    Abi("f32p_f32p", "matmul_clamp_f32_f32p_f32p", "matmul_clamp_f32_f32p_f32p",
        "get_lhs_packed_offset", "size_t m_idx, size_t k", "size_t n_idx, size_t k",
        _F32P_RUN, callconv.F32, fill=(("lhs_stride", "4 * k"),)),
    Abi("f32_f32p", "matmul_clamp_f32_f32_f32p", "matmul_clamp_f32_f32_f32p", "get_lhs_offset",
        "size_t m_idx, size_t stride", "size_t n_idx, size_t k", callconv.F32.params,
        callconv.F32),
    # tilegen's own kernels (no KleidiAI counterpart), one per family with a llama.cpp
    # mapping (the plugins' LLAMA_KERNELS): KleidiAI's qai8dxp_qsi8cxp shape for the Q8
    # convention (K-quants), its qsi8d32p_qsi4c32p shape (bl) for the Q4 one (IQ4_NL)
    *(_llama_abi(fam) for fam in LLAMA_KERNELS),
)}


# -- the micro-kernels llama.cpp's kernels.cpp names --------------------------------------

@dataclass(frozen=True)
class KaiKernel:
    """One KleidiAI matmul micro-kernel name and what stands behind it.

    ``spec``: the tilegen kernel (assembly) whose getters the name gets (every name has one:
    no exported name is portable C).  ``same_layouts``: the spec
    reads the packed LHS and RHS the KleidiAI name describes (False: it reads layouts the
    packers make from the getters' mr/nr/kr/sr, e.g. an outer-product tile standing in for a
    gemv).  ``note``: one line for docs/export.md."""

    name: str
    abi: str
    spec: str
    same_layouts: bool = True
    note: str = ""
    getter_sr: int | None = None    # get_sr's value where it is not the spec's sr
    n_step_tiles: int = 1           # get_n_step in tiles of the spec's nr (KleidiAI's unrolled n)

    @property
    def header(self) -> str:
        return f"kai/ukernels/matmul/{ABIS[self.abi].directory}/kai_{self.name}.h"

    @property
    def source(self) -> str:
        return self.header[:-2] + ".c"

    @property
    def kernel_spec(self) -> KernelSpec:
        return parse_spec(self.spec)


def _k(name: str, abi: str, spec: str, **kw) -> KaiKernel:
    return KaiKernel("matmul_clamp_f32_" + name, abi, spec, **kw)


_Q4, _Q8 = "qsi8d32p_qsi4c32p", "qai8dxp_qsi8cxp"
KERNELS: tuple[KaiKernel, ...] = (
    _k("qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod", _Q4, "q4_0:dotprod:1x4:k16:s2",
       note="n_step 4, as KleidiAI's getter (the x32 is its loop unroll)"),
    _k("qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", _Q4, "q4_0:dotprod:1x4"),
    _k("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", _Q4, "q4_0:dotprod:16x4"),
    _k("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", _Q4, "q4_0:i8mm:16x4"),
    _k("qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", _Q4, "q4_0:i8mm:16x8",
       note="NEON SMMLA on the same fixed-width layouts (every SVE+I8MM CPU has NEON I8MM)"),
    _k("qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod", _Q4, "q4_0:dotprod:1x8:k16:s2",
       note="NEON SDOT on the same fixed-width layouts"),
    _k("qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", _Q4, "q4_0_s1s0:sme2:1x4vl", getter_sr=2,
       note="the SME2 luti4 gemv (tilegen's name ends _sme2_luti4) on qsi4c32ps1s0scalef16; "
            "get_sr says 2, the sr KleidiAI's RHS packer takes (the LHS layout ignores sr)"),
    _k("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa", "f16p_qsi4c32p", "q4_0_f16:sme2:1vlx4vl",
       note="LUTI4, FMUL by the f16 block scales, FMOPA into ZA over all of k: KleidiAI's "
            "arithmetic bit for bit"),
    _k("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", _Q8, "q8_0:sme2:1vlx4vl"),
    _k("qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot", _Q8, "q8_0:sme2:1x4vl"),
    _k("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa", _Q8, "q8_0:sme:1vlx4vl"),
    _k("qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot", _Q8, "q8_0:sme:1vlx4vl", same_layouts=False,
       note="SME1 has no tilegen gemv: the 1vlx4vl SMOPA tile on the same RHS; its getters say "
            "mr = m_step = 1vl, so llama.cpp packs the LHS as qai8dxp1vlx4"),
    _k("qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod", _Q8, "q8_0:dotprod:1x4:k8:s1"),
    _k("qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod", _Q8, "q8_0:dotprod:1x4"),
    _k("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", _Q8, "q8_0:dotprod:16x4"),
    _k("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", _Q8, "q8_0:i8mm:16x4"),
    _k("bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", "bf16p_bf16p", "bf16:sme2:2vlx2vl",
       note="RHS bf16p2vlx2b (KleidiAI's kernel name drops the b)"),
    _k("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa", "f32p_f32p", "f32:sme2:2vlx2vl",
       note="f32p2vlx1biasf32 = f32p2vlx1b byte for byte (bias panel first)"),
    _k("f32_f32p2vlx1b_1x16vl_sme2_mla", "f32_f32p", "f32:sme2:1x2vl", n_step_tiles=8,
       note="the 1x2vl gemv; get_n_step says 16vl (8 panels of 2vl), as KleidiAI's"),
    _k("f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa", "f32p_f32p", "f32:sme:2vlx2vl"),
)


def _kq(abi: str, spec: str, note: str) -> KaiKernel:
    """A K-quant micro-kernel: named as tilegen names its spec (there is no KleidiAI name)."""
    return KaiKernel(parse_spec(spec).name, abi, spec, note=note)


@dataclass(frozen=True)
class KQuantEntry:
    """One entry of the patch's table of tilegen families (the K-quants, IQ4_NL, MXFP4: the
    names keep "kquant"): a gemm and a gemv of ``family`` on ``isa``
    reading one packed RHS (packed at the gemm's nr/kr)."""

    family: str
    isa: str
    gemm: KaiKernel
    gemv: KaiKernel


def _kq_abi(family: str) -> str:
    return f"{FAMILIES[family].lhs}_{FAMILIES[family].rhs}"


#: the default entries: per weight type a gemm and a gemv on one packed RHS, SME2 (tiles in SVL
#: units, kr 4), I8MM (SMMLA, kr 16) and DOTPROD (SDOT, kr 8).  The LHS is q8kp
#: (kai_lhs_quant_pack_q8kp_f32), the RHS q4kp / q6kp repacked from ggml's blocks
#: (kai_rhs_pack_nxk_q4kp_q4k, kai_rhs_pack_nxk_q6kp_q6k).  ``--tuned`` replaces tiles
#: (:func:`kquant_entries`).  The families and their tiles per ISA slot are the plugins'
#: (``LLAMA_KERNELS``, :mod:`tilegen.families`).
KQUANT_DEFAULT: tuple[KQuantEntry, ...] = tuple(
    KQuantEntry(fam, isa, _kq(_kq_abi(fam), f"{fam}:{isa}:{gt}", f"gemm, {gn}"),
                _kq(_kq_abi(fam), f"{fam}:{isa}:{vt}", f"gemv, {vn}"))
    for fam in llama.LLAMA_FAMILIES for isa, gt, vt, gn, vn in LLAMA_KERNELS[fam])
#: tilegen's K-quant micro-kernels of the default export, in the same getter/run shape, which
#: llama.cpp's KleidiAI backend calls once the export's llama-kquants.patch is applied
KQUANT_KERNELS: tuple[KaiKernel, ...] = tuple(k for e in KQUANT_DEFAULT for k in (e.gemm, e.gemv))
#: (gemm, gemv) names sharing one packed RHS, as the default patch's kernels table pairs them
KQUANT_ENTRIES: tuple[tuple[str, str], ...] = tuple((e.gemm.name, e.gemv.name) for e in KQUANT_DEFAULT)
#: the file name of the llama.cpp patch (ggml/src/ggml-cpu/kleidiai/ only) in every tree
LLAMA_PATCH = llama.PATCH_NAME


def kai_symbols() -> list[str]:
    """Every ``kai_`` identifier llama.cpp's kernels.cpp/kleidiai.cpp reference (the committed
    list, made once with ``grep -o "kai_[a-zA-Z0-9_]*" kernels.cpp kleidiai.cpp | sort -u``)."""
    return [s for s in _SYMBOLS_FILE.read_text().split() if s]


def function_symbols() -> list[str]:
    """The functions among :func:`kai_symbols` (getters and run functions): what must link."""
    return [s for s in kai_symbols() if s.startswith(("kai_get_", "kai_run_"))]


# -- generated C (templates/export/) ------------------------------------------------------
#
# The C and CMake text of the tree is in templates/export/*.j2, rendered by the kernels' Jinja
# environment; this module decides what each file holds and computes every number in it (getter
# expressions from the spec and its layout objects, checked before they are emitted).

def _render(template: str, **context) -> str:
    """The text of one file of the tree from ``templates/export/<template>``."""
    return render_template(f"export/{template}", version=__version__, kai_version=KAI_VERSION,
                           **context)


def _getter_slots(abi: Abi) -> list[tuple[str, str]]:
    """(slot, parameter list) of every getter of an interface, in KleidiAI's order: the fields
    of its ukernel struct; a kernel's functions are ``kai_<slot>_<kernel name>``."""
    return [(f"get_{g}", "void") for g in ("m_step", "n_step", "mr", "nr", "kr", "sr")] + [
        (abi.lhs_getter, abi.lhs_params), ("get_rhs_packed_offset", abi.rhs_params),
        ("get_dst_offset", "size_t m_idx, size_t n_idx, size_t dst_stride"),
        ("get_dst_size", "size_t m, size_t n")]


def _getter_protos(kk: KaiKernel) -> list[tuple[str, str]]:
    """(function name, parameter list) of every getter, in KleidiAI's order."""
    return [(f"kai_{slot}_{kk.name}", params) for slot, params in _getter_slots(ABIS[kk.abi])]


def _param_names(params: str) -> list[str]:
    """The parameter names of a C parameter list (``"void"``: none)."""
    return [p.split()[-1].lstrip("*") for p in params.split(",") if p.strip() != "void"]


def _unused(params: str, body: str) -> list[str]:
    """The parameters a getter's body does not read (the template casts them to void)."""
    return [p for p in _param_names(params) if not re.search(rf"\b{p}\b", body)]


def _getter_defs(kk: KaiKernel) -> list[dict]:
    """The getters of ``kk``: KleidiAI's function names and parameter lists, the bodies of its
    spec's descriptor (:func:`tilegen.generator.descriptor.descriptor`, with the name's n_step
    and sr where KleidiAI's differ)."""
    spec = kk.kernel_spec
    abi = ABIS[kk.abi]
    if abi.lhs_getter == "get_lhs_packed_offset" and not spec.packs_lhs:
        raise ExportError(f"{kk.name}: ABI {abi.key} needs a packed LHS, {spec} reads f32 rows")
    try:
        check_vl_scaling(spec)
        d = descriptor(spec).for_interface(kk.n_step_tiles, kk.getter_sr)
    except SpecError as e:
        raise ExportError(f"{kk.name}: {e}") from None
    out = []
    for (name, params), g in zip(_getter_protos(kk), d.getters):
        unused = _unused(params, g.body)
        missing = [p for p in g.param_names if p not in _param_names(params)
                   and re.search(rf"\b{p}\b", g.body)]
        if missing:
            raise ExportError(f"{name} reads {', '.join(missing)}, which KleidiAI's "
                              f"{g.slot} does not take ({params})")
        out.append(dict(name=name, params=params, body=g.body, unused=unused))
    return out


def ukernel_header(kk: KaiKernel) -> str:
    return _render("ukernel.h.j2", name=kk.name, spec=kk.kernel_spec,
                   getters=_getter_protos(kk), run_params=ABIS[kk.abi].run_params)


def _tilegen_symbol(spec: KernelSpec) -> str:
    return f"tilegen_{spec.name}"


def ukernel_source(kk: KaiKernel) -> str:
    """``ukernel.c.j2``: the getters and a call of the tilegen kernel."""
    abi = ABIS[kk.abi]
    spec = kk.kernel_spec
    d = descriptor(spec)
    return _render("ukernel.c.j2", name=kk.name, spec=spec,
                   getters=_getter_defs(kk), run_params=abi.run_params,
                   vl_kind=d.vl_kind, symbol=_tilegen_symbol(spec), signature=d.params,
                   tilegen_args=abi.tilegen_args)


# -- the assembly kernels --------------------------------------------------------------

def kernel_asm(spec: KernelSpec, fmt: str = "elf") -> str:
    """The tilegen kernel rendered under the hidden symbol ``tilegen_<name>``."""
    r = render(spec, fmt)
    new = ("_" if fmt == "macho" else "") + _tilegen_symbol(spec)
    text = re.sub(rf"(?<![\w.]){re.escape(r.symbol)}(?!\w)", new, r.text)
    vis = f"    .private_extern {new}" if fmt == "macho" else f"    .hidden {new}"
    text = re.sub(rf"^(\s*\.globl\s+{re.escape(new)}\s*)$", lambda m: m[1] + "\n" + vis, text,
                  count=1, flags=re.M)
    if new not in text or vis not in text:
        raise ExportError(f"cannot rename the symbol of {spec.name}")
    return text


# -- kai_common, interfaces, CMake --------------------------------------------------------

def interface_header(abi: Abi) -> str:
    return _render("interface.h.j2", abi=abi, slots=_getter_slots(abi))


def _cmake(sources: list[str], flags: dict[str, str]) -> str:
    return _render("CMakeLists.txt.j2", sources=sources, flags=sorted(flags.items()))


# -- packers (the other half, tilegen.export.packers_c) ------------------------------------

def packer_files() -> tuple[list[ExportFile], dict[str, str]]:
    """The packers' files from :mod:`tilegen.export.packers_c` and their per-file compile
    options (``packers_c.COMPILE_OPTIONS``)."""
    return list(packers_c.packer_sources()), dict(packers_c.COMPILE_OPTIONS)



# -- tuned tiles ------------------------------------------------------------------------

def tuned_overrides(target) -> dict[str, str]:
    """KleidiAI name -> tuned spec string, for the names whose packed layouts a tuned tile of
    ``target`` (tilegen/build/tuned) reads: the same LHS and RHS layout objects and the same
    gemm/gemv role as the spec the name has by default."""
    tgt = get_target(target) if isinstance(target, str) else target
    tf = read_tuned(tgt)
    if tf is None:
        return {}
    out: dict[str, str] = {}
    for kk in KERNELS:
        base = kk.kernel_spec
        for fam in tf.families.values():
            for s in (x for x in (fam.gemm, fam.gemv) if x is not None):   # the pair only
                if s.family != base.family or s.is_gemv != base.is_gemv or s == base:
                    continue
                if not (s.vl_scaled == base.vl_scaled and same_rhs(s, base)):
                    continue
                same_lhs = (lhs_layout_for(s, 32, 16 if s.vl_scaled else None)
                            == lhs_layout_for(base, 32, 16 if base.vl_scaled else None))
                if same_lhs and s.spec_string != base.spec_string:
                    out[kk.name] = s.spec_string
    return out


# llama.cpp's kernels.cpp entries that pair a gemm with a gemv on one packed RHS (packed at the
# gemm's nr/kr/sr by the entry's RHS packer; each LHS packed at its kernel's mr/kr/sr).
ENTRIES: tuple[tuple[str, str], ...] = tuple(
    ("matmul_clamp_f32_" + a, "matmul_clamp_f32_" + b) for a, b in (
        ("qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", "qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod"),
        ("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", "qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod"),
        ("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", "qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod"),
        ("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot"),
        ("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa", "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot"),
        ("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod"),
        ("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"),
        ("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa", "f32_f32p2vlx1b_1x16vl_sme2_mla"),
    ))


def tuned_pair_overrides(target) -> dict[str, str]:
    """``--tuned pairs``: besides :func:`tuned_overrides`, a tuned gemm + gemv pair of one
    family that shares its packed RHS (``shared_rhs``) replaces both kernels of a kernels.cpp
    entry when each reads the same LHS layout as the kernel it replaces and the RHS is of the
    same format (the same packer), at another nr: llama.cpp packs that RHS with the gemm's nr,
    kr, sr from the getters and both kernels read it."""
    tgt = get_target(target) if isinstance(target, str) else target
    tf = read_tuned(tgt)
    out = dict(tuned_overrides(tgt))
    if tf is None:
        return out
    byname = {k.name: k for k in KERNELS}
    claimed: dict[str, str] = {}
    for gname, vname in ENTRIES:
        g0, v0 = byname[gname].kernel_spec, byname[vname].kernel_spec
        if g0.vl_scaled or v0.vl_scaled:
            continue
        for fam in tf.families.values():
            tg, tv = fam.gemm, fam.gemv
            if tg is None or tv is None or not fam.shared_rhs or tg.family != g0.family:
                continue
            if tg.vl_scaled or tv.vl_scaled or not same_rhs(tg, tv):
                continue
            if (tg.rhs_layout_class is not g0.rhs_layout_class
                    or lhs_layout_for(tg) != lhs_layout_for(g0)
                    or lhs_layout_for(tv) != lhs_layout_for(v0)):
                continue
            for name, s in ((gname, tg), (vname, tv)):
                if s.spec_string == byname[name].spec:
                    continue
                if claimed.get(name, s.spec_string) != s.spec_string:
                    raise ExportError(f"{name}: two tuned pairs want it ({claimed[name]}, {s})")
                claimed[name] = s.spec_string
    out.update(claimed)
    return out


# -- the tree ---------------------------------------------------------------------------

def _with_spec(kk: KaiKernel, spec: str) -> KaiKernel:
    return KaiKernel(kk.name, kk.abi, spec, kk.same_layouts,
                     f"tuned: {spec} (default {kk.spec})", kk.getter_sr, kk.n_step_tiles)


def kernels_for(target=None, tuned: bool | str = False) -> list[KaiKernel]:
    """The micro-kernels of an export: :data:`KERNELS`, with ``tuned=True`` the same-layout
    tuned tiles (:func:`tuned_overrides`), with ``tuned="pairs"`` also the tuned gemm/gemv
    pairs (:func:`tuned_pair_overrides`)."""
    ks = list(KERNELS)
    if _tuned_target(target, tuned) is not None:
        over = tuned_pair_overrides(target) if tuned == "pairs" else tuned_overrides(target)
        ks = [_with_spec(k, over[k.name]) if k.name in over else k for k in ks]
    return ks


def _tuned_target(target, tuned: bool | str):
    """The Target whose tuned file a ``tuned`` export reads (None for an untuned one);
    ExportError for another ``tuned`` value, a tuned export without a target, or a target
    without a tuned file (a tuned export of it would be the default export labelled tuned)."""
    if tuned not in (False, True, "pairs"):
        raise ExportError(f"tuned must be False, True or 'pairs', got {tuned!r}")
    if not tuned:
        return None
    if target is None:
        raise ExportError("--tuned needs a target")
    tgt = get_target(target) if isinstance(target, str) else target
    path = tuned_path(tgt)
    if not path.is_file():
        have = tuned_targets()
        raise ExportError(f"--tuned/--tuned-pairs: target {tgt.name} has no tuned file ({path}); "
                          f"targets with one: {', '.join(have) or 'none'} (write one with "
                          f"`tilegen tune --target {tgt.name} --family FAMILY --write`)")
    return tgt


def kquant_entries(target=None, tuned: bool | str = False) -> list[KQuantEntry]:
    """The tilegen-family table of an export: :data:`KQUANT_DEFAULT`, with ``tuned`` (True or
    "pairs": these kernels have no KleidiAI name to keep, so both take the tuned tiles)
    each entry's tiles from the target's tuned file where they fit (:func:`_tuned_kquant`)."""
    tgt = _tuned_target(target, tuned)
    if tgt is None:
        return list(KQUANT_DEFAULT)
    tf = read_tuned(tgt)
    return [_tuned_kquant(e, tf.families.get(e.family)) for e in KQUANT_DEFAULT]


def _tuned_kquant(e: KQuantEntry, fam) -> KQuantEntry:
    """``e`` with the tuned gemm and/or gemv of ``fam`` (a TunedFamily or None) that are of the
    entry's family, ISA and role, where the two kernels then still read one packed RHS (the
    table packs it once, at the gemm's nr/kr; each LHS is packed at its own kernel's mr/kr by
    the family's one LHS packer).  The tuned pair first, else one tuned kernel with the other
    default; else the entry as it is."""
    if fam is None:
        return e
    g0, v0 = e.gemm.kernel_spec, e.gemv.kernel_spec

    def fits(s, base):
        return (s is not None and s.family == e.family and s.isa == e.isa
                and s.is_gemv == base.is_gemv and s.lhs_layout_class is base.lhs_layout_class
                and s.rhs_layout_class is base.rhs_layout_class)

    tg = fam.gemm if fits(fam.gemm, g0) else None
    tv = fam.gemv if fits(fam.gemv, v0) else None
    for g, v in ((tg, tv), (tg, v0), (g0, tv)):
        if g is None or v is None or (g, v) == (g0, v0) or not same_rhs(g, v):
            continue
        return KQuantEntry(e.family, e.isa, _kq_tuned(e.gemm, g), _kq_tuned(e.gemv, v))
    return e


def _kq_tuned(kk: KaiKernel, spec: KernelSpec) -> KaiKernel:
    if spec.spec_string == kk.spec:
        return kk
    return _kq(kk.abi, spec.spec_string, f"tuned: {spec.spec_string} (default {kk.spec})")


#: the LHS packer of each activation format the patch's families read: tilegen's q8kp
#: quantiser (K-quants), KleidiAI's generic qsi8d32p quantiser (block-32 families: llama.cpp's
#: Q4_0 table packs with it too)
LLAMA_LHS_PACKER_FOR: dict[str, str] = {**packers_c.KQUANT_PACKER_FOR,
                                        "qsi8d32p": "kai_lhs_quant_pack_qsi8d32p_f32"}


def llama_entry(e: KQuantEntry) -> llama.LlamaEntry:
    """The patch's data for one entry (:class:`tilegen.export.llama.LlamaEntry`), rendered
    from its kernels' descriptors (:func:`tilegen.generator.descriptor.descriptor`, as the
    interface the export's getters state: ``for_interface``): names, getter and run functions,
    family, ISA, and the LHS and RHS packers of their layouts' formats.  ExportError when the
    entry's two kernels disagree on what the table shares."""
    def kernel(kk: KaiKernel):
        d = descriptor(kk.kernel_spec).for_interface(kk.n_step_tiles, kk.getter_sr)
        if d.name != kk.name:
            raise ExportError(f"{kk.name}: a K-quant kernel is exported under its own name "
                              f"({d.name})")
        return d, llama.LlamaKernel(d.name, kk.header, d.getter_functions(d.name, "kai_"),
                                    f"kai_run_{d.name}")
    (dg, gemm), (dv, gemv) = kernel(e.gemm), kernel(e.gemv)
    shared = ("family", "isa", "lhs_layout_format", "rhs_layout_format")
    if any(getattr(dg, f) != getattr(dv, f) for f in shared) or dg.family != e.family:
        raise ExportError(f"{gemm.name} and {gemv.name}: one entry needs one family, ISA, "
                          f"LHS and RHS format")
    return llama.LlamaEntry(dg.family, dg.isa, gemm, gemv,
                            LLAMA_LHS_PACKER_FOR[dg.lhs_layout_format][len("kai_"):],
                            packers_c.KQUANT_PACKER_FOR[dg.rhs_layout_format][len("kai_"):],
                            dg.lhs_layout_format)


def llama_patch(target=None, tuned: bool | str = False) -> str:
    """The llama.cpp patch for the tilegen-family table of ``target`` (``tuned`` as in
    :func:`kquant_entries`); the default is the patch of every untuned export."""
    return llama.patch_text([llama_entry(e) for e in kquant_entries(target, tuned)])


def export_files(target: str = "linux-aarch64-all", tuned: bool | str = False,
                 include_packers: bool = True) -> list[ExportFile]:
    """Every file of the tree (paths relative to the root)."""
    tgt = get_target(target)
    fmt = tgt.fmt
    kernels = kernels_for(tgt, tuned)
    kq_entries = kquant_entries(tgt, tuned)
    kquants = [k for e in kq_entries for k in (e.gemm, e.gemv)]
    files: list[ExportFile] = [ExportFile("kai/kai_common.h", _render("kai_common.h.j2")),
                               ExportFile("kai/kai_common.c", _render("kai_common.c.j2"))]
    for abi in ABIS.values():
        if abi.key.startswith("q8kp_") and not any(k.abi == abi.key for k in kquants):
            continue
        files.append(ExportFile(
            f"kai/ukernels/matmul/{abi.directory}/kai_{abi.interface}_interface.h",
            interface_header(abi)))
    specs: dict[str, KernelSpec] = {}
    for kk in kernels + kquants:
        files.append(ExportFile(kk.header, ukernel_header(kk)))
        files.append(ExportFile(kk.source, ukernel_source(kk)))
        specs[kk.kernel_spec.name] = kk.kernel_spec
    for name in sorted(specs):
        files.append(ExportFile(f"kai/ukernels/matmul/tilegen/tilegen_{name}.S",
                                kernel_asm(specs[name], fmt)))
    flags: dict[str, str] = {}
    if include_packers:
        pfiles, flags = packer_files()
        files += pfiles
    paths = [f.path for f in files]
    dup = {p for p in paths if paths.count(p) > 1}
    if dup:
        raise ExportError(f"two files at {', '.join(sorted(dup))}")
    sources = sorted(p for p in paths if p.endswith((".c", ".S", ".s")))
    files.append(ExportFile("CMakeLists.txt", _cmake(sources, flags)))
    manifest = {
        "tilegen_export": 1, "kleidiai_version": KAI_VERSION, "tilegen_version": __version__,
        "target": tgt.name, "tuned": tuned,
        "kernels": [{"name": k.name, "impl": "asm", "spec": k.spec,
                     "tilegen_kernel": k.kernel_spec.name, "same_layouts": k.same_layouts,
                     "note": k.note}
                    for k in kernels],
        "kquant_kernels": [{"name": k.name, "impl": "asm", "spec": k.spec, "note": k.note}
                           for k in kquants],
    }
    files.append(ExportFile(MANIFEST, json.dumps(manifest, indent=2) + "\n"))
    files.append(ExportFile(LLAMA_PATCH, llama.patch_text([llama_entry(e) for e in kq_entries])))
    return files


def defined_functions(files: list[ExportFile]) -> set[str]:
    """``kai_`` functions the tree's C sources define (a syntactic scan)."""
    out: set[str] = set()
    for f in files:
        if f.path.endswith(".c"):
            out |= set(re.findall(r"^[A-Za-z_][\w \*]*?\b(kai_\w+)\s*\([^;]*?\)\s*\{", f.text,
                                  flags=re.M))
    return out


def kquant_symbols(patch: str | None = None) -> list[str]:
    """The ``kai_`` functions the added lines of llama-kquants.patch reference (sorted); by
    default those of the default export's patch."""
    text = llama_patch() if patch is None else patch
    added = "\n".join(l[1:] for l in text.splitlines() if l.startswith("+") and not l.startswith("+++"))
    return sorted({s for s in re.findall(r"\bkai_\w+", added)
                   if s.startswith(("kai_get_", "kai_run_"))})


def _patch_of(files: list[ExportFile]) -> str:
    """The text of the tree's llama-kquants.patch."""
    (text,) = [f.text for f in files if f.path == LLAMA_PATCH]
    return text


def missing_symbols(files: list[ExportFile] | None = None) -> list[str]:
    """llama.cpp's function symbols that the tree does not define (those of its kernels.cpp,
    then those the tree's llama-kquants.patch adds)."""
    files = export_files() if files is None else files
    have = defined_functions(files)
    want = function_symbols()
    want += [s for s in kquant_symbols(_patch_of(files)) if s not in want]
    return [s for s in want if s not in have]


def is_export(root) -> bool:
    """Whether ``root`` holds a tree this module wrote: its marker, the manifest
    ``TILEGEN_EXPORT.json`` with the ``tilegen_export`` key."""
    try:
        man = json.loads((Path(root) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(man, dict) and "tilegen_export" in man


def _check_output(root: Path, files: list[ExportFile]) -> None:
    """Refuse to write into anything but a missing or empty directory or a previous export."""
    if root.exists() and not root.is_dir():
        raise ExportError(f"{root}: exists and is not a directory")
    if not root.exists() or not any(root.iterdir()) or is_export(root):
        return
    clash = [f.path for f in files if (root / f.path).exists()]
    what = (f"; the export would overwrite {len(clash)} of its files ({', '.join(clash[:3])}"
            f"{', ...' if len(clash) > 3 else ''})" if clash else "")
    raise ExportError(f"{root}: not empty and not a tilegen export (no {MANIFEST}){what}: "
                      f"use an empty directory, or --force to write into it anyway")


def write_tree(out_dir, target: str = "linux-aarch64-all", tuned: bool | str = False,
               force: bool = False) -> dict:
    """Write the tree under ``out_dir``; returns the manifest plus ``missing`` symbols.

    ``out_dir`` must be missing, empty or a previous export (:func:`is_export`), unless
    ``force``: a directory with other files is refused (:class:`ExportError`), untouched."""
    root = Path(out_dir)
    files = export_files(target, tuned)
    if not force:
        _check_output(root, files)
    for f in files:
        p = root / f.path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f.text)
    manifest = json.loads(next(f.text for f in files if f.path == MANIFEST))
    manifest["missing"] = missing_symbols(files)
    llama_fns = function_symbols()
    manifest["missing_llama"] = [s for s in manifest["missing"] if s in llama_fns]
    manifest["functions"] = len(llama_fns) - len(manifest["missing_llama"])
    manifest["kquant_functions"] = len([s for s in kquant_symbols(_patch_of(files)) if s not in llama_fns
                                        and s not in manifest["missing"]])
    return manifest


def mapping_table(kernels: list[KaiKernel] | None = None) -> str:
    """The Markdown table of docs/export.md: KleidiAI name -> implementation."""
    rows = ["| KleidiAI micro-kernel | tilegen implementation | same layouts | note |",
            "|---|---|---|---|"]
    for k in kernels or KERNELS:
        impl = f"`{k.spec}` (asm `{k.kernel_spec.name}`)"
        rows.append(f"| `{k.name}` | {impl} | {'yes' if k.same_layouts else 'no'} | {k.note} |")
    return "\n".join(rows) + "\n"


def tuned_table() -> str:
    """The Markdown table of docs/export.md#--tuned-and---tuned-pairs: per preset with a tuned
    file, the KleidiAI names ``--tuned`` gives a tuned kernel and those ``--tuned-pairs`` adds."""
    rows = ["| preset | `--tuned` | `--tuned-pairs` adds |", "|---|---|---|"]
    for t in tuned_targets():
        one, pairs = tuned_overrides(t), tuned_pair_overrides(t)
        cells = ["<br>".join(f"`{n[len('matmul_clamp_f32_'):]}` → `{s}`" for n, s in d.items())
                 or "—" for d in (one, {n: s for n, s in pairs.items() if one.get(n) != s})]
        rows.append(f"| {t} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows) + "\n"


def kquant_tuned_table() -> str:
    """The Markdown table of docs/export.md#k-quants-beyond-kleidiai: per preset with a tuned
    file, the tilegen-family entries ``--tuned`` changes (:func:`kquant_entries`), each changed
    kernel as default -> tuned spec."""
    rows = ["| preset | table entries `--tuned` replaces (default → tuned) |", "|---|---|"]
    for t in tuned_targets():
        cells = []
        for e, d in zip(kquant_entries(t, True), KQUANT_DEFAULT):
            parts = [f"{role} `{old.spec}` → `{new.spec}`" for role, old, new in
                     (("gemm", d.gemm, e.gemm), ("gemv", d.gemv, e.gemv)) if old != new]
            if parts:
                cells.append(f"{e.family.upper()} {e.isa.upper()} " + ", ".join(parts))
        rows.append(f"| {t} | {'<br>'.join(cells) or '—'} |")
    return "\n".join(rows) + "\n"


def cmake_toolchain(cc: str = "clang-19", sysroot: str | None = None,
                    freestanding: bool | None = None) -> str:
    """A CMake toolchain file that cross-compiles the tree for aarch64 Linux with clang
    (``--target=aarch64-linux-gnu``, as tilegen's own toolchain does).  Without a sysroot
    the C sources compile freestanding (the tree needs no libc headers then)."""
    freestanding = sysroot is None if freestanding is None else freestanding
    flags = "-ffreestanding" if freestanding else ""
    lines = ["set(CMAKE_SYSTEM_NAME Linux)", "set(CMAKE_SYSTEM_PROCESSOR aarch64)",
             f"set(CMAKE_C_COMPILER {cc})", f"set(CMAKE_ASM_COMPILER {cc})",
             "set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)",
             "set(CMAKE_ASM_COMPILER_TARGET aarch64-linux-gnu)",
             "set(CMAKE_TRY_COMPILE_TARGET_TYPE STATIC_LIBRARY)",
             f'set(CMAKE_C_FLAGS_INIT "{flags}")']
    if sysroot:
        lines.append(f"set(CMAKE_SYSROOT {sysroot})")
    return "\n".join(lines) + "\n"
