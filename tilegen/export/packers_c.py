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

============================================================  ====================================
packer                                                        layout object
============================================================  ====================================
``kai_lhs_quant_pack_qai8dxp_f32``                            :class:`~tilegen.layout.q4.QAI8DXP`
``kai_lhs_quant_pack_qsi8d32p_f32``                           :class:`~tilegen.layout.q4.QSI8D32P` (away)
``kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon``                 :class:`~tilegen.layout.q4.QSI8D32P` (even)
``kai_lhs_quant_pack_qsi8d32p_f32_neon``                      :class:`~tilegen.layout.q4_sme.QSI8D32PScaleTail`
``kai_lhs_pack_f16pmrx2_f32_neon``                            :class:`~tilegen.layout.q4_sme.F16PLhs2`
``kai_lhs_pack_bf16p2vlx2_f32_sme``                           :class:`~tilegen.layout.bf16.BF16PLhs2`
``kai_lhs_pack_f32p2vlx1_f32_sme``                            :class:`~tilegen.layout.f32.F32PackedLHS`
``kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0``            :class:`~tilegen.layout.q4.QSI4C32PScaleF16`
``kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon``   :class:`~tilegen.layout.q4_sme.QSI4C32PS1S0ScaleF16`
``kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon``                      :class:`~tilegen.layout.q8.QSI8CXP`
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
  ties away, ``4x8sb`` ties even (C ``rintf``: FCVTNS under the default rounding mode); f16 and
  bf16 round to nearest even, a bf16 NaN stays quiet.
* SME packers read the streaming vector length with ``RDSVL`` (encoded with ``.inst``, so the
  files build without ``+sme``); their tile size is ``units * SVL / 4`` f32 lanes, their
  ``mr``/``nr`` arguments are not used for the layout (KleidiAI asserts they equal it).  Getters
  that take ``mr`` use the argument and need no SME.
* ``bias == NULL`` means zero biases; ``params == NULL`` means ``lhs_zero_point = 1``,
  ``scale_multiplier = 1`` for qsi8cxp.  KleidiAI's assertions (num_groups == 1, ...) are not
  repeated.
"""
from __future__ import annotations

import itertools
import re
from string import Template

from .. import __version__
from ..layout.base import c_expr, eval_expr
from ..layout.bf16 import BF16PLhs2, BF16PRhs2B
from ..layout.f16 import F16PLhs2
from ..layout.f32 import F32PackedLHS, F32PackedRHS
from ..layout.lhs_int8 import QAI8DXP, QSI8D32P, QSI8D32PScaleTail
from ..layout.rhs_int4 import QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from ..layout.rhs_int8 import QSI8CXP
from .files import ExportFile

__all__ = ["packer_sources", "PACKERS", "PACK_DIR", "PARAMS_HEADER", "SME_PACKERS",
           "COMPILE_OPTIONS"]

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

# Extra compiler options per generated file (path -> options).  None are needed: the SME
# packers encode RDSVL with .inst, f16 conversion is C's _Float16 (AArch64 baseline).
COMPILE_OPTIONS: dict[str, str] = {}

# tile of the SME packers in vector lengths (KleidiAI's "2vl")
SME_UNITS = 2


# ----------------------------------------------------------------------------------------
# expressions from layout objects, checked against them
# ----------------------------------------------------------------------------------------
def _check(expr: str, layout_value, grid) -> str:
    """``expr`` (Python syntax, ``//`` floor division) as C, after checking that it gives
    ``layout_value(**point)`` for every point of ``grid`` (dicts of the expression's names)."""
    for point in grid:
        want = layout_value(**point)
        got = eval_expr(expr, **point)
        if got != want:
            raise AssertionError(f"packer expression {expr!r} gives {got} at {point}, "
                                 f"the layout object {want}")
    return c_expr(expr)


def _grid(**axes):
    keys = list(axes)
    for vals in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, vals))


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
# C text helpers
# ----------------------------------------------------------------------------------------
_LICENSE = "SPDX-License-Identifier: Apache-2.0"


