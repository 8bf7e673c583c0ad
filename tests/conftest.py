"""Shared fixtures: built libraries and emulated-CPU guest sessions."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import tilegen
from tilegen.emulate import provision
from tilegen.emulate.remote import GuestSession

TESTS_DIR = Path(__file__).resolve().parent
#: KleidiAI's golden vectors (README files there say what each is): ``$TILEGEN_VECTORS``, else
#: the repository's ``../shared/vectors``. Tests built from them fail (never skip) when the
#: directory or a file pattern is missing.
VECTORS = Path(os.environ.get("TILEGEN_VECTORS") or TESTS_DIR.parents[1] / "shared" / "vectors")
#: KleidiAI v1.24.0's release tarball (the version llama.cpp pins): ``$TILEGEN_KLEIDIAI``, else
#: the repository's ``../shared/thirdparty/kleidiai``; missing, the tests built on it fail.
KLEIDIAI_TARBALL = Path(os.environ.get("TILEGEN_KLEIDIAI") or TESTS_DIR.parents[1] / "shared"
                        / "thirdparty" / "kleidiai" / "kleidiai-v1.24.0.tar.gz")
# qemu CPU models the execution tests run on.
EXEC_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "max")
F32_TILES = ("6x16", "4x16", "8x8", "4x24", "5x12", "1x16", "1x4")
# tiles no KleidiAI kernel has, which the allocator accepts
F32_EXTRA_TILES = ("3x8", "7x12", "2x28", "13x4")

_sessions: dict[tuple, GuestSession] = {}


def guest(cpu: str, sve_vl: int | None = None, sme_vl: int | None = None,
          env: dict[str, str] | None = None) -> GuestSession:
    """A persistent guest Python per (CPU model, vector lengths, environment)."""
    key = (cpu, sve_vl, sme_vl, tuple(sorted((env or {}).items())))
    s = _sessions.get(key)
    if s is None:
        s = _sessions[key] = GuestSession(cpu, sve_vl, sme_vl, paths=[str(TESTS_DIR)], env=env)
    return s


@pytest.fixture(scope="session")
def v2_default_lib(tmp_path_factory) -> Path:
    """neoverse-v2's default build (its tuned pairs and best kernels), built once per session
    for the tests that read it (test_tuned_presets, test_for_ops, test_exec_kquant_runtime;
    none writes into it)."""
    out = tmp_path_factory.mktemp("v2default")
    tilegen.build_library(None, target="neoverse-v2", out_dir=out)
    return out


# SME kernels are opt-in at run time (TILEGEN_SME); tests that run them enable it.
SME_ON = {"TILEGEN_SME": "1"}


def draw_examples(strategy, n: int) -> list:
    """n examples (at least) of a hypothesis strategy, drawn deterministically, for tests that
    run their cases batched (one emulator session per configuration, not one call each)."""
    from hypothesis import HealthCheck, given, settings
    drawn: list = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(c=strategy)
    def collect(c):
        drawn.append(c)

    collect()
    return drawn


def vector_files(pattern: str, keep=None, minimum: int = 1) -> list[Path]:
    """The golden vectors ``VECTORS/pattern`` (sorted) that ``keep`` accepts; raises when fewer
    than ``minimum`` do, so a moved or renamed vectors directory is a failure, not an empty test."""
    files = sorted(p for p in VECTORS.glob(pattern) if keep is None or keep(p))
    if len(files) < minimum:
        where = VECTORS if VECTORS.is_dir() else f"{VECTORS} (no such directory)"
        raise FileNotFoundError(f"{len(files)} golden vectors {pattern} in {where} (expected at "
                                f"least {minimum}); set TILEGEN_VECTORS or check out the shared "
                                "inputs next to the repository")
    return files


def vector_params(pattern: str, keep=None, minimum: int = 1, nargs: int = 1,
                  expand=None) -> list:
    """``vector_files`` as a parametrize list (``expand(path)``: the params of one file, when a
    file gives several). Without vectors it is one param that fails (a ``missing_vectors``
    marker, failed at set-up) instead of an empty parameter set, which pytest would report as a
    skip, or an error at collection that would stop the whole session; ``nargs`` is the
    parametrized argument count."""
    try:
        files = vector_files(pattern, keep, minimum)
    except FileNotFoundError as e:
        return [pytest.param(*(None,) * nargs, id=f"missing-vectors:{pattern}",
                             marks=pytest.mark.missing_vectors(str(e)))]
    return files if expand is None else [q for p in files for q in expand(p)]


def pytest_configure(config):
    config.addinivalue_line("markers", "missing_vectors(msg): the golden vectors a parametrized "
                            "test is built from are missing (the test fails at set-up)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    m = item.get_closest_marker("missing_vectors")
    if m is not None:
        pytest.fail(m.args[0], pytrace=False)


@pytest.fixture(scope="session")
def llama_cpp_src() -> Path:
    """llama.cpp's source tree (the llama-cpp-python sdist's vendor/llama.cpp), fetched into
    tilegen's cache once by the project's provisioning; a failed fetch fails the test."""
    src = provision.ensure_llama_cpp_source()
    assert (src / "ggml" / "src" / "ggml-cpu" / "kleidiai" / "kernels.cpp").is_file(), src
    return src


@pytest.fixture(scope="session")
def llama_kai(llama_cpp_src) -> Path:
    """ggml's KleidiAI glue directory (kernels.cpp, kleidiai.cpp) in llama.cpp's tree."""
    return llama_cpp_src / "ggml" / "src" / "ggml-cpu" / "kleidiai"


@pytest.fixture(scope="session")
def cross_sysroot() -> Path:
    """The aarch64 C/C++ cross sysroot of the project's provisioning (fetched once)."""
    root = provision.ensure_cross_sysroot()
    assert (root / "usr" / "include" / "c++").is_dir(), root
    return root


