#!/usr/bin/env python3
"""llama.cpp as a real client of a KleidiAI source tree (issue #14).

End to end, on an x86-64 host:

1. provisions qemu-user 11 (tilegen.emulate.provision.ensure) and an aarch64 cross sysroot with
   libc/libstdc++/libgcc dev files (provision.ensure_cross_sysroot), both Debian packages in
   tilegen's cache, and the llama.cpp vendored in the llama-cpp-python sdist
   (provision.ensure_llama_cpp_source: pip download, once);
2. cross-builds llama.cpp (clang-19 + lld, CMake toolchain file) three times:
   ``GGML_CPU_KLEIDIAI=OFF`` (reference), ``GGML_CPU_KLEIDIAI=ON`` with a ``tilegen export
   kleidiai`` tree DIR as KleidiAI's source (``FETCHCONTENT_SOURCE_DIR_KLEIDIAI``, fully
   disconnected; ``on``), and ON against the real KleidiAI v1.24.0 (the release archive in
   ``../shared/thirdparty/kleidiai``, unpacked by provision.ensure_kleidiai_source; ``real``).
   Builds are cached under ``<cache>/llama/<version>-<off|on|real>-<config hash>/``; an ON
   build's stamp holds its KleidiAI tree's content hash, and a changed tree is rebuilt
   incrementally in place. ccache (``CCACHE``) hands the objects the three builds share
   (libllama, llama-common, ggml-base) from the first build to the others;
3. writes a synthetic llama GGUF (tilegen.gguf.synth) in Q4_0, Q8_0 and F16;
4. runs llama.cpp's ``llama-debug --save-logits`` (the last prompt position's logits; one GEMM
   batch of 133 tokens, F16: 45) and ``llama-batched --temp 0`` (a 45-token prompt, then 16
   greedy GEMV steps) under qemu: OFF on neoverse-n1, ON on neoverse-n1/-v1/-n2 and on max
   (SVE/SME VL 512) with ``GGML_KLEIDIAI_SME=0``, ``=1`` and ``=2``; the real build as ON;
5. compares every run with the OFF build on neoverse-n1 and with a float64 numpy forward pass of
   the dequantised weights, and each export run with the real KleidiAI's run of the same
   configuration (identical logits where the kernels are bit-exact: ``expect_identical``),
   prints the tables, and exits 1 when a run fails its check.

Run ``scripts/llama_cpp_check.sh --help`` for the options.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the float64 reference does many tiny matmuls: OpenBLAS's thread wake-ups cost ~20x on a
# loaded 2-core machine
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tilegen.gguf import synth as sg  # noqa: E402
from tilegen.emulate import provision  # noqa: E402

LLAMA_CPP_PYTHON_VERSION = provision.LLAMA_CPP_PYTHON_VERSION
#: Baseline ISA of the ggml CPU backend: Armv8.2-A + dotprod + fp16, what every tested model
#: (neoverse-n1 upwards) has. ggml picks its own NEON/dotprod kernels at compile time from this
#: (no i8mm/SVE/SME baseline, which would SIGILL on n1); KleidiAI compiles each micro-kernel
#: with its own ISA flags and chooses among them at run time from the HWCAPs.
GGML_ARM_ARCH = "armv8.2-a+dotprod+fp16"
#: llama.cpp's own tools run: llama-debug saves a prompt's last logits; llama-batched (one
#: sequence, --temp 0) decodes greedily with a settable thread count (llama-simple has none and
#: its default of 4 threads on 2 emulated cores is ~20x slower).
TARGETS = ("llama-debug", "llama-batched", "llama-quantize")
#: The llama.cpp patch the ON build carries (docs/llama_cpp_check.md#k-quants): KleidiAI-backend
#: table entries, repack, LHS packing and GET_ROWS for Q4_K/Q6_K on tilegen's K-quant kernels.
KQUANTS_PATCH = REPO / "tilegen" / "export" / "llama-kquants.patch"
#: Weight types: the synthetic model's own (tilegen.gguf.synth) and Q4_K_M, made from its F16
#: variant by llama.cpp's own llama-quantize (so the K-quant bytes are ggml's).
KQUANT_TYPES = ("q4_k_m",)
TYPES = tuple(sg.TYPES) + KQUANT_TYPES
#: ggml types whose MUL_MATs the ON build must run on tilegen's K-quant kernels
KQUANT_GGML = ("q4_K", "q6_K")
THREADS = 2
STEPS = 16
#: llama-debug's prompt per weight type: Q4_0/Q8_0 get 133 tokens, so that with an SME thread
#: cap below the thread count KleidiAI splits the batch between its SME and non-SME kernels
#: (only for 128+ rows); F16 has no non-SME KleidiAI kernel to split with, and F16 arithmetic
#: is slow under qemu (a 133-token F16 prompt takes ~25 s), so it keeps the short prompt.
LOGITS_PROMPT = {"q4_0": sg.LONG_PROMPT, "q8_0": sg.LONG_PROMPT, "f16": sg.PROMPT,
                 "q4_k_m": sg.LONG_PROMPT}

#: CPU models run (qemu -cpu), with the features KleidiAI's selection sees.
CPUS = {
    "n1": ("neoverse-n1", "dotprod"),
    "v1": ("neoverse-v1", "dotprod i8mm sve256"),
    "n2": ("neoverse-n2", "dotprod i8mm sve128 sve2"),
    # SVE 512 (so KleidiAI's 256-bit SVE kernels are not picked), SME streaming VL 512
    "max": ("max,sve-default-vector-length=64,sme-default-vector-length=64",
            "dotprod i8mm sve512 sme2 svl512"),
}

#: Tolerances, as max|logit difference| over the reference logits' rms, at the last prompt
#: position (docs/llama_cpp_check.md derives them). REF_TOLERANCE bounds a run against the
#: float64 forward pass of the very weights the file holds, so it measures only what the
#: kernels round: int8 activations (ggml's q8_0 blocks; KleidiAI's qsi8d32p blocks or qai8dx
#: rows), f16/bf16 operands. q8_0 is looser because KleidiAI also requantises Q8_0 weights per
#: channel (qsi8cx). TOLERANCE bounds ON against OFF with the same numbers (the triangle
#: inequality would allow their sum).
REF_TOLERANCE = {"q4_0": 0.06, "q8_0": 0.08, "f16": 0.02, "q4_k_m": 0.08}
TOLERANCE = dict(REF_TOLERANCE)
#: The float64 reference's greedy steps must be at least this far from a tie, so that any
#: token difference is a failure (the model is built for margins of ~4).
MIN_MARGIN = 1.0

#: The real KleidiAI the third build compiles: the release llama.cpp pins (its CMake's
#: KLEIDIAI_COMMIT_TAG), from the shared inputs next to the repository.
KLEIDIAI_VERSION = "1.24.0"
KLEIDIAI_ARCHIVE = REPO.parent / "shared" / "thirdparty" / "kleidiai" / \
    f"kleidiai-v{KLEIDIAI_VERSION}.tar.gz"
#: Whether the export's ``matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa`` (the
#: f16-LHS SME2 GEMM llama.cpp runs for Q4_0 batches when SME is on) reproduces KleidiAI's
#: arithmetic bit for bit. It does not yet: it is generated portable C that keeps each
#: int4 x scale product exact in f32, where KleidiAI's kernel rounds it to f16 before the FMOPA.
#: So Q4_0 runs on an SME2 CPU with SME on are held to TOLERANCE against the real KleidiAI,
#: every other run to identical logits. Set to True when that kernel is the bit-exact SME2 asm
#: (issue #23 item 3): then every run must give identical logits.
F16P_Q4_0_SME2_GEMM_BIT_EXACT = True


def log(msg: str) -> None:
    print(f"llama-check: {msg}", file=sys.stderr, flush=True)


class CheckError(RuntimeError):
    pass


def run(cmd: list[str], what: str, *, cwd: Path | None = None, env: dict | None = None,
        log_file: Path | None = None) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                       text=True, errors="replace")
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n[exit {p.returncode}]\n")
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-25:])
        raise CheckError(f"{what} failed (exit {p.returncode}):\n{tail}"
                         + (f"\n(full log: {log_file})" if log_file else ""))
    return p


# ---------------------------------------------------------------------------------------------
# sources

def llama_root() -> Path:
    return provision.cache_dir() / "llama"


def llama_source(given: Path | None) -> Path:
    """The llama.cpp tree: ``given``, else the sdist's in the cache (provision fetches it once)."""
    if given is not None:
        src = given.resolve()
        if not (src / "ggml" / "src" / "ggml-cpu" / "kleidiai").is_dir():
            raise CheckError(f"{src} is not a llama.cpp source tree with ggml's KleidiAI backend")
        return src
    return provision.ensure_llama_cpp_source()


