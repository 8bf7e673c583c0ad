"""Dynamic AAPCS64 check: every kernel and packer through the ABI probe trampoline."""
from __future__ import annotations

import subprocess
import sys

import pytest

import tilegen
from tilegen.build import library as build_library_mod

from conftest import SME_ON, guest
from test_runtime_ops import all_lib  # noqa: F401 - shared session fixture


def _check(libdir, cpu, env=None):
    return guest(cpu, env=env).call("guest_calls:check_abi", str(libdir))


@pytest.mark.parametrize("cpu", ["cortex-a53", "neoverse-n1", "neoverse-v1", "max", "max-sme"])
def test_every_routine_preserves_callee_saved_state(all_lib, cpu):
    sme = cpu.endswith("-sme")
    res = _check(all_lib, cpu.removesuffix("-sme"), SME_ON if sme else None)
    assert res and all(v == [] for v in res.values()), {k: v for k, v in res.items() if v}
    if sme:   # every kernel and packer of the default library ran (SVCR checked for SME)
        import json
        man = json.loads((all_lib / "manifest.json").read_text())
        assert len(res) == len(man["kernels"]) + len(man["packers"])


def test_probe_catches_a_clobbering_kernel(tmp_path, monkeypatch):
    """A kernel whose epilogue forgets to restore x19/x20 is reported (the check can fail)."""
    real = build_library_mod.render

    def broken(spec, fmt):
        r = real(spec, fmt)
        text = r.text.replace("    ldp x19, x20, [sp, #0]\n", "    mov x19, #1\n    mov x20, #2\n", 1)
        return type(r)(r.spec, r.fmt, r.symbol, text)

    monkeypatch.setattr(build_library_mod, "render", broken)
    tilegen.build_library(["f32:neon:6x16"], out_dir=tmp_path)
    res = _check(tmp_path, "max")
    assert res["matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"] == ["x19", "x20"]


def test_cli_check_abi(all_lib):
    p = subprocess.run([sys.executable, "-m", "tilegen", "check-abi", str(all_lib)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "routines preserve x19-x28, d8-d15, sp, FPCR" in p.stdout
