"""`tilegen export kleidiai`: the tree builds with CMake (aarch64 cross, target `kleidiai`),
defines every function llama.cpp's KleidiAI glue references (link test), its headers give the
exact C types kernels.cpp's templates need, and the run functions compute what tilegen's
references compute (under qemu, SME ones at SVL 512)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tilegen
from tilegen.export import kleidiai as K
from tilegen.layout import lhs_layout_for, rhs_layout_for
from tilegen.layout.api import pack_lhs, pack_rhs

from conftest import guest, vector_params

SENT = np.float32(-4242.25)
FMAX = 3.4028234663852886e38
SVL_BITS = 512


def _toolchain():
    """clang for aarch64 and cmake (scripts/setup.sh installs both): missing ones fail."""
    from tilegen.build.toolchain import discover
    tc = discover("elf")
    assert tc.kind == "clang", f"needs clang (scripts/setup.sh installs clang-19), found {tc.kind}"
    assert shutil.which("cmake"), "needs cmake (scripts/setup.sh installs it)"
    return tc


def _nm() -> str:
    nm = shutil.which("llvm-nm-19") or shutil.which("llvm-nm")
    assert nm, "needs llvm-nm (scripts/setup.sh installs llvm-19)"
    return nm


def _run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def built(export_kai):
    """The exported tree, configured and built by CMake; (root, libkleidiai.a, toolchain)."""
    e = export_kai
    return e["root"], e["lib"], e["tc"], e["manifest"]


def test_symbol_list_is_llama_cpps(llama_kai):
    """The committed list is the grep of the vendored llama.cpp glue."""
    syms = K.kai_symbols()
    assert len(syms) > 250 and syms == sorted(set(syms))
    text = (llama_kai / "kernels.cpp").read_text() + (llama_kai / "kleidiai.cpp").read_text()
    assert sorted(set(re.findall(r"kai_[a-zA-Z0-9_]*", text))) == syms


def test_every_matmul_function_defined(llama_kai):
    files = K.export_files()
    assert K.missing_symbols(files) == []
    matmul = [s for s in K.function_symbols() if "matmul_clamp" in s]
    assert len(matmul) == len({s for s in matmul}) >= 20 * 11 - 2
    assert not set(matmul) - K.defined_functions(files)
    # every name kernels.cpp includes as a header is a file of the tree
    paths = {Path(f.path).stem for f in files}
    for s in K.kai_symbols():
        if s.startswith("kai_matmul_clamp_") or s == "kai_common":
            assert s in paths, s
    inc = re.findall(r'#include "(kai/[^"]+)"', (llama_kai / "kernels.cpp").read_text())
    have = {f.path for f in files}
    assert len(inc) > 20 and [p for p in inc if p not in have and "/pack/" not in p] == []


def test_mapping_is_documented_and_layouts_agree():
    assert len(K.KERNELS) == 20 and len({k.name for k in K.KERNELS}) == 20
    for kk in K.KERNELS:
        spec = kk.kernel_spec
        lhs_tok, rhs_tok = kk.name.split("_")[3:5] if kk.abi != "f32_f32p" else ("f32", kk.name.split("_")[4])
        if kk.same_layouts:
            assert lhs_tok == spec.lhs_format, kk.name
            assert rhs_tok.replace("biasf32", "b").rstrip("b") == spec.rhs_format.rstrip("b"), kk.name
    doc = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    assert K.mapping_table() in doc, "docs/export.md: regenerate the table (K.mapping_table())"


def test_no_exported_name_is_portable_c():
    """Every name of the export (default, --tuned and --tuned-pairs of every preset with a
    tuned file) is a tilegen assembly kernel: a checked spec, a run function that calls its
    hidden symbol, its .S file in the tree, "asm" in the manifest; and no template for a
    generated C kernel is left."""
    import json
    from tilegen.build.tuned import tuned_targets
    from tilegen.generator.render import TEMPLATE_DIR
    assert sorted(p.name for p in (TEMPLATE_DIR / "export").glob("ukernel*.j2")) == [
        "ukernel.c.j2", "ukernel.h.j2"]
    runs = [("linux-aarch64-all", False)] + [(t, tu) for t in tuned_targets()
                                             for tu in (True, "pairs")]
    for target, tuned in runs:
        files = {f.path: f.text for f in K.export_files(target, tuned, include_packers=False)}
        man = json.loads(files[K.MANIFEST])
        assert [k["impl"] for k in man["kernels"]] == ["asm"] * len(K.KERNELS), (target, tuned)
        for kk in K.kernels_for(target, tuned):
            spec = kk.kernel_spec
            sym = f"tilegen_{spec.name}"
            assert re.search(rf"kai_run_{kk.name}\([^)]*\) \{{\n    {sym}\(", files[kk.source]), kk.name
            assert f"kai/ukernels/matmul/tilegen/{sym}.S" in files, (target, kk.name)


def test_cmake_builds_target_kleidiai(built):
    root, lib, tc, manifest = built
    nm = _nm()
    defined = set(_run([nm, "--defined-only", "-g", lib]).stdout.split())
    for kk in K.KERNELS:
        assert f"kai_run_{kk.name}" in defined
    # the tilegen kernels are hidden, not exported under their own names
    assert not any(s.startswith("matmul_clamp_") for s in defined)


def test_link_every_llama_symbol(built, tmp_path):
    """A C file that takes the address of every function llama.cpp references links against
    libkleidiai.a; no kai_ symbol stays undefined."""
    root, lib, tc, _ = built
    syms = K.function_symbols()
    src = tmp_path / "link_all.c"
    src.write_text("".join(f"extern void {s}(void);\n" for s in syms)
                   + "void* const kai_all[] = {\n" + "".join(f"    (void*){s},\n" for s in syms)
                   + "};\n")
    obj = tmp_path / "link_all.o"
    _run([*tc.assemble_cmd(src, obj, "-O1", "-ffreestanding")])
    so = tmp_path / "liblink.so"
    _run(tc.link_cmd([obj, lib], so))
    nm = _nm()
    undef = set(_run([nm, "-u", so]).stdout.split()) - {"U", "w"}
    kai_undef = sorted(s for s in undef if s.startswith("kai_"))
    assert kai_undef == []
    assert not [s for s in undef if s.startswith("tilegen_")]


_CPP = """#include <stddef.h>
#include <stdint.h>
{includes}
template <size_t (*F)(void)> struct G0 {{}};
template <size_t (*F)(size_t, size_t)> struct G2 {{}};
template <size_t (*F)(size_t, size_t, size_t)> struct G3 {{}};
template <void (*F)(size_t, size_t, size_t, size_t, const void*, const void*, float*, size_t, size_t,
                    float, float)> struct RunBl {{}};
template <void (*F)(size_t, size_t, size_t, const void*, const void*, void*, size_t, size_t, float,
                    float)> struct RunVoid {{}};
template <void (*F)(size_t, size_t, size_t, const void*, const void*, float*, size_t, size_t, float,
                    float)> struct RunFloat {{}};