def tree_hash(path: Path) -> str:
    """sha256 over the relative paths, modes and contents of every file under ``path``."""
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        h.update(b"x" if os.access(f, os.X_OK) else b"-")
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def patched_source(src: Path, patch: Path) -> tuple[Path, Path]:
    """(llama.cpp tree with ``patch`` applied, its root): ``<cache>/llama/kq-<hash>/`` holds the
    tree at the same path relative to it as ``src`` has relative to the llama cache dir, so the
    build dir ``<root>/<version>-on-<hash>/build`` reaches it by the same relative path as the
    unpatched builds reach theirs and ccache (base dir: the llama cache dir) hands the patched
    build every object the patch does not touch. Made once (hard links of ``src``, real copies
    of the patched directory), under a lock; ``patch -p1`` must apply cleanly."""
    text = patch.read_bytes()
    try:
        rel = src.relative_to(llama_root())
    except ValueError:
        rel = Path("llama_cpp_python") / "vendor" / "llama.cpp"
    digest = hashlib.sha256(text + str(src).encode()).hexdigest()[:12]
    root = llama_root() / f"kq-{digest}"
    dst = root / rel
    stamp = root / ".tilegen-complete"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if stamp.is_file():
            return dst, root
        shutil.rmtree(root / rel.parts[0], ignore_errors=True)
        dst.parent.mkdir(parents=True, exist_ok=True)
        run(["cp", "-al", str(src), str(dst)], "hard-link copy of the llama.cpp tree")
        touched = sorted({str(Path(line[6:].split()[0]).parent)
                          for line in text.decode().splitlines() if line.startswith("+++ b/")})
        for d in touched:      # the patched files: real copies, never the cache's own bytes
            shutil.rmtree(dst / d)
            shutil.copytree(src / d, dst / d)
        run(["patch", "-p1", "--forward", "--no-backup-if-mismatch", "-d", str(dst), "-i",
             str(patch)], f"patch -p1 < {patch.name}")
        stamp.write_text(json.dumps({"patch": patch.name, "src": str(src)}) + "\n")
    log(f"patched llama.cpp tree: {dst} ({patch.name})")
    return dst, root


# ---------------------------------------------------------------------------------------------
# build

#: The compiler launcher of every build. The off, on and real builds compile the same libllama,
#: llama-common and ggml-base with the same flags (~90 % of a cold build's compile time; only
#: ggml-cpu and KleidiAI differ), each in its own build dir: ccache, with its base dir the
#: llama cache dir (all build dirs at the same depth, so the rewritten relative paths agree),
#: compiles those once and hands the objects to the other builds.
CCACHE = "ccache"


def ccache_env(stats_log: Path) -> dict[str, str]:
    """The build's environment: ccache's store under the llama cache dir, paths under that dir
    hashed relative to the build dir, one line per compilation in ``stats_log``."""
    root = llama_root()
    return {**os.environ, "CCACHE_DIR": str(root / "ccache"), "CCACHE_BASEDIR": str(root),
            "CCACHE_NOHASHDIR": "1", "CCACHE_MAXSIZE": "2G", "CCACHE_STATSLOG": str(stats_log)}


def ccache_counts(stats_log: Path) -> tuple[int, int]:
    """(hits, compiled) of the compilations a ccache stats log records."""
    hits = compiled = 0
    if stats_log.is_file():
        for line in stats_log.read_text().splitlines():
            if line.endswith("_cache_hit"):        # direct_cache_hit, preprocessed_cache_hit
                hits += 1
            elif line == "cache_miss":
                compiled += 1
    return hits, compiled


