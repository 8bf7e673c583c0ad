import hashlib
import json
import subprocess
import sys

import pytest

import tilegen
from tilegen.build import BuildError, TargetError, ToolchainError, discover
from tilegen.build import library as build_library_mod


def test_build_manifest(tmp_path):
    res = tilegen.build_library(["f32:neon:6x16", "f32:neon:1x4", "f32:neon:3x8"],
                                target="neoverse-n1", out_dir=tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert res.library == tmp_path / "libtilegen.so"
    assert m["sha256"] == hashlib.sha256(res.library.read_bytes()).hexdigest()
    assert m["format"] == "elf" and m["target"] == "neoverse-n1"
    assert m["toolchain"]["version"]
    names = [k["name"] for k in m["kernels"]]
    assert names == sorted(names) and "matmul_clamp_f32_f32_f32p8x1b_3x8_neon_mla" in names
    k = next(k for k in m["kernels"] if k["name"].endswith("_6x16_neon_mla"))
    # the entry is the spec and its descriptor as the loader binds it
    assert set(k) == {"name", "spec", "symbol", "params", "preferred", "descriptor"}
    assert k["spec"] == "f32:neon:6x16" and k["symbol"] == k["name"]
    d = k["descriptor"]
    assert (d["isa"], d["features"], d["vl_kind"], d["lhs"], d["rhs"]) == (
        "neon", ["neon"], None, "f32", "f32p16x1b")
    assert d["tile"] == {"mr": 6, "nr": 16, "mr_vl": False, "nr_vl": False, "kr": 1, "sr": 1}
    assert d["getters"]["get_rhs_packed_offset"]["body"].startswith("(n_idx / 16) * (")
    assert m["manifest_version"] == 3
    assert [p["name"] for p in k["params"][:3]] == ["m", "n", "k"]
    syms = subprocess.run(["llvm-objdump-19", "-T", str(res.library)], capture_output=True,
                          text=True).stdout
    for n in names:
        assert n in syms


def test_build_is_reproducible(tmp_path):
    specs = ["f32:neon:4x16", "f32:neon:8x8"]
    a = tilegen.build_library(specs, out_dir=tmp_path / "a")
    b = tilegen.build_library(list(reversed(specs)), out_dir=tmp_path / "b")
    for rel in ["libtilegen.so", "src/matmul_clamp_f32_f32_f32p8x1b_8x8_neon_mla.S",
                "obj/matmul_clamp_f32_f32_f32p16x1b_4x16_neon_mla.o"]:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    assert a.manifest["sha256"] == b.manifest["sha256"]


def test_macho_dylib(tmp_path):
    res = tilegen.build_library(["f32:neon:6x16"], target="apple-m1", out_dir=tmp_path)
    assert res.library.name == "libtilegen.dylib" and res.manifest["format"] == "macho"
    out = subprocess.run(["llvm-objdump-19", "--macho", "--exports-trie", str(res.library)],
                         capture_output=True, text=True).stdout
    assert "_matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla" in out
    hdr = subprocess.run(["llvm-objdump-19", "--macho", "--private-header", str(res.library)],
                         capture_output=True, text=True).stdout
    assert "ARM64" in hdr


def test_unknown_target_and_bad_kernel(tmp_path):
    with pytest.raises(TargetError, match="unknown target"):
        tilegen.build_library(["f32:neon:4x8"], target="pentium", out_dir=tmp_path)
    with pytest.raises(tilegen.SpecError, match="42 vector registers"):
        tilegen.build_library(["f32:neon:8x16"], out_dir=tmp_path)


def test_missing_toolchain_message(monkeypatch):
    monkeypatch.setenv("TILEGEN_CC", "/nonexistent/cc")
    with pytest.raises(ToolchainError, match="does not run"):
        discover("elf")
    monkeypatch.delenv("TILEGEN_CC")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("tilegen.build.toolchain._has_module", lambda name: False)
    with pytest.raises(ToolchainError, match="apt-get install clang-19 lld-19"):
        discover("elf")


def test_explicit_cc(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEN_CC", "clang-19")
    res = tilegen.build_library(["f32:neon:1x4"], out_dir=tmp_path)
    assert res.manifest["toolchain"]["kind"] == "custom"


def test_assembler_error_names_kernel_and_line(tmp_path, monkeypatch):
    real = build_library_mod.render

    def broken(spec, fmt):
        r = real(spec, fmt)
        return type(r)(r.spec, r.fmt, r.symbol, r.text.replace("fmla", "fmlx", 1))

    monkeypatch.setattr(build_library_mod, "render", broken)
    with pytest.raises(BuildError) as e:
        tilegen.build_library(["f32:neon:4x8"], out_dir=tmp_path)
    msg = str(e.value)
    assert "matmul_clamp_f32_f32_f32p8x1b_4x8_neon_mla" in msg and "fmlx" in msg
    assert "invalid instruction" in msg or "unrecognized" in msg


def test_cli_generate_build_list(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "tilegen", *a], capture_output=True,
                                    text=True)
    p = run("generate", "--family", "f32", "--isa", "neon", "--tile", "5x12", "-o", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "matmul_clamp_f32_f32_f32p12x1b_5x12_neon_mla"
    assert (tmp_path / "matmul_clamp_f32_f32_f32p12x1b_5x12_neon_mla.S").exists()
    p = run("generate", "--family", "f32", "--isa", "neon", "--tile", "8x16", "-o", str(tmp_path))
    assert p.returncode == 2 and "42 vector registers" in p.stderr
    p = run("build", "--target", "neoverse-n1", "--kernel", "f32:neon:7x8", "-o", str(tmp_path / "lib"))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "lib" / "libtilegen.so").exists()
    p = run("list")
    assert "f32:neon:6x16" in p.stdout and "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla" in p.stdout
    p = run("targets")
    assert "neoverse-n1" in p.stdout and "apple-m4" in p.stdout


def test_presets_and_isa_selection(tmp_path):
    from tilegen.build import default_specs, get_target
    for name in ("generic-armv8", "cortex-a53", "cortex-a76", "neoverse-n1", "graviton2",
                 "neoverse-v1", "graviton3", "neoverse-n2", "neoverse-v2", "graviton4", "grace",
                 "apple-m1", "apple-m2", "apple-m3", "apple-m4", "a64fx", "linux-aarch64-all"):
        t = get_target(name)
        assert all(t.supports(s) for s in default_specs(t))
    assert get_target("apple-m4").fmt == "macho" and "sme2" in get_target("apple-m4").features
    assert "sve" not in get_target("apple-m4").features
    isas = {s.isa for s in default_specs(get_target("cortex-a53"))}
    assert isas == {"neon"}
    assert {s.isa for s in default_specs(get_target("graviton3"))} == {
        "neon", "dotprod", "i8mm", "bf16", "sve", "sve_dotprod", "sve_i8mm"}
    assert {s.isa for s in default_specs(get_target("a64fx"))} == {"neon", "sve"}  # no dotprod/i8mm
    assert {s.isa for s in default_specs(get_target("apple-m4"))} == {"neon", "dotprod", "i8mm", "bf16", "sme", "sme2"}
    with pytest.raises(TargetError, match="aarch64 host"):
        get_target("native")
    run = lambda *a: subprocess.run([sys.executable, "-m", "tilegen", *a], capture_output=True, text=True)
    p = run("build", "--target", "graviton3", "--isa", "neon", "--kernel", "q4_0:i8mm:8x4", "-o",
            str(tmp_path / "g3"))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""          # not a TTY: no progress output
    names = [k["name"] for k in json.loads((tmp_path / "g3" / "manifest.json").read_text())["kernels"]]
    assert "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4_neon_i8mm" in names
    assert not any(n.endswith("_neon_dotprod") for n in names)
    p = run("targets", "-v")
    assert "q4_0:i8mm:16x4" in p.stdout
