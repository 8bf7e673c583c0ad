"""Mach-O (macOS arm64, the apple-* presets): the `--target apple-m4` export tree and library build
for `arm64-apple-macos` with clang and ld64.lld, without a macOS SDK or a Mac.

Covered: every `.c` and `.S` of the export tree compiles / assembles for arm64-apple-macos
(freestanding), with Mach-O symbol names (`_kai_...`; the tilegen kernels `.private_extern`) and
each kernel's `.arch` line; the objects link into a Mach-O dylib that exports every `kai_`
function llama.cpp references and needs nothing beyond what a freestanding C compilation takes
from libSystem; every header compiles as C++; the C header of an apple-m4 library build compiles
and a C client calling every prototype it declares links against the dylib; the dylib exports
exactly its manifest's symbols, their getters and the support symbols listed in SUPPORT.
Statically: no instruction names x18, the SME kernels use SVE/SME instructions only between
smstart and smstop and no AdvSIMD/FP between them, and every stack argument is 8 bytes (where
Darwin's ABI and AAPCS64 agree).  Not covered (no SDK, no Mac): the hosted branch of
`kai_common.h`, linking against libSystem, loading or running anything.
docs/export.md#mach-o-macos says more.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tilegen
from tilegen.build.cheader import getter_names
from tilegen.build.toolchain import discover
from tilegen.callconv import ABIS, PACKER_ABIS
from tilegen.cli import main
from tilegen.export import kleidiai as K
from tilegen.generator.manifest import DIGEST_SYMBOL
from tilegen.generator.render import ABI_PROBE, VL_QUERIES
from tilegen.records import ISAS

TARGET = "apple-m4"
MACOS = "--target=arm64-apple-macos14.0"
LD64 = ("-arch", "arm64", "-platform_version", "macos", "14.0", "14.0")
# What a freestanding C compilation may still reference on Darwin, all in libSystem: the stack
# protector (clang's default for Apple targets) and the four functions clang and GCC require of
# even a freestanding environment.
LIBSYSTEM = {"___stack_chk_fail", "___stack_chk_guard", "_memcpy", "_memmove", "_memset",
             "_memcmp", "_bzero"}
# The library's exports besides its kernels, packers and getters (names without Mach-O's "_").
SUPPORT = {
    "tilegen_manifest_sha256",                                         # table digest
    "tilegen_sve_vl_bytes", "tilegen_sme_svl_bytes", "tilegen_svcr",  # VL queries
    "tilegen_abi_call",                                               # ABI probe
    "tilegen_plan_call", "tilegen_plan_run", "tilegen_pool_worker",   # plan driver
    "tilegen_pool_wake", "tilegen_driver_abi", "tilegen_driver_sizes", "tilegen_driver_futex",
}
X18 = re.compile(r"\b[xw]18\b")
SVE_REG = re.compile(r"\b(?:z\d+|p\d+|pn\d+|za\w*|zt0)\b")    # SVE/SME operands
FP_REG = re.compile(r"\b[vqdshb]\d+\b")                        # AdvSIMD/FP operands


@functools.cache
def _tool(name: str) -> str:
    """clang and ld64.lld as tilegen's Mach-O discovery finds them, llvm-nm, llvm-objdump
    (scripts/setup.sh installs clang-19, lld-19, llvm-19): a missing one fails the test."""
    if name in ("cc", "ld"):
        tc = discover("macho")
        assert tc.linker and "ld64.lld" in Path(tc.linker[0]).name, tc.describe()
        return tc.driver[0] if name == "cc" else tc.linker[0]
    path = shutil.which(f"{name}-19") or shutil.which(name)
    assert path, f"needs {name} (scripts/setup.sh installs llvm-19)"
    return path


def _run(tool: str, *args) -> str:
    cmd = [_tool(tool), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout}\n{p.stderr}"
    return p.stdout


def _exports(dylib: Path) -> set[str]:
    """The dylib's export trie (what dyld binds), checked against its global symbol table."""
    trie = set(re.findall(r"^0x[0-9A-Fa-f]+\s+(\S+)$",
                          _run("llvm-objdump", "--macho", "--exports-trie", dylib), re.M))
    assert trie and trie == set(_run("llvm-nm", "-gU", "--format=just-symbols", dylib).split())
    return trie


