"""provision.ensure_llama_cpp_source (the llama.cpp tree of the tests' llama_cpp_src fixture and
of scripts/llama_cpp_check.sh), offline: a local stand-in sdist, pip replaced by a fake."""
import io
import tarfile
import threading
from pathlib import Path

import pytest

from tilegen.emulate import provision

NAME = f"llama_cpp_python-{provision.LLAMA_CPP_PYTHON_VERSION}"
KAI = Path("vendor/llama.cpp/ggml/src/ggml-cpu/kleidiai")


def _sdist(path: Path, with_kleidiai: bool = True) -> Path:
    with tarfile.open(path, "w:gz") as t:
        files = {"PKG-INFO": b"Name: llama_cpp_python\n"}
        if with_kleidiai:
            files[str(KAI / "kernels.cpp")] = b"// kai_run_x\n"
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{NAME}/{rel}")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", str(tmp_path))
    (tmp_path / "llama").mkdir()
    return tmp_path / "llama"


def test_concurrent_callers_unpack_once(cache, monkeypatch):
    _sdist(cache / f"{NAME}.tar.gz")
    (cache / f".tmp-{NAME}-interrupted").mkdir()          # a leftover of a killed run
    steps = []
    real = provision._step_llama_cpp_source

    def counted(*a):
        build = real(*a)
        return lambda tmp: (steps.append(tmp), build(tmp))[1]

    monkeypatch.setattr(provision, "_step_llama_cpp_source", counted)
    monkeypatch.setattr(provision, "_run", lambda *a, **k: pytest.fail("no download expected"))
    barrier, got, errs = threading.Barrier(4), [], []

    def call():
        barrier.wait()
        try:
            got.append(provision.ensure_llama_cpp_source(quiet=True))
        except BaseException as e:      # noqa: BLE001 - reported below
            errs.append(e)

    ths = [threading.Thread(target=call) for _ in range(4)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    assert errs == [] and len(steps) == 1
    assert got == [cache / NAME / "vendor" / "llama.cpp"] * 4
    assert (cache / NAME / KAI / "kernels.cpp").read_text() == "// kai_run_x\n"
    assert (cache / NAME / ".tilegen-complete").read_text().startswith(f"{NAME}.tar.gz sha256=")
    assert sorted(p.name for p in cache.iterdir()) == [".lock", NAME, f"{NAME}.tar.gz"]
    assert provision.ensure_llama_cpp_source(quiet=True) == got[0] and len(steps) == 1


def test_downloads_the_sdist_with_pip(cache, monkeypatch):
    cmds = []

    def fake_run(cmd, what, hint, **kw):
        cmds.append(cmd)
        _sdist(Path(cmd[cmd.index("-d") + 1]) / f"{NAME}.tar.gz")

    monkeypatch.setattr(provision, "_run", fake_run)
    src = provision.ensure_llama_cpp_source(quiet=True)
    assert src == cache / NAME / "vendor" / "llama.cpp" and (cache / NAME / KAI / "kernels.cpp").is_file()
    [cmd] = cmds
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd
    assert cmd[cmd.index("--no-binary") + 1] == ":all:"
    assert cmd[-1] == f"llama-cpp-python=={provision.LLAMA_CPP_PYTHON_VERSION}"
    assert (cache / f"{NAME}.tar.gz").is_file()


def test_a_failed_fetch_raises_and_leaves_nothing(cache, monkeypatch):
    def fail(cmd, what, hint, **kw):
        raise provision.ProvisionError(f"{what} failed (exit 1)")

    monkeypatch.setattr(provision, "_run", fail)
    with pytest.raises(provision.ProvisionError, match="pip download"):
        provision.ensure_llama_cpp_source(quiet=True)
    assert sorted(p.name for p in cache.iterdir()) == [".lock"]


def test_an_sdist_without_the_kleidiai_backend_is_refused(cache, monkeypatch):
    _sdist(cache / f"{NAME}.tar.gz", with_kleidiai=False)
    with pytest.raises(provision.ProvisionError, match="KleidiAI backend"):
        provision.ensure_llama_cpp_source(quiet=True)
    assert not (cache / NAME).exists()
