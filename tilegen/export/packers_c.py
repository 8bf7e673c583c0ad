"""The packers of the exported KleidiAI tree, as generated C (``tilegen export kleidiai``).

:func:`packer_sources` returns a header and a ``.c`` file for each of the twelve packer
micro-kernels llama.cpp calls (``ggml/src/ggml-cpu/kleidiai/kernels.cpp``), under
``kai/ukernels/matmul/pack/``, plus ``kai/kai_pack_params.h`` with the two parameter structs.
Function names, signatures and getter results are KleidiAI's (v1.24.0); the code is tilegen's.

Single source of truth: every size, stride and field offset in the C is an expression built
from a tilegen layout object (:mod:`tilegen.layout`) -- its per-slot field sizes, k multiple,
chunk geometry and conversion constants -- with the run-time geometry (``mr``, ``nr``, ``kr``,
``sr``, ``bl``, and the SME tile sizes from the streaming vector length) as C variables.  Each
expression is checked at generation time against the layout object's own methods over a grid of
geometries (:func:`_check`), so the C cannot drift from the numpy packers it must match byte for
byte.

The C text is Jinja templates under ``templates/export/pack/``, rendered by the kernels'
environment (:func:`tilegen.generator.render.render_template`): ``<layout>.c.j2`` holds a
packer's functions (shared getters in ``lhs_getters.c.j2`` and ``rhs_getters.c.j2``),
``packer.c.j2``/``packer.h.j2`` frame them (banner, includes, the static helpers the body calls)
and ``params.h.j2`` is ``kai_pack_params.h``.  This module holds what goes where: KleidiAI's
prototypes, the checked expressions and which template each packer takes.

============================================================  ====================================
packer                                                        layout object
============================================================  ====================================
``kai_lhs_quant_pack_qai8dxp_f32``                            :class:`~tilegen.layout.lhs_int8.QAI8DXP`
``kai_lhs_quant_pack_qsi8d32p_f32``                           :class:`~tilegen.layout.lhs_int8.QSI8D32P` (away)
``kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon``                 :class:`~tilegen.layout.lhs_int8.QSI8D32P` (even)
``kai_lhs_quant_pack_qsi8d32p_f32_neon``                      :class:`~tilegen.layout.lhs_int8.QSI8D32PScaleTail`
``kai_lhs_pack_f16pmrx2_f32_neon``                            :class:`~tilegen.layout.f16.F16PLhs2`
``kai_lhs_pack_bf16p2vlx2_f32_sme``                           :class:`~tilegen.layout.bf16.BF16PLhs2`
``kai_lhs_pack_f32p2vlx1_f32_sme``                            :class:`~tilegen.layout.f32.F32PackedLHS`
``kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0``            :class:`~tilegen.layout.rhs_int4.QSI4C32PScaleF16`
``kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon``   :class:`~tilegen.layout.rhs_int4.QSI4C32PS1S0ScaleF16`
``kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon``                      :class:`~tilegen.layout.rhs_int8.QSI8CXP`
``kai_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme``                  :class:`~tilegen.layout.bf16.BF16PRhs2B`
``kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme``             :class:`~tilegen.layout.f32.F32PackedRHS`
============================================================  ====================================

Behaviour (docs/layouts.md has the byte maps):

* Rows and slots: the LHS quantising packers leave the slots of rows they do not pack untouched,
  as KleidiAI does; the RHS packers fill the last group with copies of row n-1, except
  ``qsi4c32ps1s0scalef16`` (slots past n untouched, as KleidiAI).  The SME packers write whole
  row/column blocks (padding 0), as KleidiAI's predicated stores do.
* Pointer conventions are KleidiAI's: ``qai8dxp``, ``f16pmrx2``, ``qsi8d32p_f32_neon`` and the
  SME LHS packers take ``lhs`` at the first row to pack, the two ``qsi8d32p`` quantisers
  (generic and 4x8sb) at row 0 of the whole matrix.  ``lhs_packed`` points at the row block
  holding ``m_idx_start``.  Unlike KleidiAI, every packer honours ``lhs_stride`` and any
  ``m_idx_start`` (slot ``m_idx_start % mr`` onwards); with KleidiAI's own restrictions
  (contiguous rows, ``m_idx_start`` 0) the bytes are the same.
* Rounding: qai8dxp values ties away, zero point ties even; ``qsi8d32p_f32`` and ``_neon``
  ties away, ``4x8sb`` and ``q8kp`` ties even (C ``rintf``: FCVTNS under the default rounding
  mode); f16 and bf16 round to nearest even, a bf16 NaN stays quiet.
* Speed: the activation quantisers llama.cpp calls per token (``qai8dxp``, both ``qsi8d32p``
  and ``q8kp``) quantise with NEON under ``#if defined(__ARM_NEON)`` (the |x| max as an
  unsigned max over the float bits, or FMAX/FMIN, with a NaN falling back to the scalar loop;
  FCVTAS/FCVTNS, which convert as ``kai_tg_i32`` of the rounded product; narrowing) into a
  buffer stored chunk by chunk (``first``/``run``/``cstep``: checked expressions); ``q8kp``
  sums a sub-block in int16 lanes (SADALP, SADDLV) and, for mr 4 with kr 8 or 16 (the DOTPROD
  and I8MM gemms' LHS), quantises a row block's 4 slots and stores their values together
  (ST4 interleaves the slots' 4- or 8-byte chunks); the scalar loops stay for other targets
  and give the same bytes (the tests build both). About 630-990 instructions per 256-value row
  at -O3 instead of 6.3k-9.3k (docs/llama_cpp_check.md).
* SME packers read the streaming vector length with ``RDSVL`` (encoded with ``.inst``, so the
  files build without ``+sme``); their tile size is ``units * SVL / 4`` f32 lanes, their
  ``mr``/``nr`` arguments are not used for the layout (KleidiAI asserts they equal it).  Getters
  that take ``mr`` use the argument and need no SME.
* ``bias == NULL`` means zero biases; ``params == NULL`` means ``lhs_zero_point = 1``,
  ``scale_multiplier = 1`` for qsi8cxp.  KleidiAI's assertions (num_groups == 1, ...) are not
  repeated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..records import __version__
from ..generator.render import render_template
from ..layout.base import checked_c_expr as _check, grid as _grid
from ..layout.bf16 import BF16PLhs2, BF16PRhs2B
from ..layout.f16 import F16PLhs2
from ..layout.f32 import F32PackedLHS, F32PackedRHS
from ..families import C_PACKERS, PLUGINS
from ..layout.kquant import Q8KP, Q8KPI16
from ..layout.lhs_int8 import QAI8DXP, QSI8D32P, QSI8D32PScaleTail
from ..layout.rhs_int4 import QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from ..layout.rhs_int8 import QSI8CXP
from .files import ExportFile

__all__ = ["packer_sources", "PACKERS", "PACK_DIR", "PARAMS_HEADER", "SME_PACKERS",
           "COMPILE_OPTIONS", "KQUANT_PACKERS", "ALL_PACKERS", "KQUANT_PACKER_FOR"]

PACK_DIR = "kai/ukernels/matmul/pack"
PARAMS_HEADER = "kai/kai_pack_params.h"

PACKERS = (
    "kai_lhs_quant_pack_qai8dxp_f32",
    "kai_lhs_quant_pack_qsi8d32p_f32",
    "kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon",
    "kai_lhs_quant_pack_qsi8d32p_f32_neon",
    "kai_lhs_pack_f16pmrx2_f32_neon",
    "kai_lhs_pack_bf16p2vlx2_f32_sme",
    "kai_lhs_pack_f32p2vlx1_f32_sme",
    "kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0",
    "kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon",
    "kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon",
    "kai_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme",
    "kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme",
)
SME_PACKERS = tuple(p for p in PACKERS if p.endswith("_sme"))
#: tilegen's own packers for the K-quant kernels (no KleidiAI counterpart; llama.cpp calls them
#: with the export's llama-kquants.patch): the q8kp activations (and their int16 widening
#: q8ki16p, which the :i16 SME2 gemms read; no patch entry reads it yet), and the family plugins'
#: lossless repacks of their ggml blocks (block_q4_K, block_q6_K) with a row dequantiser each
#: (llama.cpp's GET_ROWS; ``C_PACKERS`` of tilegen.families).
KQUANT_PACKERS = ("kai_lhs_quant_pack_q8kp_f32", "kai_lhs_quant_pack_q8ki16p_f32") + tuple(C_PACKERS)
ALL_PACKERS = PACKERS + KQUANT_PACKERS


def _kquant_packer_for() -> dict[str, str]:
    """The K-quant packer of each K-quant layout format: q8kp's, and per plugin with a C packer
    (one each) the RHS format of its records -> that packer."""
    out = {"q8kp": "kai_lhs_quant_pack_q8kp_f32", "q8ki16p": "kai_lhs_quant_pack_q8ki16p_f32"}
    for p in PLUGINS:
        names = tuple(getattr(p, "C_PACKERS", {}))
        if len(names) > 1:
            raise TypeError(f"{p.__name__}: one C packer per plugin, got {names}")
        out.update({rec.rhs: names[0] for rec in p.RECORDS if names})
    return out


#: the K-quant packer of each K-quant layout format (the LHS or RHS a kernel reads)
KQUANT_PACKER_FOR = _kquant_packer_for()
assert tuple(KQUANT_PACKER_FOR.values()) == KQUANT_PACKERS

# Extra compiler options per generated file (path -> options).  None are needed: the SME
# packers encode RDSVL with .inst, f16 conversion is C's _Float16 (AArch64 baseline).
COMPILE_OPTIONS: dict[str, str] = {}

# tile of the SME packers in vector lengths (KleidiAI's "2vl")
SME_UNITS = 2


# ----------------------------------------------------------------------------------------
# expressions from layout objects, checked against them
# ----------------------------------------------------------------------------------------


def _roundup(var: str, mult: int) -> str:
    return f"(({var} + {mult - 1}) // {mult} * {mult})" if mult > 1 else var


_SVLS = tuple(range(16, 257, 16))        # streaming vector lengths in bytes (128..2048 bits)


def _vl_tile(cls) -> str:
    """C expression of the SME tile (mr or nr) of ``cls`` from ``svl`` (bytes), checked."""
    expr = f"{SME_UNITS} * svl // 4"
    field = cls.tile_field if hasattr(cls, "tile_field") else ("mr" if cls.role == "lhs" else "nr")

    def tile(svl):
        if hasattr(cls, "for_vl"):
            return getattr(cls.for_vl(svl, SME_UNITS), field)
        return SME_UNITS * svl // 4          # f32 layouts: units vectors of f32 lanes
    return _check(expr, tile, _grid(svl=_SVLS))


# ----------------------------------------------------------------------------------------
# what each packer's files hold (the C text is in templates/export/pack/)
# ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Packer:
    """One packer: KleidiAI's prototypes of its functions (``P`` in the templates, header
    order), the layout it writes (banner: a label and the docs/layouts.md anchor), the template
    of its C body under templates/export/pack/ and the checked expressions that fill it."""

    name: str
    protos: list[str]
    layout: str
    anchor: str
    template: str
    context: dict = field(default_factory=dict)
    params: bool = False            # the header includes kai_pack_params.h


# The static helpers of packer.c.j2, in file order; a .c carries the ones its body calls
# (-Wunused-function).
HELPERS = ("kai_tg_f32", "kai_tg_i32", "kai_tg_load_f32", "kai_tg_store_f16", "kai_tg_amax",
           "kai_tg_put_chunks", "kai_tg_svl_bytes", "kai_tg_bf16")


def _lhs_getters(name: str, lhs_type: str, *, bl: bool, bl_in_stride: bool, m_step: str):
    """Prototypes (m_step, lhs_offset, packed_offset, packed_size, run) of an LHS packer and the
    context of its four getters (export/pack/lhs_getters.c.j2), which every LHS packer shares;
    the body template defines ``row_block_stride(k[, bl], mr)`` (with bl when
    ``bl_in_stride``) and the run function."""
    n4 = name[4:]
    P = ("size_t bl, " if bl else "") + "size_t mr, size_t kr, size_t sr"
    protos = [
        f"size_t kai_get_m_step_{n4}(size_t mr)",
        f"size_t kai_get_lhs_offset_{n4}(size_t m_idx, size_t lhs_stride)",
        f"size_t kai_get_lhs_packed_offset_{n4}(size_t m_idx, size_t k, {P})",
        f"size_t kai_get_lhs_packed_size_{n4}(size_t m, size_t k, {P})",
        f"void kai_run_{n4}(size_t m, size_t k, {P}, size_t m_idx_start, {lhs_type} lhs, "
        "size_t lhs_stride, void* lhs_packed)",
    ]
    unused = (["bl"] if bl and not bl_in_stride else []) + ["kr", "sr"]
    return protos, dict(m_step=m_step, unused=unused,
                        stride_args="k, bl, mr" if bl_in_stride else "k, mr")


# ----------------------------------------------------------------------------------------
# LHS: qai8dxp
# ----------------------------------------------------------------------------------------
def _qai8dxp():
    name = "kai_lhs_quant_pack_qai8dxp_f32"
    ref = QAI8DXP(1, 8, 2)
    km = ref.k_multiple
    geo = list(_grid(mr=(1, 3, 4, 8, 16), k=(1, 31, 32, 33, 100, 256), kr=(4, 8, 16), sr=(1, 2)))
    geo = [g for g in geo if (g["kr"] // g["sr"]) in (2, 4, 8, 16, 32)]
    lay = lambda mr, kr, sr, **_: QAI8DXP(mr, kr, sr)  # noqa: E731
    kpad = _check(_roundup("k", km), lambda k, **g: lay(**g).k_padded(k), geo)
    stride_py = f"mr * ({_roundup('k', km)} + {ref.offset_bytes} + {ref.rscale_bytes})"
    stride = _check(stride_py, lambda k, **g: lay(**g).row_block_stride(k), geo)
    off_f = _check(f"mr * {_roundup('k', km)}", lambda k, **g: lay(**g).offset_field_offset(k), geo)
    rs_f = _check(f"mr * {_roundup('k', km)} + mr * {ref.offset_bytes}",
                  lambda k, **g: lay(**g).rscale_offset(k), geo)
    egeo = [dict(g, x=x, t=t) for g in geo[:40] for x in (0, g["mr"] - 1) for t in (0, 5, 31, 63)]
    elem = _check("(t // (kr // sr)) * (mr * (kr // sr)) + x * (kr // sr) + t % (kr // sr)",
                  lambda x, t, **g: lay(**g).element_offset(x, t), egeo)
    # the template stores chunks: value t of slot x at first + (t // run) * cstep + t % run
    # (run divides 32, the layout's k multiple, so a padded row is whole chunks)
    first_py, run_py, cstep_py = "x * (kr // sr)", "kr // sr", "mr * (kr // sr)"
    first = _check(first_py, lambda x, **g: lay(**g).element_offset(x, 0), egeo)
    run = _check(run_py, lambda **g: lay(**g).L, geo)
    cstep = _check(cstep_py, lambda **g: lay(**g).chunk_bytes, geo)
    _check(f"{first_py} + (t // ({run_py})) * ({cstep_py}) + t % ({run_py})",
           lambda x, t, **g: lay(**g).element_offset(x, t), egeo)
    _check(f"{km} % ({run_py})", lambda **g: 0, geo)
    del elem
    protos, getters = _lhs_getters(name, 'const float*', bl=False, bl_in_stride=False, m_step='mr')
    return _Packer(name, protos, "qai8dxp<mr>x<kr/sr> (tilegen.layout.lhs_int8.QAI8DXP)", "qai8dxp",
                   "qai8dxp.c.j2",
                   dict(getters, stride=stride, kpad=kpad, first=first.replace("x *", "slot *"),
                        run=run, cstep=cstep,
                        off_f=off_f, rs_f=rs_f, ob=ref.offset_bytes, rb=ref.rscale_bytes))


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p (generic and 4x8sb)
# ----------------------------------------------------------------------------------------
def _qsi8d32p(name: str, rounding: str):
    ref = QSI8D32P(1, 8, 2, 32, rounding)
    geo = [g for g in _grid(mr=(1, 4, 8), kr=(4, 8, 16, 32), sr=(1, 2), bl=(32, 64, 128),
                             k=(128, 256, 384))
           if g["k"] % g["bl"] == 0 and g["bl"] % (g["kr"] // g["sr"]) == 0]
    lay = lambda mr, kr, sr, bl, **_: QSI8D32P(mr, kr, sr, bl, rounding)  # noqa: E731
    sb = ref.scale_bytes
    stride = _check(f"mr * (k // bl) * (bl + {sb})", lambda k, **g: lay(**g).row_block_stride(k), geo)
    bstride = _check(f"mr * (bl + {sb})", lambda k, **g: lay(**g).block_stride, geo)
    doff = _check(f"mr * {sb}", lambda k, **g: lay(**g).data_offset_in_block, geo)
    egeo = [dict(g, x=x, e=e) for g in geo[::7] for x in (0, g["mr"] - 1) for e in (0, 9, 31)]
    elem = _check(f"mr * {sb} + (e // (kr // sr)) * (mr * (kr // sr)) + x * (kr // sr) + e % (kr // sr)",
                  lambda x, e, **g: lay(**g).element_offset(x, e), egeo)
    # the template stores chunks: element e of slot x at first + (e // run) * cstep + e % run
    first_py, run_py, cstep_py = f"mr * {sb} + x * (kr // sr)", "kr // sr", "mr * (kr // sr)"
    first = _check(first_py, lambda x, **g: lay(**g).element_offset(x, 0), egeo)
    run = _check(run_py, lambda **g: lay(**g).L, geo)
    cstep = _check(cstep_py, lambda **g: lay(**g).chunk_bytes, geo)
    _check(f"{first_py} + (e // ({run_py})) * ({cstep_py}) + e % ({run_py})",
           lambda x, e, **g: lay(**g).element_offset(x, e), egeo)
    protos, getters = _lhs_getters(name, 'const float*', bl=True, bl_in_stride=True, m_step='mr')
    del doff
    label = "qsi8d32p<mr>x<kr/sr> (tilegen.layout.lhs_int8.QSI8D32P, rounding=" + rounding + ")"
    return _Packer(name, protos, label, "qsi8d32p", "qsi8d32p.c.j2",
                   dict(getters, stride=stride, bstride=bstride, sb=sb, elem=elem, first=first, run=run,
                        cstep=cstep, rounding=rounding,
                        cvt="vcvtaq_s32_f32" if rounding == "away" else "vcvtnq_s32_f32"))


# ----------------------------------------------------------------------------------------
# LHS: qsi8d32p with trailing scales (the _neon packer of the SME GEMV)
# ----------------------------------------------------------------------------------------
def _qsi8d32p_neon():
    name = "kai_lhs_quant_pack_qsi8d32p_f32_neon"
    ref = QSI8D32PScaleTail(1)
    sb = ref.scale_bytes
    geo = [g for g in _grid(mr=(1, 2, 4), kr=(4, 8), bl=(32, 64), k=(64, 128, 192))
           if g["k"] % g["bl"] == 0]
    lay = lambda mr, kr, bl, **_: QSI8D32PScaleTail(mr, kr, 1, bl)  # noqa: E731
    stride = _check(f"mr * (k // bl) * (bl + {sb})", lambda k, **g: lay(**g).row_block_stride(k), geo)
    sgeo = [dict(g, x=x, b=b) for g in geo for x in (0, g["mr"] - 1) for b in (0, 1)]
    soff = _check(f"mr * k + (b * mr + x) * {sb}", lambda x, b, k, **g: lay(**g).scale_offset(x, b, k),
                  sgeo)
    egeo = [dict(g, x=x, e=e) for g in geo for x in (0, g["mr"] - 1) for e in (0, 5, 33)]
    elem = _check("(e // kr) * (mr * kr) + x * kr + e % kr",
                  lambda x, e, **g: lay(**g).element_offset(x, e), egeo)
    protos, getters = _lhs_getters(name, 'const float*', bl=True, bl_in_stride=True, m_step='1')
    return _Packer(name, protos,
                   "qsi8d32p<mr>x<kr>, scales last (tilegen.layout.lhs_int8.QSI8D32PScaleTail)",
                   "qsi8d32p-scale-tail", "qsi8d32p_scale_tail.c.j2",
                   dict(getters, stride=stride, soff=soff, elem=elem))


# ----------------------------------------------------------------------------------------
# LHS: f16p<mr>x2
# ----------------------------------------------------------------------------------------
def _f16pmrx2():
    name = "kai_lhs_pack_f16pmrx2_f32_neon"
    ref = F16PLhs2(1)
    geo = list(_grid(mr=(1, 4, 16, 64), k=(1, 2, 7, 64, 100)))
    lay = lambda mr, **_: F16PLhs2(mr)  # noqa: E731
    kpad = _check(_roundup("k", ref.k_multiple), lambda k, **g: lay(**g).k_padded(k), geo)
    stride = _check(f"mr * {_roundup('k', ref.k_multiple)} * {ref.elem_bytes}",
                    lambda k, **g: lay(**g).row_block_stride(k), geo)
    egeo = [dict(g, x=x, t=t) for g in geo for x in (0, g["mr"] - 1) for t in (0, 1, 5)]
    P2 = ref.pair
    elem = _check(f"((t // {P2}) * (mr * {P2}) + x * {P2} + t % {P2}) * {ref.elem_bytes}",
                  lambda x, t, **g: lay(**g).element_offset(x, t), egeo)
    protos, getters = _lhs_getters(name, 'const void*', bl=True, bl_in_stride=False, m_step='mr')
    return _Packer(name, protos, "f16p<mr>x2 (tilegen.layout.f16.F16PLhs2)", "f16pmrx2",
                   "f16pmrx2.c.j2", dict(getters, stride=stride, kpad=kpad, elem=elem))


# ----------------------------------------------------------------------------------------
# LHS: SME bf16p2vlx2 and f32p2vlx1
# ----------------------------------------------------------------------------------------
def _sme_lhs(name: str, cls):
    bf16 = cls is BF16PLhs2
    tile = _vl_tile(cls)
    geo = list(_grid(mr=(8, 16, 32, 64, 128), k=(1, 2, 3, 64, 101)))
    if bf16:
        ref = BF16PLhs2(8)
        kr = ref.kr
        stride = _check(f"mr * ({ref.slot_head_bytes} + {_roundup('k', kr)} * 2)",
                        lambda mr, k: BF16PLhs2(mr).row_block_stride(k), geo)
        kpad = _check(_roundup("k", kr), lambda mr, k: BF16PLhs2(mr).k_padded(k), geo)
        egeo = [dict(g, x=x, t=t) for g in geo for x in (0, g["mr"] - 1) for t in (0, 1, 5)]
        elem = _check(f"((t // {kr}) * (mr * {kr}) + x * {kr} + t % {kr}) * 2",
                      lambda mr, k, x, t: BF16PLhs2(mr).element_offset(x, t), egeo)
        vbytes = 2
        lname = "bf16p<mr>x2 (tilegen.layout.bf16.BF16PLhs2)"
        anchor = "bf16p"
    else:
        ref = F32PackedLHS(8)
        stride = _check(f"k * (mr * {ref.elem_bytes})", lambda mr, k: F32PackedLHS(mr).block_stride(k),
                        geo)
        kpad = "k"
        egeo = [dict(g, x=x, t=t) for g in geo for x in (0, g["mr"] - 1) for t in (0, 1, 5)]
        elem = _check(f"(t * mr + x) * {ref.elem_bytes}",
                      lambda mr, k, x, t: (t * F32PackedLHS(mr).k_step_bytes // ref.elem_bytes + x)
                      * ref.elem_bytes, egeo)
        vbytes = ref.elem_bytes
        lname = "f32p<mr>x1 (tilegen.layout.f32.F32PackedLHS)"
        anchor = "f32p-lhs"
    protos, getters = _lhs_getters(name, 'const void*', bl=False, bl_in_stride=False, m_step='vl_mr()')
    return _Packer(name, protos, lname, anchor, "sme_lhs.c.j2",
                   dict(getters, tile=tile, stride=stride, kpad=kpad, elem=elem, bf16=bf16,
                        vbytes=vbytes))


# ----------------------------------------------------------------------------------------
# RHS: qsi4c32pscalef16 (q4_0 rows -> f16 scales first, XOR 0x88 data)
# ----------------------------------------------------------------------------------------
_Q4_PARAMS = "const struct kai_rhs_pack_qs4cxs1s0_param* params"


def _q4_getters(n4: str):
    P = "size_t nr, size_t kr, size_t bl"
    return [
        f"size_t kai_get_n_step_{n4}(size_t nr)",
        f"size_t kai_get_rhs_offset_{n4}(size_t n_idx, size_t rhs_stride)",
        f"size_t kai_get_rhs_packed_stride_{n4}(size_t k, {P})",
        f"size_t kai_get_rhs_packed_offset_{n4}(size_t n_idx, size_t k, {P})",
        f"size_t kai_get_rhs_packed_size_{n4}(size_t n, size_t k, {P})",
        f"void kai_run_{n4}(size_t num_groups, size_t n, size_t k, size_t nr, size_t kr, size_t sr, "
        f"size_t bl, const uint8_t* rhs, const float* bias, void* rhs_packed, size_t extra_bytes, "
        f"{_Q4_PARAMS})",
    ]


def _qsi4c32pscalef16():
    name = "kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0"
    n4 = name[4:]
    ref = QSI4C32PScaleF16(4, 16)
    sb = ref.scale_bytes
    geo = [g for g in _grid(nr=(4, 8, 12, 64), kr=(4, 8, 16), bl=(32, 64, 128), k=(128, 256, 384))
           if g["k"] % g["bl"] == 0]
    lay = lambda nr, kr, bl, **_: QSI4C32PScaleF16(nr, kr, 2, bl)  # noqa: E731
    stride = _check(f"nr * (k // bl) * (bl // 2 + {sb})", lambda k, **g: lay(**g).group_stride(k), geo)
    src_row = _check(f"(k // bl) * ({sb} + bl // 2)",
                     lambda k, **g: lay(**g).src_row_bytes(k), geo)
    bstride = _check(f"nr * (bl // 2 + {sb})", lambda k, **g: lay(**g).block_stride, geo)
    soff = _check(f"{ref.scale_offset_in_block} + i * {sb}",
                  lambda i, **g: lay(**g).scale_offset(0) + i * sb,
                  [dict(g, i=i) for g in geo for i in (0, 3)])
    doff = _check(f"{ref.scale_offset_in_block} + nr * {sb}", lambda k, **g: lay(**g).data_offset(0), geo)
    seg = _check("nr * kr // 2", lambda k, **g: lay(**g).segment_bytes, geo)
    protos = _q4_getters(n4)
    return _Packer(name, protos, "qsi4c32p<nr>x<kr/2>scalef16 (tilegen.layout.rhs_int4.QSI4C32PScaleF16)",
                   "qsi4c32pscalef16", "qsi4c32pscalef16.c.j2",
                   dict(stride=stride, src_row=src_row, bstride=bstride, soff=soff, doff=doff,
                        seg=seg, sb=sb, xor=hex(ref.data_xor)), params=True)


def _qsi4c32ps1s0scalef16():
    name = "kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
    n4 = name[4:]
    ref = QSI4C32PS1S0ScaleF16(4)
    sb = ref.scale_bytes
    geo = [g for g in _grid(nr=(4, 16, 64), kr=(4, 8), bl=(32, 64), k=(64, 128, 192))
           if g["k"] % g["bl"] == 0]
    lay = lambda nr, kr, bl, **_: QSI4C32PS1S0ScaleF16(nr, kr, 2, bl)  # noqa: E731
    stride = _check(f"nr * (k // bl) * (bl // 2 + {sb})", lambda k, **g: lay(**g).group_stride(k), geo)
    src_row = _check(f"(k // bl) * ({sb} + bl // 2)", lambda k, **g: lay(**g).src_row_bytes(k), geo)
    sgeo = [dict(g, i=i, b=b) for g in geo for i in (0, g["nr"] - 1) for b in (0, 1)]
    soff = _check(f"nr * k // 2 + (b * nr + i) * {sb}",
                  lambda i, b, k, **g: lay(**g).scale_offset(i, b, k), sgeo)
    bgeo = [dict(g, i=i, t=t) for g in geo for i in (0, g["nr"] - 1) for t in (0, 2, 6, 30)]
    boff = _check("(t // kr) * (nr * kr // 2) + i * (kr // 2) + (t % kr) // 2",
                  lambda i, t, **g: lay(**g).byte_offset(i, t), bgeo)
    protos = _q4_getters(n4)
    return _Packer(name, protos,
                   "qsi4c32p<nr>x4 s1s0 scalef16 (tilegen.layout.rhs_int4.QSI4C32PS1S0ScaleF16)",
                   "qsi4c32ps1s0scalef16", "qsi4c32ps1s0scalef16.c.j2",
                   dict(stride=stride, src_row=src_row, soff=soff, boff=boff, sb=sb), params=True)


# ----------------------------------------------------------------------------------------
# RHS: qsi8cxp
# ----------------------------------------------------------------------------------------
def _qsi8cxp():
    name = "kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon"
    n4 = name[4:]
    ref = QSI8CXP(4, 4)
    km = ref.k_multiple
    geo = list(_grid(nr=(4, 8, 16, 64), kr=(1, 4, 8, 16), k=(1, 31, 32, 70, 100)))
    lay = lambda nr, kr, **_: QSI8CXP(nr, kr)  # noqa: E731
    K = _roundup("k", km)
    stride = _check(f"nr * ({K} + {ref.rsum_bytes} + {ref.scale_bytes} + {ref.bias_bytes})",
                    lambda k, **g: lay(**g).group_stride(k), geo)
    kpad = _check(K, lambda k, **g: lay(**g).k_padded(k), geo)
    rs = _check(f"nr * {K} + {ref.rsum_offset_in_tail}", lambda k, **g: lay(**g).rsum_offset(k), geo)
    sc = _check(f"nr * {K} + nr * {ref.rsum_bytes}", lambda k, **g: lay(**g).scale_offset(k), geo)
    bi = _check(f"nr * {K} + nr * ({ref.rsum_bytes} + {ref.scale_bytes})",
                lambda k, **g: lay(**g).bias_offset(k), geo)
    egeo = [dict(g, i=i, t=t) for g in geo for i in (0, g["nr"] - 1) for t in (0, 5, 31)]
    elem = _check("(t // kr) * (nr * kr) + i * kr + t % kr",
                  lambda i, t, **g: lay(**g).element_offset(i, t), egeo)
    P = "size_t nr, size_t kr, size_t sr"
    protos = [
        f"size_t kai_get_n_step_{n4}(size_t nr)",
        f"size_t kai_get_rhs_offset_{n4}(size_t n_idx, size_t rhs_stride)",
        f"size_t kai_get_rhs_packed_stride_{n4}(size_t k, {P})",
        f"size_t kai_get_rhs_packed_offset_{n4}(size_t n_idx, size_t k, {P})",
        f"size_t kai_get_rhs_packed_size_{n4}(size_t n, size_t k, {P})",
        f"void kai_run_{n4}(size_t num_groups, size_t n, size_t k, size_t nr, size_t kr, size_t sr, "
        "const int8_t* rhs, const float* bias, const float* scale, void* rhs_packed, "
        "size_t extra_bytes, const struct kai_rhs_pack_qsi8cx_params* params)",
    ]
    return _Packer(name, protos, "qsi8cxp<nr>x<kr> (tilegen.layout.rhs_int8.QSI8CXP)", "qsi8cxp",
                   "qsi8cxp.c.j2",
                   dict(stride=stride, kpad=kpad, elem=elem, rs=rs, sc=sc, bi=bi, rb=ref.rsum_bytes,
                        sbytes=ref.scale_bytes, bb=ref.bias_bytes), params=True)


# ----------------------------------------------------------------------------------------
# RHS: SME bf16p2vlx2b (k x n input) and f32p2vlx1biasf32 (n x k input)
# ----------------------------------------------------------------------------------------
_SME_RHS_RUN = ("void kai_run_{n4}(size_t num_groups, size_t n, size_t k, size_t nr, size_t kr, "
                "size_t sr, size_t rhs_stride, const void* rhs, const void* bias, const void* scale, "
                "void* rhs_packed, size_t extra_bytes, const void* params)")


def _bf16p2vlx2b():
    name = "kai_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme"
    n4 = name[4:]
    tile = _vl_tile(BF16PRhs2B)
    ref = BF16PRhs2B(8)
    kr = ref.kr
    geo = list(_grid(nr=(8, 16, 64, 128), k=(1, 2, 3, 64, 101)))
    stride = _check(f"nr * ({ref.slot_head_bytes} + {_roundup('k', kr)} * 2)",
                    lambda nr, k: BF16PRhs2B(nr).group_stride(k), geo)
    kpad = _check(_roundup("k", kr), lambda nr, k: BF16PRhs2B(nr).k_padded(k), geo)
    doff = _check(f"nr * {ref.slot_head_bytes}", lambda nr, k: BF16PRhs2B(nr).data_offset(k), geo)
    egeo = [dict(g, i=i, t=t) for g in geo for i in (0, g["nr"] - 1) for t in (0, 1, 5)]
    elem = _check(f"nr * {ref.slot_head_bytes} + ((t // {kr}) * (nr * {kr}) + i * {kr} + t % {kr}) * 2",
                  lambda nr, k, i, t: BF16PRhs2B(nr).data_offset(k) + BF16PRhs2B(nr).element_offset(i, t),
                  egeo)
    protos = [
        f"size_t kai_get_n_step_{n4}(void)",
        f"size_t kai_get_rhs_offset_{n4}(size_t n_idx)",
        f"size_t kai_get_bias_offset_{n4}(size_t n_idx)",
        f"size_t kai_get_rhs_packed_stride_{n4}(size_t k)",
        f"size_t kai_get_rhs_packed_offset_{n4}(size_t n_idx, size_t k)",
        f"size_t kai_get_rhs_packed_size_{n4}(size_t n, size_t k)",
        _SME_RHS_RUN.format(n4=n4),
    ]
    del doff
    return _Packer(name, protos, "bf16p<nr>x2b (tilegen.layout.bf16.BF16PRhs2B)", "bf16p",
                   "bf16p2vlx2b.c.j2", dict(tile=tile, stride=stride, kpad=kpad, elem=elem))


def _f32p2vlx1biasf32():
    name = "kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"
    n4 = name[4:]
    tile = _vl_tile(F32PackedRHS)
    ref = F32PackedRHS(16)
    eb = ref.elem_bytes
    geo = list(_grid(nr=(8, 16, 64, 128), k=(1, 2, 3, 64, 101), n=(1, 7, 130)))
    # KleidiAI's stride getter of this packer is per column: a panel of nr columns is nr of them
    col = _check(F32PackedRHS(1).stride_expr, lambda nr, k, n: F32PackedRHS(nr).panel_stride(k) // nr, geo)
    size = _check(f"(n + nr - 1) // nr * nr * ({F32PackedRHS(1).stride_expr})",
                  lambda nr, k, n: F32PackedRHS(nr).packed_size(n, k), geo)
    panel = _check(f"nr * {eb} + k * (nr * {eb})", lambda nr, k, n: F32PackedRHS(nr).panel_stride(k), geo)
    protos = [
        f"size_t kai_get_n_step_{n4}(void)",
        f"size_t kai_get_rhs_offset_{n4}(size_t n_idx, size_t rhs_stride)",
        f"size_t kai_get_bias_offset_{n4}(size_t n_idx)",
        f"size_t kai_get_rhs_packed_stride_{n4}(size_t k)",
        f"size_t kai_get_rhs_packed_offset_{n4}(size_t n_idx, size_t k)",
        f"size_t kai_get_rhs_packed_size_{n4}(size_t n, size_t k)",
        _SME_RHS_RUN.format(n4=n4),
    ]
    return _Packer(name, protos, "f32p<nr>x1b = f32p2vlx1biasf32 (tilegen.layout.f32.F32PackedRHS)",
                   "f32p-rhs", "f32p2vlx1biasf32.c.j2",
                   dict(tile=tile, col=col, size=size, panel=panel, eb=eb))


# ----------------------------------------------------------------------------------------
# K-quants: q8kp (LHS), q4kp and q6kp (RHS from ggml blocks)
# ----------------------------------------------------------------------------------------
_KQ_KRS = (2, 4, 8, 16, 32)


def _q8kp(cls=Q8KP, name: str = "kai_lhs_quant_pack_q8kp_f32"):
    """The Q8_K-style activation quantiser of ``cls``: q8kp (int8 values), or q8ki16p (the same
    values widened to int16: ``value_bytes`` 2, each value's bytes twice as far)."""
    ref = cls(1, 8)
    qk, db, nb, vb = ref.qk, ref.d_bytes, ref.bsum_count, ref.value_bytes
    w = "" if vb == 1 else f" * {vb}"           # a value's bytes (q8kp's expressions as before)
    geo = list(_grid(mr=(1, 2, 4, 8, 16), kr=_KQ_KRS, k=(256, 512, 1024)))
    lay = lambda mr, kr, **_: cls(mr, kr)  # noqa: E731
    rec = _check(f"mr * ({qk * vb} + {db} + 2 * {nb})", lambda k, **g: lay(**g).sb_record_bytes, geo)
    stride = _check(f"(k // {qk}) * mr * ({qk * vb} + {db} + 2 * {nb})",
                    lambda k, **g: lay(**g).row_block_stride(k), geo)
    d_off = _check(f"mr * {qk * vb}", lambda k, **g: lay(**g).d_offset, geo)
    hi_off = _check(f"mr * ({qk * vb} + {db})", lambda k, **g: lay(**g).bsum_hi_offset, geo)
    lo_off = _check(f"mr * ({qk * vb} + {db} + {nb})", lambda k, **g: lay(**g).bsum_lo_offset, geo)
    egeo = [dict(g, x=x, t=t) for g in geo[::3] for x in (0, g["mr"] - 1) for t in (0, 5, 37, 300)
            if t < g["k"]]
    elem = _check(f"(t // {qk}) * mr * ({qk * vb} + {db} + 2 * {nb}) + ((t % {qk}) // (kr // 2) * "
                  f"(mr * (kr // 2)) + x * (kr // 2) + (t % (kr // 2))){w}",
                  lambda x, t, **g: lay(**g).element_offset(x, t), egeo)
    # the template stores chunks: value t of slot x in super-block s at
    # s * rec + first + (t % qk // L) * cstep + (t % L) * vb, run = L * vb bytes at a time
    first_py, run_py, cstep_py = f"x * (kr // 2){w}", f"kr // 2{w}", f"mr * (kr // 2){w}"
    first = _check(first_py, lambda x, **g: lay(**g).element_offset(x, 0), egeo)
    run = _check(run_py, lambda **g: lay(**g).L * vb, geo)
    cstep = _check(cstep_py, lambda **g: lay(**g).chunk_bytes, geo)
    _check(f"(t // {qk}) * mr * ({qk * vb} + {db} + 2 * {nb}) + {first_py} + (t % {qk} // (kr // 2)) * "
           f"({cstep_py}) + t % (kr // 2){w}", lambda x, t, **g: lay(**g).element_offset(x, t), egeo)
    del elem
    protos, getters = _lhs_getters(name, "const float*", bl=False, bl_in_stride=False, m_step="mr")
    return _Packer(name, protos, f"{cls.format}<mr>x<kr/2> (tilegen.layout.kquant.{cls.__name__})",
                   cls.format, "q8kp.c.j2",
                   dict(getters, stride=stride, rec=rec, d_off=d_off, hi_off=hi_off, lo_off=lo_off,
                        first=first.replace("x *", "slot *"), run=run, cstep=cstep, qk=qk, db=db, nb=nb,
                        vb=vb, sub=ref.sub_k, bsum_shift=ref.bsum_hi_shift))


_KQ_RUN = ("void kai_run_{n4}(size_t num_groups, size_t n, size_t k, size_t nr, size_t kr, "
           "size_t sr, size_t rhs_stride, const void* rhs, const void* bias, const void* scale, "
           "void* rhs_packed, size_t extra_bytes, const void* params)")


def _kq_rhs_protos(n4: str) -> list[str]:
    P = "size_t nr, size_t kr, size_t sr"
    return [
        f"size_t kai_get_n_step_{n4}(size_t nr)",
        f"size_t kai_get_rhs_offset_{n4}(size_t n_idx, size_t rhs_stride)",
        f"size_t kai_get_rhs_packed_stride_{n4}(size_t k, {P})",
        f"size_t kai_get_rhs_packed_offset_{n4}(size_t n_idx, size_t k, {P})",
        f"size_t kai_get_rhs_packed_size_{n4}(size_t n, size_t k, {P})",
        _KQ_RUN.format(n4=n4),
        f"void kai_run_dequant_row_{n4}(size_t row, size_t k, size_t nr, size_t kr, "
        "const void* rhs_packed, float* out)",
    ]


def _kq_geo():
    return list(_grid(nr=(1, 4, 8, 12, 16, 64), kr=_KQ_KRS, k=(256, 512)))


def _kq_rhs(name: str, builder) -> _Packer:
    """A K-quant RHS packer a family plugin brings (its ``C_PACKERS``): the shared prototypes
    (repack and row dequantiser), and the plugin's layout banner, template and checked
    expressions at the K-quant geometries."""
    return _Packer(name, _kq_rhs_protos(name[4:]), **builder(_kq_geo()))


# ----------------------------------------------------------------------------------------
# the tree
# ----------------------------------------------------------------------------------------
def _builders():
    return {
        "kai_lhs_quant_pack_qai8dxp_f32": _qai8dxp,
        "kai_lhs_quant_pack_qsi8d32p_f32": lambda: _qsi8d32p("kai_lhs_quant_pack_qsi8d32p_f32", "away"),
        "kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon":
            lambda: _qsi8d32p("kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon", "even"),
        "kai_lhs_quant_pack_qsi8d32p_f32_neon": _qsi8d32p_neon,
        "kai_lhs_pack_f16pmrx2_f32_neon": _f16pmrx2,
        "kai_lhs_pack_bf16p2vlx2_f32_sme": lambda: _sme_lhs("kai_lhs_pack_bf16p2vlx2_f32_sme", BF16PLhs2),
        "kai_lhs_pack_f32p2vlx1_f32_sme": lambda: _sme_lhs("kai_lhs_pack_f32p2vlx1_f32_sme", F32PackedLHS),
        "kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0": _qsi4c32pscalef16,
        "kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon": _qsi4c32ps1s0scalef16,
        "kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon": _qsi8cxp,
        "kai_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme": _bf16p2vlx2b,
        "kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme": _f32p2vlx1biasf32,
        "kai_lhs_quant_pack_q8kp_f32": _q8kp,
        "kai_lhs_quant_pack_q8ki16p_f32": lambda: _q8kp(Q8KPI16, "kai_lhs_quant_pack_q8ki16p_f32"),
        **{name: (lambda name=name, b=b: _kq_rhs(name, b)) for name, b in C_PACKERS.items()},
    }


def packer_sources() -> list[ExportFile]:
    """The generated packer sources of the KleidiAI tree: per packer ``<name>.h`` and
    ``<name>.c`` under :data:`PACK_DIR`, and the parameter structs' header."""
    common = dict(version=__version__, pack_dir=PACK_DIR, params_header=PARAMS_HEADER)
    out = [ExportFile(PARAMS_HEADER, render_template("export/pack/params.h.j2", **common))]
    builders = _builders()
    assert tuple(builders) == ALL_PACKERS
    for name in ALL_PACKERS:
        p = builders[name]()
        assert p.name == name
        ctx = dict(common, name=name, n4=name[4:], P=p.protos, layout=p.layout, anchor=p.anchor)
        body = render_template(f"export/pack/{p.template}", **ctx, **p.context)
        helpers = [h for h in HELPERS if h + "(" in body]
        out.append(ExportFile(f"{PACK_DIR}/{name}.h",
                              render_template("export/pack/packer.h.j2", **ctx, params=p.params)))
        out.append(ExportFile(f"{PACK_DIR}/{name}.c",
                              render_template("export/pack/packer.c.j2", **ctx, helpers=helpers,
                                              body=body)))
    return out
