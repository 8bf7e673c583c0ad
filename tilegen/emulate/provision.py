"""Provision the tools that run Arm64 code on a non-Arm host, into a per-user cache.

Three steps, each done once (a stamp file marks it complete, so later calls are offline):

1. ``qemu``: qemu-user 11.x from Debian sid (a static-pie build that runs on bookworm).
2. ``sysroot``: an aarch64 Debian bookworm root with ``python3.11`` (``dpkg -x`` of arm64 .debs).
3. ``wheels``: PyPI aarch64 wheels (numpy, pytest, hypothesis, jinja2, gguf and their
   dependencies), unzipped
   into one guest ``site`` directory.

apt runs with a private state (sources list, lists, archives, ``status``) under the cache, so
the machine's own apt configuration and dpkg database are never touched. The Debian mirror is
taken from the machine's apt sources. Each step builds in a temporary directory that is
renamed into place, and a file lock serialises concurrent callers.

Besides: the arm64 cross-build sysroot (``ensure_cross_sysroot``), llama.cpp's source
(``ensure_llama_cpp_source``) and the real KleidiAI from a release tarball the caller names
(``ensure_kleidiai_source``; ``ensure_kleidiai_library`` builds it for aarch64 with its own CMake),
each the same way (temporary directory, stamp, rename, lock).

On an aarch64 host nothing is emulated: the running interpreter is the guest Python.
"""
from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NUMPY_VERSION", "GUEST_WHEELS", "QEMU_MIN_VERSION", "CROSS_SYSROOT_PACKAGES",
           "LLAMA_CPP_PYTHON_VERSION", "Toolbox", "ProvisionError", "cache_dir", "ensure",
           "ensure_cross_sysroot", "ensure_llama_cpp_source", "is_native", "KLEIDIAI_SHA256",
           "KLEIDIAI_CMAKE_FLAGS", "KleidiAI", "ensure_kleidiai_source", "ensure_kleidiai_library",
           "cross_cmake_toolchain"]

NUMPY_VERSION = "2.4.6"
#: Requirements installed into the guest site dir (pip resolves their dependencies).
#: hypothesis: the runtime's stateful property test (tests/guest_state.py) runs in the guest.
GUEST_WHEELS: tuple[str, ...] = (f"numpy=={NUMPY_VERSION}", "pytest", "jinja2", "gguf",
                                 "hypothesis")
#: qemu-user older than this lacks SME2.
QEMU_MIN_VERSION = 11
GUEST_PYTHON_VERSION = "3.11"
_WHEEL_PLATFORMS = ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "manylinux_2_17_aarch64")
# libstdc++6: numpy's wheel links it (manylinux leaves it to the system)
_SYSROOT_PACKAGES = ("python3-minimal", "python3", "libstdc++6")
#: Debian bookworm arm64 packages of the C/C++ cross-build sysroot (``ensure_cross_sysroot``):
#: headers, crt files and libraries that ``clang --target=aarch64-linux-gnu --sysroot`` links
#: against (gcc 12's libstdc++ and libgcc, as on a bookworm arm64 machine).
CROSS_SYSROOT_PACKAGES: tuple[str, ...] = ("libc6-dev", "linux-libc-dev", "libstdc++-12-dev",
                                           "libgcc-12-dev")
#: llama-cpp-python release whose sdist vendors the llama.cpp that is tilegen's client
#: (``ensure_llama_cpp_source``: its ggml KleidiAI glue, and scripts/llama_cpp_check.sh's builds).
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_STAMP = ".tilegen-complete"
#: The guest site dir is named after its requirement list, so changing GUEST_WHEELS
#: provisions a new one instead of reusing a stale cache.
_SITE = "site-" + __import__("hashlib").sha256(" ".join(GUEST_WHEELS).encode()).hexdigest()[:10]
_APT_SOURCE_FILES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


class ProvisionError(RuntimeError):
    """A provisioning step failed; the message says what failed and what to do."""


@dataclass(frozen=True)
class Toolbox:
    """Everything needed to run a command on an (emulated) aarch64 CPU."""

    qemu: Path | None          #: qemu-aarch64 binary (None on a native aarch64 host)
    sysroot: Path | None       #: aarch64 root for ``qemu -L`` (None on a native host)
    python: Path               #: the aarch64 python3.11 binary (sys.executable on a native host)
    site: Path                 #: guest site dir holding the unzipped wheels
    shim: Path                 #: dir whose only entry is a ``tilegen`` symlink to this package
    qemu_version: str | None   #: e.g. "11.1.3"