def _banner(what: str, layout: str, anchor: str) -> str:
    return (f"// {_LICENSE}\n"
            f"// Generated by tilegen {__version__} (tilegen.export.packers_c): {what}.\n"
            f"// Layout: {layout} (tilegen docs/layouts.md#{anchor}); do not edit.\n")


def _header(name: str, protos: list[str], layout: str, anchor: str, params: bool) -> str:
    inc = f'#include "{PARAMS_HEADER}"\n' if params else ""
    body = "\n\n".join(p.strip() + ";" for p in protos)
    return (f"{_banner(name + ' declarations', layout, anchor)}\n#pragma once\n\n"
            f"#include <stddef.h>\n#include <stdint.h>\n{inc}\n"
            "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n"
            f"{body}\n\n"
            "#ifdef __cplusplus\n}\n#endif\n")


_COMMON = r"""
#include <stddef.h>
#include <stdint.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif
"""

# helpers, each emitted only into the files that call it (-Wunused-function)
_HELPERS = {
    "kai_tg_f32": r"""
// A rounded f32 result the compiler may not fuse into a following add (FMA contraction).
static inline float kai_tg_f32(float v) {
    __asm__("" : "+w"(v));
    return v;
}
""",
    "kai_tg_i32": r"""
// (int32_t) of an integral float as AArch64 converts it: saturating, NaN -> 0.
static inline int32_t kai_tg_i32(float v) {
    if (v != v) {
        return 0;
    }
    if (v >= 2147483648.0f) {
        return INT32_MAX;
    }
    if (v <= -2147483648.0f) {
        return INT32_MIN;
    }
    return (int32_t)v;
}
""",
    "kai_tg_load_f32": r"""
// f32 value i of a row at any byte alignment (row strides are in bytes).
static inline float kai_tg_load_f32(const uint8_t* row, size_t i) {
    float v;
    __builtin_memcpy(&v, row + i * sizeof(float), sizeof(v));
    return v;
}
""",
    "kai_tg_store_f16": r"""
// f32 -> f16 (round to nearest even), stored little-endian.
static inline void kai_tg_store_f16(uint8_t* dst, float v) {
    const _Float16 h = (_Float16)v;
    __builtin_memcpy(dst, &h, sizeof(h));
}
""",
}

_SVL = r"""
// Streaming vector length in bytes: RDSVL X0, #1 (encoded, so no +sme build flag is needed;
// the CPU must implement SME).
static inline size_t kai_tg_svl_bytes(void) {
    uint64_t v;
    __asm__ volatile(".inst 0x04bf5820\n\tmov %0, x0" : "=r"(v) : : "x0");
    return (size_t)v;
}
"""

_BF16 = r"""
// f32 -> bf16 bits, round to nearest even, NaN kept quiet (tilegen.layout.q4.f32_to_bf16_rne).
static inline uint16_t kai_tg_bf16(float f) {
    uint32_t b;
    __builtin_memcpy(&b, &f, sizeof(b));
    if ((b & ${abs_mask}u) > ${inf_bits}u) {
        return (uint16_t)((b >> 16) | ${quiet_bit}u);
    }
    return (uint16_t)((b + ${round_bias}u + ((b >> 16) & 1u)) >> 16);
}
"""


def _bf16_helper() -> str:
    return Template(_BF16).substitute(abs_mask="0x7FFFFFFF", inf_bits="0x7F800000",
                                      quiet_bit="0x0040", round_bias="0x7FFF")


def _source(name: str, layout: str, anchor: str, body: str, *, sme: bool = False,
            bf16: bool = False) -> str:
    parts = [_banner(name, layout, anchor), f'\n#include "{PACK_DIR}/{name}.h"\n', _COMMON]
    parts += [text for fn, text in _HELPERS.items() if fn + "(" in body]
    if sme:
        parts.append(_SVL)
    if bf16:
        parts.append(_bf16_helper())
    parts.append(body)
    return "".join(parts)


_BUILTINS = re.compile(r"\b(memcpy|memset|roundf|rintf|fabsf)\(")


def _sub(text: str, **kw) -> str:
    """Fill a C template; libc calls become compiler builtins (inline instructions: FRINTA,
    FRINTX, FABS, loads/stores), so the files need no libc headers and build freestanding."""
    text = Template(text).substitute(**kw).replace("INFINITY", "__builtin_inff()")
    return _BUILTINS.sub(r"__builtin_\1(", text)


