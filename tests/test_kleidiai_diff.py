"""The export against the real KleidiAI v1.24.0: differential tests of every exported name.

KleidiAI's own library (built by its CMake, ``provision.ensure_kleidiai_library``) and
``tilegen export kleidiai`` (built by its CMakeLists) are two shared objects with the same
``kai_`` names; the emulated Python loads both (``tests/guest_kaidiff.py``) and makes the same
calls, by name, into each, for every one of the 20 matmul micro-kernels and 12 packers the
export provides, on the CPU models that have each ISA and, for the SME names, at every streaming
vector length (128 to 2048 bits):

* every getter KleidiAI's headers declare returns KleidiAI's value, at drawn arguments;
* every packer writes exactly the bytes KleidiAI's writes, with KleidiAI's values (buffers
  prefilled with 0x00 and 0xFF; m, n, k at and off the step multiples, m_idx_start > 0 and
  padded strides where KleidiAI honours them);
* every micro-kernel, run as llama.cpp's kleidiai.cpp runs it (each library's own packers,
  the LHS packed over threads through get_lhs_packed_offset, the matmul over an m x n grid
  of calls through the LHS/RHS/dst offset getters, n in multiples of n_step), gives KleidiAI's
  dst bit for bit -- and so does the export's kernel on KleidiAI's packed buffers -- or, for
  the names in ``BOUNDED``, stays within the bound derived there.

Shapes are hypothesis-drawn (fixed seed) and batched, one guest call per name and CPU.
docs/export.md ("Against KleidiAI") has the table of names and results.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import strategies as st

from tilegen.export import kleidiai as K
from tilegen.export.packers_c import PACK_DIR, PACKERS
from tilegen.layout.ggml import dequantize_q4_0, quantize_q4_0

from conftest import SME_ON, draw_examples, guest

SENT = -4242.25
FMAX = float(np.finfo(np.float32).max)
U32 = 2.0 ** -24            # binary32 unit roundoff
U16 = 2.0 ** -11            # binary16 unit roundoff

# -- where each name runs -------------------------------------------------------------------
#: guest configurations: name -> (cpu, sve_vl, sme_vl, env)
CONFIGS = {
    "n1": ("neoverse-n1", None, None, None),
    "v1": ("neoverse-v1", None, None, None),          # SVE 256
    "n2": ("neoverse-n2", None, None, None),          # SVE 128
    "max": ("max", None, None, None),                 # SVE 512
    "max-sve256": ("max", 256, None, None),
    **{f"sme{v}": ("max", None, v, SME_ON) for v in (128, 256, 512, 1024, 2048)},
}
DOTPROD = ("n1", "v1", "n2", "max")
I8MM = ("v1", "n2", "max")
# KleidiAI's SVE q4 kernels support SVE 256 only (their run asserts it; llama.cpp picks them only
# when svcntb() == 32)
SVE256 = ("v1", "max-sve256")
SME = tuple(c for c in CONFIGS if c.startswith("sme"))

_D32, _SB = "kai_lhs_quant_pack_qsi8d32p_f32", "kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
_D32N, _F16 = "kai_lhs_quant_pack_qsi8d32p_f32_neon", "kai_lhs_pack_f16pmrx2_f32_neon"
_QAI = "kai_lhs_quant_pack_qai8dxp_f32"
_BFL, _F32L = "kai_lhs_pack_bf16p2vlx2_f32_sme", "kai_lhs_pack_f32p2vlx1_f32_sme"
_Q4P = "kai_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0"
_Q4S = "kai_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
_Q8P = "kai_rhs_pack_nxk_qsi8cxp_qsi8cx_neon"
_BFR, _F32R = "kai_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", "kai_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"

#: LHS packers taking ``bl``; the ones that honour lhs_stride and m_idx_start (KleidiAI's
#: qsi8d32p_f32_neon and f16pmrx2 ignore both, its SME packers assert m_idx_start == 0); the
#: ones whose lhs pointer is row 0 of the matrix (not the first row packed) when m_idx_start > 0
BL_PACKERS = (_D32, _SB, _D32N, _F16)
STRIDED = (_QAI, _D32, _SB, _BFL, _F32L)
IDX_START = (_QAI, _D32, _SB)
ROW0_POINTER = (_D32, _SB)


@dataclass(frozen=True)
class Name:
    """One exported micro-kernel: how llama.cpp's kernels.cpp runs it (run arguments, its LHS
    and RHS packers), where it runs, and whether KleidiAI's run takes m == 1 only."""

    stem: str
    run: str                      # "bl", "packed" or "rows" (f32 LHS rows)
    lhs: str | None
    rhs: str
    rhs_kind: str                 # "q4", "q8", "kxn", "nxk"
    configs: tuple[str, ...]
    gemv: bool = False            # KleidiAI's run asserts m == 1

    @property
    def name(self) -> str:
        return "matmul_clamp_f32_" + self.stem