def _undefined(path: Path) -> set[str]:
    return set(_run("llvm-nm", "-u", "--format=just-symbols", path).split())


def _x18_lines(path: Path) -> list[str]:
    return [ln for ln in _run("llvm-objdump", "-d", "--no-show-raw-insn", path).splitlines()
            if ln.startswith(" ") and X18.search(ln)]


def _streaming_faults(obj: Path) -> list[str]:
    """Instructions of an SME kernel, in layout order, that a CPU with SME but without SVE
    (apple-m4's features) or without FEAT_SME_FA64 would refuse: an SVE/SME register operand
    outside smstart..smstop, or an AdvSIMD/FP one (and no SVE/SME one) inside."""
    faults, streaming, seen = [], False, 0
    for ln in _run("llvm-objdump", "-d", "--no-show-raw-insn", obj).splitlines():
        parts = ln.split("\t")
        if len(parts) < 2 or not ln.startswith(" "):
            continue
        op, args = parts[1].strip(), parts[2] if len(parts) > 2 else ""
        if op in ("smstart", "smstop"):
            streaming, seen = op == "smstart", seen + 1
        elif SVE_REG.search(args) and not streaming:
            faults.append(f"outside streaming mode: {ln.strip()}")
        elif streaming and FP_REG.search(args) and not SVE_REG.search(args):
            faults.append(f"AdvSIMD/FP in streaming mode: {ln.strip()}")
    return faults if seen >= 2 else [f"{obj.name}: no smstart/smstop"]


# -- the export tree -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def export_objs(tmp_path_factory):
    """`tilegen export kleidiai --target apple-m4`, every source of its CMakeLists compiled for
    arm64-apple-macos (the tree's own C flags, -O2 and C99, plus -ffreestanding)."""
    base = tmp_path_factory.mktemp("macho_kai")
    root = base / "kleidiai"
    assert main(["export", "kleidiai", "--target", TARGET, "-o", str(root)]) == 0
    sources = re.findall(r"\$\{CMAKE_CURRENT_SOURCE_DIR\}/(\S+)",
                         (root / "CMakeLists.txt").read_text())
    (base / "obj").mkdir()

    def compile_one(rel: str) -> tuple[str, Path]:
        obj = base / "obj" / (Path(rel).name + ".o")
        flags = ["-ffreestanding", "-std=gnu99", "-O2", "-Wall", "-Werror"] \
            if rel.endswith(".c") else []
        _run("cc", MACOS, *flags, f"-I{root}", "-c", root / rel, "-o", obj)
        return rel, obj

    with ThreadPoolExecutor(max_workers=2) as ex:
        objs = dict(ex.map(compile_one, sources))
    return root, objs


def test_export_sources_build_for_macos(export_objs):
    root, objs = export_objs
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".c", ".S"))
    assert sorted(objs) == on_disk and len(on_disk) > 40
    hdr = _run("llvm-objdump", "--macho", "--private-header", *objs.values())
    assert hdr.count("MH_MAGIC_64   ARM64") == len(objs) and hdr.count(" OBJECT ") == len(objs)
    specs = {kk.kernel_spec.name: kk.kernel_spec
             for kk in K.kernels_for(TARGET) + list(K.KQUANT_KERNELS) if kk.spec}
    for rel, obj in objs.items():
        syms = re.findall(r"\) (external|private external) (\S+)$",
                          _run("llvm-nm", "-m", "--defined-only", obj), re.M)
        if rel.endswith(".c"):
            assert syms and all(v == "external" and s.startswith("_kai_") for v, s in syms), rel
            continue
        # one kernel under its hidden name (Mach-O's "_"; not exported from a dylib), assembled
        # from its own .arch line; the SME ones enter and leave streaming mode themselves
        spec = specs[Path(rel).stem[len("tilegen_"):]]
        assert syms == [("private external", f"_tilegen_{spec.name}")], rel
        assert f"\n    .arch {ISAS[spec.isa].arch}\n" in (root / rel).read_text(), rel
        if spec.isa in ("sme", "sme2"):
            assert _streaming_faults(obj) == [], rel
    assert {s.isa for s in specs.values()} == {"sme", "sme2", "dotprod", "i8mm"}