def _lhs_getters(name: str, lhs_type: str, *, bl: bool, bl_in_stride: bool, m_step: str):
    """Prototypes (m_step, lhs_offset, packed_offset, packed_size, run) of an LHS packer and
    the C of its four getters, which every LHS packer shares; the caller defines
    ``row_block_stride(k[, bl], mr)`` (with bl when ``bl_in_stride``) and the run function."""
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
    unused = "".join(f"    (void){v};\n" for v in (("bl",) if bl and not bl_in_stride else ())
                     + ("kr", "sr"))
    args = "k, bl, mr" if bl_in_stride else "k, mr"
    step = "    return mr;" if m_step == "mr" else f"    (void)mr;\n    return {m_step};"
    note = ("// Any m_idx_start works (slots are placed individually), as in KleidiAI's m_step "
            "of 1.\n" if m_step == "1" else "")
    getters = (f"{note}{protos[0]} {{\n{step}\n}}\n\n"
               f"{protos[1]} {{\n    return m_idx * lhs_stride;\n}}\n\n"
               f"{protos[2]} {{\n{unused}    return (m_idx / mr) * row_block_stride({args});\n}}\n\n"
               f"{protos[3]} {{\n{unused}    return ((m + mr - 1) / mr) * row_block_stride({args});\n}}\n")
    return protos, getters


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
    protos, getters = _lhs_getters(name, 'const float*', bl=False, bl_in_stride=False, m_step='mr')
    body = _sub(r"""
static size_t row_block_stride(size_t k, size_t mr) {
    return ${stride};
}

${getters}
${p4} {
    if (m == 0 || k == 0) {
        return;
    }
    const size_t stride = row_block_stride(k, mr);
    const size_t k_padded = ${kpad};
    const size_t row_floats = lhs_stride / sizeof(float);
    for (size_t r = 0; r < m; ++r) {
        const float* x = lhs + r * row_floats;
        const size_t g = m_idx_start + r;
        const size_t slot = g % mr;
        uint8_t* blk = (uint8_t*)lhs_packed + (g / mr - m_idx_start / mr) * stride;
        float mx = -INFINITY;
        float mn = INFINITY;
        for (size_t t = 0; t < k; ++t) {
            mx = x[t] > mx ? x[t] : mx;
            mn = x[t] < mn ? x[t] : mn;
        }
        const float rmin = 0.0f < mn ? 0.0f : mn;
        const float rmax = 0.0f > mx ? 0.0f : mx;
        const float scale = rmin == rmax ? 1.0f : 255.0f / (rmax - rmin);
        const float rscale = scale == 0.0f ? 0.0f : 1.0f / scale;
        const float dmin = kai_tg_f32(rmin * scale);
        const float dmax = kai_tg_f32(rmax * scale);
        const float e1 = kai_tg_f32(-128.0f + dmin);
        const float e2 = kai_tg_f32(127.0f + dmax);
        float zp = (e1 + e2) > 0.0f ? -128.0f - dmin : 127.0f - dmax;
        zp = zp > -128.0f ? zp : -128.0f;
        zp = zp < 127.0f ? zp : 127.0f;
        const int32_t nzp = (int32_t)rintf(zp);
        int32_t q = 0;
        for (size_t t = 0; t < k_padded; ++t) {
            if (t < k) {
                q = (int32_t)((uint32_t)kai_tg_i32(roundf(x[t] * scale)) + (uint32_t)nzp);
                q = q < -128 ? -128 : (q > 127 ? 127 : q);
            }
            blk[${elem}] = (uint8_t)(int8_t)q;
        }
        const int32_t offset = -nzp;
        memcpy(blk + ${off_f} + slot * ${ob}, &offset, ${ob});
        memcpy(blk + ${rs_f} + slot * ${rb}, &rscale, ${rb});
    }
}
""", stride=stride, kpad=kpad, elem=elem.replace("x *", "slot *"), off_f=off_f, rs_f=rs_f,
                ob=ref.offset_bytes, rb=ref.rscale_bytes,
                getters=getters, **{f"p{i}": p for i, p in enumerate(protos)})
    return name, protos, "qai8dxp<mr>x<kr/sr> (tilegen.layout.q4.QAI8DXP)", "qai8dxp", body, {}


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
    protos, getters = _lhs_getters(name, 'const float*', bl=True, bl_in_stride=True, m_step='mr')
    rnd = "roundf" if rounding == "away" else "rintf"
    body = _sub(r"""
static size_t row_block_stride(size_t k, size_t bl, size_t mr) {
    return ${stride};
}

${getters}
// lhs points at row 0 of the whole matrix: row m_idx_start + r is packed.
${p4} {
    if (m == 0 || bl == 0 || k % bl != 0) {
        return;
    }
    const size_t stride = row_block_stride(k, bl, mr);
    const size_t row_floats = lhs_stride / sizeof(float);
    for (size_t r = 0; r < m; ++r) {
        const size_t g = m_idx_start + r;
        const size_t x = g % mr;
        const float* src = lhs + g * row_floats;
        uint8_t* blk = (uint8_t*)lhs_packed + (g / mr - m_idx_start / mr) * stride;
        for (size_t b = 0; b < k / bl; ++b) {
            const float* xb = src + b * bl;
            uint8_t* dst = blk + b * (${bstride});
            float amax = 0.0f;
            for (size_t e = 0; e < bl; ++e) {
                const float a = fabsf(xb[e]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float inv = d != 0.0f ? 1.0f / d : 0.0f;
            kai_tg_store_f16(dst + x * ${sb}, d);
            for (size_t e = 0; e < bl; ++e) {
                dst[${elem}] = (uint8_t)kai_tg_i32(${rnd}(xb[e] * inv));
            }
        }
    }
}
""", stride=stride, bstride=bstride, sb=sb, elem=elem, rnd=rnd,
                getters=getters, **{f"p{i}": p for i, p in enumerate(protos)})
    del doff
    label = "qsi8d32p<mr>x<kr/sr> (tilegen.layout.q4.QSI8D32P, rounding=" + rounding + ")"
    return name, protos, label, "qsi8d32p", body, {}


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
    body = _sub(r"""
static size_t row_block_stride(size_t k, size_t bl, size_t mr) {
    return ${stride};
}

${getters}
// lhs points at the first row to pack (row m_idx_start).
${p4} {
    (void)sr;
    if (m == 0 || bl == 0 || kr == 0 || k % bl != 0 || bl % kr != 0) {
        return;
    }
    const size_t stride = row_block_stride(k, bl, mr);
    const size_t row_floats = lhs_stride / sizeof(float);
    for (size_t r = 0; r < m; ++r) {
        const size_t g = m_idx_start + r;
        const size_t x = g % mr;
        const float* src = lhs + r * row_floats;
        uint8_t* blk = (uint8_t*)lhs_packed + (g / mr - m_idx_start / mr) * stride;
        for (size_t b = 0; b < k / bl; ++b) {
            const float* xb = src + b * bl;
            float amax = 0.0f;
            for (size_t i = 0; i < bl; ++i) {
                const float a = fabsf(xb[i]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float inv = d != 0.0f ? 1.0f / d : 0.0f;
            kai_tg_store_f16(blk + ${soff}, d);
            for (size_t i = 0; i < bl; ++i) {
                const size_t e = b * bl + i;
                blk[${elem}] = (uint8_t)kai_tg_i32(roundf(xb[i] * inv));
            }
        }
    }
}
""", stride=stride, soff=soff, elem=elem, getters=getters, **{f"p{i}": p for i, p in enumerate(protos)})
    return (name, protos, "qsi8d32p<mr>x<kr>, scales last (tilegen.layout.q4_sme.QSI8D32PScaleTail)",
            "qsi8d32p-scale-tail", body, {})


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
    body = _sub(r"""
static size_t row_block_stride(size_t k, size_t mr) {
    return ${stride};
}

${getters}
// lhs points at the first row to pack (row m_idx_start).
${p4} {
    (void)bl;
    (void)kr;
    (void)sr;
    if (m == 0 || k == 0) {
        return;
    }
    const size_t stride = row_block_stride(k, mr);
    const size_t k_padded = ${kpad};
    for (size_t r = 0; r < m; ++r) {
        const size_t g = m_idx_start + r;
        const size_t x = g % mr;
        const uint8_t* src = (const uint8_t*)lhs + r * lhs_stride;
        uint8_t* blk = (uint8_t*)lhs_packed + (g / mr - m_idx_start / mr) * stride;
        for (size_t t = 0; t < k_padded; ++t) {
            kai_tg_store_f16(blk + ${elem}, t < k ? kai_tg_load_f32(src, t) : 0.0f);
        }
    }
}
""", stride=stride, kpad=kpad, elem=elem, getters=getters, **{f"p{i}": p for i, p in enumerate(protos)})
    return name, protos, "f16p<mr>x2 (tilegen.layout.q4_sme.F16PLhs2)", "f16pmrx2", body, {}


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
        value = "const uint16_t v = t < k ? kai_tg_bf16(kai_tg_load_f32(src, t)) : 0;"
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
        value = "const float v = kai_tg_load_f32(src, t);"
        vbytes = ref.elem_bytes
        lname = "f32p<mr>x1 (tilegen.layout.f32.F32PackedLHS)"
        anchor = "f32p-lhs"
    protos, getters = _lhs_getters(name, 'const void*', bl=False, bl_in_stride=False, m_step='vl_mr()')
    body = _sub(r"""
// Rows per block at the streaming vector length.
static size_t vl_mr(void) {
    const size_t svl = kai_tg_svl_bytes();
    return ${tile};
}

static size_t row_block_stride(size_t k, size_t mr) {
    return ${stride};
}

${getters}
// lhs points at the first row to pack; the rows of the last block past m are written as 0.
${p4} {
    (void)kr;
    (void)sr;
    if (m == 0 || k == 0) {
        return;
    }
    mr = vl_mr();
    const size_t stride = row_block_stride(k, mr);
    const size_t k_padded = ${kpad};
    const size_t end = m_idx_start + m;
    const size_t last = (end + mr - 1) / mr * mr;
    for (size_t g = m_idx_start; g < last; ++g) {
        const size_t x = g % mr;
        const uint8_t* src = (const uint8_t*)lhs + (g - m_idx_start) * lhs_stride;
        uint8_t* blk = (uint8_t*)lhs_packed + (g / mr - m_idx_start / mr) * stride;
        for (size_t t = 0; t < k_padded; ++t) {
            uint8_t* dst = blk + ${elem};
            if (g < end) {
                ${value}
                memcpy(dst, &v, ${vbytes});
            } else {
                memset(dst, 0, ${vbytes});
            }
        }
    }
}
""", tile=tile, stride=stride, kpad=kpad, elem=elem, value=value, vbytes=vbytes,
                getters=getters, **{f"p{i}": p for i, p in enumerate(protos)})
    return name, protos, lname, anchor, body, dict(sme=True, bf16=bf16)


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


