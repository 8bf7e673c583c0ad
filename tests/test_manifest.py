"""The manifest is checked against the library: tampered tables, truncated libraries and
kernels the CPU cannot run are errors, never wrong results or a crash.  Every load and call
runs in the guest Python, a separate process, so a SIGILL/SIGBUS fails the test."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

import tilegen

from conftest import guest

F32 = "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"
I8MM = "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_8x4_neon_i8mm"
PACKER = "lhs_quant_pack_qsi8d32p4x8_f32_neon"


@pytest.fixture(scope="module")
def small_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manifestlib")
    tilegen.build_library(["f32:neon:6x16", "q4_0:i8mm:8x4"], target="neoverse-v1", out_dir=out)
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit(libdir: Path, name: str, fn) -> None:
    mpath = libdir / "manifest.json"
    man = json.loads(mpath.read_text())
    fn(next(e for e in man["kernels"] + man["packers"] if e["name"] == name))
    mpath.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")


def test_untampered_library_runs(small_lib):
    g = guest("max")
    assert g.call("guest_manifest:load_and_run", str(small_lib), F32) == "ok"
    assert g.call("guest_manifest:load_and_run", str(small_lib), I8MM) == "ok"


@pytest.mark.parametrize("spec", ["f32:neon:6x8", "f32:neon:6x16:k4:s1", "f32:neon"])
def test_edited_spec_is_load_error(small_lib, tmp_path, spec):
    """The tile, features and formats come from the spec string; an entry whose spec does
    not give its name (or is no spec) is refused."""
    lib = _copy(small_lib, tmp_path / "lib")
    _edit(lib, F32, lambda e: e.__setitem__("spec", spec))
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and F32 in got, got


def test_edited_isa_is_load_error_not_sigill(small_lib, tmp_path):
    lib = _copy(small_lib, tmp_path / "lib")
    _edit(lib, I8MM, lambda e: e.__setitem__("spec", "q4_0:dotprod:8x4"))
    got = guest("cortex-a53").call("guest_manifest:load_and_run", str(lib), I8MM)
    assert got.startswith("LoadError:") and I8MM in got, got


def test_extra_field_is_load_error(small_lib, tmp_path):
    lib = _copy(small_lib, tmp_path / "lib")
    _edit(lib, F32, lambda e: e.__setitem__("features", ["neon"]))
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and F32 in got and "features" in got, got


def test_edited_signature_is_load_error(small_lib, tmp_path):
    lib = _copy(small_lib, tmp_path / "lib")
    _edit(lib, F32, lambda e: e["params"][9].__setitem__("ctype", "size_t"))
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and F32 in got and "params" in got, got


@pytest.mark.parametrize("edit", ["flip preferred", "mark best", "drop a kernel"])
def test_edited_table_is_load_error(small_lib, tmp_path, edit):
    """Fields the spec does not determine, and the set of entries, are covered by the digest
    of the kernel table the library carries."""
    lib = _copy(small_lib, tmp_path / "lib")
    mpath = lib / "manifest.json"
    man = json.loads(mpath.read_text())
    if edit == "flip preferred":
        e = next(e for e in man["kernels"] if e["name"] == F32)
        e["preferred"] = not e["preferred"]
    elif edit == "mark best":       # the for_ops kernels (manifest "best") are covered too
        e = next(e for e in man["kernels"] if e["name"] == F32)
        e["best"] = "gemm"
    else:
        man["kernels"] = [e for e in man["kernels"] if e["name"] != I8MM]
    mpath.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and "kernel table" in got, got


def test_edited_packer_is_load_error(small_lib, tmp_path):
    lib = _copy(small_lib, tmp_path / "lib")
    _edit(lib, PACKER, lambda e: e.__setitem__("spec", "lhs:qsi8d32p:8x8:k16:s2"))
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and PACKER in got, got


# 4096: later pages of the mapped segments lie wholly past the end of the file (SIGBUS on
# access); "half": the last page is partly there; "-64": the section header table is cut
@pytest.mark.parametrize("keep", ["4096", "half", "-64"])
def test_truncated_library_with_fixed_sha_is_load_error(small_lib, tmp_path, keep):
    lib = _copy(small_lib, tmp_path / "lib")
    so = lib / "libtilegen.so"
    blob = so.read_bytes()
    size = {"4096": 4096, "half": len(blob) // 2, "-64": len(blob) - 64}[keep]
    so.write_bytes(blob[:size])
    mpath = lib / "manifest.json"
    man = json.loads(mpath.read_text())
    man["sha256"] = hashlib.sha256(so.read_bytes()).hexdigest()
    mpath.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    got = guest("max").call("guest_manifest:load_and_run", str(lib), F32)
    assert got.startswith("LoadError:") and "truncated" in got, got


def test_direct_call_without_the_isa_raises(small_lib):
    g = guest("cortex-a53")
    got = g.call("guest_manifest:call_direct", str(small_lib), I8MM)
    assert got.startswith("ArgumentError:") and "i8mm" in got, got
    assert g.call("guest_manifest:call_direct", str(small_lib), F32) == "ok"


def test_direct_packer_call_without_neon_raises(small_lib):
    """On a CPU without NEON (a CpuInfo given to load: TILEGEN_ISA features imply neon) the
    packers refuse like the kernels."""
    got = guest("max").call("guest_manifest:call_packer_direct", str(small_lib), PACKER, [])
    assert got.startswith("ArgumentError:") and "neon" in got, got


def test_macho_structure_is_checked(tmp_path):
    """The structural check of Mach-O dylibs (pure Python: runs on the host)."""
    from tilegen.runtime import LoadError
    from tilegen.runtime.integrity import check_image
    res = tilegen.build_library(["f32:neon:6x16"], target="apple-m1", out_dir=tmp_path)
    blob = res.library.read_bytes()
    check_image(blob, "macho", res.library.name)
    for size in (16, 4096, len(blob) // 2, len(blob) - 8):
        with pytest.raises(LoadError, match="truncated"):
            check_image(blob[:size], "macho", res.library.name)
    with pytest.raises(LoadError, match="not an ELF"):
        check_image(blob, "elf", res.library.name)


def test_library_carries_the_table_digest(small_lib):
    import subprocess
    from tilegen.generator.manifest import DIGEST_SYMBOL, table_digest
    man = json.loads((small_lib / "manifest.json").read_text())
    digest = table_digest(man["kernels"], man["packers"], man["format"], man["abi_probe"])
    assert digest.encode() in (small_lib / "libtilegen.so").read_bytes()
    syms = subprocess.run(["llvm-objdump-19", "-T", str(small_lib / "libtilegen.so")],
                          capture_output=True, text=True).stdout
    assert DIGEST_SYMBOL in syms


def test_load_runs_no_allocator_and_renders_nothing(small_lib):
    """Loading a library (and calling its kernels) reads the manifest and the spec strings: it
    never runs the register allocator or a renderer (the guest replaces them by functions
    that raise)."""
    got = guest("max").call("guest_manifest:load_without_generating", str(small_lib),
                            [F32, I8MM])
    assert got == "ok", got


def _entries(libdir: Path) -> dict:
    return json.loads((libdir / "manifest.json").read_text())


@pytest.mark.parametrize("field,value", [
    ("features", ["neon"]), ("vl_kind", "sme"), ("lhs", "qsi8d32p1x8"),
    ("getters.get_m_step.body", "4"),
    ("getters.get_rhs_packed_offset.body", "(n_idx / 4) * (k)"),
    ("tile.kr", 4)])
def test_edited_descriptor_is_load_error(small_lib, field, value):
    """A kernel entry's descriptor is what its spec derives: any edit is refused before the
    library is mapped (host: the check is pure Python), naming the field."""
    from tilegen.runtime import LoadError
    from tilegen.runtime.integrity import check_entries
    man = _entries(small_lib)
    e = next(e for e in man["kernels"] if e["name"] == I8MM)
    *path, last = ["descriptor"] + field.split(".")
    node = e
    for key in path:
        node = node[key]
    assert node[last] != value
    node[last] = value
    with pytest.raises(LoadError, match=f"{I8MM} has descriptor.{field}="):
        check_entries(man["kernels"], man["packers"], man["format"], "libtilegen.so")


def test_entries_give_each_kernel_its_descriptor(small_lib):
    """check_entries parses each spec once and hands the loader the descriptors (equal to
    the generator's for the checked spec) and the packer specs, in the manifest's order."""
    from tilegen.generator.descriptor import descriptor
    from tilegen.generator.manifest import parse_packer_spec
    from tilegen.runtime.integrity import check_entries
    man = _entries(small_lib)
    kernels, packers = check_entries(man["kernels"], man["packers"], man["format"], "lib")
    assert [d.name for d in kernels] == [e["name"] for e in man["kernels"]] == sorted([F32, I8MM])
    assert kernels == [descriptor(tilegen.parse_spec(e["spec"])) for e in man["kernels"]]
    assert packers == [parse_packer_spec(e["spec"]) for e in man["packers"]]


@pytest.mark.parametrize("spec", ["q4_0:i8mm:8x4:k16:s4", "q4_0:i8mm:6x4", "q4_0:i8mm:8x4:k12:s2"])
def test_spec_the_layouts_refuse_is_load_error(small_lib, spec):
    """An entry whose spec the layouts refuse is a LoadError naming the kernel (the loader
    asks the records and the layouts, not the register allocator)."""
    from tilegen.runtime import LoadError
    from tilegen.runtime.integrity import check_entries
    man = _entries(small_lib)
    next(e for e in man["kernels"] if e["name"] == I8MM)["spec"] = spec
    with pytest.raises(LoadError, match=f"{I8MM} has a bad spec"):
        check_entries(man["kernels"], man["packers"], man["format"], "libtilegen.so")
