"""The generated C header and getters: compile a C client for aarch64, link it to the library,
run it under qemu."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import tilegen
from tilegen.emulate.provision import ensure
from tilegen.emulate.runner import guest_command

CLANG = shutil.which("clang-19")
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def lib_with_header(tmp_path_factory):
    out = tmp_path_factory.mktemp("clib")
    tilegen.build_library(["f32:neon:6x16", "q4_0:i8mm:16x4", "q4_0_dx:dotprod:1x4"],
                          target="linux-aarch64-all", out_dir=out)
    return out


def test_header_declares_every_kernel_and_getter(lib_with_header):
    h = (lib_with_header / "tilegen_kernels.h").read_text()
    import json
    man = json.loads((lib_with_header / "manifest.json").read_text())
    for k in man["kernels"]:
        assert f"void {k['name']}(" in h and f"{k['name']}_ukernel" in h
        for g in ("get_m_step", "get_n_step", "get_mr", "get_nr", "get_kr", "get_sr",
                  "get_rhs_packed_offset", "get_dst_offset", "get_dst_size"):
            assert f"size_t {g}_{k['name']}(" in h
    from tilegen.generator.manifest import parse_packer_spec
    for p in man["packers"]:
        assert parse_packer_spec(p["spec"]).c_signature in h


@pytest.mark.parametrize("cpu", ["neoverse-n1", "max"])
def test_c_client_runs_under_qemu(lib_with_header, tmp_path, cpu):
    assert CLANG, "needs clang-19 (scripts/setup.sh installs it)"
    exe = tmp_path / "use_header"
    cmd = [CLANG, "--target=aarch64-linux-gnu", "-O1", "-ffreestanding", "-nostdlib",
           "-fno-stack-protector", "-fuse-ld=lld", "-Wl,--dynamic-linker=/lib/ld-linux-aarch64.so.1",
           f"-I{lib_with_header}", f"-L{lib_with_header}", f"-Wl,-rpath,{lib_with_header}",
           str(HERE / "c" / "use_header.c"), "-ltilegen", "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    argv, env = guest_command([str(exe)], cpu=cpu, toolbox=ensure(quiet=True))
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"C client exit code {r.returncode}: {r.stderr}"


def test_getters_agree_with_layouts():
    """The C getters are generated from the same stride expressions the layouts evaluate."""
    from tilegen.build.cheader import getters_c
    from tilegen.layout import lhs_layout_for, rhs_layout_for
    spec = tilegen.parse_spec("q4_0_dx:i8mm:8x4")
    src = getters_c([spec])
    assert rhs_layout_for(spec).stride_expr.replace("//", "/") in src
    assert lhs_layout_for(spec).stride_expr.replace("//", "/") in src