def toolchain_text(sysroot: Path) -> str:
    return f"""\
# generated by scripts/llama_cpp_check.py: clang-19 + lld for aarch64 Linux (Debian bookworm)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_SYSROOT "{sysroot}")
set(CMAKE_C_COMPILER clang-19)
set(CMAKE_CXX_COMPILER clang++-19)
set(CMAKE_ASM_COMPILER clang-19)
set(CMAKE_C_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_CXX_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_ASM_COMPILER_TARGET aarch64-linux-gnu)
set(CMAKE_EXE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_SHARED_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_MODULE_LINKER_FLAGS_INIT "-fuse-ld=lld")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
"""


def cmake_flags(kleidiai: bool, export: Path | None) -> list[str]:
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF",          # static: two self-contained binaries
        "-DGGML_NATIVE=OFF",
        f"-DGGML_CPU_ARM_ARCH={GGML_ARM_ARCH}",
        "-DGGML_OPENMP=OFF",                # clang's libomp has no arm64 build in the sysroot
        "-DGGML_CCACHE=OFF",                # the launcher below instead (ggml's finds any)
        f"-DCMAKE_C_COMPILER_LAUNCHER={CCACHE}",
        f"-DCMAKE_CXX_COMPILER_LAUNCHER={CCACHE}",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_TOOLS=ON",           # llama-quantize (only the TARGETS are built)
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_EXAMPLES=ON",        # llama-debug, llama-batched
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DFETCHCONTENT_FULLY_DISCONNECTED=ON",
        f"-DGGML_CPU_KLEIDIAI={'ON' if kleidiai else 'OFF'}",
    ]
    if kleidiai:
        assert export is not None
        flags.append(f"-DFETCHCONTENT_SOURCE_DIR_KLEIDIAI={export}")
    return flags


@dataclasses.dataclass
class Build:
    name: str           # "off", "on" (the export) or "real" (the real KleidiAI)
    dir: Path
    bin: Path
    seconds: float      # the cold build's time
    cached: bool
    incremental: float | None = None   # the last incremental rebuild's time
    ccache: tuple[int, int] | None = None   # the last build's (ccache hits, compiled)


def clang_version() -> str:
    return run(["clang-19", "--version"], "clang-19 --version").stdout.splitlines()[0]


def sync_tree(src: Path, dst: Path) -> int:
    """Make ``dst`` a copy of ``src``, rewriting only files whose bytes differ (so ninja rebuilds
    only what changed); returns the number of files written or removed."""
    n = 0
    want = {p.relative_to(src) for p in src.rglob("*") if p.is_file() and ".git" not in p.parts}
    if dst.is_dir():
        for p in sorted(dst.rglob("*"), reverse=True):
            r = p.relative_to(dst)
            if p.is_file() and r not in want:
                p.unlink()
                n += 1
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
    for r in sorted(want):
        a, b = src / r, dst / r
        if b.is_file() and b.read_bytes() == a.read_bytes():
            continue
        b.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(a, b)       # a fresh mtime: newer than the objects built from the old one
        os.chmod(b, a.stat().st_mode & 0o777)
        n += 1
    return n


