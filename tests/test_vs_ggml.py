"""bench/vs_ggml.py: ggml's repack kernels (K-quants, IQ4_NL) and vec_dot (IQ4_XS), built from
the llama.cpp sources of the llama-cpp-python sdist, cut to one 256-k super-block by two qemu traces and measured by llvm-mca."""
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("vs_ggml", BENCH / "vs_ggml.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["vs_ggml"] = mod          # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


vs = _load()


def test_one_super_block_is_the_extra_stretch(monkeypatch):
    monkeypatch.setattr(vs, "WINDOW", 2)      # these traces are short
    a, x, b = [1, 2, 3], [10, 11, 12, 13], [20, 21]
    assert vs.one_super_block(a + x + x + b, a + x + x + x + b) == x
    # the loop's exit test comes first in the body: the cut is a rotation of it
    rot = vs.one_super_block(a + [10, 11] + b, a + [10, 11, 10, 11] + b)
    assert sorted(rot) == [10, 11] and len(rot) == 2
    with pytest.raises(vs.GgmlError, match="no more instructions"):
        vs.one_super_block(a + x, a + x)
    with pytest.raises(vs.GgmlError, match="stretches added"):
        vs.one_super_block([1, 2, 3], [9, 9, 9, 9])
    # two passes over k (a tile run in two register blocks): a stretch in each
    y = [30, 31, 32]
    two = vs.one_super_block(a + x * 2 + [5] + y * 2 + b, a + x * 3 + [5] + y * 3 + b)
    assert two == x + y


def test_tilegen_specs_are_spec_strings():
    """The default run (no --tilegen) measures the families' default kernels and the grid:
    every entry is a spec string the bench parses (the defaults were once kernel names, and
    ``python bench/vs_ggml.py`` failed on the first one)."""
    from tilegen.build.defaults import default_specs
    from tilegen.build.targets import get_target
    from tilegen.generator.validate import as_spec
    specs = vs.tilegen_specs("neoverse-v2", ("iq4_nl", "mxfp4"))
    names = [as_spec(s).name for s in specs]
    assert len(set(names)) == len(names)
    want = {s.name for s in default_specs(get_target("neoverse-v2"))
            if s.family in ("iq4_nl", "mxfp4") and s.isa_info.vl_kind != "sme"}
    assert want and want <= set(names)


def test_dot_macs():
    assert vs.dot_macs("smmla", "v0.4s, v1.16b, v2.16b", 128) == 32
    assert vs.dot_macs("sdot", "v0.4s, v1.16b, v2.4b[3]", 128) == 16
    assert vs.dot_macs("sdot", "v0.2s, v1.8b, v2.8b", 128) == 8
    assert vs.dot_macs("smmla", "z0.s, z1.b, z2.b", 256) == 64
    assert vs.dot_macs("sdot", "z0.s, z1.b, z2.b", 256) == 32
    assert vs.dot_macs("smlal", "v0.4s, v1.4h, v2.4h", 128) == 0


def test_ggml_kernels_cut_to_one_super_block_and_measured(llama_cpp_src, cross_sysroot, tmp_path):
    b = vs.build("-mcpu=neoverse-v2", tmp_path, llama_cpp_src)
    assert {g[2] for g in vs.GGML} <= set(b.funcs)
    cpu = vs.QEMU_CPU["neoverse-v2"]
    for func, rows, mac in (("ggml_gemm_q4_K_8x8_q8_K", 4, "smmla"),
                            ("ggml_gemv_q6_K_8x4_q8_K", 1, "sdot"),
                            ("ggml_gemm_iq4_nl_4x4_q8_0", 4, "sdot"),
                            ("ggml_vec_dot_iq4_xs_q8_K", 1, "sdot")):
        p = vs.ggml_path(b, func, rows, "neoverse-v2", cpu, tmp_path)
        cols = vs.COLS[func]
        assert p["macs"] == rows * cols * 256 and not p["sve"]
        assert sum(ln.startswith(mac + " ") for ln in p["lines"]) == \
            rows * cols * 256 // (32 if mac == "smmla" else 16)
        assert not any(vs.BRANCH.match(ln.split()[0]) for ln in p["lines"])
        # steady state: one more super-block adds the same number of instructions again
        t = [len(vs.trace(b, func, nb, cpu, tmp_path)) for nb in (2, 3, 4)]
        assert t[2] - t[1] == t[1] - t[0] == p["insns"]
        mpc = rows * cols * 256 / vs.mca_block(p["lines"], "neoverse-v2")
        assert 1 < mpc < 128, mpc
    with pytest.raises(vs.GgmlError, match="dot-product MACs"):
        vs.ggml_path(b, "ggml_gemm_q4_K_8x8_q8_K", 2, "neoverse-v2", cpu, tmp_path)
    # IQ4_XS's vec_dot (quants.c, NEON): one output, its 16 indices decoded by TBL per 16 k
    p = vs.ggml_path(b, "ggml_vec_dot_iq4_xs_q8_K", 1, "neoverse-v2", cpu, tmp_path)
    assert sum(ln.startswith("tbl ") for ln in p["lines"]) == 256 // 16
    with pytest.raises(vs.GgmlError, match="dot-product MACs"):
        vs.ggml_path(b, "ggml_vec_dot_iq4_xs_q8_K", 2, "neoverse-v2", cpu, tmp_path)


def test_vec_dot_declared_by_the_plugin():
    """What ggml runs for a type its repack lacks comes from the plugin (``GGML_VEC_DOT``),
    not from the bench: IQ4_XS's vec_dot serves gemm and gemv (nrc 1), and a family declaring
    another (nrc 2) is listed with its nrc (its call: nrc x nrc outputs), no bench edit."""
    from types import SimpleNamespace

    from tilegen.families import plugin
    assert vs.VEC_DOT == {"ggml_vec_dot_iq4_xs_q8_K": 1}
    xs = [g for g in vs.GGML if g[0] == "iq4_xs"]
    assert xs == [("iq4_xs", r, "ggml_vec_dot_iq4_xs_q8_K", "sdot", 1) for r in ("gemm", "gemv")]
    assert "iq4_xs" in vs.TILEGEN_FAMILIES and plugin("iq4_xs").GGML_REPACK == ()
    assert vs.rows_of("ggml_vec_dot_iq4_xs_q8_K", "gemm") == 1
    assert vs.rows_of("ggml_gemm_q4_K_8x8_q8_K", "gemm") == 4
    fake = SimpleNamespace(RECORDS=(SimpleNamespace(name="fake"),),
                           GGML_VEC_DOT=(("gemm", "ggml_vec_dot_fake_q8_0", "smmla", 2),
                                         ("gemv", "ggml_vec_dot_fake_1", "sdot", 1)))
    assert vs._ggml_kernels([fake]) == (("fake", "gemm", "ggml_vec_dot_fake_q8_0", "smmla", 2),
                                        ("fake", "gemv", "ggml_vec_dot_fake_1", "sdot", 1))
    assert vs.vec_dots([fake]) == {"ggml_vec_dot_fake_q8_0": 2, "ggml_vec_dot_fake_1": 1}


def test_tilegen_trace_agrees_with_per_k(cross_sysroot, tmp_path):
    """The qemu cut of a generated kernel (Q8 calling convention) through 256 k, by llvm-mca,
    is what analyze.per_k models from the markers (here q8_0: its hot loop x 256 / k-step)."""
    from tilegen.analysis.mca import per_k
    from tilegen.generator.validate import as_spec
    spec = as_spec("q8_0:i8mm:4x8")
    lines = vs.tilegen_trace_lines(spec, tmp_path, vs.QEMU_CPU["neoverse-v2"])
    assert sum(ln.startswith("smmla ") for ln in lines) == 4 * 8 * 256 // 32
    r = per_k(spec, "neoverse-v2", 256)
    assert vs.mca_block(lines, "neoverse-v2") == pytest.approx(r.cycles, rel=0.02)


def test_tilegen_kquant_trace_agrees_with_per_k(cross_sysroot, tmp_path):
    """q4_K 8x8 on i8mm runs two 4-row passes over k: the cut has a stretch in each, and per
    pass it costs what per_k models from the super-block marker (block-begin k=256)."""
    from tilegen.analysis.mca import per_k
    from tilegen.generator.validate import as_spec
    spec = as_spec("q4_K:i8mm:8x8")
    lines = vs.tilegen_trace_lines(spec, tmp_path, vs.QEMU_CPU["neoverse-v2"])
    r = per_k(spec, "neoverse-v2", 256)
    passes = 8 * 8 * 256 // r.macs
    assert passes == 2 and r.unit_k == 256
    assert vs.mca_block(lines, "neoverse-v2") / passes == pytest.approx(r.cycles, rel=0.02)