NAMES = (
    Name("qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod", "bl", _D32, _Q4P, "q4", DOTPROD),
    Name("qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", "bl", _D32, _Q4P, "q4", DOTPROD, gemv=True),
    Name("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", "bl", _D32, _Q4P, "q4", DOTPROD),
    Name("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", "bl", _SB, _Q4P, "q4", I8MM),
    Name("qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", "bl", _SB, _Q4P, "q4", SVE256),
    Name("qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod", "bl", _D32, _Q4P, "q4", SVE256, gemv=True),
    Name("qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", "bl", _D32N, _Q4S, "q4", SME, gemv=True),
    Name("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa", "bl", _F16, _Q4S, "q4", SME),
    Name("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", "packed", _QAI, _Q8P, "q8", SME),
    Name("qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot", "packed", _QAI, _Q8P, "q8", SME),
    Name("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa", "packed", _QAI, _Q8P, "q8", SME),
    Name("qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot", "packed", _QAI, _Q8P, "q8", SME),
    Name("qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod", "packed", _QAI, _Q8P, "q8", DOTPROD),
    Name("qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod", "packed", _QAI, _Q8P, "q8", DOTPROD),
    Name("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", "packed", _QAI, _Q8P, "q8", DOTPROD),
    Name("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", "packed", _QAI, _Q8P, "q8", I8MM),
    Name("bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", "packed", _BFL, _BFR, "kxn", SME),
    Name("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa", "packed", _F32L, _F32R, "nxk", SME),
    Name("f32_f32p2vlx1b_1x16vl_sme2_mla", "rows", None, _F32R, "nxk", SME, gemv=True),
    Name("f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa", "packed", _F32L, _F32R, "nxk", SME),
)
BY_STEM = {n.stem: n for n in NAMES}


# -- where the export differs from KleidiAI, and the bounds ------------------------------

def _fused_bias_bound(kai: np.ndarray, ctx: dict) -> np.ndarray:
    """KleidiAI's SME q8 gemv kernels add the bias fused (FMLA: r = fl(bias + s*f)); tilegen's
    SMOPA and SME2 gemv round the product first (fl(fl(s*f) + bias)).  With p = s*f exact and
    S = p + bias: |fl(p) - p| <= u|p| and each result is within u|S| of its exact sum, so
    |dst_tilegen - dst_kai| <= u|p| + 2u|S| + u^2|p| <= u(3|S| + |bias|)(1 + u); |S| <=
    |dst_kai| / (1 - u), and the clamp is 1-Lipschitz."""
    bias = ctx["bias"][None, :]
    return U32 * (3 * np.abs(kai) / (1 - U32) + np.abs(bias)) * (1 + U32) + 1e-45


