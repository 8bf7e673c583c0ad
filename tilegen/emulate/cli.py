"""``tilegen emulate [--cpu MODEL] [--sve-vl BITS] [--sme-vl BITS] [--provision-only] [--quiet]
-- CMD...``: run CMD on an emulated aarch64 CPU (``python`` in CMD is the guest Python)."""
from __future__ import annotations

import argparse
import subprocess
import sys

from .provision import ProvisionError, ensure
from .runner import CPU_MODELS, EmulateError, guest_command, validate

__all__ = ["emulate_main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tilegen emulate",
        usage="%(prog)s [-h] [--cpu MODEL] [--sve-vl BITS] [--sme-vl BITS] [--quiet]\n"
              "                       (--provision-only | -- CMD...)",
        description="Run CMD on an emulated aarch64 CPU (qemu-user; native on aarch64 hosts). "
                    "`python` as CMD is the guest Python, which sees tilegen, numpy, pytest, "
                    "hypothesis, jinja2 and gguf. Tools are provisioned into the cache on first "
                    "use.",
        epilog="example: tilegen emulate --cpu max --sve-vl 512 -- python -m pytest tests")
    p.add_argument("--cpu", default="max", metavar="MODEL",
                   help=f"CPU model (default max): {', '.join(CPU_MODELS)}")
    p.add_argument("--sve-vl", type=int, metavar="BITS", help="SVE vector length in bits")
    p.add_argument("--sme-vl", type=int, metavar="BITS", help="SME streaming vector length in bits")
    p.add_argument("--provision-only", action="store_true",
                   help="only provision the tools (and print where they are)")
    p.add_argument("--quiet", action="store_true", help="no provisioning progress messages")
    return p


def emulate_main(argv: list[str], prog: str = "tilegen emulate") -> int:
    """Parse ``argv`` (everything after ``--`` is CMD) and return CMD's exit code.

    A CMD killed by signal N returns 128+N, as a shell reports it; usage errors return 2 and
    provisioning failures 1.  ``prog``: the command named in error messages (a subcommand that
    runs itself in the emulator names itself).
    """
    argv = list(argv)
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    p = _parser()
    try:  # argparse exits on --help and on usage errors; return its code instead
        a = p.parse_args(argv)
        if bool(cmd) == a.provision_only:
            p.error("give either `-- CMD...` or --provision-only")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    try:
        validate(a.cpu, a.sve_vl, a.sme_vl)  # before provisioning: bad options fail fast
        tb = ensure(quiet=a.quiet)
        if a.provision_only:
            if not a.quiet:
                for k, v in vars(tb).items():
                    print(f"{k}: {v}")
            return 0
        host_cmd, env = guest_command(cmd, a.cpu, a.sve_vl, a.sme_vl, toolbox=tb)
    except EmulateError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except ProvisionError as e:
        print(f"{prog}: provisioning failed: {e}", file=sys.stderr)
        return 1
    try:
        rc = subprocess.run(host_cmd, env=env).returncode
    except OSError as e:
        print(f"{prog}: cannot run {host_cmd[0]!r}: {e}", file=sys.stderr)
        return 127
    return 128 - rc if rc < 0 else rc