def build(name: str, src: Path, sysroot: Path, export: Path | None, jobs: int,
          rebuild: bool, root: Path | None = None) -> Build:
    """The ``off`` build, or an ON build (``on``, ``real``) against the KleidiAI tree
    ``export``, from the cache when current.

    The build dir is keyed by the name, the llama.cpp version, the CMake flags, the toolchain
    and the sysroot. An ON build compiles a copy of its KleidiAI tree kept inside its build dir
    (``kleidiai-src``), and its stamp records the tree's content hash: a changed tree is
    synced into that copy (only changed files rewritten) and rebuilt incrementally (KleidiAI's
    sources, ggml's kleidiai.cpp/kernels.cpp, the link), not from scratch.
    """
    kleidiai = name != "off"
    placeholder = Path("@BUILD_DIR@/kleidiai-src")
    tc = toolchain_text(sysroot)
    key = {"llama-cpp-python": LLAMA_CPP_PYTHON_VERSION, "src": str(src),
           "flags": cmake_flags(kleidiai, placeholder if kleidiai else None),
           "toolchain": tc, "clang": clang_version(),
           "sysroot": (sysroot / ".tilegen-complete").read_text()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    bdir = (root or llama_root()) / f"{LLAMA_CPP_PYTHON_VERSION}-{name}-{digest}"
    flags = cmake_flags(kleidiai, bdir / "kleidiai-src" if kleidiai else None)
    export_hash = None
    if kleidiai:
        t0 = time.monotonic()
        export_hash = tree_hash(export)
        log(f"{name} build: KleidiAI tree {export}: content hash {export_hash[:12]} "
            f"({time.monotonic() - t0:.1f} s)")
    stamp = bdir / "stamp.json"
    bindir = bdir / "build" / "bin"
    info = json.loads(stamp.read_text()) if stamp.is_file() else None

    def current() -> bool:
        return (info is not None and not rebuild and info.get("export") == export_hash
                and all((bindir / t).is_file() for t in TARGETS))

    if current():
        log(f"{name} build: cached in {bdir} (cold build took {info['seconds']:.0f} s)")
        return Build(name, bdir, bindir, info["seconds"], True, info.get("incremental"),
                     tuple(info["ccache"]) if info.get("ccache") else None)
    bdir.mkdir(parents=True, exist_ok=True)
    with open(bdir / ".lock", "a+") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        info = json.loads(stamp.read_text()) if stamp.is_file() else None
        if current():  # another process built it meanwhile
            return Build(name, bdir, bindir, info["seconds"], True, info.get("incremental"))
        if rebuild or info is None:
            shutil.rmtree(bdir / "build", ignore_errors=True)   # cold
            info = None
        stamp.unlink(missing_ok=True)
        (bdir / "toolchain.cmake").write_text(tc)
        (bdir / "key.json").write_text(json.dumps(key, indent=1, sort_keys=True) + "\n")
        blog = bdir / "build.log"
        blog.write_text("")
        slog = bdir / "ccache-stats.log"
        slog.unlink(missing_ok=True)
        env = ccache_env(slog)
        t0 = time.monotonic()
        if kleidiai:
            n = sync_tree(export, bdir / "kleidiai-src")
            log(f"{name} build: {n} file(s) of the KleidiAI tree changed")
        kind = "cold" if info is None else "incremental"
        log(f"{name} build ({kind}): configuring in {bdir}/build")
        run(["cmake", "-S", str(src), "-B", str(bdir / "build"), "-G", "Ninja",
             f"-DCMAKE_TOOLCHAIN_FILE={bdir / 'toolchain.cmake'}", *flags],
            f"cmake configure ({name})", env=env, log_file=blog)
        log(f"{name} build ({kind}): ninja -j{jobs} {' '.join(TARGETS)} (log: {blog})")
        run(["ninja", "-C", str(bdir / "build"), f"-j{jobs}", *TARGETS],
            f"build ({name})", env=env, log_file=blog)
        secs = time.monotonic() - t0
        cc = ccache_counts(slog)
        new = {"seconds": secs if info is None else info["seconds"], "export": export_hash,
               "incremental": None if info is None else secs, "built": time.strftime("%F %T"),
               "ccache": cc}
        stamp.write_text(json.dumps(new) + "\n")
    log(f"{name} build: {kind} build done in {secs:.0f} s (ccache: {cc[0]} objects reused, "
        f"{cc[1]} compiled)")
    return Build(name, bdir, bindir, new["seconds"], False, new["incremental"], cc)


# ---------------------------------------------------------------------------------------------
# runs

@dataclasses.dataclass
class Run:
    build: str
    cpu: str
    sme: str            # "-" (OFF build), else the GGML_KLEIDIAI_SME value
    wtype: str
    logits: np.ndarray | None = None
    tokens: list[int] | None = None
    kernels: str = ""   # what KleidiAI reported selecting
    seconds: float = 0.0
    error: str | None = None
    #: K-quant MUL_MATs the KleidiAI backend logged (-v, the patch's debug line) per weight:
    #: {weight name: [count in llama-debug, count in llama-batched]}, and the kernels they ran on
    kq_calls: dict = dataclasses.field(default_factory=dict)
    kq_kernels: tuple = ()


def is_sme_cpu(cpu: str) -> bool:
    return "sme2" in CPUS[cpu][1].split()


def run_env(cpu: str, sme: str) -> dict[str, str]:
    """The environment of a run: ``GGML_KLEIDIAI_SME`` for the ON builds, and a chunk multiplier
    of 1 where ggml's KleidiAI backend splits a matmul between the SME kernel and the non-SME
    fallback ("hybrid": an SME CPU, 0 < cap < THREADS, 128+ rows).

    There the threads take column chunks from a shared atomic counter (kleidiai.cpp: thread i
    starts at chunk i, then ``ggml_threadpool_chunk_add``), THREADS x multiplier (default 4)
    chunks in all, so which kernel computes which columns depends on timing and the logits vary
    from run to run. With multiplier 1 there are at most THREADS chunks: thread i computes chunk
    i and its next ``chunk_add`` is past the end, so the split is static (the SME threads take
    the first chunks) and both kernels still run.
    """
    if sme == "-":
        return {}
    env = {"GGML_KLEIDIAI_SME": sme}
    if is_sme_cpu(cpu) and 0 < int(sme) < THREADS:
        env["GGML_KLEIDIAI_CHUNK_MULTIPLIER"] = "1"
    return env


def expect_identical(wtype: str, cpu: str, sme: str) -> bool:
    """Whether the export's run must give the real KleidiAI's logits bit for bit: every path
    but Q4_0 on an SME2 CPU with SME on, whose batches go through the f16-LHS SME2 GEMM, until
    F16P_Q4_0_SME2_GEMM_BIT_EXACT says that kernel is bit-exact too."""
    f16p_gemm = wtype == "q4_0" and is_sme_cpu(cpu) and sme not in ("-", "0")
    return F16P_Q4_0_SME2_GEMM_BIT_EXACT or not f16p_gemm


def guest(tb, sysroot: Path, cpu: str, argv: list[str], env: dict[str, str]) -> list[str]:
    cmd = [str(tb.qemu), "-L", str(sysroot), "-cpu", CPUS[cpu][0]]
    for k, v in env.items():
        cmd += ["-E", f"{k}={v}"]
    return cmd + argv


def kleidiai_picks(report: str) -> str:
    """A kleidiai_report without the K-quant picks (which only the patched build reports)."""
    return " ".join(w for w in report.split() if w.split(":")[0] not in KQUANT_GGML)


def kleidiai_report(text: str) -> str:
    """KleidiAI's kernel choice as logged ("kleidiai: primary q4 kernel feature I8MM")."""
    picks = []
    for line in text.splitlines():
        if "kleidiai: primary " in line:
            w = line.split("kleidiai: primary ", 1)[1].split()
            if len(w) >= 4 and f"{w[0]}:{w[-1]}" not in picks:
                picks.append(f"{w[0]}:{w[-1]}")
    return " ".join(picks)


def kquant_matmuls(text: str) -> list[tuple[str, str, str]]:
    """(weight, ggml type, kernels) of each K-quant MUL_MAT the KleidiAI backend logged at debug
    level (llama-kquants.patch: "kleidiai: MUL_MAT blk.0.attn_q.weight (q4_K) m=.. n=.. k=..:
    I8MM gemm")."""
    out = []
    for line in text.splitlines():
        if "kleidiai: MUL_MAT " not in line:
            continue
        w = line.split("kleidiai: MUL_MAT ", 1)[1].split()
        if len(w) >= 7 and w[1].strip("()") in KQUANT_GGML:
            out.append((w[0], w[1].strip("()"), " ".join(w[5:7])))
    return out


def check_kquant_calls(r: "Run", weights: dict[str, str]) -> list[str]:
    """Problems with an ON run's K-quant MUL_MATs: every Q4_K/Q6_K weight used by a MUL_MAT
    (``weights``: name -> ggml type; token_embd is a GET_ROWS) must be logged, each as often as
    the others within one tool's run (once per graph evaluation), and nothing else."""
    problems = []
    got = set(r.kq_calls)
    if got != set(weights):
        problems.append(f"K-quant MUL_MATs on the KleidiAI backend: missing "
                        f"{sorted(set(weights) - got)}, unexpected {sorted(got - set(weights))}")
    for i, tool in enumerate(("llama-debug", "llama-batched")):
        counts = {c[i] for c in r.kq_calls.values()}
        if len(counts) > 1 or 0 in counts:
            problems.append(f"{tool}: K-quant MUL_MAT counts per weight differ: "
                            + ", ".join(f"{n} {c[i]}" for n, c in sorted(r.kq_calls.items())))
    return problems


def one_run(tb, sysroot: Path, b: Build, cpu: str, sme: str, wtype: str, model: Path,
            work: Path) -> Run:
    r = Run(b.name, cpu, sme, wtype)
    env = run_env(cpu, sme)
    out = work / f"{b.name}-{cpu}-{sme}-{wtype}"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        # one prompt batch (GEMM; 133 rows for q4_0/q8_0); flash attention off so the KQ/KQV
        # products are MUL_MATs too; -v shows KleidiAI's kernel choice
        p = run(guest(tb, sysroot, cpu, [str(b.bin / "llama-debug"), "-m", str(model),
                                         "-p", LOGITS_PROMPT[wtype], "--save-logits",
                                         "--logits-output-dir", str(out), "-t", str(THREADS),
                                         "-c", "256", "-fa", "off", "--no-warmup", "-v"], env),
                f"llama-debug {b.name} {cpu} sme={sme} {wtype}", log_file=out / "run.log")
        r.kernels = kleidiai_report(p.stdout + p.stderr)
        kq = [kquant_matmuls(p.stdout + p.stderr)]
        binf = out / f"llamacpp-{model.stem}.bin"
        r.logits = np.fromfile(binf, dtype=np.float32)
        if r.logits.shape != (sg.ModelConfig().n_vocab,) or not np.all(np.isfinite(r.logits)):
            raise CheckError(f"{binf}: {r.logits.size} logits (finite: "
                             f"{bool(np.all(np.isfinite(r.logits)))}), expected "
                             f"{sg.ModelConfig().n_vocab} finite values")
        tokf = out / f"llamacpp-{model.stem}-tokens.bin"
        got = np.fromfile(tokf, dtype=np.int32).tolist()
        if got != sg.prompt_ids(prompt=LOGITS_PROMPT[wtype]):
            raise CheckError(f"llama.cpp tokenised the prompt as {got}, expected "
                             f"{sg.prompt_ids(prompt=LOGITS_PROMPT[wtype])}")
        # greedy decoding (--temp 0 keeps only the top logit): prompt GEMM, then 16
        # single-token (GEMV) steps; -n counts the prompt's tokens too
        p = run(guest(tb, sysroot, cpu, [str(b.bin / "llama-batched"), "-m", str(model),
                                         "-p", sg.PROMPT, "-np", "1", "-t", str(THREADS),
                                         "-n", str(len(sg.prompt_ids()) + STEPS), "--temp", "0",
                                         "-c", "128"] + (["-v"] if wtype in KQUANT_TYPES else []),
                      env),
                f"llama-batched {b.name} {cpu} sme={sme} {wtype}", log_file=out / "run.log")
        kq.append(kquant_matmuls(p.stdout + p.stderr))
        for i, calls in enumerate(kq):
            for name, _, kern in calls:
                r.kq_calls.setdefault(name, [0, 0])[i] += 1
        r.kq_kernels = tuple(sorted({kern for calls in kq for _, _, kern in calls}))
        shown = "<s> " + sg.PROMPT  # the prompt's pieces: "<s>", "▁the", ...
        line = next((l for l in p.stdout.splitlines() if l.startswith(shown)), None)
        if line is None:
            raise CheckError(f"llama-batched printed no line starting with {shown!r}:\n"
                             + p.stdout[-500:])
        gen = line[len(shown):]
        r.tokens = sg.detokenize_ids(gen)
        if len(r.tokens) != STEPS:
            raise CheckError(f"llama-batched generated {len(r.tokens)} tokens, not {STEPS}: "
                             f"{gen!r}")
    except (CheckError, ValueError, OSError) as e:
        r.error = str(e)
    r.seconds = time.monotonic() - t0
    return r


# ---------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="llama_cpp_check.sh", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Without --export the script writes the tree itself (`tilegen export kleidiai "
               "--target TARGET`); --off-only builds and runs only the OFF (reference) build.")
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="KleidiAI source tree (`tilegen export kleidiai -o DIR`) to build and run "
                        "llama.cpp with GGML_CPU_KLEIDIAI=ON against (default: export one now)")
    p.add_argument("--target", default="linux-aarch64-all",
                   help="preset of the tree exported when --export is not given "
                        "(default linux-aarch64-all)")
    p.add_argument("--tuned", action="store_true",
                   help="export with --tuned (when --export is not given)")
    p.add_argument("--off-only", action="store_true",
                   help="only the OFF (reference) build: no export, no ON build")
    p.add_argument("--kleidiai", type=Path, metavar="TARBALL", default=KLEIDIAI_ARCHIVE,
                   help="the real KleidiAI's release archive for the third build (default "
                        f"../shared/thirdparty/kleidiai/{KLEIDIAI_ARCHIVE.name} next to the "
                        "repository; a missing archive is an error)")
    p.add_argument("--no-real", action="store_true",
                   help="no build against the real KleidiAI (and no export-vs-real table)")
    p.add_argument("--llama-src", type=Path, metavar="DIR",
                   help="llama.cpp source tree (default: the llama-cpp-python "
                        f"{LLAMA_CPP_PYTHON_VERSION} sdist's vendor/llama.cpp, downloaded into the cache)")
    p.add_argument("--types", default=",".join(TYPES),
                   help=f"weight types (default: all of {', '.join(TYPES)}; q4_k_m is llama-quantize's "
                        "Q4_K_M of the f16 model, run on the patched ON build)")
    p.add_argument("--patch", type=Path, default=KQUANTS_PATCH,
                   help="the patch the ON build's llama.cpp carries (default: "
                        "tilegen/export/llama-kquants.patch)")
    p.add_argument("--cpus", default=",".join(CPUS),
                   help=f"CPU models for the ON builds (default: all of {', '.join(CPUS)})")
    p.add_argument("--off-cpus", default="n1",
                   help="CPU models for the OFF build (the first is the reference; default n1; "
                        "ggml's kernels are fixed at compile time, so OFF on another model must "
                        "agree bit for bit: `n1,max` checks that)")
    p.add_argument("--sme", default=f"1,{THREADS}",
                   help="GGML_KLEIDIAI_SME values (SME thread caps) for the ON builds on max, "
                        f"besides 0 (default 1,{THREADS}: with {THREADS} threads and a cap of 1, "
                        "batches under 128 rows run the non-SME fallback kernel for Q4_0/Q8_0; "
                        f"a cap of {THREADS} runs the SME kernels on every thread)")
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--rebuild", action="store_true",
                   help="rebuild from scratch (delete the cached build dirs' contents first)")
    p.add_argument("--build-only", action="store_true")
    p.add_argument("--work", type=Path, help="directory for models, logits and logs "
                                              "(default: a temporary one, kept on failure)")
    p.add_argument("--json", type=Path, help="write the results as JSON here")
    a = p.parse_args(argv)
    a.types = [t for t in a.types.split(",") if t]
    a.cpus = [c for c in a.cpus.split(",") if c]
    a.off_cpus = [c for c in a.off_cpus.split(",") if c]
    a.sme = [v for v in a.sme.split(",") if v]
    if not all(v.isdigit() for v in a.sme):
        p.error(f"--sme {','.join(a.sme)}: give non-negative integers")
    for t in a.types:
        if t not in TYPES:
            p.error(f"unknown type {t!r} (choose from {', '.join(TYPES)})")
    for c in a.cpus + a.off_cpus:
        if c not in CPUS:
            p.error(f"unknown cpu {c!r} (choose from {', '.join(CPUS)})")
    if a.export is not None:
        a.export = a.export.resolve()
        if not (a.export / "CMakeLists.txt").is_file():
            p.error(f"--export {a.export}: no CMakeLists.txt (is it a KleidiAI source tree?)")
    return a