def _f16_weights_bound(kai: np.ndarray, ctx: dict) -> np.ndarray:
    """KleidiAI's f16 gemm rounds every int4 x scale to f16 before FMOPA (w = fl16(q*d),
    |w - q*d| <= 2^-11 |q*d|, or 2^-25 in f16's subnormal range) and accumulates over all of k
    in f32; the export's generated C keeps q*d exact (f16 x int4 fits f32), sums each 32-block in
    f32 and adds fl(S_b * d_b) per block.  Both see the same f16 activations a (the same packed
    LHS), so with T = sum_k |a_k q_k d_k| and A = sum_k |a_k|:
    |dst_tilegen - dst_kai| <= 2^-11 T + 2^-25 A + 2(k + 2) u T (1 + 2^-11), u = 2^-24
    (each f32 sum of at most k + 2 terms is within (k + 2)u of its exact value)."""
    t, a, k = ctx["T"], ctx["A"], ctx["k"]
    return U16 * t + 2.0 ** -25 * a + 2 * (k + 2) * U32 * t * (1 + U16)


#: name -> (why the export's dst is not KleidiAI's bit for bit, the bound's function)
BOUNDED = {
    "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot": (
        "KleidiAI fuses the bias add (FMLA); tilegen's SME2 gemv rounds s*f first", _fused_bias_bound),
    "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot": (
        "the SMOPA tile behind the SME1 gemv name: not fused, and it reads the LHS at mr = 1vl",
        _fused_bias_bound),
    "f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa": (
        "generated portable C: q*d exact in f32, per-block f32 sums; KleidiAI rounds q*d to f16 "
        "and FMOPAs over all of k", _f16_weights_bound),
}
#: getters whose value is the export's by design, not KleidiAI's: name -> {getter: why}
GETTERS_DIFFER = {
    "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot": {
        "m_step": "no SME1 gemv in tilegen: the 1vlx4vl SMOPA tile reads the LHS packed at mr = 1vl",
        "mr": "as m_step",
        "lhs_offset": "the LHS row blocks of mr = 1vl rows",
    },
}


# -- KleidiAI's headers: the getters each name declares ------------------------------------

_PROTO = re.compile(r"^size_t\s+(kai_get_\w+)\s*\(([^)]*)\)\s*;", re.M)


def _protos(src: Path, header: str) -> list[tuple[str, list[str]]]:
    text = re.sub(r"//[^\n]*", "", (src / header).read_text())
    out = []
    for fn, params in _PROTO.findall(text):
        names = [p.split()[-1] for p in params.split(",") if p.strip() not in ("", "void")]
        out.append((fn, names))
    assert out, header
    return out


def _packer_header(p: str) -> str:
    return f"{PACK_DIR}/{p}.h"


def test_the_names_are_the_exports():
    """The tables here cover exactly the export's 20 micro-kernels and 12 packers, with the
    pairings of llama.cpp's kernels.cpp."""
    assert sorted(n.name for n in NAMES) == sorted(k.name for k in K.KERNELS)
    used = {n.lhs for n in NAMES if n.lhs} | {n.rhs for n in NAMES}
    assert used == set(PACKERS)
    assert set(BOUNDED) | set(GETTERS_DIFFER) <= set(BY_STEM)


def test_every_kleidiai_function_is_exported(kleidiai_ref, export_kai):
    """Every function KleidiAI's header of an exported name declares is defined by the export
    (the symbols of its shared object)."""
    from tilegen.build.toolchain import discover  # noqa: F401  (the fixture checked clang)
    import subprocess
    nm = next(p for p in ("llvm-nm-19", "llvm-nm") if __import__("shutil").which(p))
    syms = set(subprocess.run([nm, "-D", "--defined-only", str(export_kai["so"])],
                              capture_output=True, text=True, check=True).stdout.split())
    headers = [k.header for k in K.KERNELS] + [_packer_header(p) for p in PACKERS]
    declared = set()
    for h in headers:
        text = re.sub(r"//[^\n]*", "", (kleidiai_ref.source / h).read_text())
        declared |= set(re.findall(r"\b(kai_(?:get|run)_\w+)\s*\(", text))
    assert len(declared) > 250
    assert sorted(declared - syms) == []


# -- getters ------------------------------------------------------------------------------

_K_BY_KIND = {"q4": (32, 64, 96, 256, 4096), "q8": (1, 5, 31, 32, 33, 100, 4096),
              "kxn": (1, 2, 3, 17, 64, 101), "nxk": (1, 2, 3, 17, 64, 101)}
