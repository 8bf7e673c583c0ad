"""Build and run command lines that execute on an emulated (qemu-user) or native aarch64 CPU.

``python``/``python3``/``python3.11`` as ``argv[0]`` means the guest (aarch64) Python; any other
``argv[0]`` is an aarch64 ELF run under qemu directly. The guest sees this tilegen package
(through the toolbox's shim dir) and the guest wheels, never the host's x86 site-packages.

Note: the guest cannot ``execve`` another aarch64 binary (this machine has no binfmt_misc entry
for it), so e.g. ``subprocess.run([sys.executable, ...])`` inside the guest fails with ENOEXEC;
host (x86-64) binaries can be run from the guest.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .provision import Toolbox, ensure, is_native

__all__ = ["CPU_MODELS", "QEMU_CPU_MODELS", "HOST_CPU", "SVE_VECTOR_LENGTHS",
           "SME_VECTOR_LENGTHS", "EmulateError", "validate", "guest_command", "run"]

#: CPU models of qemu-user 11.x (``qemu-aarch64 -cpu help``).
QEMU_CPU_MODELS: tuple[str, ...] = (
    "a64fx", "cortex-a35", "cortex-a53", "cortex-a55", "cortex-a57", "cortex-a710", "cortex-a72",
    "cortex-a76", "cortex-a78ae", "max", "neoverse-n1", "neoverse-n2", "neoverse-v1")
#: Run natively (aarch64 hosts only).
HOST_CPU = "host"
CPU_MODELS: tuple[str, ...] = QEMU_CPU_MODELS + (HOST_CPU,)

_POW2_VLS = (128, 256, 512, 1024, 2048)
#: SVE vector lengths (bits) each qemu model implements; the first listed default is qemu's:
#: max 512, a64fx 512, neoverse-v1 256, neoverse-n2 and cortex-a710 128. Measured with
#: prctl(PR_SVE_GET_VL) in the guest: qemu silently rounds an unsupported request down to the
#: next length the model has (and ``max`` even takes non-powers of two such as 384), so tilegen
#: checks the request itself rather than rely on qemu.
SVE_VECTOR_LENGTHS: dict[str, tuple[int, ...]] = {
    "max": _POW2_VLS,
    "a64fx": (128, 256, 512),
    "neoverse-v1": (128, 256),
    "neoverse-n2": (128,),
    "cortex-a710": (128,),
}
#: SME streaming vector lengths (bits); only ``max`` has SME (default 256).
SME_VECTOR_LENGTHS: dict[str, tuple[int, ...]] = {"max": _POW2_VLS}

_GUEST_PYTHON_NAMES = ("python", "python3", "python3.11")


class EmulateError(ValueError):
    """An invalid CPU model or vector length for the emulated (or native) CPU."""


def _check_vl(kind: str, bits: int | None, cpu: str, table: Mapping[str, tuple[int, ...]]) -> None:
    if bits is None:
        return
    if isinstance(bits, bool) or not isinstance(bits, int) or bits not in _POW2_VLS:
        raise EmulateError(f"{kind} vector length {bits!r} is invalid: give bits, a power of two "
                           f"from 128 to 2048 ({', '.join(map(str, _POW2_VLS))})")
    if cpu not in table:
        raise EmulateError(f"cpu {cpu!r} has no {kind}, so no {kind} vector length can be set; "
                           f"models with {kind}: {', '.join(table)}")
    if bits not in table[cpu]:
        raise EmulateError(f"cpu {cpu!r} implements {kind} vector lengths "
                           f"{', '.join(map(str, table[cpu]))} bits, not {bits}")


def _native_vl(kind: str) -> int | None:
    """The default vector length (bits) new processes get on this aarch64 Linux host."""
    try:
        return int(Path(f"/proc/sys/abi/{kind}_default_vector_length").read_text()) * 8
    except (OSError, ValueError):
        return None


def validate(cpu: str, sve_vl: int | None = None, sme_vl: int | None = None) -> None:
    """Raise EmulateError unless ``cpu`` with these vector lengths (bits) can run here."""
    if is_native():
        if cpu not in (HOST_CPU, "max"):
            raise EmulateError(f"cpu {cpu!r} cannot be emulated on this aarch64 host: it runs "
                               f"natively, so only {HOST_CPU!r} (or 'max') is valid")
        for kind, bits in (("sve", sve_vl), ("sme", sme_vl)):
            have = _native_vl(kind)
            if bits is not None and bits != have:
                raise EmulateError(
                    f"this aarch64 host runs natively with "
                    f"{f'{kind.upper()} vector length {have} bits' if have else f'no {kind.upper()}'}"
                    f" and cannot give {bits}; omit the {kind.upper()} vector length")
        return
    if cpu not in QEMU_CPU_MODELS:
        extra = f" ({HOST_CPU!r} is only valid on an aarch64 host)" if cpu == HOST_CPU else ""
        raise EmulateError(f"unknown cpu model {cpu!r}{extra}; valid models: "
                           f"{', '.join(QEMU_CPU_MODELS)}")
    _check_vl("SVE", sve_vl, cpu, SVE_VECTOR_LENGTHS)
    _check_vl("SME", sme_vl, cpu, SME_VECTOR_LENGTHS)


def guest_command(argv: Sequence[str], cpu: str = "max", sve_vl: int | None = None,
                  sme_vl: int | None = None, env: Mapping[str, str] | None = None,
                  toolbox: Toolbox | None = None) -> tuple[list[str], dict[str, str]]:
    """Host argv and environment that run ``argv`` on CPU model ``cpu``.

    ``sve_vl``/``sme_vl`` are vector lengths in bits (None: the model's default). ``env`` holds
    variables added to this process's environment for the guest; the host's ``PYTHONPATH``,
    ``PYTHONHOME`` and ``PYTHONDONTWRITEBYTECODE`` are dropped (x86 paths; bytecode caching
    speeds emulated imports), and a ``PYTHONPATH`` given in ``env`` comes after the shim and
    guest site dirs. ``toolbox`` defaults to :func:`ensure()` (provisioning on first use).
    Raises EmulateError for an invalid model or vector length, before any provisioning.
    """
    argv = list(argv)
    if not argv:
        raise EmulateError("no command given")
    validate(cpu, sve_vl, sme_vl)
    tb = toolbox if toolbox is not None else ensure()

    genv = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE"):
        genv.pop(var, None)
    extra = dict(env or {})
    paths = [str(tb.shim), str(tb.site)]
    if extra.get("PYTHONPATH"):
        paths.append(extra.pop("PYTHONPATH"))
    genv.update(extra)
    genv.update(PYTHONPATH=os.pathsep.join(paths), PYTHONNOUSERSITE="1",
                TILEGEN_EMULATED_CPU=HOST_CPU if tb.qemu is None else cpu)

    if argv[0] in _GUEST_PYTHON_NAMES:
        argv[0] = str(tb.python)
    if tb.qemu is None:  # native aarch64 host
        return argv, genv
    spec = cpu
    if sve_vl is not None:
        spec += f",sve-default-vector-length={sve_vl // 8}"
    if sme_vl is not None:
        spec += f",sme-default-vector-length={sme_vl // 8}"
    assert tb.sysroot is not None
    return [str(tb.qemu), "-L", str(tb.sysroot), "-cpu", spec, *argv], genv


def run(argv: Sequence[str], cpu: str = "max", sve_vl: int | None = None,
        sme_vl: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` on the (emulated) CPU; return its exit code (negative: killed by signal)."""
    cmd, genv = guest_command(argv, cpu, sve_vl, sme_vl, env)  # validates, then ensure()s
    return subprocess.run(cmd, env=genv).returncode