def export_tree(target: str, tuned: bool) -> Path:
    """``tilegen export kleidiai`` of this checkout into a fresh directory."""
    out = Path(tempfile.mkdtemp(prefix="kai-export-"))
    cmd = [sys.executable, "-m", "tilegen", "export", "kleidiai", "--target", target,
           "-o", str(out)] + (["--tuned"] if tuned else [])
    log(f"exporting: {' '.join(cmd[1:])}")
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout + r.stderr)
        raise SystemExit(2)
    log(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "exported")
    return out


def quantized_model(tb, sysroot: Path, off: Build, wtype: str, work: Path,
                    weights: dict[str, np.ndarray], cfg) -> tuple[Path, dict, dict[str, str]]:
    """The K-quant model: the synthetic F16 model quantised by llama.cpp's own llama-quantize
    (OFF build, under qemu), its weights dequantised from the file by gguf.quants (float64, the
    reference's), and {weight: ggml type} of its Q4_K/Q6_K matrices that MUL_MATs use."""
    import gguf
    f16 = sg.write_gguf(work / "synthetic-f16.gguf", "f16", cfg)
    model = work / f"synthetic-{wtype}.gguf"
    run(guest(tb, sysroot, "n1", [str(off.bin / "llama-quantize"), str(f16), str(model),
                                  wtype.upper(), str(THREADS)], {}),
        f"llama-quantize {wtype}", log_file=work / f"quantize-{wtype}.log")
    dq, kq = {}, {}
    for t in gguf.GGUFReader(str(model)).tensors:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
        dq[t.name] = np.asarray(a, np.float64).reshape(weights[t.name].shape)
        if t.tensor_type.name in [k.upper() for k in KQUANT_GGML] and t.name != "token_embd.weight":
            kq[t.name] = t.tensor_type.name.replace("_K", "_K")
    if set(dq) != set(weights):
        raise CheckError(f"{model.name}: tensors {sorted(set(dq) ^ set(weights))} differ from the model's")
    types = {}
    for n, ty in kq.items():
        types[ty] = types.get(ty, 0) + 1
    log(f"{wtype}: llama-quantize wrote {', '.join(f'{v} {k}' for k, v in sorted(types.items()))} "
        "matrices used by MUL_MAT")
    return model, dq, {n: ty.lower().replace("_k", "_K") for n, ty in kq.items()}


