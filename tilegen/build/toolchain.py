"""Toolchain discovery: find something that assembles AArch64 `.S` and links a shared library.

Order (first that works wins):
1. ``TILEGEN_CC`` / ``--cc`` (a compiler driver command line, e.g. ``"clang-19"``),
2. the native ``cc`` when host and target are both aarch64 Linux,
3. ``clang`` (any version >= 15; ``clang``, ``clang-NN``) with ``--target`` and lld,
4. ``aarch64-linux-gnu-gcc`` (ELF only),
5. ``python -m ziglang cc``.
"""
from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ToolchainError", "Toolchain", "discover", "CLANG_MIN"]

CLANG_MIN = 15
_INSTALL_HINT = ("install one: `apt-get install clang-19 lld-19` (Debian/Ubuntu), "
                 "`apt-get install gcc-aarch64-linux-gnu` (ELF only), or `pip install ziglang`; "
                 "or point TILEGEN_CC / --cc at an AArch64-capable compiler driver")


class ToolchainError(RuntimeError):
    """No usable toolchain, or the toolchain failed."""


@dataclass(frozen=True)
class Toolchain:
    kind: str                      # "clang", "gcc", "zig", "cc", "custom"
    driver: tuple[str, ...]        # compiler driver argv prefix
    fmt: str                       # "elf" or "macho"
    version: str                   # first line of `--version`
    target_flags: tuple[str, ...] = ()
    link_flags: tuple[str, ...] = field(default=())
    linker: tuple[str, ...] = ()   # when set, the linker is called directly (Mach-O via ld64.lld)

    def describe(self) -> dict:
        return {"kind": self.kind, "driver": " ".join(self.driver), "version": self.version,
                "target_flags": list(self.target_flags), "link_flags": list(self.link_flags),
                "linker": " ".join(self.linker)}

    def assemble_cmd(self, src: Path, obj: Path, *extra: str) -> list[str]:
        """Assemble a .S (or, with ``extra`` flags, compile a freestanding .c) to an object."""
        return [*self.driver, *self.target_flags, *extra, "-c", str(src), "-o", str(obj)]

    def link_cmd(self, objs: list[Path], out: Path) -> list[str]:
        if self.linker:
            return [*self.linker, *self.link_flags, "-o", str(out), *map(str, objs)]
        return [*self.driver, *self.target_flags, *self.link_flags, "-o", str(out),
                *map(str, objs)]