_Q4_GETTERS = r"""
${p0} {
    return nr;
}

${p1} {
    return n_idx * rhs_stride;
}

${p2} {
    (void)kr;
    return ${stride};
}

${p3} {
    return (n_idx / nr) * ${fn}(k, nr, kr, bl);
}

${p4} {
    return ((n + nr - 1) / nr) * ${fn}(k, nr, kr, bl);
}
"""


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
    body = _sub(_Q4_GETTERS + r"""
${p5} {
    (void)num_groups;
    (void)sr;
    (void)bias;
    (void)extra_bytes;
    (void)params;
    if (n == 0 || bl == 0 || kr < 2 || kr % 2 != 0 || k % bl != 0 || bl % kr != 0) {
        return;
    }
    const size_t stride = ${fn}(k, nr, kr, bl);
    const size_t src_row = ${src_row};
    const size_t groups = (n + nr - 1) / nr;
    for (size_t gi = 0; gi < groups; ++gi) {
        uint8_t* grp = (uint8_t*)rhs_packed + gi * stride;
        for (size_t i = 0; i < nr; ++i) {
            const size_t j = gi * nr + i < n ? gi * nr + i : n - 1;   // last group: copies of row n-1
            for (size_t b = 0; b < k / bl; ++b) {
                const uint8_t* sblk = rhs + j * src_row + b * (${sb} + bl / 2);
                uint8_t* blk = grp + b * (${bstride});
                memcpy(blk + ${soff}, sblk, ${sb});
                const uint8_t* sdata = sblk + ${sb};
                for (size_t s = 0; s < bl / kr; ++s) {
                    for (size_t e = 0; e < kr / 2; ++e) {
                        blk[${doff} + s * (${seg}) + i * (kr / 2) + e] =
                            (uint8_t)(sdata[s * (kr / 2) + e] ^ ${xor}u);
                    }
                }
            }
        }
    }
}
""", fn=f"kai_get_rhs_packed_stride_{n4}", stride=stride, src_row=src_row, bstride=bstride,
                soff=soff, doff=doff, seg=seg, sb=sb, xor=hex(ref.data_xor),
                **{f"p{i}": p for i, p in enumerate(protos)})
    return (name, protos, "qsi4c32p<nr>x<kr/2>scalef16 (tilegen.layout.q4.QSI4C32PScaleF16)",
            "qsi4c32pscalef16", body, dict(params=True))


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
    body = _sub(_Q4_GETTERS + r"""
// The nibble of element e of a q4_0-style block (byte e: low nibble; byte e - bl/2: high).
static inline uint8_t src_nibble(const uint8_t* data, size_t e, size_t bl) {
    return e < bl / 2 ? (uint8_t)(data[e] & 0x0F) : (uint8_t)(data[e - bl / 2] >> 4);
}

// Rows of the last group past n are not written.
${p5} {
    (void)num_groups;
    (void)sr;
    (void)bias;
    (void)extra_bytes;
    (void)params;
    if (n == 0 || bl == 0 || kr < 2 || kr % 2 != 0 || k % bl != 0 || bl % kr != 0) {
        return;
    }
    const size_t stride = ${fn}(k, nr, kr, bl);
    const size_t src_row = ${src_row};
    for (size_t j = 0; j < n; ++j) {
        uint8_t* grp = (uint8_t*)rhs_packed + (j / nr) * stride;
        const size_t i = j % nr;
        for (size_t b = 0; b < k / bl; ++b) {
            const uint8_t* sblk = rhs + j * src_row + b * (${sb} + bl / 2);
            memcpy(grp + ${soff}, sblk, ${sb});
            for (size_t e = 0; e < bl; e += 2) {
                const size_t t = b * bl + e;
                grp[${boff}] = (uint8_t)(src_nibble(sblk + ${sb}, e, bl) |
                                         (src_nibble(sblk + ${sb}, e + 1, bl) << 4));
            }
        }
    }
}
""", fn=f"kai_get_rhs_packed_stride_{n4}", stride=stride, src_row=src_row, soff=soff, boff=boff,
                sb=sb, **{f"p{i}": p for i, p in enumerate(protos)})
    return (name, protos, "qsi4c32p<nr>x4 s1s0 scalef16 (tilegen.layout.q4_sme.QSI4C32PS1S0ScaleF16)",
            "qsi4c32ps1s0scalef16", body, dict(params=True))


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
    body = _sub(r"""
${p0} {
    return nr;
}

${p1} {
    return n_idx * rhs_stride;
}

${p2} {
    (void)kr;
    (void)sr;
    return ${stride};
}

${p3} {
    return (n_idx / nr) * ${fn}(k, nr, kr, sr);
}

${p4} {
    return ((n + nr - 1) / nr) * ${fn}(k, nr, kr, sr);
}

// rhs: n rows of k int8 values; the last group is completed with copies of row n-1.
${p5} {
    (void)num_groups;
    (void)extra_bytes;
    if (n == 0 || k == 0 || kr == 0) {
        return;
    }
    const int32_t lhs_zero_point = params != NULL ? params->lhs_zero_point : 1;
    const float scale_multiplier = params != NULL ? params->scale_multiplier : 1.0f;
    const size_t stride = ${fn}(k, nr, kr, sr);
    const size_t k_padded = ${kpad};
    const size_t groups = (n + nr - 1) / nr;
    for (size_t gi = 0; gi < groups; ++gi) {
        uint8_t* grp = (uint8_t*)rhs_packed + gi * stride;
        for (size_t i = 0; i < nr; ++i) {
            const size_t j = gi * nr + i < n ? gi * nr + i : n - 1;
            const int8_t* row = rhs + j * k;
            uint32_t sum = 0;
            for (size_t t = 0; t < k_padded; ++t) {
                const int8_t v = t < k ? row[t] : 0;
                sum += (uint32_t)(int32_t)v;
                grp[${elem}] = (uint8_t)v;
            }
            const int32_t rsum = (int32_t)(sum * (uint32_t)lhs_zero_point);
            const float s = scale[j] * scale_multiplier;
            const float b = bias != NULL ? bias[j] : 0.0f;
            memcpy(grp + ${rs} + i * ${rb}, &rsum, ${rb});
            memcpy(grp + ${sc} + i * ${sbytes}, &s, ${sbytes});
            memcpy(grp + ${bi} + i * ${bb}, &b, ${bb});
        }
    }
}
""", fn=f"kai_get_rhs_packed_stride_{n4}", stride=stride, kpad=kpad, elem=elem, rs=rs, sc=sc,
                bi=bi, rb=ref.rsum_bytes, sbytes=ref.scale_bytes, bb=ref.bias_bytes,
                **{f"p{i}": p for i, p in enumerate(protos)})
    return (name, protos, "qsi8cxp<nr>x<kr> (tilegen.layout.q8.QSI8CXP)",
            "qsi8cxp", body, dict(params=True))


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
    body = _sub(r"""
static size_t vl_nr(void) {
    const size_t svl = kai_tg_svl_bytes();
    return ${tile};
}

static size_t block_stride(size_t k, size_t nr) {
    return ${stride};
}

${p0} {
    return vl_nr();
}

${p1} {
    return n_idx * sizeof(float);
}

${p2} {
    return n_idx * sizeof(float);
}

${p3} {
    return block_stride(k, vl_nr());
}

${p4} {
    const size_t nr = vl_nr();
    return (n_idx / nr) * block_stride(k, nr);
}

${p5} {
    const size_t nr = vl_nr();
    return ((n + nr - 1) / nr) * block_stride(k, nr);
}

// rhs: k rows of n f32 values, rows rhs_stride bytes apart.  K padding repeats K-row 0;
// columns past n are 0 (values and bias).
${p6} {
    (void)num_groups;
    (void)kr;
    (void)sr;
    (void)scale;
    (void)extra_bytes;
    (void)params;
    if (n == 0 || k == 0) {
        return;
    }
    nr = vl_nr();
    const size_t stride = block_stride(k, nr);
    const size_t k_padded = ${kpad};
    const size_t groups = (n + nr - 1) / nr;
    for (size_t gi = 0; gi < groups; ++gi) {
        uint8_t* grp = (uint8_t*)rhs_packed + gi * stride;
        for (size_t i = 0; i < nr; ++i) {
            const size_t j = gi * nr + i;
            const float b = (j < n && bias != NULL) ? ((const float*)bias)[j] : 0.0f;
            memcpy(grp + i * sizeof(float), &b, sizeof(float));
            for (size_t t = 0; t < k_padded; ++t) {
                uint16_t v = 0;
                if (j < n) {
                    const size_t tt = t < k ? t : 0;
                    float w;
                    memcpy(&w, (const uint8_t*)rhs + tt * rhs_stride + j * sizeof(float), sizeof(w));
                    v = kai_tg_bf16(w);
                }
                memcpy(grp + ${elem}, &v, sizeof(v));
            }
        }
    }
}
""", tile=tile, stride=stride, kpad=kpad, elem=elem, **{f"p{i}": p for i, p in enumerate(protos)})
    del doff
    return (name, protos, "bf16p<nr>x2b (tilegen.layout.bf16.BF16PRhs2B)",
            "bf16p", body,
            dict(sme=True, bf16=True))


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
    body = _sub(r"""
static size_t vl_nr(void) {
    const size_t svl = kai_tg_svl_bytes();
    return ${tile};
}

${p0} {
    return vl_nr();
}

${p1} {
    return n_idx * rhs_stride;
}

${p2} {
    return n_idx * ${eb};
}

// Bytes per column (its bias and k values); a panel of nr columns is nr times this.
${p3} {
    return ${col};
}

${p4} {
    return n_idx * ${fn}(k);
}

${p5} {
    const size_t nr = vl_nr();
    return ${size};
}

// rhs: n rows of k f32 values, rows rhs_stride bytes apart; columns past n are 0.
${p6} {
    (void)num_groups;
    (void)kr;
    (void)sr;
    (void)scale;
    (void)extra_bytes;
    (void)params;
    if (n == 0) {
        return;
    }
    nr = vl_nr();
    const size_t panel = ${panel};
    const size_t groups = (n + nr - 1) / nr;
    for (size_t gi = 0; gi < groups; ++gi) {
        uint8_t* grp = (uint8_t*)rhs_packed + gi * panel;
        for (size_t i = 0; i < nr; ++i) {
            const size_t j = gi * nr + i;
            const float b = (j < n && bias != NULL) ? ((const float*)bias)[j] : 0.0f;
            memcpy(grp + i * ${eb}, &b, ${eb});
            const uint8_t* row = (const uint8_t*)rhs + j * rhs_stride;
            for (size_t t = 0; t < k; ++t) {
                uint8_t* dst = grp + nr * ${eb} + (t * nr + i) * ${eb};
                if (j < n) {
                    memcpy(dst, row + t * ${eb}, ${eb});
                } else {
                    memset(dst, 0, ${eb});
                }
            }
        }
    }
}
""", tile=tile, col=col, size=size, panel=panel, eb=eb, fn=f"kai_get_rhs_packed_stride_{n4}",
                **{f"p{i}": p for i, p in enumerate(protos)})
    return (name, protos, "f32p<nr>x1b = f32p2vlx1biasf32 (tilegen.layout.f32.F32PackedRHS)",
            "f32p-rhs", body, dict(sme=True))