def rel(d: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(d)) / np.sqrt(np.mean(ref * ref)))


def run_plan(builds: list[Build], cpus: list[str], off_cpus: list[str],
             sme: list[str], kquant: bool = False) -> list[tuple[Build, str, str]]:
    """(build, cpu, GGML_KLEIDIAI_SME) of every run: the OFF build on ``off_cpus`` (the first is
    the reference), then each ON build (on, real: side by side) on ``cpus`` with SME off and,
    on SME CPUs, with each cap in ``sme``.  A K-quant model (``kquant``) runs only the patched
    export build (the real KleidiAI has no K-quant kernel: its build would run ggml's, as OFF)."""
    plan = [(builds[0], c, "-") for c in off_cpus]
    ons = [b for b in builds[1:] if not kquant or b.name == "on"]
    for c in cpus:
        caps = [v for v in sme if v != "0"] if is_sme_cpu(c) else []
        plan += [(b, c, v) for v in ["0"] + caps for b in ons]
    return plan


def compare_real(exp: Run, real: Run) -> dict:
    """A row of the export-vs-real-KleidiAI table: one llama.cpp configuration run with the
    export (``exp``) and with the real KleidiAI (``real``), checked by ``expect_identical``."""
    ident = expect_identical(exp.wtype, exp.cpu, exp.sme)
    row = {"type": exp.wtype, "cpu": exp.cpu, "sme": exp.sme, "kernels": exp.kernels or "-",
           "expect": "identical" if ident else f"d/rms<={TOLERANCE[exp.wtype]}"}
    problems = []
    if exp.error or real.error:
        problems.append(f"not compared: the {'export' if exp.error else 'real'} run failed")
    else:
        if kleidiai_picks(exp.kernels) != kleidiai_picks(real.kernels):
            problems.append(f"KleidiAI picked {exp.kernels!r} with the export, "
                            f"{real.kernels!r} with the real tree")
        d = exp.logits - real.logits
        row["max_abs"] = float(np.max(np.abs(d)))
        row["d_rel"] = rel(d, real.logits)
        row["bit_equal"] = int(np.count_nonzero(exp.logits.view(np.uint32)
                                                == real.logits.view(np.uint32)))
        row["n_logits"] = int(exp.logits.size)
        row["tok_equal"] = exp.tokens == real.tokens
        if ident and row["bit_equal"] != row["n_logits"]:
            problems.append(f"{row['n_logits'] - row['bit_equal']} of {row['n_logits']} logits "
                            f"differ (max |d| {row['max_abs']:.3g}) on a path whose kernels are "
                            "bit-exact")
        if not ident and row["d_rel"] > TOLERANCE[exp.wtype]:
            problems.append(f"max|d| {row['max_abs']:.4f} = {row['d_rel']:.4f} x rms > "
                            f"tolerance {TOLERANCE[exp.wtype]}")
        if not row["tok_equal"]:
            problems.append(f"greedy tokens differ: {exp.tokens} vs {real.tokens}")
    row["ok"] = not problems
    row["problems"] = problems
    return row


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.monotonic()
    if provision.is_native():
        raise SystemExit("llama_cpp_check: this script cross-builds on an x86-64 host")
    tb = provision.ensure()
    sysroot = provision.ensure_cross_sysroot()
    src = llama_source(a.llama_src)
    builds = [build("off", src, sysroot, None, a.jobs, a.rebuild)]
    exported = a.export is None and not a.off_only
    if exported:
        a.export = export_tree(a.target, a.tuned)
    if a.export is not None:
        psrc, proot = patched_source(src, a.patch)
        builds.append(build("on", psrc, sysroot, a.export, a.jobs, a.rebuild, root=proot))
        if exported:    # the build dir holds its own copy (kleidiai-src)
            shutil.rmtree(a.export, ignore_errors=True)
        if not a.no_real:
            real_src = provision.ensure_kleidiai_source(a.kleidiai)
            builds.append(build("real", src, sysroot, real_src, a.jobs, a.rebuild))
    t_built = time.monotonic()
    if a.build_only:
        return 0

    work = a.work or Path(tempfile.mkdtemp(prefix="llama-check-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = sg.ModelConfig()
    ids = sg.prompt_ids(cfg)
    weights = sg.make_weights(cfg)
    rows, pairs, failed = [], [], False
    for wtype in a.types:
        plan = run_plan(builds, a.cpus, a.off_cpus, a.sme, wtype in KQUANT_TYPES)
        kq_weights: dict[str, str] = {}
        if wtype in KQUANT_TYPES:
            model, dq, kq_weights = quantized_model(tb, sysroot, builds[0], wtype, work, weights, cfg)
        else:
            model = sg.write_gguf(work / f"synthetic-{wtype}.gguf", wtype, cfg)
            dq = sg.dequantized(weights, wtype)
        ref_toks, margins, _ = sg.greedy_reference(dq, ids, STEPS, cfg)
        ref_logits = sg.reference_logits(dq, sg.prompt_ids(cfg, LOGITS_PROMPT[wtype]), cfg)[-1]
        if min(margins) < MIN_MARGIN:
            raise CheckError(f"the synthetic {wtype} model's greedy path has a near-tie "
                             f"(margin {min(margins):.3f} < {MIN_MARGIN}): change ModelConfig")
        runs = []
        for b, cpu, sme in plan:
            r = one_run(tb, sysroot, b, cpu, sme, wtype, model, work)
            log(f"{wtype} {b.name} {cpu} sme={sme}: {r.seconds:.1f} s"
                + (f" ERROR {r.error.splitlines()[0]}" if r.error else ""))
            runs.append(r)
        base = runs[0]
        for r in runs:
            row = {"type": wtype, "build": r.build, "cpu": r.cpu, "sme": r.sme,
                   "kernels": r.kernels or "-", "seconds": round(r.seconds, 1)}
            problems = []
            if kq_weights and r.build == "on" and not r.error:
                row["kq"] = [sum(c[i] for c in r.kq_calls.values()) for i in (0, 1)]
                row["kq_kernels"] = ", ".join(r.kq_kernels)
                problems += check_kquant_calls(r, kq_weights)
            if r.error:
                problems.append(r.error)
            else:
                row["d_f64"] = rel(r.logits - ref_logits, ref_logits)
                row["tok_f64"] = r.tokens == ref_toks
                if row["d_f64"] > REF_TOLERANCE[wtype]:
                    problems.append(f"logits off the float64 reference by {row['d_f64']:.4f} "
                                    f"x rms > {REF_TOLERANCE[wtype]}")
                if r is base:
                    if r.tokens != ref_toks:
                        problems.append(f"greedy tokens {r.tokens} != float64 reference {ref_toks}")
                elif base.error is None:
                    d = r.logits - base.logits
                    row["max_abs"] = float(np.max(np.abs(d)))
                    row["d_ref"] = rel(d, base.logits)
                    row["tok_ref"] = r.tokens == base.tokens
                    if row["d_ref"] > TOLERANCE[wtype]:
                        problems.append(f"max|dlogit| {row['max_abs']:.4f} = {row['d_ref']:.4f} x rms "
                                        f"> tolerance {TOLERANCE[wtype]}")
                    if r.tokens != base.tokens:
                        k = next(i for i, (x, y) in enumerate(zip(r.tokens, base.tokens))
                                 if x != y)
                        problems.append(f"greedy tokens differ from step {k} (reference margin "
                                        f"there {margins[k]:.2f}): {r.tokens} vs {base.tokens}")
            row["ok"] = not problems
            row["problems"] = problems
            failed |= bool(problems)
            rows.append(row)
        real = {(r.cpu, r.sme): r for r in runs if r.build == "real"}
        for r in runs:
            if r.build == "on" and (r.cpu, r.sme) in real:
                pairs.append(compare_real(r, real[r.cpu, r.sme]))
                failed |= not pairs[-1]["ok"]
        log(f"{wtype}: float64 reference greedy margins min {min(margins):.2f}, "
            f"logit rms {np.sqrt(np.mean(ref_logits ** 2)):.2f}")

    print_table(rows, builds, t_built - t_start, time.monotonic() - t_built)
    if pairs:
        print_real_table(pairs)
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "export_vs_real": pairs, "builds": [
            {"name": b.name, "dir": str(b.dir), "seconds": b.seconds, "cached": b.cached,
             "incremental": b.incremental, "ccache": b.ccache}
            for b in builds]}, indent=1) + "\n")
    if failed:
        print(f"llama-check: FAILED (work dir kept: {work})", file=sys.stderr)
        return 1
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print("llama-check: all runs within tolerance")
    return 0