def _version(argv: list[str], flag: str = "--version") -> str | None:
    try:
        p = subprocess.run([*argv, flag], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    out = (p.stdout or p.stderr).strip().splitlines()
    return out[0].strip() if out else "unknown"


def _clang_major(version: str) -> int | None:
    m = re.search(r"clang version (\d+)", version)
    return int(m.group(1)) if m else None


def _host_is_aarch64_linux() -> bool:
    return sys.platform.startswith("linux") and platform.machine() in ("aarch64", "arm64")


def _clang_candidates() -> list[str]:
    names = ["clang"] + [f"clang-{v}" for v in range(30, CLANG_MIN - 1, -1)]
    return [n for n in names if shutil.which(n)]


def _lld_for(clang: str, fmt: str) -> str | None:
    """Path of the lld flavour a clang should use, preferring the matching version."""
    suffix = clang[len("clang"):]  # "" or "-19"
    flavour = "ld.lld" if fmt == "elf" else "ld64.lld"
    names = [flavour + suffix, flavour] + [f"{flavour}-{v}" for v in range(30, CLANG_MIN - 1, -1)]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    # clang's own install dir (Debian: /usr/lib/llvm-NN/bin)
    real = Path(shutil.which(clang) or clang).resolve().parent
    cand = real / flavour
    return str(cand) if cand.exists() else None


def _target_flags(kind: str, fmt: str) -> tuple[str, ...]:
    if kind in ("clang", "custom-clang"):
        return ("--target=aarch64-linux-gnu",) if fmt == "elf" else ("--target=arm64-apple-macos11",)
    if kind == "zig":
        return ("-target", "aarch64-linux-gnu") if fmt == "elf" else ("-target", "aarch64-macos")
    return ()


def _link_flags(kind: str, fmt: str, lld: str | None = None) -> tuple[str, ...]:
    common = ("-shared", "-nostdlib")
    if fmt == "macho":
        common = ("-dynamiclib", "-nostdlib", "-Wl,-undefined,error")
    if kind in ("clang", "custom-clang") and lld:
        return (*common, f"-fuse-ld={lld}", "-Wl,--build-id=none" if fmt == "elf" else "-Wl,-S")
    if kind == "gcc":
        return (*common, "-Wl,--build-id=none")
    return common


_MACHO_LLD_FLAGS = ("-dylib", "-arch", "arm64", "-platform_version", "macos", "11.0", "11.0",
                    "-install_name", "@rpath/libtilegen.dylib")


def discover(fmt: str = "elf", cc: str | None = None) -> Toolchain:
    """Find a toolchain for object format ``fmt`` or raise :class:`ToolchainError`."""
    if fmt not in ("elf", "macho"):
        raise ToolchainError(f"unknown object format {fmt!r}")
    tried: list[str] = []
    user = cc or os.environ.get("TILEGEN_CC")
    if user:
        argv = shlex.split(user)
        ver = _version(argv)
        if ver is None:
            raise ToolchainError(f"TILEGEN_CC/--cc={user!r} does not run (`{user} --version` failed)")
        kind = "custom-clang" if "clang" in ver else ("zig" if "zig" in user else "custom")
        base = Path(argv[0]).name
        lld = _lld_for(base if base.startswith("clang") else "clang", fmt) \
            if kind == "custom-clang" else None
        if fmt == "macho" and lld:
            return Toolchain("custom", tuple(argv), fmt, ver, _target_flags(kind, fmt),
                             _MACHO_LLD_FLAGS, linker=(lld,))
        return Toolchain("custom", tuple(argv), fmt, ver, _target_flags(kind, fmt),
                         _link_flags(kind, fmt, lld))
    if fmt == "elf" and _host_is_aarch64_linux() and shutil.which("cc"):
        ver = _version(["cc"])
        if ver:
            return Toolchain("cc", ("cc",), fmt, ver, (), _link_flags("gcc", fmt))
        tried.append("cc (native)")
    for clang in _clang_candidates():
        ver = _version([clang])
        major = _clang_major(ver or "")
        if not ver or major is None or major < CLANG_MIN:
            tried.append(f"{clang} ({ver or 'does not run'}; need >= {CLANG_MIN})")
            continue
        lld = _lld_for(clang, fmt)
        if not lld:
            tried.append(f"{clang} (no {'ld.lld' if fmt == 'elf' else 'ld64.lld'} found)")
            continue
        if fmt == "macho":  # the clang driver on Linux cannot drive ld64.lld for Darwin
            return Toolchain("clang", (clang,), fmt, ver, _target_flags("clang", fmt),
                             _MACHO_LLD_FLAGS, linker=(lld,))
        return Toolchain("clang", (clang,), fmt, ver, _target_flags("clang", fmt),
                         _link_flags("clang", fmt, lld))
    if fmt == "elf" and shutil.which("aarch64-linux-gnu-gcc"):
        ver = _version(["aarch64-linux-gnu-gcc"])
        if ver:
            return Toolchain("gcc", ("aarch64-linux-gnu-gcc",), fmt, ver, (), _link_flags("gcc", fmt))
    tried.append("aarch64-linux-gnu-gcc")
    zig = [sys.executable, "-m", "ziglang", "cc"]
    ver = _version([sys.executable, "-m", "ziglang"], "version") if _has_module("ziglang") else None
    if ver:
        return Toolchain("zig", tuple(zig), fmt, f"zig {ver}", _target_flags("zig", fmt),
                         _link_flags("zig", fmt))
    tried.append("python -m ziglang")
    raise ToolchainError(f"no AArch64 toolchain found (tried: {'; '.join(tried)}); {_INSTALL_HINT}")


def _has_module(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None
