"""q8_0 family records, names, allocator rules and manifest entries (host only)."""
from __future__ import annotations

import pytest

from tilegen.generator.manifest import kernel_entry
from tilegen.generator.render import generate, render
from tilegen.generator.spec import KernelSpec
from tilegen.generator.validate import parse_spec, validate
from tilegen.records import SpecError


@pytest.mark.parametrize("text, name", [
    ("q8_0:i8mm:16x4", "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm"),
    ("q8_0:dotprod:16x4", "matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod"),
    ("q8_0:dotprod:1x4", "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"),
    ("q8_0:dotprod:1x4:k8:s1", "matmul_clamp_f32_qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod"),
    ("q8_0:neon:4x4", "matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_4x4_neon"),
])
def test_q8_names_follow_kleidiai(text, name):
    spec = parse_spec(text)
    assert spec.name == name
    assert parse_spec(spec.spec_string) == spec
    e = kernel_entry(spec, spec.name)
    assert parse_spec(e["spec"]) == spec and spec.family == "q8_0" and e["name"] == name
    assert spec.lhs_format == name.split("_")[3] and spec.rhs_format == name.split("_")[4]
    assert [p["name"] for p in e["params"]][:5] == ["m", "n", "k", "lhs_packed", "rhs_packed"]


@pytest.mark.parametrize("kw, words", [
    (dict(isa="i8mm", mr=1, nr=4), ["i8mm", "mr a multiple of 4", "mr=1"]),
    (dict(isa="i8mm", mr=4, nr=4, kr=4, sr=1), ["kr=8", "kr=4"]),
    (dict(isa="dotprod", mr=4, nr=4, kr=8, sr=1), ["kr=4", "gemv", "kr=8"]),
    (dict(isa="dotprod", mr=6, nr=4), ["mr=6", "multiple of 4"]),
    (dict(isa="dotprod", mr=4, nr=6), ["nr=6", "multiple of 4"]),
    (dict(isa="dotprod", mr=4, nr=4, kr=4, sr=2), ["sr=1", "sr=2"]),
    (dict(isa="dotprod", mr=16, nr=32), ["16x32", "needs 41 vector registers", "32 exist"]),
    (dict(isa="i8mm", mr=4, nr=4, acc_mem=True), ["acc_mem"]),
])
def test_q8_allocator_refuses_with_numbers(kw, words):
    with pytest.raises(SpecError) as e:
        validate(KernelSpec("q8_0", **kw))
    for w in words:
        assert w in str(e.value), str(e.value)


def test_q8_template_reads_offsets_from_the_layouts():
    text = generate("q8_0:i8mm:16x4")
    assert "smmla" in text and "fmla" not in text and "fmadd" not in text
    assert "sdot" in generate("q8_0:dotprod:16x4")
    assert "smull2" in generate("q8_0:neon:4x4") and "sdot" not in generate("q8_0:neon:4x4")
    # 16x8 does not fit the registers at once: it runs as two 8-row register blocks
    from tilegen.generator.regalloc import allocate
    assert allocate(parse_spec("q8_0:i8mm:16x8")).mr_reg == 8 and \
        allocate(parse_spec("q8_0:i8mm:16x4")).mr_reg == 16
    assert render("q8_0:i8mm:16x8").text.count("smmla") == render("q8_0:i8mm:8x8").text.count("smmla")


def test_q8_header_getters_and_macho(tmp_path):
    """Mach-O renders; the C header declares the q8 kernels with KleidiAI's signature and
    compiles; the getters come from the layouts' stride expressions."""
    import shutil
    import subprocess

    import tilegen
    from tilegen.build.cheader import getters_c
    assert "_matmul_clamp_f32_qai8dxp4x8_qsi8cxp4x8_16x4_neon_i8mm:" in generate("q8_0:i8mm:16x4", "macho")
    spec = parse_spec("q8_0:i8mm:16x4")
    src = getters_c([spec])
    assert f"get_rhs_packed_offset_{spec.name}(size_t n_idx, size_t k, size_t bl) {{ return (n_idx / 4) * (4 * ((k + 31) / 32 * 32 + 12)); }}" in src
    assert f"get_lhs_packed_offset_{spec.name}(size_t m_idx, size_t k) {{ return (m_idx / 4) * (4 * ((k + 31) / 32 * 32 + 8)); }}" in src
    tilegen.build_library(["q8_0:i8mm:16x4", "q8_0:dotprod:1x4:k8:s1"], target="neoverse-v1",
                          out_dir=tmp_path)
    h = (tmp_path / "tilegen_kernels.h").read_text()
    assert (f"void {spec.name}(size_t m, size_t n, size_t k, const void* lhs_packed, "
            f"const void* rhs_packed, void* dst, size_t dst_stride_row, size_t dst_stride_col, "
            f"float scalar_min, float scalar_max);") in h
    clang = shutil.which("clang-19")
    assert clang, "needs clang-19 (scripts/setup.sh installs it)"
    (tmp_path / "t.c").write_text('#include "tilegen_kernels.h"\nint main(void){return 0;}\n')
    p = subprocess.run([clang, "--target=aarch64-linux-gnu", "-fsyntax-only", "-ffreestanding",
                        f"-I{tmp_path}", str(tmp_path / "t.c")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