def print_table(rows: list[dict], builds: list[Build], t_build: float, t_run: float) -> None:
    def f(x, fmt):
        return format("-", ">" + fmt.split(".")[0]) if x is None else format(x, fmt)
    hdr = (f"{'type':6} {'build':5} {'cpu':4} {'sme':3} {'kleidiai kernels':42} "
           f"{'max|d|':>8} {'d/rms':>8} {'tok=':>4} {'d64/rms':>8} {'tok64':>5} {'s':>5}  result")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['type']:6} {r['build']:5} {r['cpu']:4} {r['sme']:3} {r['kernels'][:42]:42} "
              f"{f(r.get('max_abs'), '8.4f')} {f(r.get('d_ref'), '8.5f')} "
              f"{('yes' if r['tok_ref'] else 'NO') if 'tok_ref' in r else 'ref':>4} "
              f"{f(r.get('d_f64'), '8.5f')} "
              f"{('yes' if r['tok_f64'] else 'NO') if 'tok_f64' in r else '-':>5} "
              f"{r['seconds']:5.1f}  {'ok' if r['ok'] else 'FAIL'}")
        if "kq" in r:
            print(f"      K-quant MUL_MATs on tilegen's kernels: {r['kq'][0]} (llama-debug) + "
                  f"{r['kq'][1]} (llama-batched) = {sum(r['kq'])}, on {r['kq_kernels'] or '-'}")
        for pr in r["problems"]:
            print(f"      {pr.splitlines()[0]}")
    print()
    print("columns: max|d| = max |logit - OFF@n1 logit| at the last prompt position; d/rms = that "
          "over the OFF logits' rms; tok= = 16 greedy tokens equal OFF@n1's; d64/rms, tok64 = the "
          "same against a float64 forward pass of the dequantised weights")
    for b in builds:
        inc = f", last incremental rebuild {b.incremental:.0f} s" if b.incremental else ""
        cc = f", ccache reused {b.ccache[0]} of {sum(b.ccache)} objects" if b.ccache else ""
        print(f"build {b.name}: {'cached' if b.cached else 'built'}; cold build {b.seconds:.0f} s"
              f"{inc}{cc} ({b.dir})")
    print(f"time: builds/provisioning {t_build:.0f} s, runs {t_run:.0f} s")


