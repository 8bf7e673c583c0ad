import subprocess
import sys

import pytest

from tilegen.emulate.remote import GuestCrashed, GuestError, GuestSession, GuestTimeout
from tilegen.emulate.runner import EmulateError, validate


def _emulate(*args):
    return subprocess.run([sys.executable, "-m", "tilegen", "emulate", *args],
                          capture_output=True, text=True)


def test_emulate_prints_aarch64():
    p = _emulate("--cpu", "cortex-a53", "--", "python", "-c",
                 "import tilegen, platform; print(platform.machine())")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "aarch64"


def test_exit_code_is_returned():
    p = _emulate("--cpu", "neoverse-n1", "--", "python", "-c", "import sys; sys.exit(7)")
    assert p.returncode == 7


def test_vector_lengths_reach_the_guest():
    code = ("import ctypes; l = ctypes.CDLL(None); l.prctl.restype = ctypes.c_int; "
            "print(l.prctl(51, 0, 0, 0, 0) & 0xffff)")   # PR_SVE_GET_VL -> bytes
    p = _emulate("--cpu", "max", "--sve-vl", "256", "--sme-vl", "512", "--", "python", "-c", code)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "32"


@pytest.mark.parametrize("args,match", [
    (("--cpu", "pentium"), "pentium"),
    (("--cpu", "max", "--sve-vl", "384"), "384"),
    (("--cpu", "cortex-a53", "--sve-vl", "256"), "cortex-a53"),
    (("--cpu", "neoverse-v1", "--sme-vl", "256"), "neoverse-v1"),
])
def test_bad_model_or_vl(args, match):
    p = _emulate(*args, "--", "python", "-c", "pass")
    assert p.returncode == 2 and match in p.stderr
    with pytest.raises(EmulateError, match=match):
        cpu = args[1]
        sve = int(args[3]) if "--sve-vl" in args else None
        sme = int(args[3]) if "--sme-vl" in args else None
        validate(cpu, sve, sme)


def test_guest_session_errors_and_crash_recovery():
    with GuestSession("cortex-a53") as g:
        assert g.call("platform:machine") == "aarch64"
        with pytest.raises(GuestError) as e:
            g.call("math:sqrt", -1.0)
        assert e.value.type_name == "ValueError"
        with pytest.raises(GuestCrashed, match="signal 6"):
            g.call("os:abort")
        assert g.call("operator:add", 2, 3) == 5      # a fresh guest after the crash
        with pytest.raises(GuestTimeout, match="within 1 s"):
            g.call_with_timeout(1, "time:sleep", 60)
        assert g.call_with_timeout(60, "operator:add", 2, 3) == 5   # a fresh guest again