def test_export_links_into_a_dylib_with_llamas_symbols(export_objs, tmp_path):
    """ld64.lld links the objects into a Mach-O dylib: it exports every `kai_` function
    llama.cpp references (kai_symbols.txt) and no tilegen kernel, and leaves undefined only what
    libSystem provides (the link lets those through: there is no libSystem here to link)."""
    root, objs = export_objs
    dylib = tmp_path / "libkleidiai.dylib"
    _run("ld", "-dylib", *LD64, "-install_name", "@rpath/libkleidiai.dylib",
         "-undefined", "dynamic_lookup", "-o", dylib, *objs.values())
    assert "DYLIB" in _run("llvm-objdump", "--macho", "--private-header", dylib)
    exports = _exports(dylib)
    files = K.export_files(TARGET)
    assert not {f"_{s}" for s in K.function_symbols()} - exports
    assert exports <= {f"_{s}" for s in K.defined_functions(files)}
    assert not [s for s in exports if s.startswith("_tilegen")]
    assert _undefined(dylib) <= LIBSYSTEM
    assert _x18_lines(dylib) == []    # x18 is the platform register on macOS


def test_export_headers_compile_as_cpp_for_macos(export_objs, tmp_path):
    """llama.cpp includes the headers from C++ (kernels.cpp): all of them in one translation
    unit compile for arm64-apple-macos."""
    root, _ = export_objs
    headers = sorted(str(p.relative_to(root)) for p in root.rglob("*.h"))
    assert len(headers) > 30
    src = tmp_path / "all_headers.cpp"
    src.write_text("".join(f'#include "{h}"\n' for h in headers))
    _run("cc", MACOS, "-x", "c++", "-std=c++17", "-ffreestanding", "-fsyntax-only", "-Wall",
         "-Werror", f"-I{root}", src)


# -- the library of `tilegen build --target apple-m4` ----------------------------------------