template <void (*F)(size_t, size_t, size_t, const void*, size_t, const void*, void*, size_t, size_t,
                    float, float)> struct RunRows {{}};
{uses}
int use_common(void) {{
    struct kai_rhs_pack_qs4cxs1s0_param a; struct kai_rhs_pack_qsi8cx_params b;
    a.lhs_zero_point = 1; a.rhs_zero_point = 8; b.lhs_zero_point = 1; b.scale_multiplier = 1.0f;
    return (int)kai_roundup(5, 4) + (int)KAI_MIN(a.rhs_zero_point, 2) + (int)kai_cast_f32_f16(0x3c00)
           + (int)b.scale_multiplier;
}}
"""
_RUN_KIND = {"qsi8d32p_qsi4c32p": ("RunBl", "G3"), "f16p_qsi4c32p": ("RunBl", "G3"),
             "qai8dxp_qsi8cxp": ("RunFloat", "G2"), "bf16p_bf16p": ("RunVoid", "G2"),
             "f32p_f32p": ("RunVoid", "G2"), "f32_f32p": ("RunRows", "G2")}


def test_headers_have_llama_cpps_types(built, tmp_path):
    """kernels.cpp passes the functions as template arguments of exact function-pointer
    types: a C++ file doing the same with every ukernel header compiles."""
    root, lib, tc, _ = built
    uses, includes = [], ['#include "kai/kai_common.h"']
    for kk in K.KERNELS:
        includes.append(f'#include "{kk.header}"')
        run, off = _RUN_KIND[kk.abi]
        n = kk.name
        lhs = "get_lhs_offset" if kk.abi == "f32_f32p" else "get_lhs_packed_offset"
        uses += [f"template struct G0<kai_get_{g}_{n}>;" for g in
                 ("m_step", "n_step", "mr", "nr", "kr", "sr")]
        uses += [f"template struct {off}<kai_{lhs}_{n}>;",
                 f"template struct {off}<kai_get_rhs_packed_offset_{n}>;",
                 f"template struct G3<kai_get_dst_offset_{n}>;",
                 f"template struct G2<kai_get_dst_size_{n}>;",
                 f"template struct {run}<kai_run_{n}>;"]
    src = tmp_path / "types.cpp"
    src.write_text(_CPP.format(includes="\n".join(includes), uses="\n".join(uses)))
    _run([*tc.driver, *tc.target_flags, "-x", "c++", "-std=c++17", "-ffreestanding",
          "-fsyntax-only", "-Werror", f"-I{root}", src])


# -- numerics under qemu -----------------------------------------------------------------

@pytest.fixture(scope="module")
def kai_so(export_kai):
    return str(export_kai["so"])


def _cases(m_n_k, make):
    cases, refs = [], []
    for i, (m, n, k) in enumerate(m_n_k):
        lhs, rhs, ref_fn = make(m, n, k, i)
        cmin, cmax = -FMAX, FMAX
        if i % 2:
            free = ref_fn(-FMAX, FMAX)
            lo, hi = np.quantile(free, [0.25, 0.75])
            cmin, cmax = float(np.float32(lo)), float(np.float32(hi))
        cases.append(dict(m=m, n=n, k=k, bl=32, lhs=lhs, rhs=rhs, clamp_min=cmin,
                          clamp_max=cmax, sentinel=SENT))
        refs.append(ref_fn(cmin, cmax))
    return cases, refs


def _check(outs, cases, refs, what):
    for out, c, ref in zip(outs, cases, refs):
        m, n = c["m"], c["n"]
        assert (out[m:] == SENT).all() and (out[:, n:] == SENT).all(), (what, m, n)
        got = out[:m, :n]
        assert np.array_equal(got, ref), f"{what} m={m} n={n} k={c['k']}: {np.sum(got != ref)} differ"


def _stride(layout, k):
    from tilegen.layout.base import eval_expr
    return eval_expr(layout.stride_expr, k=k, bl=32)


def _getters_match(g, kk, kai_so, vl):
    """The getters at this VL are the spec's geometry and its layout objects' strides."""
    spec = kk.kernel_spec
    lhs = lhs_layout_for(spec, 32, vl if spec.vl_scaled else None)
    rhs = rhs_layout_for(spec, 32, vl if spec.vl_scaled else None)
    k, bl = 256, [32] if K.ABIS[kk.abi].rhs_params.endswith("size_t bl") else []
    lhs_args = [2 * lhs.mr, k] + bl if lhs is not None else [3, 1000]
    got = g.call("guest_kai:getters", kai_so, kk.name,
                 "get_lhs_offset" if lhs is None else "get_lhs_packed_offset", lhs_args,
                 [3 * rhs.nr, k] + bl)
    want = dict(m_step=spec.mr_at(vl), n_step=kk.n_step_tiles * spec.nr_at(vl), mr=lhs.mr if lhs else 1,
                nr=rhs.nr, kr=spec.kr, sr=spec.sr,
                lhs_offset=2 * _stride(lhs, k) if lhs is not None else 3000,
                rhs_offset=3 * _stride(rhs, k), dst_offset=3 * 100 + 8 * 4, dst_size=60)
    assert got == want, (kk.name, got, want)


def _by_name(stem):
    return next(k for k in K.KERNELS if k.name == "matmul_clamp_f32_" + stem)


def test_neon_q4_q8_run_functions(kai_so):
    """q4_0 (i8mm gemm, dotprod gemv) and q8_0 (i8mm gemm) through their KleidiAI names on
    KleidiAI-layout data from tilegen's packers: bit-exact with tilegen's references."""
    from tilegen.reference.q4 import matmul_qsi8d32p_qsi4c32pscalef16 as ref_q4
    from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp as ref_q8
    g = guest("max")
    rng = np.random.default_rng(14)
    for stem in ("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm",
                 "qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod",
                 "qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm",
                 "qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod",
                 "qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod",
                 "qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod"):
        kk = _by_name(stem)
        spec = kk.kernel_spec
        _getters_match(g, kk, kai_so, None)
        lhs_l = lhs_layout_for(spec)
        nr, kr, sr = spec.nr, spec.kr, spec.sr

        def make(m, n, k, i):
            x = rng.normal(size=(m, k)).astype(np.float32)
            w = rng.normal(size=(n, k)).astype(np.float32)
            lp = lhs_l.pack(x)
            rp = pack_rhs("qsi4c32pscalef16", w, nr=nr, kr=kr, sr=sr, bl=32)
            return lp, rp, lambda c0, c1: ref_q4(lp, rp, m, n, k, 32, lhs_l.mr, nr, kr, sr, c0, c1)
        shapes = [(1, 5, 32), (17, 9, 64), (4, nr, 96)] if spec.mr > 1 else [(1, 9, 64), (1, 33, 128)]
        cases, refs = _cases(shapes, make)
        _check(g.call("guest_kai:run", kai_so, kk.name, "bl", cases), cases, refs, stem)

    for stem in ("qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod",
                 "qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"):
        kk = _by_name(stem)
        spec = kk.kernel_spec
        _getters_match(g, kk, kai_so, None)
        mr, kr = lhs_layout_for(spec).mr, spec.kr

        def make8(m, n, k, i):
            x = rng.normal(size=(m, k)).astype(np.float32)
            w = rng.normal(size=(n, k)).astype(np.float32)
            lp = pack_lhs("qai8dxp", x, mr=mr, kr=kr, sr=1)
            rp = pack_rhs("qsi8cxp", w, nr=4, kr=kr)
            return lp, rp, lambda c0, c1: ref_q8(lp, rp, m, n, k, mr, 4, kr, 1, c0, c1)
        shapes = [(1, 3, 32), (18, 9, 64), (5, 4, 96)] if mr > 1 else [(1, 3, 32), (1, 13, 96)]
        cases, refs = _cases(shapes, make8)
        _check(g.call("guest_kai:run", kai_so, kk.name, "packed", cases), cases, refs, stem)


def test_sme_run_functions(kai_so):
    """SME/SME2 names at SVL 512 (getters read it with RDSVL): q8_0 SMOPA (also behind the
    SME1 gemv name), bf16 BFMOPA, f32 FMOPA (packed LHS) and the f32 SME2 gemv (LHS rows)."""
    from tilegen.reference.f32 import matmul_f32
    from tilegen.reference.bf16 import matmul_bf16
    from tilegen.reference.q8 import matmul_qai8dxp_qsi8cxp as ref_q8
    vl = SVL_BITS // 8
    g = guest("max", None, SVL_BITS)
    rng = np.random.default_rng(15)
    for stem in ("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa",
                 "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot",
                 "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot"):
        kk = _by_name(stem)
        spec = kk.kernel_spec
        _getters_match(g, kk, kai_so, vl)
        mr, nr = lhs_layout_for(spec, 32, vl).mr, spec.nr_at(vl)

        def make8(m, n, k, i):
            x = rng.normal(size=(m, k)).astype(np.float32)
            w = rng.normal(size=(n, k)).astype(np.float32)
            lp = pack_lhs("qai8dxp", x, mr=mr, kr=4, sr=1)
            rp = pack_rhs("qsi8cxp", w, nr=nr, kr=4)
            return lp, rp, lambda c0, c1: ref_q8(lp, rp, m, n, k, mr, nr, 4, 1, c0, c1)
        shapes = [(1, 7, 32), (1, nr + 3, 64)] + ([(mr + 2, 9, 96)] if mr > 1 else [])
        cases, refs = _cases(shapes, make8)
        _check(g.call("guest_kai:run", kai_so, kk.name, "packed", cases), cases, refs, stem)

    kk = _by_name("bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa")
    spec = kk.kernel_spec
    _getters_match(g, kk, kai_so, vl)
    ll, rl = lhs_layout_for(spec, 32, vl), rhs_layout_for(spec, 32, vl)

    def makeb(m, n, k, i):
        x = rng.normal(size=(m, k)).astype(np.float32)
        w = rng.normal(size=(n, k)).astype(np.float32)
        b = rng.normal(size=n).astype(np.float32)
        lp, rp = ll.pack(x), rl.pack(w, b)
        return lp, rp, lambda c0, c1: matmul_bf16(lp, rp, m, n, k, ll, rl, c0, c1)
    cases, refs = _cases([(1, 3, 5), (ll.mr + 3, rl.nr + 1, 17)], makeb)
    _check(g.call("guest_kai:run", kai_so, kk.name, "packed", cases), cases, refs, kk.name)

    for stem, kind in (("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa", "packed"),
                       ("f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa", "packed"),
                       ("f32_f32p2vlx1b_1x16vl_sme2_mla", "rows")):
        kk = _by_name(stem)
        spec = kk.kernel_spec
        _getters_match(g, kk, kai_so, vl)
        ll, rl = lhs_layout_for(spec, 32, vl), rhs_layout_for(spec, 32, vl)

        def makef(m, n, k, i):
            x = rng.normal(size=(m, k)).astype(np.float32)
            w = rng.normal(size=(n, k)).astype(np.float32)
            b = rng.normal(size=n).astype(np.float32)
            return (ll.pack(x) if ll is not None else x), rl.pack(w, bias=b), \
                lambda c0, c1: matmul_f32(x, w, b, c0, c1)
        shapes = [(1, 5, 3), (1, rl.nr + 7, 20)] + ([(ll.mr + 1, 9, 11)] if ll else [])
        cases, refs = _cases(shapes, makef)
        _check(g.call("guest_kai:run", kai_so, kk.name, kind, cases), cases, refs, stem)


@pytest.mark.parametrize("src", ["kernels.cpp", "kleidiai.cpp"])
def test_llama_cpp_glue_compiles(built, llama_kai, cross_sysroot, src):
    """llama.cpp's own kleidiai/kernels.cpp and kleidiai.cpp compile against the tree (the
    vendored sources and the aarch64 sysroot with libstdc++ headers come from provisioning)."""
    root, lib, tc, _ = built
    ggml = llama_kai.parents[2]
    _run([*tc.driver, *tc.target_flags, "-x", "c++", "-std=c++17", "-fsyntax-only",
          f"--sysroot={cross_sysroot}", "-DGGML_USE_CPU_KLEIDIAI", f"-I{ggml / 'include'}",
          f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", f"-I{root}", llama_kai / src])


def test_ps1s0_kernels(kai_so):
    """The two kernels of llama.cpp's SME2 Q4_0 entry on data from tilegen's numpy packers of
    those layouts (tilegen.layout.rhs_int4, .f16, .lhs_int8), at SVL 512: the gemv (tilegen's SME2 luti4 asm,
    qsi8d32p scale-tail LHS, RHS packed with the getters' sr = 2) bit-exact with the block
    formula, the f16 gemm (tilegen's SME2 FMOPA asm, q4_0_f16) bit-exact with the reference of
    KleidiAI's arithmetic (tilegen.reference.q4.matmul_f16p_qsi4c32ps1s0)."""
    from tilegen.layout.ggml import quantize_q4_0, split_q4_0
    from tilegen.layout.f16 import F16PLhs2
    from tilegen.layout.lhs_int8 import QSI8D32P, QSI8D32PScaleTail
    from tilegen.layout.rhs_int4 import QSI4C32PS1S0ScaleF16
    from tilegen.reference.f32 import fma_f32
    from tilegen.reference.q4 import _block_dots, matmul_f16p_qsi4c32ps1s0
    vl = SVL_BITS // 8
    g = guest("max", None, SVL_BITS)
    rng = np.random.default_rng(16)
    nr, mr = 4 * vl // 4, vl // 4
    rl = QSI4C32PS1S0ScaleF16(nr, 4, 2, 32)
    f16 = lambda bits: bits.view(np.float16).astype(np.float32)  # noqa: E731

    def weights(n, k):
        raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
        u, d = split_q4_0(raw, n, k)
        return rl.pack(raw, n, k), u.astype(np.int64) - 8, f16(d)

    kk = _by_name("qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot")
    got = g.call("guest_kai:getters", kai_so, kk.name, "get_lhs_packed_offset", [2, 256, 32],
                 [3 * nr, 256, 32])
    ll = QSI8D32PScaleTail(1, 4, 1, 32)
    assert got == dict(m_step=1, n_step=nr, mr=1, nr=nr, kr=4, sr=2,
                       lhs_offset=2 * ll.row_block_stride(256), rhs_offset=3 * rl.group_stride(256),
                       dst_offset=332, dst_size=60)

    def make_gemv(m, n, k, i):
        x = rng.normal(size=(m, k)).astype(np.float32)
        rp, v, dr = weights(n, k)
        q, dl = QSI8D32P(1, 4, 1, 32, "away").quantize_rows(x)
        S = _block_dots(q, v, k, 32)

        def ref(c0, c1):
            a = np.zeros((m, n), np.float32)
            for b in range(k // 32):
                a = fma_f32(S[:, :, b].astype(np.float32),
                            (dr[None, :, b] * f16(dl)[:, None, b]).astype(np.float32), a)
            return np.minimum(np.maximum(a, np.float32(c0)), np.float32(c1))
        return ll.pack(x), rp, ref
    cases, refs = _cases([(1, 5, 32), (1, nr + 9, 128), (1, 2 * nr, 64)], make_gemv)
    _check(g.call("guest_kai:run", kai_so, kk.name, "bl", cases), cases, refs, kk.name)

    kk = _by_name("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa")
    lf = F16PLhs2(mr, 4, 2)
    got = g.call("guest_kai:getters", kai_so, kk.name, "get_lhs_packed_offset", [2 * mr, 256, 32],
                 [3 * nr, 256, 32])
    assert got == dict(m_step=mr, n_step=nr, mr=mr, nr=nr, kr=4, sr=2,
                       lhs_offset=2 * lf.row_block_stride(256), rhs_offset=3 * rl.group_stride(256),
                       dst_offset=332, dst_size=60)

    def make_gemm(m, n, k, i):
        lp, rp = lf.pack(rng.normal(size=(m, k)).astype(np.float32)), weights(n, k)[0]
        return lp, rp, lambda c0, c1: matmul_f16p_qsi4c32ps1s0(lp, rp, m, n, k, 32, mr, nr, c0, c1)
    cases, refs = _cases([(1, 3, 32), (mr + 3, nr + 5, 64), (2, 7, 96)], make_gemm)
    _check(g.call("guest_kai:run", kai_so, kk.name, "bl", cases), cases, refs, kk.name)


def test_tuned_replaces_only_same_layouts(tmp_path, monkeypatch):
    """--tuned: a tuned tile stands behind a KleidiAI name only when it reads the same packed
    LHS and RHS as the default, in the same gemm/gemv role; its getters describe it."""
    import json
    tdir = tmp_path / "tuned"
    tdir.mkdir()
    fam = lambda gemm, gemv: {"gemm": gemm, "gemv": gemv, "shared_rhs": True, "scores": {}}  # noqa: E731
    (tdir / "neoverse-n2.json").write_text(json.dumps({
        "tilegen_tuned": 1, "target": "neoverse-n2", "model": "neoverse-n2",
        "families": {"q4_0": fam("q4_0:dotprod:12x4", "q4_0:dotprod:1x12:k16:s2"),
                     "q8_0": fam("q8_0:i8mm:12x4", None)}}))
    monkeypatch.setenv("TILEGEN_TUNED_DIR", str(tdir))
    over = K.tuned_overrides("neoverse-n2")
    assert over == {"matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod": "q4_0:dotprod:12x4",
                    "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm": "q8_0:i8mm:12x4"}
    files = {f.path: f.text for f in K.export_files("neoverse-n2", tuned=True)}
    kk = _by_name("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod")
    src = files[kk.source]
    assert "tilegen_matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_12x4_neon_dotprod(" in src
    assert re.search(r"kai_get_m_step_\w+\(void\) \{\n    return 12;", src)
    assert "kai/ukernels/matmul/tilegen/tilegen_matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_12x4_neon_dotprod.S" in files
    man = json.loads(files[K.MANIFEST])
    assert sum(k["note"].startswith("tuned") for k in man["kernels"]) == 2
    assert K.missing_symbols([K.ExportFile(p, t) for p, t in files.items()]) == []


def test_cli_export(tmp_path, capsys):
    from tilegen.cli import main
    assert main(["export", "kleidiai", "--target", "neoverse-v2", "-o", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "262 of 262" in out and "kai_run_matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm: q4_0:i8mm:16x4 (asm)" in out
    assert (tmp_path / "t" / "CMakeLists.txt").is_file()
    assert (tmp_path / "t" / "kai" / "kai_common.h").is_file()
    assert main(["export", "kleidiai", "--target", "nonesuch", "-o", str(tmp_path / "u")]) == 2
    capsys.readouterr()
    # the patch alone: the one the tree carries, for the same preset and --tuned
    assert main(["export", "llama-patch", "--target", "neoverse-v2", "--tuned", "-o",
                 str(tmp_path / "v2.patch")]) == 0
    out = capsys.readouterr().out
    assert "q6_K i8mm: q6_K:i8mm:32x4 + q6_K:i8mm:1x4  [tuned]" in out
    assert (tmp_path / "v2.patch").read_text() == K.llama_patch("neoverse-v2", True)
    assert main(["export", "kleidiai", "--target", "neoverse-v2", "--tuned", "-o", str(tmp_path / "tv")]) == 0
    assert "kai_run_matmul_clamp_f32_q8kp4x8_q6kp4x8_32x4_neon_i8mm: q6_K:i8mm:32x4 (asm)  [K-quant, " \
        "llama-kquants.patch, tuned]" in capsys.readouterr().out
    assert (tmp_path / "tv" / K.LLAMA_PATCH).read_text() == (tmp_path / "v2.patch").read_text()
    assert main(["export", "llama-patch", "-o", str(tmp_path / "d.patch")]) == 0
    assert (tmp_path / "d.patch").read_text() == FIXTURE_PATCH.read_text()
    assert main(["export", "llama-patch", "-o", str(tmp_path / "no" / "such" / "x.patch")]) == 2
    assert "cannot write" in capsys.readouterr().err


# llama.cpp's kernels.cpp tables: (gemm, gemm LHS packer, gemv, gemv LHS packer, RHS packer,
# RHS kind); the RHS is packed once at the gemm's nr/kr/sr and read by both.
_Q4P, _Q4S = "rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0", "rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
_Q8P, _QAI = "rhs_pack_nxk_qsi8cxp_qsi8cx_neon", "lhs_quant_pack_qai8dxp_f32"
_D32, _SB = "lhs_quant_pack_qsi8d32p_f32", "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
LLAMA_TABLE = [
    ("q4", "f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa", "lhs_pack_f16pmrx2_f32_neon",
     "qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot", "lhs_quant_pack_qsi8d32p_f32_neon", _Q4S),
    ("q4", "qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", _SB, "qsi8d32p1x8_qsi4c32p8x8_1x8_sve_dotprod", _D32, _Q4P),
    ("q4", "qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", _SB, "qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod", _D32, _Q4P),
    ("q4", "qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", _D32, "qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", _D32, _Q4P),
    ("q8", "qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", _QAI, "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot", _QAI, _Q8P),
    ("q8", "qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa", _QAI, "qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot", _QAI, _Q8P),
    ("q8", "qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm", _QAI, "qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod", _QAI, _Q8P),
    ("q8", "qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", _QAI, "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod", _QAI, _Q8P),
    ("bf16", "bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", "lhs_pack_bf16p2vlx2_f32_sme", None, None,
     "rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme"),
    ("f32", "f32p2vlx1_f32p2vlx1biasf32_sme2_mopa", "lhs_pack_f32p2vlx1_f32_sme",
     "f32_f32p2vlx1b_1x16vl_sme2_mla", None, "rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"),
    ("f32", "f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa", "lhs_pack_f32p2vlx1_f32_sme", None, None,
     "rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"),
]
_KIND = {"qsi8d32p_qsi4c32p": "bl", "f16p_qsi4c32p": "bl", "qai8dxp_qsi8cxp": "packed",
         "bf16p_bf16p": "packed", "f32p_f32p": "packed", "f32_f32p": "rows"}


def _table_weights(fam: str, w: np.ndarray):
    """The weights a kernels.cpp table entry of family ``fam`` packs, from float ``w`` (n, k):
    (what guest_kai:llama_flow packs, the float weights they stand for, its RHS kind, the
    relative tolerance of the product)."""
    from tilegen.layout.ggml import dequantize_q4_0, quantize_q4_0
    n, k = w.shape
    if fam == "q4":
        raw = quantize_q4_0(w)
        return dict(raw=raw, n=n), dequantize_q4_0(raw, n, k), "q4", 0.02
    if fam == "q8":
        s = (np.abs(w).max(axis=1) / 127).astype(np.float32)
        q = np.clip(np.rint(w / s[:, None]), -127, 127).astype(np.int8)
        return dict(q=q, scale=s), q.astype(np.float32) * s[:, None], "q8", 0.02
    return (dict(w=w), w, "kxn" if fam == "bf16" else "nxk", 0.01 if fam == "bf16" else 1e-5)


@pytest.mark.parametrize("entry", LLAMA_TABLE, ids=lambda e: e[1])
def test_llama_table_entry_end_to_end(kai_so, entry):
    """One kernels.cpp table entry as kleidiai.cpp drives it, with the exported packers and
    kernels (geometry only from the getters): gemm (m = 7) and gemv (m = 1) within the
    quantisation error of the float product.  n = 37, and for the SME names also 53, whose
    last column group (2 x 16 columns at SVL 512) has its second vector partly filled
    (#30 item 8)."""
    fam, gemm, gemm_lhs, gemv, gemv_lhs, rhs_packer = entry
    g = guest("max", None, SVL_BITS)
    rng = np.random.default_rng(17)
    k = 128
    for n in ((37, 53) if "_sme" in gemm else (37,)):
        w = rng.normal(size=(n, k)).astype(np.float32)
        wdat, wref, rkind, tol = _table_weights(fam, w)
        byname = {kk.name: kk for kk in K.KERNELS}
        for kern, lhs_packer, m in ((gemm, gemm_lhs, 7), (gemv, gemv_lhs, 1)):
            if kern is None:
                continue
            name = "matmul_clamp_f32_" + kern
            x = rng.normal(size=(m, k)).astype(np.float32)
            got = g.call("guest_kai:llama_flow", kai_so, name, _KIND[byname[name].abi],
                         "matmul_clamp_f32_" + gemm, lhs_packer and "" + lhs_packer,
                         bool(lhs_packer) and byname[name].abi in ("qsi8d32p_qsi4c32p", "f16p_qsi4c32p"),
                         rhs_packer, rkind, x, wdat)
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            err = np.abs(got - ref).max() / np.abs(ref).max()
            assert err < tol, f"{kern} m={m}: relative error {err}"


def test_tuned_pairs_end_to_end(tmp_path_factory):
    """--tuned-pairs for a preset whose tuned q4_0 pair has nr 8 and q8_0 pair nr 20: the
    replaced table entries still compute the product (RHS packed at the tuned gemm's nr, read
    by the tuned gemv; each entry with its family's weights: the q8_0 entries once got q4_0
    blocks and crashed); its tuned K-quant entries are bit-exact (_kquant_entry_bit_exact)."""
    over = K.tuned_pair_overrides("neoverse-v2")
    entries = [e for e in LLAMA_TABLE if "matmul_clamp_f32_" + e[1] in over]
    assert entries, "the committed neoverse-v2 tuned file pairs no kernels.cpp entry: pick a preset that does"
    tc = _toolchain()
    base = tmp_path_factory.mktemp("kaituned")
    man = K.write_tree(base / "tree", target="neoverse-v2", tuned="pairs")
    assert man["missing"] == []
    (base / "aarch64.cmake").write_text(K.cmake_toolchain(cc=tc.driver[0]))
    _run(["cmake", "-S", base / "tree", "-B", base / "build", "-DCMAKE_BUILD_TYPE=Release",
          *(["-G", "Ninja"] if shutil.which("ninja") else []),
          f"-DCMAKE_TOOLCHAIN_FILE={base / 'aarch64.cmake'}"])
    _run(["cmake", "--build", base / "build", "-j", "2"])
    so = base / "libkai_tuned.so"
    _run(tc.link_cmd(["-Wl,--whole-archive", base / "build" / "libkleidiai.a",
                      "-Wl,--no-whole-archive"], so))
    assert {e[0] for e in entries} == {"q4", "q8"}
    g = guest("max")
    rng = np.random.default_rng(18)
    n, k = 29, 96
    byname = {kk.name: kk for kk in K.KERNELS}
    for fam, gemm, gemm_lhs, gemv, gemv_lhs, rhs_packer in entries:
        wdat, wref, rkind, tol = _table_weights(fam, rng.normal(size=(n, k)).astype(np.float32))
        got_nr = g.call("guest_kai:getters", str(so), "matmul_clamp_f32_" + gemm,
                        "get_lhs_packed_offset", [0, k, 32], [0, k, 32])["nr"]
        assert got_nr == parse_nr(over["matmul_clamp_f32_" + gemm])
        for kern, lhs_packer, m in ((gemm, gemm_lhs, 9), (gemv, gemv_lhs, 1)):
            name = "matmul_clamp_f32_" + kern
            x = rng.normal(size=(m, k)).astype(np.float32)
            got = g.call("guest_kai:llama_flow", str(so), name, _KIND[byname[name].abi],
                         "matmul_clamp_f32_" + gemm, lhs_packer,
                         byname[name].abi in ("qsi8d32p_qsi4c32p", "f16p_qsi4c32p"), rhs_packer,
                         rkind, x, wdat)
            ref = x.astype(np.float64) @ wref.astype(np.float64).T
            assert np.abs(got - ref).max() / np.abs(ref).max() < tol, (kern, m)
    # the tree's K-quant entries with tuned tiles (q6_K i8mm 32x4 on neoverse-v2), as its
    # llama-kquants.patch wires them: getters, C packers and run functions bit-exact
    kq = [e for e, d in zip(K.kquant_entries("neoverse-v2", "pairs"), K.KQUANT_DEFAULT) if e != d]
    assert kq, "the committed neoverse-v2 tuned file changes no K-quant entry: pick a preset that does"
    for e in kq:
        _kquant_entry_bit_exact(guest("max", None, SVL_BITS), str(so), e.gemm, e.gemv, 26)


def parse_nr(spec: str) -> int:
    return tilegen.parse_spec(spec).nr


@pytest.mark.parametrize("gemm,lhs_packer,m,rounding", [
    ("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", _D32, 7, "away"),
    ("qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", _D32, 1, "away"),
    ("qsi8d32p4x8_qsi4c32p8x8_16x8_sve_i8mm", _SB, 7, "even"),
    ("qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm", _SB, 9, "even")])
def test_llama_flow_q4_bit_exact(kai_so, gemm, lhs_packer, m, rounding):
    """The exported C packers + kernel of a q4_0 entry (as kleidiai.cpp calls them) give the
    bytes of tilegen's numpy pipeline: dst equals the reference bit for bit."""
    from tilegen.layout.ggml import quantize_q4_0
    from tilegen.layout.lhs_int8 import QSI8D32P
    from tilegen.reference.q4 import matmul_qsi8d32p_qsi4c32pscalef16 as ref_q4
    rng = np.random.default_rng(19)
    n, k = 37, 256
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
    name = "matmul_clamp_f32_" + gemm
    spec = _by_name(gemm).kernel_spec
    x = rng.normal(size=(m, k)).astype(np.float32)
    got = guest("max").call("guest_kai:llama_flow", kai_so, name, "bl", name, lhs_packer, True,
                            _Q4P, "q4", x, dict(raw=raw, n=n))
    ll = lhs_layout_for(spec)
    lp = QSI8D32P(ll.mr, ll.kr, ll.sr, 32, rounding).pack(x)
    rp = pack_rhs("qsi4c32pscalef16", ggml=raw, n=n, k=k, nr=spec.nr, kr=spec.kr, sr=spec.sr, bl=32)
    want = ref_q4(lp, rp, m, n, k, 32, ll.mr, spec.nr, spec.kr, spec.sr, -FMAX, FMAX)
    assert np.array_equal(got, want), np.abs(got - want).max()


def _kai_stem(p: Path) -> str:
    return re.sub(r"_m\d+_n\d+_k\d+(_bl\d+)?$", "", p.stem)


def _kai_vectors():
    names = {k.name for k in K.KERNELS}
    return vector_params("matmul_clamp_f32_*.npz", keep=lambda p: _kai_stem(p) in names)


@pytest.mark.parametrize("path", _kai_vectors(), ids=lambda p: p.stem)
def test_reproduces_kleidiai_vectors(kai_so, path):
    """KleidiAI's own packed buffers through the exported name: KleidiAI's dst bit for bit, and
    the getters' mr/nr/kr/sr are KleidiAI's."""
    z = np.load(path)
    name = _kai_stem(path)
    kk = next(k for k in K.KERNELS if k.name == name)
    m, n, k = int(z["m"]), int(z["n"]), int(z["k"])
    g = guest("max")
    got = g.call("guest_kai:getters", kai_so, name, "get_lhs_packed_offset", [0, k, 32], [0, k, 32])
    assert [got[x] for x in ("mr", "nr", "kr", "sr")] == [int(z[x]) for x in ("mr", "nr", "kr", "sr")]
    case = dict(m=m, n=n, k=k, bl=int(z["bl"]), lhs=z["lhs_packed"], rhs=z["rhs_packed"],
                clamp_min=float(z["clamp_min"]), clamp_max=float(z["clamp_max"]), sentinel=SENT)
    out = g.call("guest_kai:run", kai_so, name, _KIND[kk.abi], [case])[0]
    assert np.array_equal(out[:m, :n].view(np.uint32), z["dst"].view(np.uint32))


@pytest.mark.parametrize("target", ["cortex-a53", "a64fx", "linux-aarch64-all"])
@pytest.mark.parametrize("flag", ["--tuned", "--tuned-pairs"])
def test_tuned_export_needs_a_tuned_file(target, flag, tmp_path, capsys):
    """--tuned on a target without a tuned file used to write the default tree labelled
    "tuned": true; it is refused, naming the targets that have one."""
    import json
    from tilegen.build.tuned import tuned_targets
    from tilegen.cli import main
    have = tuned_targets()
    assert "neoverse-v2" in have and target not in have
    assert main(["export", "kleidiai", "--target", target, flag, "-o", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tilegen export: error: --tuned/--tuned-pairs: target {target} has no "
                          f"tuned file") and f"targets with one: {', '.join(have)} " in err, err
    assert not (tmp_path / "t").exists()
    for tuned in (True, "pairs"):
        with pytest.raises(K.ExportError, match=f"target {target} has no tuned file"):
            K.export_files(target, tuned=tuned)
    # a target with a tuned file exports "tuned": true
    man = json.loads({f.path: f.text for f in K.export_files("neoverse-v2", tuned=True)}[K.MANIFEST])
    assert man["tuned"] is True and any(k["note"].startswith("tuned") for k in man["kernels"])


# --------------------------------------------------------------------------------------------
# K-quants: tilegen's own micro-kernels and packers, which llama-kquants.patch wires into
# llama.cpp's KleidiAI backend

def _kq_packer(gemm_kk) -> tuple[str, str]:
    """(weight kind, RHS packer without "kai_") of a K-quant gemm: its family and the family's
    C packer of its RHS format (the registry's, through packers_c.KQUANT_PACKER_FOR)."""
    from tilegen.export.packers_c import KQUANT_PACKER_FOR
    from tilegen.families import FAMILIES
    fam = gemm_kk.kernel_spec.family
    return fam, KQUANT_PACKER_FOR[FAMILIES[fam].rhs][len("kai_"):]


def _kquant_entry_bit_exact(g, so, gemm_kk, gemv_kk, seed: int):
    """One tilegen-family table entry as kleidiai.cpp drives it (geometry from the getters, checked
    first; RHS from ggml blocks by the exported C repack at the gemm's nr/kr, LHS by the C q8kp
    quantiser at each kernel's mr/kr): gemm (m = 13, 2 VL + 1) and gemv (m = 1) equal
    tilegen.reference.kquant's arithmetic computed from the activations and the ggml blocks
    (``matmul_blocks``: no packed bytes), bit for bit.  n leaves the last column group of nr
    partly filled, and twice its second half: for the SME2 gemm's 2-VL groups, the second
    vector partly filled (#30 item 8)."""
    from tilegen.families import rhs_layout_class
    kind, packer = _kq_packer(gemm_kk)
    le = K.llama_entry(K.KQuantEntry(kind, gemm_kk.kernel_spec.isa, gemm_kk, gemv_kk))
    vl = SVL_BITS // 8
    rng = np.random.default_rng(seed)
    gspec = gemm_kk.kernel_spec
    rlay = rhs_layout_for(gspec, 32, vl if gspec.vl_scaled else None)
    nr = rlay.nr
    halves = (nr + nr // 2 + max(1, nr // 8), nr // 2 + max(1, nr // 4))
    assert all(nr // 2 < n % nr < nr for n in halves), (nr, halves)
    for n, k in ((37, 512), (8, 256), (2 * nr + 3, 256), (halves[0], 256), (halves[1], 512)):
        raw = rhs_layout_class(kind).random_ggml(n, k, int(rng.integers(1 << 30)))
        for kk, m in ((gemm_kk, 13), (gemv_kk, 1), (gemm_kk, 2 * vl + 1)):
            spec = kk.kernel_spec
            _getters_match(g, kk, so, vl if spec.vl_scaled else None)
            x = (rng.normal(size=(m, k)) * rng.uniform(0.1, 10.0, size=(m, 1))).astype(np.float32)
            got = g.call("guest_kai:llama_flow", so, kk.name, "bl" if le.kernel_bl else "packed",
                         gemm_kk.name, le.lhs_packer, le.kernel_bl, packer, "kq", x,
                         dict(raw=raw, n=n))
            want = _entry_reference(kind, spec, rlay, x, raw, n, vl if spec.vl_scaled else None)
            assert np.array_equal(np.asarray(got, np.float32).view(np.uint32),
                                  want.astype(np.float32).view(np.uint32)), (kk.name, m, n, k)


def _entry_reference(family: str, spec, rlay, x, raw, n, vl: int | None = None):
    """dst of a table entry's kernel ``spec`` from the activations and the ggml blocks: a
    K-quant family (q8kp activations) by tilegen.reference.kquant.matmul_blocks (no packed
    bytes); a block-32 family (qsi8d32p, KleidiAI's generic quantiser: rounding away) by its
    plugin's ``matmul_<lhs>_<rhs>`` on the layouts' packed bytes (RHS as the gemm packs it; ``vl``:
    the vector length in bytes a VL-scaled kernel's LHS layout is taken at)."""
    from tilegen.families import FAMILIES, plugin, rhs_layout_class
    from tilegen.layout.lhs_int8 import QSI8D32P
    from tilegen.reference.kquant import matmul_blocks
    rec = FAMILIES[family]
    if rec.lhs == "q8kp":
        return matmul_blocks(rhs_layout_class(family), x, raw, n)
    assert rec.lhs == "qsi8d32p", rec
    m, k = x.shape
    ll = lhs_layout_for(spec, 32, vl)
    lp = QSI8D32P(ll.mr, ll.kr, ll.sr, 32, "away").pack(x)
    ref = getattr(plugin(family), f"matmul_{rec.lhs}_{rec.rhs}")
    return ref(lp, rlay.pack_from_ggml(raw, n, k), m, n, k, 32, ll.mr, rlay.nr, rlay.kr, rlay.sr,
               -FMAX, FMAX)


@pytest.mark.parametrize("entry", K.KQUANT_DEFAULT, ids=lambda e: e.gemm.name)
def test_kquant_entry_end_to_end_bit_exact(kai_so, entry):
    """Each tilegen-family entry (K-quants, IQ4_NL, MXFP4) of the default export's patched
    kernels.cpp (_kquant_entry_bit_exact)."""
    _kquant_entry_bit_exact(guest("max", None, SVL_BITS), kai_so, entry.gemm, entry.gemv, 25)


def test_kquant_patch_is_defined_and_touches_only_the_backend():
    """Every kai_ function the tree's llama-kquants.patch adds a call to is defined by the tree
    (the K-quant ukernels and packers), every K-quant ukernel is in the patch's tables, and the
    patch touches only ggml/src/ggml-cpu/kleidiai/ (default and tuned exports)."""
    for target, tuned in _KQ_EXPORTS:
        files = K.export_files(target, tuned)
        text = {f.path: f.text for f in files}[K.LLAMA_PATCH]
        syms = K.kquant_symbols(text)
        assert syms and not set(syms) - K.defined_functions(files), (target, tuned)
        assert K.missing_symbols(files) == [], (target, tuned)
        for e in K.kquant_entries(target, tuned):
            for kk in (e.gemm, e.gemv):
                assert f"kai_run_{kk.name}>" in text, kk.name
        touched = re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M)
        assert touched and all(t.startswith("ggml/src/ggml-cpu/kleidiai/") for t in touched), touched


# --------------------------------------------------------------------------------------------
# llama-kquants.patch is generated (tilegen.export.llama): today's tile set gives the committed
# hand-written patch (tests/data), its table is checked entry by entry, it applies to the
# vendored llama.cpp, and --tuned tiles reach the kernel names, getters and table

FIXTURE_PATCH = Path(__file__).resolve().parent / "data" / "llama-kquants.patch"
#: the exports whose patches are checked: the default and every tuned preset
_KQ_EXPORTS = [("linux-aarch64-all", False)] + [
    (t, True) for t in ("neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2")]


def test_generated_patch_is_the_committed_one():
    """The default export's generated patch is the hand-written one byte for byte (and the
    package no longer carries a copy of it)."""
    want = FIXTURE_PATCH.read_text()
    assert K.llama_patch() == want
    tree = {f.path: f.text for f in K.export_files("linux-aarch64-all")}
    assert tree[K.LLAMA_PATCH] == want
    assert {f.path: f.text for f in K.export_files("apple-m4")}[K.LLAMA_PATCH] == want
    assert not (Path(K.__file__).parent / "llama-kquants.patch").exists()


def _c_init(s: str, i: int) -> tuple[list, int]:
    """The brace initialiser at s[i] == "{" as nested lists of its items (strings)."""
    assert s[i] == "{", s[i:i + 40]
    out, tok, i = [], "", i + 1
    while s[i] != "}":
        if s[i] == "{":
            sub, i = _c_init(s, i)
            out.append(sub)
        elif s[i] == ",":
            out += [tok.strip()] if tok.strip() else []
            tok, i = "", i + 1
        else:
            tok, i = tok + s[i], i + 1
    return out + ([tok.strip()] if tok.strip() else []), i + 1


def kquant_table(patch: str) -> list[list]:
    """The entries of gemm_gemv_kernels_kquant[] as the patched kernels.cpp has them (its added
    lines, comments removed): per entry, in ggml_kleidiai_kernels' field order, the gemm's
    function list, the gemm LHS info, the gemv's, the gemv LHS info, the RHS info, then
    required_cpu, lhs_type, rhs_type, op_type."""
    added = "\n".join(l[1:] for l in patch.splitlines() if l.startswith("+") and not l.startswith("+++"))
    src = re.sub(r"/\*.*?\*/", "", added, flags=re.S)
    at = re.search(r"gemm_gemv_kernels_kquant\[\]\s*=\s*", src)
    assert at, "the patch has no gemm_gemv_kernels_kquant[] table"
    table, _ = _c_init(src, at.end())
    assert table and table[-1] == [], "the table ends with its sentinel"
    return table[:-1]


#: ggml's CPU features (kernels.h's cpu_feature) an entry for a kernel of each tilegen ISA
#: requires, as llama.cpp's own tables write them (I8MM entries also ask for DOTPROD)
_GGML_FEATURES = {"sme2": {"SME2"}, "i8mm": {"I8MM", "DOTPROD"}, "dotprod": {"DOTPROD"}}
_KERNEL_SLOTS = ("get_m_step", "get_n_step", "get_mr", "get_nr", "get_kr", "get_sr",
                 "get_dst_offset", "get_dst_size", "get_lhs_packed_offset", "get_rhs_packed_offset",
                 "run")


def kquant_table_errors(patch: str, specs: dict[str, str], packer_headers: dict[str, str]) -> list[str]:
    """What is wrong with the patch's tilegen-family table: each entry's kernels (by position, every
    getter and run function of one kernel), LHS packer, RHS packer and dequantiser against its
    weight type and required CPU features.  ``specs``: kernel name -> spec string (the export
    manifest); ``packer_headers``: packer name -> its header text (the layout it writes)."""
    from tilegen.families import FAMILIES
    from tilegen.layout.base import same_rhs
    errors = []
    by_type = {f.upper(): f for f in FAMILIES}
    seen = []
    for i, ent in enumerate(kquant_table(patch)):
        gemm, gemm_lhs, gemv, gemv_lhs, rhs, req, lhs_type, rhs_type, op_type = ent
        where = f"entry {i} ({rhs_type}, {req})"
        fam = by_type.get(rhs_type.removeprefix("GGML_TYPE_"))
        features = {f.strip().removeprefix("CPU_FEATURE_") for f in req.split("|")}
        if fam is None or lhs_type != "GGML_TYPE_F32" or op_type != "GGML_TYPE_F32":
            errors.append(f"{where}: types {lhs_type}, {rhs_type}, {op_type}")
            continue
        kspecs = []
        for role, fns in (("gemm", gemm), ("gemv", gemv)):
            names = set()
            for slot, fn in zip(_KERNEL_SLOTS, fns):
                m = re.fullmatch(rf"(?:&\w+<)?kai_{slot}_(matmul_clamp_f32_\w+?)>?", fn)
                names.add(m[1] if m else f"<{fn} is not a {slot}>")
            if len(fns) != len(_KERNEL_SLOTS) or len(names) != 1 or names - set(specs):
                errors.append(f"{where}: {role} functions {fns} are not one exported kernel's")
                continue
            spec = tilegen.parse_spec(specs[names.pop()])
            kspecs.append(spec)
            if spec.family != fam:
                errors.append(f"{where}: {role} {spec} is not a {fam} kernel")
            if spec.is_gemv != (role == "gemv"):
                errors.append(f"{where}: {role} {spec} is not a {role}")
            if _GGML_FEATURES.get(spec.isa) != features:
                errors.append(f"{where}: {role} {spec} ({spec.isa}) under CPU features {sorted(features)}")
            lhs_fns = gemm_lhs if role == "gemm" else gemv_lhs
            pk = [re.fullmatch(rf"(?:&\w+<)?kai_{s}_(\w+?)>?", f) for s, f in zip(
                ("get_lhs_offset", "get_lhs_packed_offset", "get_lhs_packed_size", "run"), lhs_fns)]
            pnames = {m[1] for m in pk if m}
            cls = spec.lhs_layout_class
            if (None in pk or len(pnames) != 1 or len(lhs_fns) != 4
                    or not re.search(rf"\({cls.__module__}\.{cls.__name__}[,)]",
                                     packer_headers.get(pnames.pop(), ""))):
                errors.append(f"{where}: {role} LHS info {lhs_fns} does not pack {cls.__name__}")
        if len(kspecs) == 2:
            g, v = kspecs
            if g.rhs_layout_class is not v.rhs_layout_class or not same_rhs(g, v):
                errors.append(f"{where}: {g} and {v} do not read one packed RHS")
            want = ["kai_get_rhs_packed_stride_{p}", "&rhs_to_float_fn6<kai_run_dequant_row_{p}>",
                    "&rhs_ps_fn5<kai_get_rhs_packed_size_{p}>", "&rhs_stride_fn4<kai_get_rhs_packed_stride_{p}>",
                    "&rhs_pack_fn13<kai_run_{p}>"]
            m = re.fullmatch(r"kai_get_rhs_packed_stride_(\w+)", rhs[0]) if rhs else None
            cls = g.rhs_layout_class
            if (not m or rhs != [w.format(p=m[1]) for w in want]
                    or f"({cls.__module__}.{cls.__name__})" not in packer_headers.get(m[1], "")):
                errors.append(f"{where}: RHS info {rhs} does not pack and dequantise {cls.__name__}")
            seen.append((fam, g.isa, features))
    # one entry per (type, ISA); within a type no entry is shadowed by an earlier one that
    # needs fewer features (the selection takes the first that runs)
    keys = [(f, isa) for f, isa, _ in seen]
    if len(set(keys)) != len(keys):
        errors.append(f"duplicate entries: {keys}")
    for a in range(len(seen)):
        for b in range(a + 1, len(seen)):
            if seen[a][0] == seen[b][0] and seen[a][2] < seen[b][2]:
                errors.append(f"{seen[b][:2]} is shadowed by {seen[a][:2]}")
    return errors


def _table_inputs(files):
    import json
    tree = {f.path: f.text for f in files}
    man = json.loads(tree[K.MANIFEST])
    specs = {k["name"]: k["spec"] for k in man["kquant_kernels"]}
    headers = {Path(p).stem[len("kai_"):]: t for p, t in tree.items()
               if p.startswith("kai/ukernels/matmul/pack/") and p.endswith(".h")}
    return tree[K.LLAMA_PATCH], specs, headers


@pytest.mark.parametrize("target,tuned", _KQ_EXPORTS)
def test_kquant_table_entries_match_their_types(target, tuned):
    """#30 item 8(b): the patch's tilegen-family table, parsed as C, has one entry per weight
    type and ISA slot whose kernels, LHS packers, RHS packer and dequantiser are that type's on that ISA
    (default and tuned exports)."""
    patch, specs, headers = _table_inputs(K.export_files(target, tuned))
    table = kquant_table(patch)
    from tilegen.families import LLAMA_KERNELS     # one entry per family and ISA slot it maps
    assert len(table) == len(K.KQUANT_DEFAULT) == sum(map(len, LLAMA_KERNELS.values()))
    assert kquant_table_errors(patch, specs, headers) == []


def test_kquant_table_check_catches_miswiring():
    """The table check fails on each wiring mistake a unit test used to miss: the Q4_K and
    Q6_K gemv swapped (#30 item 8(b)), a gemm and a gemv swapped, two entries' CPU features
    swapped, two entries' RHS packers swapped, one getter of another kernel (the swapped lines:
    the first entry's and the next entry's that differ from it, whatever the table's order)."""
    patch, specs, headers = _table_inputs(K.export_files())
    by = {(e.family, e.isa): e for e in K.KQUANT_DEFAULT}

    def swap(text, a, b):
        return text.replace(a, "\0").replace(b, a).replace("\0", b)

    q4, q6 = by["q4_K", "i8mm"], by["q6_K", "i8mm"]
    lines = patch.split("\n")
    cpu = [i for i, l in enumerate(lines) if "/* .required_cpu" in l]
    rhs = [i for i, l in enumerate(lines) if "/* .to_float" in l]
    mutants = {
        "gemv Q4_K <-> Q6_K": swap(patch, q4.gemv.name, q6.gemv.name),
        "gemm <-> gemv": swap(patch, q4.gemm.name, q4.gemv.name),
        "required_cpu": "\n".join(swap_lines(lines, cpu[0], next(i for i in cpu if lines[i] != lines[cpu[0]]))),
        "to_float": "\n".join(swap_lines(lines, rhs[0], next(i for i in rhs if lines[i] != lines[rhs[0]]))),
        "one getter": patch.replace(f"kai_get_kr_{q4.gemm.name},", f"kai_get_kr_{by['q4_K', 'dotprod'].gemm.name},"),
    }
    for what, text in mutants.items():
        assert text != patch, what
        assert kquant_table_errors(text, specs, headers), f"{what}: the miswired table passes"


def test_patch_refuses_tables_it_cannot_write():
    """No entries, a second entry of one type and ISA, or an ISA without a llama.cpp slot (SVE)
    are refused by name, not written."""
    from dataclasses import replace
    from tilegen.export import llama
    es = [K.llama_entry(e) for e in K.KQUANT_DEFAULT]
    with pytest.raises(llama.PatchError, match="no kernel entries"):
        llama.patch_text([])
    q4k_i8mm = next(e for e in es if (e.family, e.isa) == ("q4_K", "i8mm"))
    with pytest.raises(llama.PatchError, match="a second q4_K i8mm entry"):
        llama.patch_text(es + [q4k_i8mm])
    with pytest.raises(llama.PatchError, match="no llama.cpp mapping for q4_K on sve_i8mm"):
        llama.patch_text([replace(q4k_i8mm, isa="sve_i8mm")])


def test_llama_entry_renders_the_descriptor(monkeypatch):
    """#31: the patch's per-kernel data is its kernels' descriptors rendered: the getter and run
    functions, family, ISA and both packers follow ``descriptor(spec)`` (a descriptor saying
    another RHS format or ISA changes the entry), and an entry whose two kernels' descriptors
    disagree on what the table shares is refused."""
    from dataclasses import replace
    from tilegen.generator.descriptor import descriptor
    e = next(x for x in K.KQUANT_DEFAULT if (x.family, x.isa) == ("q4_K", "i8mm"))
    got = K.llama_entry(e)
    for kk, lk in ((e.gemm, got.gemm), (e.gemv, got.gemv)):
        d = descriptor(kk.kernel_spec)
        assert lk.getters == {g.slot: f"kai_{g.slot}_{d.name}" for g in d.getters}
        assert lk.run == f"kai_run_{d.name}" and lk.name == d.name
    assert (got.lhs_packer, got.rhs_packer) == ("lhs_quant_pack_q8kp_f32", "rhs_pack_nxk_q4kp_q4k")

    def fake(**over):
        def f(spec):
            return replace(descriptor(spec), **over)
        return f
    monkeypatch.setattr(K, "descriptor", fake(rhs_layout_format="q6kp", isa="dotprod"))
    moved = K.llama_entry(e)
    assert (moved.rhs_packer, moved.isa) == ("rhs_pack_nxk_q6kp_q6k", "dotprod")
    real = fake()
    monkeypatch.setattr(K, "descriptor", lambda s: replace(real(s), isa="sme2") if s.is_gemv
                        else real(s))
    with pytest.raises(K.ExportError, match="one entry needs one family, ISA"):
        K.llama_entry(e)


def swap_lines(lines: list[str], a: int, b: int) -> list[str]:
    out = list(lines)
    out[a], out[b] = lines[b], lines[a]
    return out


def test_generated_patch_applies_to_llama_cpp(llama_cpp_src, tmp_path):
    """Every generated patch (default and tuned presets, and tables of one family, whose hunks
    have other line counts) applies with patch -p1 --dry-run to the vendored llama.cpp; applied,
    the default one gives the blob ids of its index lines (git hash-object before and after),
    and a tuned one has no index line for a file whose patched text differs (kernels.cpp)."""
    from tilegen.export import llama
    rel = Path("ggml/src/ggml-cpu/kleidiai")
    texts = {f"{target}-{tuned}": K.llama_patch(target, tuned) for target, tuned in _KQ_EXPORTS}
    # other tables change the hunks' line counts (one family: shorter type lists, one entry)
    for fam, isas in (("q4_K", ("sme2", "i8mm", "dotprod")), ("q6_K", ("dotprod",))):
        part = llama.patch_text([K.llama_entry(e) for e in K.KQUANT_DEFAULT
                                 if e.family == fam and e.isa in isas])
        assert f"GGML_TYPE_{fam.upper()}" in part and len(part.splitlines()) < len(K.llama_patch().splitlines())
        texts[f"{fam}-{len(isas)}"] = part
    for what, text in texts.items():
        p = tmp_path / f"{what}.patch"
        p.write_text(text)
        _run(["patch", "-p1", "--dry-run", "-d", llama_cpp_src, "-i", p])
    dst = tmp_path / "llama.cpp"
    shutil.copytree(llama_cpp_src / rel, dst / rel)
    text = K.llama_patch()
    index = dict(re.findall(r"^diff --git a/(\S+) .*\nindex (\w+\.\.\w+) ", text, flags=re.M))
    files = re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M)
    # the index lines a patch has are right (the default one has all three: it equals the
    # fixture); a table the ids are not known for (another family added, say) has none, and
    # applies as well, so a new family needs no new blob id
    assert set(index) <= set(files) and len(files) == 3

    def blob(path):
        return _run(["git", "hash-object", dst / path]).stdout.strip()

    before = {f: blob(f) for f in files}
    (tmp_path / "d.patch").write_text(text)
    _run(["patch", "-p1", "-d", dst, "-i", tmp_path / "d.patch"])
    for f in index:
        pre, post = index[f].split("..")
        assert before[f].startswith(pre) and blob(f).startswith(post), (f, index[f])
    tuned = K.llama_patch("neoverse-v2", True)
    assert tuned != text
    t_index = dict(re.findall(r"^diff --git a/(\S+) .*\nindex (\w+\.\.\w+) ", tuned, flags=re.M))
    assert "ggml/src/ggml-cpu/kleidiai/kernels.cpp" not in t_index and \
        all(index.get(f) == v for f, v in t_index.items()), (t_index, index)


def test_export_md_tuned_tables_are_the_tuned_files():
    """docs/export.md's two tables of what the committed tuned files replace (the KleidiAI names
    under --tuned / --tuned-pairs, and the tilegen-family entries) are the ones the code derives
    from tilegen/build/tuned/*.json (they went stale when presets were re-tuned: q4_0's pairs,
    q8_0's, iq4_nl's and mxfp4's n1 entries); each table has a row per tuned preset, and
    --tuned-pairs changes the tilegen-family entries as --tuned does."""
    from tilegen.build.tuned import tuned_targets
    doc = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    for table, fn in ((K.tuned_table(), "tuned_table"), (K.kquant_tuned_table(), "kquant_tuned_table")):
        assert table in doc, f"docs/export.md: regenerate the table (K.{fn}())"
        assert [r.split(" | ")[0][2:] for r in table.splitlines()[2:]] == tuned_targets()
    for t in tuned_targets():
        assert K.kquant_entries(t, "pairs") == K.kquant_entries(t, True), t


def test_tuned_kquant_tiles_reach_names_getters_and_table():
    """--tuned: a preset's tuned K-quant pair replaces the entry of its family and ISA (the
    kernel names follow the tile: there is no KleidiAI name to keep) where both kernels still
    read one packed RHS; the tree has the tuned kernels' headers, getters (m_step = the tuned
    mr), run functions and assembly, and the patch's table names them.  Tuned tiles of an ISA
    the table has no slot for (SVE) leave the entry as it is."""
    import json
    from tilegen.build.tuned import read_tuned
    from tilegen.build.targets import get_target
    want = {"neoverse-v2": {("q6_K", "i8mm"): ("q6_K:i8mm:32x4", "q6_K:i8mm:1x4")},
            "neoverse-n1": {("q4_K", "dotprod"): ("q4_K:dotprod:12x4", "q4_K:dotprod:1x4"),
                            ("q6_K", "dotprod"): ("q6_K:dotprod:32x4", "q6_K:dotprod:1x4"),
                            ("iq4_nl", "dotprod"): ("iq4_nl:dotprod:12x4", "iq4_nl:dotprod:1x4"),
                            ("mxfp4", "dotprod"): ("mxfp4:dotprod:4x8", "mxfp4:dotprod:1x8")}}
    for target, changed in want.items():
        tf = read_tuned(get_target(target))
        for (fam, isa), pair in changed.items():      # the committed tuned file's pair
            assert (tf.families[fam].gemm.spec_string, tf.families[fam].gemv.spec_string) == pair
        for tuned in (True, "pairs"):
            entries = K.kquant_entries(target, tuned)
            got = {(e.family, e.isa): (e.gemm.spec, e.gemv.spec) for e, d in zip(entries, K.KQUANT_DEFAULT)
                   if e != d}
            assert got == changed, (target, tuned)
            files = {f.path: f.text for f in K.export_files(target, tuned, include_packers=False)}
            man = json.loads(files[K.MANIFEST])
            assert [k["spec"] for k in man["kquant_kernels"]] == [
                s for e in entries for s in (e.gemm.spec, e.gemv.spec)]
            patch = files[K.LLAMA_PATCH]
            for e in entries:
                for kk in (e.gemm, e.gemv):
                    spec = kk.kernel_spec
                    assert kk.name == spec.name
                    assert f'#include "{kk.header}"' in patch and f"kai_run_{kk.name}>" in patch
                    src = files[kk.source]
                    assert re.search(rf"kai_get_m_step_{kk.name}\(void\) \{{\n    return {spec.mr};", src) \
                        or spec.mr_vl, kk.name
                    assert f"    tilegen_{spec.name}(" in src
                    assert f"kai/ukernels/matmul/tilegen/tilegen_{spec.name}.S" in files
            assert all(f"kai_run_{K.KQUANT_DEFAULT[i].gemm.name}>" not in patch
                       for i, e in enumerate(entries) if e.gemm != K.KQUANT_DEFAULT[i].gemm)
    # a preset whose tuned q4_K pair is SVE keeps the default q4_K entries
    assert all(e == d for e, d in zip(K.kquant_entries("neoverse-v2", True), K.KQUANT_DEFAULT)
               if e.family == "q4_K")


@pytest.mark.parametrize("src", ["kernels.cpp", "kleidiai.cpp"])
def test_patched_llama_cpp_glue_compiles(built, llama_kai, cross_sysroot, tmp_path, src):
    """The tree's llama-kquants.patch applies with patch -p1 to the vendored llama.cpp and its
    kernels.cpp and kleidiai.cpp compile against the tree."""
    root, lib, tc, _ = built
    ggml = llama_kai.parents[2]
    top = ggml.parent
    dst = tmp_path / "llama.cpp"
    kai_rel = llama_kai.relative_to(top)
    shutil.copytree(llama_kai, dst / kai_rel)
    _run(["patch", "-p1", "--dry-run", "-d", top, "-i", root / K.LLAMA_PATCH])
    _run(["patch", "-p1", "-d", dst, "-i", root / K.LLAMA_PATCH])
    _run([*tc.driver, *tc.target_flags, "-x", "c++", "-std=c++17", "-fsyntax-only", "-Wall",
          f"--sysroot={cross_sysroot}", "-DGGML_USE_CPU_KLEIDIAI", f"-I{ggml / 'include'}",
          f"-I{ggml / 'src'}", f"-I{ggml / 'src' / 'ggml-cpu'}", f"-I{dst / kai_rel}", f"-I{root}",
          dst / kai_rel / src])


def test_export_refuses_a_foreign_directory(tmp_path, capsys):
    """`export kleidiai -o DIR` into a non-empty directory that is not a previous export used
    to overwrite the user's CMakeLists.txt and kai/kai_common.h: it is refused in one line
    (exit 2) and left untouched, unless --force; a previous export, an empty and a missing
    directory are written."""
    from tilegen.cli import main
    foreign = tmp_path / "foreign"
    (foreign / "kai").mkdir(parents=True)
    mine = {"CMakeLists.txt": "project(mine)\n", "kai/kai_common.h": "/* mine */\n",
            "notes.txt": "keep\n"}
    for p, t in mine.items():
        (foreign / p).write_text(t)
    before = sorted(p.relative_to(foreign) for p in foreign.rglob("*"))
    argv = ["export", "kleidiai", "--target", "neoverse-n1", "-o", str(foreign)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"tilegen export: error: {foreign}: not empty and not a tilegen export "
        f"(no TILEGEN_EXPORT.json); the export would overwrite 2 of its files "
        f"(kai/kai_common.h, CMakeLists.txt): use an empty directory, or --force"), err
    assert sorted(p.relative_to(foreign) for p in foreign.rglob("*")) == before
    assert {p: (foreign / p).read_text() for p in mine} == mine
    # a directory with only unrelated files is refused too
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep\n")
    with pytest.raises(K.ExportError, match=r"not empty and not a tilegen export \(no TILEGEN_EXPORT.json\): use"):
        K.write_tree(other, target="neoverse-n1")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    # a marker that is not the export's is not one
    (other / K.MANIFEST).write_text('{"something": 1}\n')
    assert not K.is_export(other)
    with pytest.raises(K.ExportError, match="not a tilegen export"):
        K.write_tree(other, target="neoverse-n1")
    # --force writes, overwriting the files at the export's paths only
    assert main(argv + ["--force"]) == 0
    capsys.readouterr()
    assert (foreign / "notes.txt").read_text() == "keep\n"
    assert (foreign / "CMakeLists.txt").read_text() != mine["CMakeLists.txt"]
    assert K.is_export(foreign)
    # a previous export is re-exported, also with another target and --tuned
    (foreign / "CMakeLists.txt").write_text("stale\n")
    assert main(["export", "kleidiai", "--target", "neoverse-v2", "--tuned", "-o", str(foreign)]) == 0
    capsys.readouterr()
    assert "add_library(kleidiai" in (foreign / "CMakeLists.txt").read_text()
    # an empty and a missing directory are written
    (tmp_path / "empty").mkdir()
    for d in ("empty", "missing/deeper"):
        assert main(["export", "kleidiai", "--target", "neoverse-n1", "-o", str(tmp_path / d)]) == 0
        capsys.readouterr()
        assert K.is_export(tmp_path / d)
    # a file where the directory should be
    (tmp_path / "file").write_text("x")
    assert main(["export", "kleidiai", "-o", str(tmp_path / "file")]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# MUL_MAT_ID (mixture of experts, issue #33): the patch's grouped steps (kleidiai_moe.cpp.j2's
# core(), the very text the patch adds to kleidiai.cpp) in a C++ harness over the exported
# table entries, under qemu, bit-exact with one llama_flow per expert on its gathered rows

#: the harness's routed rows per chunk (the patch's default is larger): the cases below run
#: several chunks, and an expert whose rows span two chunks
MMID_CHUNK_ROWS = 5


@pytest.fixture(scope="module")
def mmid_harness(export_kai, llama_kai, cross_sysroot, tmp_path_factory):
    import jinja2
    from tilegen.generator.render import template_env
    env = template_env().overlay(loader=jinja2.ChoiceLoader([
        jinja2.FileSystemLoader(str(Path(__file__).parent / "data" / "templates")),
        template_env().loader]))
    out = tmp_path_factory.mktemp("mmid")
    src = out / "mmid_harness.cpp"
    src.write_text(env.get_template("mmid_harness.cpp.j2").render(chunk_rows=MMID_CHUNK_ROWS))
    tc = export_kai["tc"]
    lld = next(f for f in tc.link_flags if f.startswith("-fuse-ld="))
    exe = out / "mmid_harness"
    _run([*tc.driver, "--driver-mode=g++", *tc.target_flags, "-std=c++17", "-O1", "-Wall", "-Werror",
          f"--sysroot={cross_sysroot}", f"-I{llama_kai.parents[2] / 'include'}", f"-I{llama_kai}",
          src, "-o", exe, lld, "-static-libstdc++", "-static-libgcc", "-ldl"])
    return exe


def _mmid_weights(fam: str, n: int, k: int, rng):
    """One expert's weights as the table entry's RHS packer takes them (llama_flow's kinds),
    and the ggml blocks they come from (what lib.pack_weights takes as from_ggml=): Q8_0 is
    requantised per channel as llama.cpp's repack does."""
    from tilegen.layout.ggml import quantize_q4_0, quantize_q8_0
    from tilegen.layout.rhs_int8 import requantize_q8_0
    if fam == "q4":
        raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
        return dict(raw=raw, n=n), "q4", raw
    if fam == "q8":
        raw = quantize_q8_0(rng.normal(size=(n, k)).astype(np.float32))
        q, s = requantize_q8_0(raw, n, k)
        return dict(q=q, scale=s), "q8", raw
    from tilegen.families import rhs_layout_class      # a K-quant family: its seeded blocks
    raw = rhs_layout_class(fam).random_ggml(n, k, int(rng.integers(1 << 30)))
    return dict(raw=raw, n=n), "kq", raw


#: (family, gemm, gemm LHS packer, gemv, gemv LHS packer, RHS packer): a table entry per
#: family and ISA kind; tilegen's families' ones from the default export's table
_KQ_ENTRIES = [(e.family, e.gemm.name[len("matmul_clamp_f32_"):], K.llama_entry(e).lhs_packer,
                e.gemv.name[len("matmul_clamp_f32_"):], K.llama_entry(e).lhs_packer,
                _kq_packer(e.gemm)[1]) for e in K.KQUANT_DEFAULT]
_MMID_ENTRIES = [e for e in LLAMA_TABLE if e[0] in ("q4", "q8") and ("_neon_i8mm" in e[1] or "sme2" in e[1])] + [
    e for e in _KQ_ENTRIES if "sme2" in e[1] or "dotprod" in e[1] or e[0] == "q6_K"]

#: the MUL_MAT_ID cases (n_as, n, ids, src1_rows): a prompt batch with an expert that gets no
#: rows and one that gets one row (activations shared by the slots, as gate/up), every row on
#: one expert, a decode step (one token, activations per slot, as down); n leaves a partial
#: column chunk; with MMID_CHUNK_ROWS = 5 the first runs 4 chunks, the second 2 (its expert's 6 rows
#: cut 5 + 1: the 1-row piece runs the gemm), the third 1
_MMID_CASES = [(5, 53, np.array([[2, 3], [4, 2], [3, 4], [2, 1], [4, 3], [3, 2], [2, 4]], np.int32), 1),
               (4, 37, np.full((6, 1), 2, np.int32), 1),
               (4, 53, np.array([[3, 0]], np.int32), 2)]


def _mmid_harness_run(g, kai_so, harness, tmp_path, entry, cpu, sme_vl, case, rng,
                      threads=("1", "2", "3")):
    """One MUL_MAT_ID case through the C harness over table entry ``entry`` on qemu model
    ``cpu``: the experts' weights packed by the entry's exported RHS packer (in guest ``g``),
    the harness run for each thread count (the results must agree bit for bit);
    returns (dst of shape (n_tokens, n_ids, n), x, per expert (weights, RHS kind, ggml
    blocks), bl)."""
    from tilegen.emulate.runner import guest_command
    from tilegen.export.llama import LLAMA_FAMILIES
    fam, gemm, gemm_lhs, gemv, gemv_lhs, rhs_packer = entry
    tg = LLAMA_FAMILIES.get(fam)                        # a tilegen family of the patch
    bl = fam == "q4" or (tg is not None and tg.kernel_bl)
    block_args = ({"q4": (32, 32, 32), "q8": (0, 0, 32)}[fam] if tg is None   # kleidiai_get_block_args
                  else (tg.block_len,) * 3 if bl else (0, 0, 0))
    k = 256 if fam in ("q4", "q8") else 512
    n_as, n, ids, src1_rows = case
    n_tokens, n_ids = ids.shape
    ws = [_mmid_weights(fam, n, k, rng) for _ in range(n_as)]
    rhs = [g.call("guest_kai:pack_rhs", kai_so, "matmul_clamp_f32_" + gemm, rhs_packer, rk, k, w)
           for w, rk, _ in ws]
    x = (rng.normal(size=(n_tokens, src1_rows, k)) * rng.uniform(0.5, 4.0, size=(n_tokens, 1, 1))).astype(np.float32)
    blob = np.array([k, n, n_as, n_ids, n_tokens, src1_rows, *block_args], np.int64).tobytes() \
        + ids.tobytes() + x.tobytes() + b"".join(np.int64(len(r)).tobytes() + r for r in rhs)
    (tmp_path / "in.bin").write_bytes(blob)
    cmd, env = guest_command([str(harness), kai_so, "1" if bl else "0",
                              "matmul_clamp_f32_" + gemm, gemm_lhs, "matmul_clamp_f32_" + gemv,
                              gemv_lhs, str(tmp_path / "in.bin"), str(tmp_path / "out.bin"),
                              *threads], cpu, sme_vl, sme_vl)
    _run(cmd, env=env)
    raw_out = np.fromfile(tmp_path / "out.bin", np.uint8).reshape(len(threads), -1)
    chunks = raw_out[:, :8].copy().view(np.int64)[:, 0]
    outs = raw_out[:, 8:].copy().view(np.float32).reshape(len(threads), n_tokens, n_ids, n)
    assert all(np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)) for o in outs[1:])
    assert not np.any(outs[0] == np.float32(-4242.25))
    # the chunks: each expert's rows cut into pieces of MMID_CHUNK_ROWS, whole pieces per chunk
    counts = np.bincount(ids.reshape(-1), minlength=n_as)
    pieces = [min(MMID_CHUNK_ROWS, c - r) for c in counts for r in range(0, c, MMID_CHUNK_ROWS)]
    want, used = 0, MMID_CHUNK_ROWS
    for m in pieces:
        if used + m > MMID_CHUNK_ROWS:
            want, used = want + 1, 0
        used += m
    assert list(chunks) == [want] * len(threads), (chunks, want, counts)
    return outs[0], x, ws, bl


@pytest.mark.parametrize("entry", _MMID_ENTRIES, ids=lambda e: f"{e[0]}-{e[1]}")
def test_patch_mul_mat_id_is_per_expert_matmuls(kai_so, mmid_harness, tmp_path, entry):
    """The patch's MUL_MAT_ID steps (group, pack, compute; 1, 2 and 3 threads) over one table
    entry give, for every (slot, token) row, exactly what the entry's kernel gives for the rows
    routed to its expert gathered into one matmul (llama_flow: the gemv for an expert with one
    row, else the gemm), bit for bit, and leave no dst row unwritten (the cases of
    ``_MMID_CASES``)."""
    fam, gemm, gemm_lhs, gemv, gemv_lhs, rhs_packer = entry
    g = guest("max", None, SVL_BITS)
    kind = "bl" if fam == "q4" else None
    rng = np.random.default_rng(33)
    for case in _MMID_CASES:
        got, x, ws, bl = _mmid_harness_run(g, kai_so, mmid_harness, tmp_path, entry, "max", SVL_BITS,
                                           case, rng)
        kind = "bl" if bl else "packed"
        n_as, n, ids, src1_rows = case
        n_tokens, n_ids = ids.shape
        for e in range(n_as):
            rows = [(s, t) for t in range(n_tokens) for s in range(n_ids) if ids[t, s] == e]
            if not rows:
                continue
            xe = np.stack([x[t, s % src1_rows] for s, t in rows])
            kern = gemv if len(rows) == 1 else gemm
            lhs = gemv_lhs if len(rows) == 1 else gemm_lhs
            want = g.call("guest_kai:llama_flow", kai_so, "matmul_clamp_f32_" + kern, kind,
                          "matmul_clamp_f32_" + gemm, lhs, bl, rhs_packer, ws[e][1], xe, ws[e][0])
            mine = np.stack([got[t, s] for s, t in rows])
            assert np.array_equal(mine.view(np.uint32), np.asarray(want, np.float32).view(np.uint32)), \
                (gemm, n, e, len(rows))


def _kai_spec(name: str) -> str:
    """The tilegen spec string of an exported kernel (KleidiAI's names and tilegen's own)."""
    full = "matmul_clamp_f32_" + name
    for kk in K.KERNELS:
        if kk.name == full:
            return kk.kernel_spec.spec_string
    for e in K.KQUANT_DEFAULT:
        for kk in (e.gemm, e.gemv):
            if kk.name == full:
                return kk.kernel_spec.spec_string
    raise KeyError(name)


def _py_entry(fam: str, cpu: str):
    """The table entry of type ``fam`` that llama.cpp's chain runs on qemu model ``cpu`` (the
    best ISA the model has): neoverse-n1 dotprod, neoverse-v1 i8mm (Q4_0: its SVE-named
    entry), max the SME2 entry where the type has one Python can pair (Q4_0's SME2 entry packs
    its gemm and gemv in two layouts, which a KernelPair cannot: its i8mm entry there)."""
    table = [e for e in LLAMA_TABLE if e[0] == fam] if fam in ("q4", "q8") else \
        [e for e in _KQ_ENTRIES if e[0] == fam]
    want = {"neoverse-n1": ("dotprod",), "neoverse-v1": ("sve_i8mm", "i8mm"),
            "max": ("sme2", "neon_i8mm", "i8mm")}[cpu]
    for isa in want:
        for e in table:
            if e[1].endswith("_" + isa) if isa != "sme2" else "_sme2_" in e[1] and fam != "q4":
                return e
    raise KeyError((fam, cpu))


#: (type, qemu model): each patched MUL_MAT_ID type on each model, one shape set each
_PY_CASES = [(fam, cpu) for fam in ("q4", "q8", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq4_nl", "mxfp4")
             for cpu in ("neoverse-n1", "neoverse-v1", "max")]
_PY_KIND = {"q4": "q4_0", "q8": "q8_0"}


@pytest.fixture(scope="module")
def mmid_py_lib(tmp_path_factory) -> Path:
    """A tilegen library with the gemm and gemv of every entry ``_PY_CASES`` runs."""
    specs = sorted({_kai_spec(name) for fam, cpu in _PY_CASES
                    for name in (_py_entry(fam, cpu)[1], _py_entry(fam, cpu)[3])})
    out = tmp_path_factory.mktemp("mmidpy")
    tilegen.build_library(specs, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("fam,cpu", _PY_CASES, ids=lambda v: v)
def test_patch_mul_mat_id_is_the_python_grouped_call(kai_so, mmid_harness, mmid_py_lib, tmp_path, fam, cpu):
    """The patch's MUL_MAT_ID (C harness, 1 and 3 threads) equals ``lib.matmul_experts`` bit
    for bit on the same inputs (the same ggml blocks of each expert, activations and ids), on
    the qemu model ``cpu`` with the entry llama.cpp runs there, Python's table set to that
    entry's gemm and gemv (1 and 3 threads; max at SVL 512 with SME on): experts with no
    rows, one row (the gemv), all rows, activations broadcast over slots."""
    from conftest import SME_ON
    from tilegen.families import KQUANT_FAMILIES
    entry = _py_entry(fam, cpu)
    sme = cpu == "max"
    g = guest("max", None, SVL_BITS)
    py = guest(cpu, None, SVL_BITS if sme else None, SME_ON if sme else None)
    kind = _PY_KIND.get(fam, fam)
    assert fam in _PY_KIND or fam in KQUANT_FAMILIES or fam in ("iq4_nl", "mxfp4"), fam
    rng = np.random.default_rng(34)
    seen = set()
    for case in _MMID_CASES:
        got, x, ws, _ = _mmid_harness_run(g, kai_so, mmid_harness, tmp_path, entry, cpu,
                                          SVL_BITS if sme else None, case, rng, threads=("1", "3"))
        n_as, n, ids, src1_rows = case
        raw = np.stack([w[2] for w in ws])
        r = py.call("guest_moe:grouped_call", str(mmid_py_lib), kind, _kai_spec(entry[1]),
                    _kai_spec(entry[3]), raw, n, x.shape[-1], x, ids, (1, 3))
        assert r["kernels"] == [_kai_spec(entry[3]), _kai_spec(entry[1])], r["kernels"]
        for y in r["y"]:
            assert y.shape == got.shape
            bad = np.argwhere(y.view(np.uint32) != got.view(np.uint32))
            assert bad.size == 0, (entry[1], case[1], bad[:5].tolist())
        counts = np.bincount(ids.reshape(-1), minlength=n_as)
        seen |= {"none" if c == 0 else "one" if c == 1 else "all" if c == ids.shape[0] else "some"
                 for c in counts}
    assert seen == {"none", "one", "all", "some"}, seen
