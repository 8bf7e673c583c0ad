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
import shutil
import subprocess
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

#: LHS packers taking ``bl``; the ones that honour lhs_stride (KleidiAI's qsi8d32p_f32_neon and
#: f16pmrx2 ignore it; its 4x8sb reads the rows of a 4-row group k floats apart) and
#: m_idx_start (its SME packers assert m_idx_start == 0; its 4x8sb packs 4-row groups into whole
#: row blocks, so m_idx_start a multiple of mr); the ones whose lhs pointer is row 0 of the
#: matrix (not the first row packed) when m_idx_start > 0
BL_PACKERS = (_D32, _SB, _D32N, _F16)
STRIDED = (_QAI, _D32, _BFL, _F32L)
IDX_START = (_QAI, _D32, _SB)
IDX_START_ALIGNED = (_SB,)
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


#: name -> (why the export's dst is not KleidiAI's bit for bit, the bound's function)
BOUNDED = {
    "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot": (
        "KleidiAI fuses the bias add (FMLA); tilegen's SME2 gemv rounds s*f first", _fused_bias_bound),
    "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot": (
        "the SMOPA tile behind the SME1 gemv name: not fused, and it reads the LHS at mr = 1vl",
        _fused_bias_bound),
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
    pairings of llama.cpp's kernels.cpp (test_export_kleidiai.LLAMA_TABLE)."""
    from test_export_kleidiai import LLAMA_TABLE
    assert sorted(n.name for n in NAMES) == sorted(k.name for k in K.KERNELS)
    used = {n.lhs for n in NAMES if n.lhs} | {n.rhs for n in NAMES}
    assert used == set(PACKERS)
    assert set(BOUNDED) | set(GETTERS_DIFFER) <= set(BY_STEM)
    pairs = {(gemm, gemm_lhs, rhs) for _, gemm, gemm_lhs, _, _, rhs in LLAMA_TABLE}
    pairs |= {(gemv, gemv_lhs, rhs) for _, _, _, gemv, gemv_lhs, rhs in LLAMA_TABLE if gemv}
    assert {(n.stem, n.lhs and n.lhs[4:], n.rhs[4:]) for n in NAMES} == pairs


def test_docs_table_is_these_results():
    """docs/export.md's table ("Against KleidiAI") has a row per name, "bounded" exactly for
    BOUNDED and "differ by design" exactly for GETTERS_DIFFER."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    part = doc[doc.index("## Against KleidiAI"):doc.index("## Tests")]
    rows = dict(re.findall(r"^\| `(\w+)` \|(.*)$", part, re.M))
    assert sorted(rows) == sorted(BY_STEM)
    assert {s for s, r in rows.items() if "**bounded**" in r} == set(BOUNDED)
    assert {s for s, r in rows.items() if "differ by design" in r} == set(GETTERS_DIFFER)


def test_every_kleidiai_function_is_exported(kleidiai_ref, export_kai):
    """Every function KleidiAI's header of an exported name declares is defined by KleidiAI's
    shared object (its CMake built every micro-kernel and packer) and by the export's."""
    nm = next((p for p in ("llvm-nm-19", "llvm-nm") if shutil.which(p)), None)
    assert nm, "needs llvm-nm (scripts/setup.sh installs llvm-19)"
    headers = [k.header for k in K.KERNELS] + [_packer_header(p) for p in PACKERS]
    declared = set()
    for h in headers:
        text = re.sub(r"//[^\n]*", "", (kleidiai_ref.source / h).read_text())
        declared |= set(re.findall(r"\b(kai_(?:get|run)_\w+)\s*\(", text))
    assert len(declared) > 250
    for so in (kleidiai_ref.shared, export_kai["so"]):
        syms = set(subprocess.run([nm, "-D", "--defined-only", str(so)], capture_output=True,
                                  text=True, check=True).stdout.split())
        assert sorted(declared - syms) == [], so


def test_kleidiai_provisioning(kleidiai_ref, tmp_path, monkeypatch):
    """The reference build is keyed and checked: a tarball that is no known KleidiAI release
    is refused before anything is extracted; the cached build holds the static library, the
    shared object and its stamp, in a directory named by version and key."""
    from tilegen.emulate import provision
    assert kleidiai_ref.version == "1.24.0"
    assert kleidiai_ref.static.is_file() and kleidiai_ref.shared.is_file()
    assert (kleidiai_ref.static.parent / ".tilegen-complete").is_file()
    assert kleidiai_ref.static.parent.name.startswith("lib-1.24.0-")
    assert (kleidiai_ref.source / "kai" / "kai_common.h").is_file()
    fake = tmp_path / "kleidiai-v1.24.0.tar.gz"
    fake.write_bytes(b"not KleidiAI")
    monkeypatch.setenv("TILEGEN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(provision.ProvisionError, match="no KleidiAI release tilegen knows"):
        provision.ensure_kleidiai_source(fake)
    with pytest.raises(provision.ProvisionError, match="no KleidiAI tarball"):
        provision.ensure_kleidiai_library(tmp_path / "missing.tar.gz")
    assert not (tmp_path / "cache").exists()


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
        calls = [(fn, list(a)) for fn, a in dict.fromkeys(
            (fn, tuple(a)) for fn, a in _getter_calls(name, kleidiai_ref.source, geo, draws))]
        for (fn, args), (want, got) in zip(calls, g.call("guest_kaidiff:getters", paths, calls)):
            if want == got:
                continue
            if _differs_by_design(fn):
                by_design.add(fn)
            else:
                wrong.append((fn, args, want, got))
    assert not wrong, f"{len(wrong)} getter values differ from KleidiAI's, e.g. {wrong[:6]}"
    expected = {f"kai_get_{_GETTER_FN.get(x, x)}_matmul_clamp_f32_{s}"
                for s, xs in GETTERS_DIFFER.items() if config in BY_STEM[s].configs for x in xs}
    assert by_design == expected


# -- micro-kernels, as llama.cpp runs them ---------------------------------------------

FLOW_DRAWS = st.fixed_dictionaries(dict(
    mi=st.integers(0, 2), mo=st.sampled_from((-1, 0, 1, 3)), ni=st.integers(0, 3),
    no=st.sampled_from((-1, 0, 1, 5)), k=st.integers(1, 300), threads=st.integers(1, 4),
    m_parts=st.integers(1, 3), lpad=st.sampled_from((0, 1, 16)), dpad=st.sampled_from((0, 1, 9)),
    rpad=st.sampled_from((0, 3)), clamp=st.booleans(), bias=st.booleans(),
    seed=st.integers(0, 2 ** 16)))
FLOW_EXAMPLES = 8


def _k_for(kind: str, k: int) -> int:
    """q4 formats take whole 32-blocks; q8 any k (off 32 too); the float formats any k."""
    return 32 * (1 + k % 8) if kind == "q4" else (k if kind == "q8" else 1 + k % 160)


def _flow_case(name: Name, geo: dict, d: dict) -> tuple[dict, dict]:
    """One guest flow case from a draw, and the host's context for the bounds."""
    rng = np.random.default_rng(d["seed"])
    m = 1 if name.gemv else max(1, d["mi"] * geo["m_step"] + d["mo"])
    n = max(1, d["ni"] * geo["n_step"] + d["no"])
    k = _k_for(name.rhs_kind, d["k"])
    strided = name.lhs in STRIDED or name.lhs is None
    ldx = k + (d["lpad"] if strided else 0)
    x = rng.normal(size=(m, ldx)).astype(np.float32)
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    rhs = dict(packer=name.rhs, kind=name.rhs_kind)
    if name.rhs_kind == "q4":               # KleidiAI's q4 packers take no bias
        rhs["w"] = quantize_q4_0(w)
        wf, bias = dequantize_q4_0(rhs["w"], n, k), np.zeros(n, np.float32)
    elif name.rhs_kind == "q8":
        s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
        q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
        bias = bias if d["bias"] else np.zeros(n, np.float32)
        rhs.update(w=q, scale=s, bias=bias if d["bias"] else None)
        wf = q.astype(np.float64) * s[:, None]
    else:                                   # float rows of rhs_stride bytes; bias required
        ld = (n if name.rhs_kind == "kxn" else k) + d["rpad"]
        src = np.ascontiguousarray(w.T) if name.rhs_kind == "kxn" else w
        full = rng.normal(size=(src.shape[0], ld)).astype(np.float32)
        full[:, :src.shape[1]] = src
        rhs.update(w=full, stride=4 * ld, bias=bias)
        wf = w
    ref = x[:, :k].astype(np.float64) @ np.asarray(wf, np.float64).T + bias
    lo, hi = (np.quantile(ref, [0.3, 0.7]).astype(np.float32) if d["clamp"]
              else (np.float32(-FMAX), np.float32(FMAX)))
    case = dict(kernel=name.name, run=name.run, lhs=name.lhs and dict(packer=name.lhs,
                bl=name.lhs in BL_PACKERS), rhs=rhs, m=m, n=n, k=k, x=x, lhs_stride=4 * ldx,
                dst_stride=4 * (n + d["dpad"]), clamp=(float(lo), float(hi)), sentinel=SENT,
                threads=d["threads"], m_parts=d["m_parts"])
    a16 = np.abs(x[:, :k].astype(np.float16).astype(np.float64))
    ctx = dict(bias=bias, k=k, T=a16 @ np.abs(np.asarray(wf, np.float64)).T,
               A=a16.sum(axis=1, keepdims=True))
    return case, ctx


def _rows(buf: np.ndarray, c: dict) -> tuple[np.ndarray, np.ndarray]:
    """dst[m, n] from the guest's buffer, and the bytes between the rows."""
    ds, m, n = c["dst_stride"], c["m"], c["n"]
    full = np.zeros(m * ds, np.uint8)
    full[:buf.size] = buf
    rows = full.reshape(m, ds)
    return rows[:, :4 * n].copy().view(np.float32), rows[:-1, 4 * n:]


def _written(kai: list, exp: list, what: str) -> list[str]:
    """The export writes exactly the bytes KleidiAI's packer writes, with its values."""
    wk, we = kai[0] == kai[1], exp[0] == exp[1]
    if wk.size != we.size:
        return [f"{what}: {we.size} bytes, KleidiAI {wk.size}"]
    out = []
    if (wk != we).any():
        out.append(f"{what}: writes {int(np.sum(we & ~wk))} bytes KleidiAI leaves, leaves "
                   f"{int(np.sum(wk & ~we))} it writes (first at {int(np.argmax(wk != we))})")
    diff = wk & (kai[0] != exp[0])
    if diff.any():
        out.append(f"{what}: {int(diff.sum())} of {int(wk.sum())} written bytes differ (first at "
                   f"{int(np.argmax(diff))})")
    return out


def _compare_flow(name: Name, c: dict, ctx: dict, res: dict) -> list[str]:
    kai, exp = res["libs"]
    where = f"m={c['m']} n={c['n']} k={c['k']}"
    bad = []
    if name.stem not in GETTERS_DIFFER:
        if kai["geo"] != exp["geo"]:
            bad.append(f"geometry {exp['geo']}, KleidiAI {kai['geo']}")
        bad += _written(kai["rhs"], exp["rhs"], "packed RHS")
        if kai["lhs"] is not None:
            bad += _written(kai["lhs"], exp["lhs"], "packed LHS")
    else:
        bad += _written(kai["rhs"], exp["rhs"], "packed RHS")
    want, gap = _rows(kai["dst"], c)
    sent = np.frombuffer(np.float32(SENT).tobytes(), np.uint8)
    assert (gap.reshape(-1, 4) == sent).all() if gap.size else True, "KleidiAI wrote between rows"
    runs = [("dst", exp["dst"])] + ([("cross", res["cross"])] if "cross" in res else [])
    for what, buf in runs:
        got, g = _rows(buf, c)
        if g.size and not (g.reshape(-1, 4) == sent).all():
            bad.append(f"{what}: written between rows")
        if name.stem in BOUNDED:
            lim = BOUNDED[name.stem][1](want.astype(np.float64), ctx)
            err = np.abs(got.astype(np.float64) - want)
            if not (err <= lim).all():
                i = np.unravel_index(np.argmax(err - lim), err.shape)
                bad.append(f"{what}: |d| {err[i]:.3g} over the bound {lim[i]:.3g} at {i}")
        elif not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
            diff = got.view(np.uint32) != want.view(np.uint32)
            bad.append(f"{what}: {int(diff.sum())} of {diff.size} differ, max |d| "
                       f"{np.nanmax(np.abs(got - want)):.3g}")
    return [f"{where}: {b}" for b in bad]


_RUNS = [(n, c) for n in NAMES for c in n.configs]


@pytest.mark.parametrize("name,config", _RUNS, ids=[f"{n.stem}-{c}" for n, c in _RUNS])
def test_kernel_matches_kleidiai(name, config, kleidiai_ref, export_kai):
    """``name`` as llama.cpp runs it, with each library's own packers and getters: packed
    buffers, dst (and the export's kernel on KleidiAI's packed buffers) equal KleidiAI's, or
    within BOUNDED's bound."""
    g = guest(*CONFIGS[config])
    paths = [str(kleidiai_ref.shared), str(export_kai["so"])]
    geo = g.call("guest_kaidiff:geometry", paths[0], name.name, name.lhs)
    built = [_flow_case(name, geo, d) for d in draw_examples(FLOW_DRAWS, FLOW_EXAMPLES)]
    results = g.call("guest_kaidiff:flow", paths, [c for c, _ in built])
    bad = [b for (c, ctx), r in zip(built, results) for b in _compare_flow(name, c, ctx, r)]
    assert not bad, f"{name.stem} on {config}: " + "; ".join(bad[:6])


# -- packers, called directly ------------------------------------------------------------

PACK_DRAWS = st.fixed_dictionaries(dict(
    mi=st.integers(0, 3), mo=st.sampled_from((-1, 0, 1, 2)), start=st.integers(0, 9),
    k=st.integers(1, 300), pad=st.sampled_from((0, 1, 7)), bias=st.booleans(),
    seed=st.integers(0, 2 ** 16)))
PACK_EXAMPLES = 8
_P4_BYTES = np.array([1, 8], np.uint8)                         # lhs_zero_point 1, rhs_zero_point 8
_P8_BYTES = np.frombuffer(np.int32(1).tobytes() + np.float32(1).tobytes(), np.uint8)


def _lhs_call(p: str, geo: dict, d: dict, kind: str) -> tuple:
    """A direct call of LHS packer ``p`` at the kernel geometry ``geo``: m rows from row
    m_idx_start (where KleidiAI honours it), rows ``pad`` floats apart where it honours
    lhs_stride; the destination the whole packed size of m_idx_start + m rows, passed at
    get_lhs_packed_offset(m_idx_start) (KleidiAI's getters, evaluated in the guest)."""
    rng = np.random.default_rng(d["seed"])
    mr = geo["mr"]
    m = max(1, d["mi"] * mr + d["mo"])
    start = d["start"] if p in IDX_START else 0
    start -= start % mr if p in IDX_START_ALIGNED else 0
    k = _k_for(kind, d["k"])
    ld = k + (d["pad"] if p in STRIDED else 0)
    x = rng.normal(size=(start + m, ld)).astype(np.float32)
    bl = [32] if p in BL_PACKERS else []
    g3 = [mr, geo["kr"], geo["sr"]]
    size = (f"kai_get_lhs_packed_size_{p[4:]}", [start + m, k, *bl, *g3])
    off = (f"kai_get_lhs_packed_offset_{p[4:]}", [start, k, *bl, *g3])
    src = ("in", x, 0 if p in ROW0_POINTER else 4 * ld * start)
    args = [("u", m), ("u", k), *(("u", v) for v in bl + g3), ("u", start), src, ("u", 4 * ld),
            ("out",)]
    return (f"kai_run_{p[4:]}", args, size, off), f"m={m} k={k} m_idx_start={start} ld={ld}"


def _rhs_call(p: str, geo: dict, d: dict, kind: str) -> tuple:
    """A direct call of RHS packer ``p`` at ``geo``: n rows off the nr multiples, bias or none
    (where KleidiAI takes one), padded rows of the float formats."""
    rng = np.random.default_rng(d["seed"])
    nr, kr, sr = geo["nr"], geo["kr"], geo["sr"]
    n = max(1, d["mi"] * nr + d["mo"])
    k = _k_for(kind, d["k"])
    w = rng.normal(size=(n, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    head = [("u", 1), ("u", n), ("u", k), ("u", nr), ("u", kr), ("u", sr)]
    if kind == "q4":
        size = (f"kai_get_rhs_packed_size_{p[4:]}", [n, k, nr, kr, 32])
        args = [*head, ("u", 32), ("in", quantize_q4_0(w)), ("null",), ("out",), ("u", 0),
                ("in", _P4_BYTES)]
    elif kind == "q8":
        size = (f"kai_get_rhs_packed_size_{p[4:]}", [n, k, nr, kr, sr])
        s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
        q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
        args = [*head, ("in", q), ("in", bias) if d["bias"] else ("null",), ("in", s), ("out",),
                ("u", 0), ("in", _P8_BYTES)]
    else:
        size = (f"kai_get_rhs_packed_size_{p[4:]}", [n, k])
        src = np.ascontiguousarray(w.T) if kind == "kxn" else w
        full = rng.normal(size=(src.shape[0], src.shape[1] + d["pad"])).astype(np.float32)
        full[:, :src.shape[1]] = src
        args = [*head, ("u", full.strides[0]), ("in", full), ("in", bias), ("null",), ("out",),
                ("u", 0), ("null",)]
    return (f"kai_run_{p[4:]}", args, size, 0), f"n={n} k={k} nr={nr}"


def _packer_plan(config: str) -> list[tuple[str, Name]]:
    """(packer, a name that reads it) for every packer used on ``config``, at every distinct
    geometry its names give it."""
    seen, out = set(), []
    for n in _names_on(config):
        for p in (n.lhs, n.rhs):
            if p and (p, n.stem) not in seen:
                seen.add((p, n.stem))
                out.append((p, n))
    return out


@pytest.mark.parametrize("config", list(CONFIGS))
def test_packers_match_kleidiai(config, kleidiai_ref, export_kai):
    """Every packer used on ``config``, at the geometry of each name that reads it, called
    directly on drawn arguments (m_idx_start > 0, padded strides where KleidiAI honours them):
    the export writes exactly KleidiAI's bytes."""
    g = guest(*CONFIGS[config])
    paths = [str(kleidiai_ref.shared), str(export_kai["so"])]
    draws = draw_examples(PACK_DRAWS, PACK_EXAMPLES)
    calls, where = [], []
    for p, name in _packer_plan(config):
        geo = g.call("guest_kaidiff:geometry", paths[0], name.name, name.lhs)
        make = _lhs_call if p == name.lhs else _rhs_call
        for d in draws:
            call, what = make(p, geo, d, name.rhs_kind)
            calls.append(call)
            where.append(f"{p} ({name.stem} geometry) {what}")
    bad = []
    for w, (kai, exp) in zip(where, g.call("guest_kaidiff:packers", paths, calls)):
        bad += [f"{w}: {b}" for b in _written(kai, exp, "packed")]
    assert not bad, "; ".join(bad[:6])