def is_native() -> bool:
    """True when this host is itself aarch64 (no emulation needed)."""
    return platform.machine().lower() in ("aarch64", "arm64")


def cache_dir() -> Path:
    """``$TILEGEN_CACHE``, else ``$XDG_CACHE_HOME/tilegen``, else ``~/.cache/tilegen``."""
    if os.environ.get("TILEGEN_CACHE"):
        return Path(os.environ["TILEGEN_CACHE"]).expanduser().absolute()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser().absolute() / "tilegen"
    return Path.home() / ".cache" / "tilegen"


# ---------------------------------------------------------------------------------------------
# small helpers

def _logger(quiet: bool) -> Callable[[str], None]:
    def log(msg: str) -> None:
        if not quiet:
            print(f"tilegen: {msg}", file=sys.stderr, flush=True)
    return log


def _run(cmd: list[str], what: str, hint: str, *, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` capturing its output, or raise ProvisionError with the output's tail."""
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, errors="replace")
    except OSError as e:
        raise ProvisionError(f"{what} failed: cannot run {cmd[0]!r} ({e}). {hint}") from None
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise ProvisionError(f"{what} failed (exit {p.returncode}):\n{tail}\n{hint}")
    return p


def _tree_size(path: Path) -> int:
    """Disk usage of ``path`` in bytes (like ``du``: allocated blocks, symlinks not followed)."""
    total = 0
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"


@contextmanager
def _locked(lock_path: Path, log: Callable[[str], None]) -> Iterator[None]:
    with open(lock_path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another tilegen process to finish provisioning ({lock_path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read_stamp(target: Path) -> str | None:
    try:
        return (target / _STAMP).read_text().strip()
    except OSError:
        return None


def _build_step(root: Path, name: str, build: Callable[[Path], str],
                log: Callable[[str], None]) -> str:
    """Build step ``name`` in a temp dir, stamp it, and rename it to ``root/name`` atomically."""
    target = root / name
    if target.exists():  # an unstamped leftover (cannot normally happen: the rename is atomic)
        shutil.rmtree(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    t0 = time.monotonic()
    try:
        stamp = build(tmp)
        (tmp / _STAMP).write_text(stamp + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"{name}: done in {time.monotonic() - t0:.1f} s ({_mib(_tree_size(target))})")
    return stamp


def _ensure_step(root: Path, name: str, step: Callable[[], Callable[[Path], str]],
                 log: Callable[[str], None], leftovers: tuple[str, ...] = ()) -> bool:
    """Build step ``root/name`` once: unless it is stamped, take ``root``'s lock, look again,
    clear what an interrupted run left (``.tmp-<name>-*`` and the ``leftovers`` patterns: we
    hold the lock) and build it with ``step()``'s function.  True when this call built it."""
    if _read_stamp(root / name) is not None:
        return False
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock", log):
        if _read_stamp(root / name) is not None:
            return False
        for pattern in (f".tmp-{name}-*", *leftovers):
            for leftover in root.glob(pattern):
                shutil.rmtree(leftover, ignore_errors=True)
        _build_step(root, name, step(), log)
        return True


def _unpack_top(archive: Path, tmp: Path, top: str, required: tuple[str, ...],
                what: str) -> None:
    """Extract ``archive`` into ``tmp`` and make its top directory ``top`` the tree at
    ``tmp``; ProvisionError unless every ``required`` path (relative to ``top``) is there."""
    with tarfile.open(archive) as t:
        t.extractall(tmp, filter="data")
    root = tmp / top
    if not all((root / r).exists() for r in required):
        raise ProvisionError(f"{archive} holds no {top}/ with {what}")
    for entry in root.iterdir():
        os.rename(entry, tmp / entry.name)
    root.rmdir()


# ---------------------------------------------------------------------------------------------
# apt with a private state

@dataclass(frozen=True)
class _AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def _parse_apt_sources() -> list[_AptSource]:
    """The machine's enabled ``deb`` sources (one-line ``.list`` and deb822 ``.sources``)."""
    files: list[Path] = []
    for p in _APT_SOURCE_FILES:
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix in (".list", ".sources"))
        elif p.is_file():
            files.append(p)
    out: list[_AptSource] = []
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for para in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                key = None
                for line in para.splitlines():
                    if not line.strip() or line.lstrip().startswith("#"):
                        continue
                    if line[0].isspace() and key:
                        fields[key] += " " + line.strip()
                    elif ":" in line:
                        key, _, val = line.partition(":")
                        key = key.strip().lower()
                        fields[key] = val.strip()
                if "deb" not in fields.get("types", "").split() or \
                        fields.get("enabled", "yes").lower() == "no":
                    continue
                for uri in fields.get("uris", "").split():
                    out.append(_AptSource(uri.rstrip("/"), tuple(fields.get("suites", "").split()),
                                          tuple(fields.get("components", "").split())))
        else:
            for line in text.splitlines():
                line = re.sub(r"\[[^\]]*\]", " ", line.split("#", 1)[0]).split()
                if len(line) >= 3 and line[0] == "deb":
                    out.append(_AptSource(line[1].rstrip("/"), (line[2],), tuple(line[3:])))
    return out


def _debian_mirrors() -> tuple[str, str | None]:
    """(Debian archive URI, Debian security URI or None) from the machine's apt sources."""
    sources = _parse_apt_sources()
    main = next((s.uri for s in sources if "main" in s.components
                 and not any(x.endswith("-security") or "/" in x for x in s.suites)), None)
    security = next((s.uri for s in sources if any(x.endswith("-security") for x in s.suites)),
                    None)
    if main is None:
        raise ProvisionError("no Debian mirror found: none of /etc/apt/sources.list, "
                             "/etc/apt/sources.list.d/*.{list,sources} has an enabled `deb` entry "
                             "with component `main`. Add the machine's Debian mirror there.")
    return main, security


class _PrivateApt:
    """apt-get with its own sources list, lists, archives, cache and (empty) dpkg status."""

    def __init__(self, state: Path, sources: list[str], arch: str, label: str) -> None:
        self.state, self.label = state, label
        for d in ("lists/partial", "archives/partial", "cache", "log", "empty.d"):
            (state / d).mkdir(parents=True, exist_ok=True)
        (state / "sources.list").write_text("".join(s + "\n" for s in sources))
        (state / "status").touch()
        self.opts: list[str] = []
        for k, v in {
            "Dir::Etc::sourcelist": state / "sources.list",
            "Dir::Etc::sourceparts": "/nonexistent",
            "Dir::Etc::preferences": "/nonexistent",
            "Dir::Etc::preferencesparts": state / "empty.d",  # /nonexistent/ draws a warning
            "Dir::State": state,
            "Dir::State::Lists": state / "lists",
            "Dir::State::status": state / "status",
            "Dir::Cache": state / "cache",
            "Dir::Cache::archives": state / "archives",
            "Dir::Log": state / "log",
            "Debug::NoLocking": 1,
            "APT::Architecture": arch,
            "APT::Architectures": arch,
            "APT::Install-Recommends": 0,
            "Acquire::Languages": "none",
        }.items():
            self.opts += ["-o", f"{k}={v}"]
        self.env = {**os.environ, "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}

    _HINT = ("Check that this machine reaches its Debian mirror (see /etc/apt/sources.list.d/) "
             "and that apt-get runs as root; then retry. A fully provisioned cache can also be "
             "copied in and pointed at with TILEGEN_CACHE.")

    def __call__(self, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        return _run(["apt-get", *self.opts, *args], f"apt-get {args[0]} ({self.label})",
                    self._HINT, cwd=cwd, env=self.env)

    def update(self) -> None:
        """``apt-get update``; it exits 0 even when every fetch failed, so check the lists."""
        p = self("update")
        if not any((self.state / "lists").glob("*_Packages*")):
            problems = "\n".join(l for l in (p.stdout + p.stderr).splitlines() if l.startswith(("W:", "E:", "Err:")))
            raise ProvisionError(f"apt-get update ({self.label}) fetched no package lists "
                                 f"(no network?):\n{problems}\n{self._HINT}")


def _host_deb_arch() -> str:
    return _run(["dpkg", "--print-architecture"], "dpkg --print-architecture",
                "dpkg is needed to unpack Debian packages.").stdout.strip()


def _unpack_debs(debs: list[Path], dest: Path) -> None:
    for deb in debs:
        _run(["dpkg", "-x", str(deb), str(dest)], f"dpkg -x {deb.name}",
             "The downloaded package may be corrupt; delete the cache dir and retry.")
        deb.unlink()


# ---------------------------------------------------------------------------------------------
# the steps

def _qemu_bin(qemu_dir: Path) -> Path:
    return qemu_dir / "usr" / "bin" / "qemu-aarch64"


def _qemu_version(qemu: Path) -> str:
    out = _run([str(qemu), "--version"], "qemu-aarch64 --version",
               "The unpacked qemu-aarch64 does not run on this host.").stdout
    m = re.search(r"version (\d+(?:\.\d+)*)", out)
    if not m:
        raise ProvisionError(f"cannot parse the qemu version from {out.strip()!r}")
    return m.group(1)


def _step_qemu(root: Path, log: Callable[[str], None]) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        mirror, _ = _debian_mirrors()
        apt = _PrivateApt(root / "apt" / "sid", [f"deb {mirror} sid main"], _host_deb_arch(),
                          "Debian sid")
        log(f"qemu: apt-get update (Debian sid from {mirror})")
        apt.update()
        log("qemu: downloading qemu-user (~72 MB)")
        dl = tmp / ".deb"
        dl.mkdir()
        apt("download", "qemu-user", cwd=dl)
        unpack = tmp / ".unpack"
        _unpack_debs(sorted(dl.glob("*.deb")), unpack)
        # keep only what runs aarch64 code: the other targets' emulators are ~90% of the package
        src = _qemu_bin(unpack)
        if not src.is_file():
            raise ProvisionError("the qemu-user package has no usr/bin/qemu-aarch64")
        _qemu_bin(tmp).parent.mkdir(parents=True)
        os.rename(src, _qemu_bin(tmp))
        for d in (dl, unpack):
            shutil.rmtree(d)
        version = _qemu_version(_qemu_bin(tmp))
        if int(version.split(".")[0]) < QEMU_MIN_VERSION:
            raise ProvisionError(f"Debian sid's qemu-user is {version}; tilegen needs "
                                 f"{QEMU_MIN_VERSION}.x or newer (SME2). Check the mirror.")
        shutil.rmtree(root / "apt" / "sid", ignore_errors=True)  # lists: ~100 MB, not needed again
        return version
    return build


def _bookworm_arm64_apt(state: Path) -> tuple["_PrivateApt", str]:
    """A private apt (state dir ``state``) over Debian bookworm arm64 from the machine's own
    mirrors (+ updates, + security when configured), and the mirror's URI."""
    mirror, security = _debian_mirrors()
    sources = [f"deb {mirror} bookworm main", f"deb {mirror} bookworm-updates main"]
    if security:
        sources.append(f"deb {security} bookworm-security main")
    return _PrivateApt(state, sources, "arm64", "Debian bookworm arm64"), mirror


def _step_sysroot(root: Path, qemu: Path, log: Callable[[str], None]) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        state = root / "apt" / "arm64"
        apt, mirror = _bookworm_arm64_apt(state)
        log(f"sysroot: apt-get update (bookworm arm64 from {mirror})")
        apt.update()
        log(f"sysroot: downloading {' '.join(_SYSROOT_PACKAGES)} for arm64 with dependencies")
        apt("install", "-y", "--download-only", *_SYSROOT_PACKAGES)
        debs = sorted((state / "archives").glob("*.deb"))
        log(f"sysroot: unpacking {len(debs)} packages")
        _unpack_debs(debs, tmp)
        python = tmp / "usr" / "bin" / f"python{GUEST_PYTHON_VERSION}"
        if not python.is_file():
            raise ProvisionError(f"the arm64 sysroot has no usr/bin/python{GUEST_PYTHON_VERSION}: "
                                 "is the machine's mirror a Debian bookworm mirror?")
        out = _run([str(qemu), "-L", str(tmp), "-cpu", "max", str(python), "-c",
                    "import ctypes, platform, sys; print(platform.machine(), sys.version.split()[0])"],
                   "running the aarch64 python under qemu", "The sysroot is incomplete.").stdout
        shutil.rmtree(state, ignore_errors=True)
        return out.strip()
    return build


def _relativize_symlinks(root: Path) -> None:
    """Point the absolute symlinks under ``root`` (``libm.so -> /lib/...``) inside ``root``.

    A linker given ``--sysroot`` opens ``libm.so`` through the file system, so an absolute
    target would reach the host's own (x86-64 or missing) file."""
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            link = Path(dirpath) / name
            if not link.is_symlink():
                continue
            dest = os.readlink(link)
            if dest.startswith("/"):
                rel = os.path.relpath(root / dest.lstrip("/"), link.parent)
                link.unlink()
                os.symlink(rel, link)


def _step_cross_sysroot(root: Path, log: Callable[[str], None]) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        state = root / "apt" / "arm64-dev"
        apt, mirror = _bookworm_arm64_apt(state)
        log(f"cross-sysroot: apt-get update (bookworm arm64 from {mirror})")
        apt.update()
        log(f"cross-sysroot: downloading {' '.join(CROSS_SYSROOT_PACKAGES)} for arm64 "
            "with dependencies")
        apt("install", "-y", "--download-only", *CROSS_SYSROOT_PACKAGES)
        debs = sorted((state / "archives").glob("*.deb"))
        log(f"cross-sysroot: unpacking {len(debs)} packages")
        _unpack_debs(debs, tmp)
        _relativize_symlinks(tmp)
        missing = [f for f in ("usr/include/stdio.h", "usr/lib/aarch64-linux-gnu/crt1.o",
                               "usr/lib/aarch64-linux-gnu/libc.so")
                   if not (tmp / f).exists()]
        gcc = sorted((tmp / "usr" / "lib" / "gcc" / "aarch64-linux-gnu").glob("*/crtbegin.o"))
        if missing or not gcc:
            raise ProvisionError("the arm64 cross sysroot is incomplete (missing "
                                 f"{', '.join(missing) or 'gcc crtbegin.o'}): is the machine's "
                                 "mirror a Debian bookworm mirror?")
        shutil.rmtree(state, ignore_errors=True)
        return " ".join(d.name for d in debs)
    return build


def _step_wheels(cross: bool, log: Callable[[str], None],
                 check: Callable[[Path], None] | None) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        dl = tmp / ".wheels"
        cmd = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
               "--disable-pip-version-check", "-d", str(dl)]
        if cross:
            cmd += ["--python-version", GUEST_PYTHON_VERSION, "--implementation", "cp",
                    "--abi", "cp" + GUEST_PYTHON_VERSION.replace(".", "")]
            for plat in _WHEEL_PLATFORMS:
                cmd += ["--platform", plat]
        log(f"wheels: pip download {' '.join(GUEST_WHEELS)}")
        _run(cmd + list(GUEST_WHEELS), "pip download of the guest wheels",
             "Check that PyPI is reachable (pip config, network) and that numpy "
             f"{NUMPY_VERSION} has an aarch64 wheel; then retry.")
        wheels = sorted(dl.glob("*.whl"))
        for whl in wheels:
            with zipfile.ZipFile(whl) as z:
                z.extractall(tmp)
        shutil.rmtree(dl)
        if check:
            check(tmp)
        return " ".join(w.name for w in wheels)
    return build


# ---------------------------------------------------------------------------------------------
# public entry point

def _shim(root: Path) -> Path:
    """A dir holding only a ``tilegen`` symlink to this package (one per package location)."""
    pkg = Path(__file__).resolve().parents[1]
    shim = root / "shims" / hashlib.sha256(str(pkg).encode()).hexdigest()[:16]
    link = shim / "tilegen"
    try:
        if os.readlink(link) == str(pkg):
            return shim
    except OSError:
        pass
    shim.mkdir(parents=True, exist_ok=True)
    tmp = shim / f".tilegen-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    os.symlink(pkg, tmp)
    os.replace(tmp, link)  # atomic, so a concurrent caller never sees a missing link
    return shim


def _cross_toolbox(root: Path) -> Toolbox | None:
    """The toolbox if every step's stamp is present, else None."""
    version = _read_stamp(root / "qemu")
    if version is None or _read_stamp(root / "sysroot") is None or \
            _read_stamp(root / _SITE) is None:
        return None
    return Toolbox(qemu=_qemu_bin(root / "qemu"), sysroot=root / "sysroot",
                   python=root / "sysroot" / "usr" / "bin" / f"python{GUEST_PYTHON_VERSION}",
                   site=root / _SITE, shim=_shim(root), qemu_version=version)


def _native_toolbox(root: Path, log: Callable[[str], None]) -> Toolbox:
    site = root / "site-native"
    missing = [r for r in ("numpy", "pytest", "jinja2") if importlib.util.find_spec(r) is None]
    if missing and _read_stamp(site) is None:
        root.mkdir(parents=True, exist_ok=True)
        with _locked(root / ".lock", log):
            if _read_stamp(site) is None:
                _build_step(root, site.name, _step_wheels(False, log, None), log)
    site.mkdir(parents=True, exist_ok=True)
    return Toolbox(qemu=None, sysroot=None, python=Path(sys.executable), site=site,
                   shim=_shim(root), qemu_version=None)


def ensure_cross_sysroot(quiet: bool = False) -> Path:
    """Provision (once) and return an aarch64 sysroot for cross-compiling C/C++ with clang.

    ``dpkg -x`` of Debian bookworm arm64 :data:`CROSS_SYSROOT_PACKAGES` and their dependencies
    (libc6, libstdc++6, libgcc-s1 included, so ``qemu-aarch64 -L`` of it runs what was linked
    against it), in ``<cache>/cross-sysroot``. Works on any host with apt-get and dpkg.
    """
    log = _logger(quiet)
    root = cache_dir()
    target = root / "cross-sysroot"
    if _ensure_step(root, target.name, lambda: _step_cross_sysroot(root, log), log):
        shutil.rmtree(root / "apt" / "arm64-dev", ignore_errors=True)
    return target


def _step_llama_cpp_source(root: Path, name: str,
                           log: Callable[[str], None]) -> Callable[[Path], str]:
    spec = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"

    def build(tmp: Path) -> str:
        sdist = root / f"{name}.tar.gz"
        if not sdist.is_file():
            dl = Path(tempfile.mkdtemp(prefix=".tmp-pip-", dir=root))
            try:
                log(f"llama.cpp: pip download {spec} (sdist, ~70 MB) into {root}")
                _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                      "--no-deps", "--no-binary", ":all:", "-d", str(dl), spec],
                     f"pip download {spec}",
                     "Check that PyPI is reachable (pip config, network); then retry.")
                got = dl / sdist.name
                if not got.is_file():
                    raise ProvisionError(f"pip download {spec} did not produce {sdist.name} "
                                         f"(got {sorted(p.name for p in dl.iterdir())})")
                os.rename(got, sdist)
            finally:
                shutil.rmtree(dl, ignore_errors=True)
        _unpack_top(sdist, tmp, name, ("vendor/llama.cpp/ggml/src/ggml-cpu/kleidiai",),
                    "ggml's KleidiAI backend (vendor/llama.cpp/ggml/src/ggml-cpu/kleidiai); "
                    "delete it and retry")
        return f"{sdist.name} sha256={hashlib.sha256(sdist.read_bytes()).hexdigest()}"
    return build


def ensure_llama_cpp_source(quiet: bool = False) -> Path:
    """Fetch (once) and return the llama.cpp source tree vendored in the llama-cpp-python
    :data:`LLAMA_CPP_PYTHON_VERSION` sdist: ``<cache>/llama/llama_cpp_python-<v>/vendor/llama.cpp``.

    ``pip download --no-deps --no-binary :all:`` of the sdist (kept next to the tree), unpacked
    into a temporary directory that is stamped and renamed into place under a file lock, so
    concurrent callers (test sessions, scripts/llama_cpp_check.sh) each see the whole tree or
    wait for it; offline once done. Raises ProvisionError when the download or unpacking fails.
    """
    log = _logger(quiet)
    root = cache_dir() / "llama"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    src = root / name / "vendor" / "llama.cpp"
    _ensure_step(root, name, lambda: _step_llama_cpp_source(root, name, log), log,
                 leftovers=(".tmp-pip-*", ".tmp-sdist-*"))
    return src


def ensure(quiet: bool = False) -> Toolbox:
    """Provision (once) and return the toolbox. Offline and fast once the cache is complete.

    Raises ProvisionError when a download or unpacking step fails.
    """
    log = _logger(quiet)
    root = cache_dir()
    if is_native():
        return _native_toolbox(root, log)
    tb = _cross_toolbox(root)
    if tb is not None:
        return tb
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / ".lock", log):
        t0 = time.monotonic()
        ran = False
        for leftover in root.glob(".tmp-*"):  # from an interrupted run; we hold the lock
            shutil.rmtree(leftover, ignore_errors=True)
        if _read_stamp(root / "qemu") is None:
            log(f"provisioning qemu-user, an aarch64 sysroot and guest wheels into {root} "
                "(once; ~150 MB download)")
            _build_step(root, "qemu", _step_qemu(root, log), log)
            ran = True
        qemu = _qemu_bin(root / "qemu")
        sysroot = root / "sysroot"
        if _read_stamp(sysroot) is None:
            _build_step(root, "sysroot", _step_sysroot(root, qemu, log), log)
            ran = True
        python = sysroot / "usr" / "bin" / f"python{GUEST_PYTHON_VERSION}"

        def check(site: Path) -> None:
            _run([str(qemu), "-L", str(sysroot), "-cpu", "max", "-E", f"PYTHONPATH={site}",
                  "-E", "PYTHONNOUSERSITE=1", str(python), "-c",
                  "import numpy, jinja2, pytest, gguf, hypothesis"],
                 "importing the guest wheels under qemu",
                 "The downloaded wheels do not import in the aarch64 Python.")

        if _read_stamp(root / _SITE) is None:
            _build_step(root, _SITE, _step_wheels(True, log, check), log)
            ran = True
        if ran:
            shutil.rmtree(root / "apt", ignore_errors=True)
            log(f"provisioning took {time.monotonic() - t0:.1f} s; cache {root} is "
                f"{_mib(_tree_size(root))}")
    tb = _cross_toolbox(root)
    assert tb is not None
    return tb


# ---------------------------------------------------------------------------------------------
# the real KleidiAI (reference for differential tests), from a release tarball given by path

#: sha256 of the KleidiAI release tarballs tilegen knows (``git archive`` of the tags; the
#: shared ``thirdparty/kleidiai`` README lists them): a tarball with another digest is refused.
KLEIDIAI_SHA256: dict[str, str] = {
    "1.24.0": "1833ce2b5e1f78ccb2961a45aea9c3ec8a39d7f02822f96355542b8b69022653",
    "1.30.0": "8dc596977c2266f116948d9cdc2ebc6fc877d471952dc29eadc51dc27917385e",
}
#: KleidiAI's own CMake options for the reference library: no unit tests or benchmarks (they
#: fetch GoogleTest), position-independent objects so one shared object can hold all of them.
#: KleidiAI's CMake adds every micro-kernel and packer on a non-MSVC aarch64 build (NEON,
#: SVE, SME and SME2 files each with their own ``-march``); there is no per-ISA switch.
#: Release optimisation without ``-DNDEBUG``: KleidiAI's precondition checks (``KAI_ASSUME``,
#: ``KAI_ASSERT``) stay on and abort with a message, where a Release build would turn them into
#: ``__builtin_unreachable()`` (a call outside them undefined, not reported).
KLEIDIAI_CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_C_FLAGS_RELEASE=-O3", "-DCMAKE_CXX_FLAGS_RELEASE=-O3",
    "-DKLEIDIAI_BUILD_TESTS=OFF", "-DKLEIDIAI_BUILD_BENCHMARK=OFF",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON")
_KLEIDIAI_CC = ("clang-19", "clang++-19")


@dataclass(frozen=True)
class KleidiAI:
    """A built KleidiAI: its source tree (include root), static library and a shared object
    holding every object of it (``--whole-archive``, ``-Bsymbolic``: its ``kai_`` calls bind
    inside it, so it loads next to another library with the same names)."""

    version: str
    source: Path
    static: Path
    shared: Path


def _kleidiai_version(tarball: Path) -> tuple[str, str]:
    """(version, sha256) of a known KleidiAI release tarball, or ProvisionError."""
    if not tarball.is_file():
        raise ProvisionError(f"no KleidiAI tarball at {tarball}: check out the shared inputs next "
                             "to the repository (../shared/thirdparty/kleidiai)")
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    for version, want in KLEIDIAI_SHA256.items():
        if digest == want:
            return version, digest
    raise ProvisionError(f"{tarball}: sha256 {digest} is no KleidiAI release tilegen knows "
                         f"({', '.join(KLEIDIAI_SHA256)})")


def _step_kleidiai_source(tarball: Path, version: str) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        _unpack_top(tarball, tmp, f"kleidiai-{version}", ("CMakeLists.txt", "kai/kai_common.h"),
                    "CMakeLists.txt and kai/kai_common.h")
        return f"{tarball.name} sha256={KLEIDIAI_SHA256[version]}"
    return build


def ensure_kleidiai_source(tarball: Path, quiet: bool = False) -> Path:
    """Extract (once) a KleidiAI release tarball (:data:`KLEIDIAI_SHA256`) into
    ``<cache>/kleidiai/src-<version>-<sha>``, the tree's root (``CMakeLists.txt``, ``kai/``);
    unpacked into a temporary directory, stamped and renamed into place under a file lock."""
    log = _logger(quiet)
    version, digest = _kleidiai_version(Path(tarball))
    root = cache_dir() / "kleidiai"
    name = f"src-{version}-{digest[:12]}"
    _ensure_step(root, name, lambda: _step_kleidiai_source(Path(tarball), version), log)
    return root / name


def cross_cmake_toolchain(sysroot: Path, cc: str = _KLEIDIAI_CC[0],
                          cxx: str = _KLEIDIAI_CC[1]) -> str:
    """A CMake toolchain file: clang (C, C++, ASM) + lld for aarch64 Linux against ``sysroot``
    (:func:`ensure_cross_sysroot`)."""
    settings = [("CMAKE_SYSTEM_NAME", "Linux"), ("CMAKE_SYSTEM_PROCESSOR", "aarch64"),
                ("CMAKE_SYSROOT", f'"{sysroot}"')]
    for lang, comp in (("C", cc), ("CXX", cxx), ("ASM", cc)):
        settings += [(f"CMAKE_{lang}_COMPILER", comp),
                     (f"CMAKE_{lang}_COMPILER_TARGET", "aarch64-linux-gnu")]
    settings += [(f"CMAKE_{kind}_LINKER_FLAGS_INIT", '"-fuse-ld=lld"')
                 for kind in ("EXE", "SHARED", "MODULE")]
    settings += [(f"CMAKE_FIND_ROOT_PATH_MODE_{what}", mode) for what, mode in
                 (("PROGRAM", "NEVER"), ("LIBRARY", "ONLY"), ("INCLUDE", "ONLY"),
                  ("PACKAGE", "ONLY"))]
    return "".join(f"set({k} {v})\n" for k, v in settings)


def _step_kleidiai_library(src: Path, sysroot: Path, toolchain: str, jobs: int,
                           log: Callable[[str], None]) -> Callable[[Path], str]:
    def build(tmp: Path) -> str:
        (tmp / "toolchain.cmake").write_text(toolchain)
        bdir = tmp / ".build"
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        hint = "KleidiAI's CMake needs cmake >= 3.16, clang-19, clang++-19 and lld (scripts/setup.sh)."
        _run(["cmake", "-S", str(src), "-B", str(bdir), *gen, *KLEIDIAI_CMAKE_FLAGS,
              f"-DCMAKE_TOOLCHAIN_FILE={tmp / 'toolchain.cmake'}"], "configuring KleidiAI", hint)
        log(f"kleidiai: building {src.name} for aarch64 ({jobs} jobs)")
        _run(["cmake", "--build", str(bdir), "--target", "kleidiai", "-j", str(jobs)],
             "building KleidiAI", hint)
        static = next(bdir.rglob("libkleidiai.a"), None)
        if static is None:
            raise ProvisionError(f"KleidiAI's build made no libkleidiai.a under {bdir}")
        os.rename(static, tmp / "libkleidiai.a")
        shutil.rmtree(bdir)
        _run([_KLEIDIAI_CC[0], "--target=aarch64-linux-gnu", f"--sysroot={sysroot}",
              "-fuse-ld=lld", "-shared", "-Wl,-Bsymbolic", "-o", str(tmp / "libkleidiai.so"),
              "-Wl,--whole-archive", str(tmp / "libkleidiai.a"), "-Wl,--no-whole-archive", "-lm"],
             "linking KleidiAI into a shared object", hint)
        return "built"
    return build


def ensure_kleidiai_library(tarball: Path, quiet: bool = False, jobs: int | None = None) -> KleidiAI:
    """Build (once) KleidiAI's static library for aarch64 Linux with KleidiAI's own CMake
    (:data:`KLEIDIAI_CMAKE_FLAGS`), clang-19 + lld and the cross sysroot, and a shared object of
    it; cached in ``<cache>/kleidiai/lib-<key>``, keyed by the tarball's sha256, the flags, the
    toolchain file, clang's version and the sysroot's stamp (a file lock serialises builders)."""
    log = _logger(quiet)
    src = ensure_kleidiai_source(tarball, quiet)
    version, digest = _kleidiai_version(Path(tarball))
    sysroot = ensure_cross_sysroot(quiet)
    toolchain = cross_cmake_toolchain(sysroot)
    clang = _run([_KLEIDIAI_CC[0], "--version"], "clang-19 --version",
                 "KleidiAI's reference build needs clang-19 (scripts/setup.sh installs it).")
    key = hashlib.sha256("\n".join([digest, *KLEIDIAI_CMAKE_FLAGS, toolchain,
                                    clang.stdout.splitlines()[0],
                                    _read_stamp(sysroot) or ""]).encode()).hexdigest()[:12]
    root = cache_dir() / "kleidiai"
    name = f"lib-{version}-{key}"
    done = KleidiAI(version, src, root / name / "libkleidiai.a", root / name / "libkleidiai.so")
    _ensure_step(root, name, lambda: _step_kleidiai_library(
        src, sysroot, toolchain, jobs or os.cpu_count() or 2, log), log)
    return done