def print_real_table(pairs: list[dict]) -> None:
    print()
    print(f"tilegen export (on) vs the real KleidiAI v{KLEIDIAI_VERSION} (real), same llama.cpp "
          "and configuration:")
    hdr = (f"{'type':5} {'cpu':4} {'sme':3} {'kleidiai kernels':28} {'max|d|':>8} "
           f"{'d/rms':>8} {'bit-equal':>9} {'tok=':>4} {'expected':12}  result")
    print(hdr)
    print("-" * len(hdr))
    for r in pairs:
        eq = f"{r['bit_equal']}/{r['n_logits']}" if "bit_equal" in r else "-"
        tok = ("yes" if r["tok_equal"] else "NO") if "tok_equal" in r else "-"
        mx = format(r["max_abs"], "8.4f") if "max_abs" in r else format("-", ">8")
        dr = format(r["d_rel"], "8.5f") if "d_rel" in r else format("-", ">8")
        print(f"{r['type']:5} {r['cpu']:4} {r['sme']:3} {r['kernels'][:28]:28} {mx} {dr} {eq:>9} "
              f"{tok:>4} {r['expect']:12}  {'ok' if r['ok'] else 'FAIL'}")
        for pr in r["problems"]:
            print(f"      {pr.splitlines()[0]}")
    print()
    print("columns: max|d| = max |export logit - real logit| at the last prompt position; d/rms "
          "= that over the real logits' rms; bit-equal = logits with the same float32 bits; "
          "tok= = the 16 greedy tokens agree; "
          "expected: identical (every logit bit-equal) where the export's kernels are bit-exact "
          "with KleidiAI's, else max|d| over the real logits' rms within the tolerance.")
    if any(r["expect"] != "identical" for r in pairs):
        print("Q4_0 with SME on an SME2 CPU is checked within the tolerance only: the export's "
              "f16-LHS SME2 GEMM (matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa) is "
              "taken as not bit-exact (F16P_Q4_0_SME2_GEMM_BIT_EXACT = False in "
              "scripts/llama_cpp_check.py).")
    caps = sorted({r["sme"] for r in pairs if "GGML_KLEIDIAI_CHUNK_MULTIPLIER"
                   in run_env(r["cpu"], r["sme"])})
    if caps:
        print(f"GGML_KLEIDIAI_SME={','.join(caps)} runs on SME CPUs set "
              "GGML_KLEIDIAI_CHUNK_MULTIPLIER=1: ggml's split of 128+-row batches between the "
              "SME and the fallback kernel is then static (one column chunk per thread), so the "
              "comparison is deterministic.")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (CheckError, provision.ProvisionError) as e:
        print(f"llama-check: error: {e}", file=sys.stderr)
        sys.exit(2)