@pytest.fixture(scope="session")
def kleidiai_ref() -> provision.KleidiAI:
    """KleidiAI v1.24.0 built for aarch64 by its own CMake (clang-19, the cross sysroot),
    once per machine into the cache (``provision.ensure_kleidiai_library``)."""
    return provision.ensure_kleidiai_library(KLEIDIAI_TARBALL)


@pytest.fixture(scope="session")
def export_kai(tmp_path_factory) -> dict:
    """``tilegen export kleidiai`` (linux-aarch64-all) configured and built by its CMake
    (clang cross, target ``kleidiai``) and linked into a shared object (``-Bsymbolic``, so it
    loads next to KleidiAI's own): root, lib (libkleidiai.a), so, toolchain, manifest."""
    import shutil
    import subprocess
    from tilegen.build.toolchain import discover
    from tilegen.export import kleidiai as K

    def run(cmd):
        p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
        assert p.returncode == 0, f"{' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}"

    tc = discover("elf")
    assert tc.kind == "clang", f"needs clang (scripts/setup.sh installs clang-19), found {tc.kind}"
    assert shutil.which("cmake"), "needs cmake (scripts/setup.sh installs it)"
    base = tmp_path_factory.mktemp("kai")
    root = base / "kleidiai"
    manifest = K.write_tree(root, target="linux-aarch64-all")
    (base / "aarch64.cmake").write_text(K.cmake_toolchain(cc=tc.driver[0]))
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", root, "-B", base / "build", *gen, "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_TOOLCHAIN_FILE={base / 'aarch64.cmake'}"])
    run(["cmake", "--build", base / "build", "-j", "2"])
    lib = base / "build" / "libkleidiai.a"
    so = base / "libkai_export.so"
    run(tc.link_cmd(["-Wl,-Bsymbolic", "-Wl,--whole-archive", lib, "-Wl,--no-whole-archive"], so))
    return dict(root=root, lib=lib, so=so, tc=tc, manifest=manifest)


def pytest_sessionfinish(session, exitstatus):
    for s in _sessions.values():
        s.close()


@pytest.fixture(scope="session")
def f32_lib(tmp_path_factory) -> Path:
    """A library with every f32 tile of the suite, built for generic Armv8 (NEON)."""
    out = tmp_path_factory.mktemp("f32lib")
    specs = [f"f32:neon:{t}" for t in F32_TILES + F32_EXTRA_TILES]
    tilegen.build_library(specs, target="generic-armv8", out_dir=out)
    return out


# NEON features of the qemu CPU models the NEON exec tests run on (the others have all three)
CPU_FEATURES = {"cortex-a53": {"neon"}, "neoverse-n1": {"neon", "dotprod"}}


def refused_for_missing_features(cpu: str, lib, spec) -> bool:
    """Whether ``cpu`` lacks a feature ``spec`` needs; if so, after checking that the runtime
    refuses the kernel with an ArgumentError naming every missing feature."""
    missing = set(spec.features) - CPU_FEATURES.get(cpu, {"neon", "dotprod", "i8mm"})
    if missing:
        msg = guest(cpu).call("guest_calls:kernel_refused", str(lib), spec.name)
        assert "ArgumentError" in msg and all(f in msg for f in missing), msg
    return bool(missing)