# ----------------------------------------------------------------------------------------
# the tree
# ----------------------------------------------------------------------------------------
_PARAMS_TEXT = r"""
#pragma once

#include <stdint.h>

// Parameters of the int4 RHS packers (qsi4c32pscalef16, qsi4c32ps1s0scalef16): llama.cpp
// passes lhs_zero_point = 1, rhs_zero_point = 8 (the packers assume 8).
#ifndef KAI_RHS_PACK_QS4CXS1S0_PARAM_DEFINED
#define KAI_RHS_PACK_QS4CXS1S0_PARAM_DEFINED
struct kai_rhs_pack_qs4cxs1s0_param {
    int8_t lhs_zero_point;
    uint8_t rhs_zero_point;
};
#endif

// Parameters of the int8 RHS packer (qsi8cxp): rsum = lhs_zero_point * sum of a column's
// values, scale = scale * scale_multiplier.
#ifndef KAI_RHS_PACK_QSI8CX_PARAMS_DEFINED
#define KAI_RHS_PACK_QSI8CX_PARAMS_DEFINED
struct kai_rhs_pack_qsi8cx_params {
    int32_t lhs_zero_point;
    float scale_multiplier;
};
#endif
"""


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
    }


def packer_sources() -> list[ExportFile]:
    """The generated packer sources of the KleidiAI tree: per packer ``<name>.h`` and
    ``<name>.c`` under :data:`PACK_DIR`, and the parameter structs' header."""
    out = [ExportFile(PARAMS_HEADER, _banner("parameter structs of the packers",
                                             "tilegen.export.packers_c", "kleidiai-packers")
                      + _PARAMS_TEXT)]
    builders = _builders()
    assert tuple(builders) == PACKERS
    for name in PACKERS:
        name_, protos, layout, anchor, body, opts = builders[name]()
        assert name_ == name
        params = opts.pop("params", False)
        out.append(ExportFile(f"{PACK_DIR}/{name}.h", _header(name, protos, layout, anchor, params)))
        out.append(ExportFile(f"{PACK_DIR}/{name}.c", _source(name, layout, anchor, body, **opts)))
    return out