@pytest.fixture(scope="module")
def apple_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("macho_lib")
    assert main(["build", "--target", TARGET, "-o", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "macho" and manifest["library"] == "libtilegen.dylib"
    return out, manifest


def _ctype_list(params: list[dict]) -> str:
    return ", ".join(p["ctype"] for p in params) or "void"


def _arg(ctype: str) -> str:
    return {"size_t": "(size_t)1", "float": "1.0f"}.get(ctype, f"({ctype})buf")


def test_header_and_a_client_build_for_macos(apple_lib, tmp_path):
    """tilegen_kernels.h compiles for arm64-apple-macos (C and C++); a C client calling every
    kernel, getter and packer it declares compiles, its prototypes have the manifest's parameter
    types, and it links (ld64.lld, undefined symbols are errors) against libtilegen.dylib."""
    out, man = apple_lib
    hdr = (out / "tilegen_kernels.h").read_text()
    protos = {name: [p.strip().rsplit(" ", 1)[0] for p in params.split(",") if p.strip() != "void"]
              for name, params in re.findall(r"^(?:void|size_t) (\w+)\(([^)]*)\);$", hdr, re.M)}
    fixed = [k for k in man["kernels"] if not tilegen.parse_spec(k["spec"]).vl_scaled]
    getters = [g for k in fixed for g in getter_names(tilegen.parse_spec(k["spec"]))]
    assert len(fixed) > 20 and len(fixed) < len(man["kernels"]) and len(getters) == 10 * len(fixed)
    assert sorted(protos) == sorted([k["name"] for k in fixed] + getters
                                    + [p["name"] for p in man["packers"]])
    lines = ['#include "tilegen_kernels.h"', "static unsigned char buf[64];",
             "size_t tilegen_macho_client(void) {", "    size_t s = 0;"]
    for entry in fixed + man["packers"]:
        ctypes = [p["ctype"] for p in entry["params"]]
        assert protos[entry["name"]] == ctypes, entry["name"]
        fn = entry["name"]
        lines.append(f"    _Static_assert(__builtin_types_compatible_p(__typeof__(&{fn}), "
                     f"void (*)({_ctype_list(entry['params'])})), \"{fn}\");")
    for name, ctypes in sorted(protos.items()):
        call = f"{name}({', '.join(_arg(c) for c in ctypes)})"
        lines.append(f"    s += {call};" if name in getters else f"    {call};")
    lines.append(f"    return s + {fixed[0]['name']}_ukernel.get_n_step();\n}}\n")
    src = tmp_path / "client.c"
    src.write_text("\n".join(lines))
    obj = tmp_path / "client.o"
    _run("cc", MACOS, "-std=c11", "-ffreestanding", "-O1", "-Wall", "-Wextra", "-Werror",
         f"-I{out}", "-c", src, "-o", obj)
    _run("cc", MACOS, "-x", "c++", "-std=c++17", "-ffreestanding", "-fsyntax-only", "-Wall",
         "-Werror", f"-I{out}", "-include", "tilegen_kernels.h", "/dev/null")
    assert _undefined(obj) == {f"_{n}" for n in protos}
    client = tmp_path / "libclient.dylib"
    _run("ld", "-dylib", *LD64, "-install_name", "@rpath/libclient.dylib", "-o", client,
         obj, out / "libtilegen.dylib")
    assert "@rpath/libtilegen.dylib" in _run("llvm-objdump", "--macho", "--dylibs-used",
                                             client)


def test_dylib_exports_are_the_manifest(apple_lib):
    """The dylib exports its manifest's kernels and packers (Mach-O names: "_" + name), the
    getters of the kernels the header declares, and the support symbols listed in SUPPORT —
    nothing else; it needs no symbol from elsewhere and no instruction names x18."""
    out, man = apple_lib
    lib = out / man["library"]
    entries = man["kernels"] + man["packers"]
    assert all(e["symbol"] == "_" + e["name"] for e in entries)
    getters = [g for k in man["kernels"] for g in getter_names(tilegen.parse_spec(k["spec"]))]
    expected = {e["symbol"] for e in entries} | {f"_{n}" for n in [*getters, *SUPPORT]}
    exports = _exports(lib)
    assert sorted(expected - exports) == [] and sorted(exports - expected) == []
    assert len(exports) == len(entries) + len(getters) + len(SUPPORT)
    # SUPPORT is what the runtime binds by name, plus the digest it checks at load
    runtime = Path(tilegen.__file__).parent / "runtime"
    bound = {n for f in ("driver.py", "library.py")
             for n in re.findall(r'"(tilegen_\w+)"', (runtime / f).read_text())}
    assert bound | {DIGEST_SYMBOL} == SUPPORT
    assert {ABI_PROBE, man["abi_probe"], *VL_QUERIES} <= SUPPORT
    assert _undefined(lib) == set()
    assert _x18_lines(lib) == []


def test_library_sme_kernels_keep_sve_in_streaming_mode(apple_lib):
    """apple-m4 has SME but no SVE: every SVE/SME instruction of the library's SME kernels lies
    between their smstart and smstop, and none in between is AdvSIMD/FP (see _streaming_faults)."""
    out, man = apple_lib
    sme = [k["name"] for k in man["kernels"]
           if tilegen.parse_spec(k["spec"]).isa in ("sme", "sme2")]
    assert len(sme) >= 10
    assert {n: _streaming_faults(out / "obj" / f"{n}.o") for n in sme} == {n: [] for n in sme}


def test_stack_arguments_fit_darwins_abi():
    """Darwin's arm64 ABI passes stack arguments at their natural size and alignment, AAPCS64
    in 8-byte slots; the generated routines read AAPCS64 slots (e.g. a packer's lhs_stride and
    lhs_packed at [sp] and [sp, #8]).  The two agree because every argument past x7 is 8 bytes
    and no convention has more than 8 floating-point arguments."""
    stacked = {}
    for abi in [*ABIS.values(), *PACKER_ABIS.values()]:
        fp = [c for c in abi.ctypes if c in ("float", "double")]
        gp = [c for c in abi.ctypes if c not in ("float", "double")]
        assert len(fp) <= 8, abi.name
        stacked[abi.name] = gp[8:]
    assert all(c == "size_t" or c.endswith("*") for c in sum(stacked.values(), [])), stacked
    assert {n for n, s in stacked.items() if s} >= {"f32", "q4", "lhs_bl", "lhs_rows"}