_GETTER_FN = {"lhs_offset": "lhs_packed_offset"}


def _kernel_header(name: Name) -> str:
    return next(k.header for k in K.KERNELS if k.name == name.name)


def _getter_calls(name: Name, src: Path, geo: dict, draws: list) -> list:
    """(function, args) for every getter declared by ``name``'s header and its packers'
    headers, at the drawn arguments: indices on the multiples KleidiAI's getters assume (the
    kernel's m_step / n_step; a packer's mr / nr), geometry arguments the kernel's (KleidiAI's
    getters), k as the format allows (q4: multiples of 32)."""
    ks = _K_BY_KIND[name.rhs_kind]
    owners = [(_kernel_header(name), None)] + [(_packer_header(p), p) for p in (name.lhs, name.rhs) if p]
    calls = []
    for header, owner in owners:
        if owner is None:
            # a gemv's only row is 0 (some of KleidiAI's assert m_idx == 0)
            m_mult, n_mult, tile = 0 if name.gemv else geo["m_step"], geo["n_step"], {}
        elif owner == name.lhs:
            m_mult, n_mult, tile = geo["mr"], 1, dict(mr=geo["mr"])
        else:
            m_mult, n_mult, tile = 1, geo["nr"], dict(nr=geo["nr"])
        for fn, params in _protos(src, header):
            for d in draws:
                k, pad = ks[d["k"] % len(ks)], 4 * d["pad"]
                vals = dict(m_idx=d["a"] * m_mult, n_idx=d["b"] * n_mult, k=k, bl=32, m=d["m"],
                            n=d["n"], kr=geo["kr"], sr=geo["sr"],
                            **{s: 4 * d["n"] + pad for s in ("dst_stride", "dst_stride_row")},
                            **{s: 4 * k + pad for s in ("lhs_stride", "lhs_stride_row",
                                                        "rhs_stride", "stride")}, **tile)
                calls.append((fn, [vals[p] for p in params]))
    return calls


def _names_on(config: str) -> list[Name]:
    return [n for n in NAMES if config in n.configs]


def _differs_by_design(fn: str) -> bool:
    return any(fn == f"kai_get_{_GETTER_FN.get(g, g)}_matmul_clamp_f32_{stem}"
               for stem, getters in GETTERS_DIFFER.items() for g in getters)


GETTER_DRAWS = st.fixed_dictionaries(dict(
    a=st.integers(0, 5), b=st.integers(0, 5), k=st.integers(0, 6), m=st.integers(1, 300),
    n=st.integers(1, 300), pad=st.integers(0, 9)))


@pytest.mark.parametrize("config", list(CONFIGS))
def test_getters_match_kleidiai(config, kleidiai_ref, export_kai):
    """Every getter of every name running on ``config`` (and of its LHS and RHS packers)
    returns KleidiAI's value at every drawn argument, at this CPU's vector lengths; the
    exceptions are GETTERS_DIFFER's, and those must differ (else the entry is stale)."""
    g = guest(*CONFIGS[config])
    paths = [str(kleidiai_ref.shared), str(export_kai["so"])]
    draws = draw_examples(GETTER_DRAWS, 12)
    wrong, by_design = [], set()
    for name in _names_on(config):
        geo = g.call("guest_kaidiff:geometry", paths[0], name.name, name.lhs)
        calls = _getter_calls(name, kleidiai_ref.source, geo, draws)
        for (fn, args), (want, got) in zip(calls, g.call("guest_kaidiff:getters", paths, calls)):
            if want == got:
                continue
            if _differs_by_design(fn):
                by_design.add(fn)
            else:
                wrong.append((fn, args, want, got))
    assert not wrong, f"{len(wrong)} getter values differ from KleidiAI's, e.g. {wrong[:6]}"
    expected = {f"kai_get_{_GETTER_FN.get(g, g)}_matmul_clamp_f32_{s}"
                for s, gs in GETTERS_DIFFER.items() if config in BY_STEM[s].configs for g in gs}
    assert by_design == expected
