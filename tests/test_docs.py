"""The docs stay true: links resolve, the README's tour runs, the code map names every module.

* every relative link of README.md and docs/*.md points at a file that exists, and its
  ``#anchor`` at a heading of the target (GitHub's slugs) or an explicit ``<a id=...>``;
* the README keeps "The two commands" (CI relies on the README naming the test command);
* every command of the README's tour works: the ``sh`` block after ``<!-- tour: cli`` line by
  line as ``python -m tilegen ...``, the ``python`` block after ``<!-- tour: python host`` on
  the host and the one after ``<!-- tour: python aarch64`` under ``tilegen emulate`` (natively
  on aarch64), all in a temporary directory, so the tour's ``out/...`` paths land there;
* docs/code-map.md names every module and template of ``tilegen/``, and every path it names
  exists.
"""
from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS]
CODE_MAP = REPO / "docs" / "code-map.md"

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.I)
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for i, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            yield i, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown text (before de-duplication)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # links -> their text
    parts = _CODE_SPAN.split(text)          # [prose, ticks, code, prose, ticks, code, ...]
    text = "".join(re.sub(r"<[^>]+>", "", p) if i % 3 == 0 else p if i % 3 == 2 else ""
                   for i, p in enumerate(parts))   # HTML tags go, code keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)                          # punctuation goes, _ and - stay
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub makes for ``path``: heading slugs (duplicates get -1, -2, ...) and
    explicit ``<a id="...">`` / ``<a name="...">``."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    text = path.read_text()
    for _, line in _prose_lines(text):
        m = _HEADING.match(line)
        if m:
            s = slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
        out.update(_HTML_ID.findall(line))
    return out


def relative_links(path: Path):
    """(line, target) of every relative Markdown link outside code blocks and code spans."""
    for i, line in _prose_lines(path.read_text()):
        line = _CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line)
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:
                continue
            yield i, target


def test_pages_exist():
    assert README.is_file() and DOCS, "README.md and docs/*.md"
    for p in ("layouts.md", "export.md", "llama_cpp_check.md", "code-map.md", "testing.md"):
        assert (REPO / "docs" / p).is_file(), p


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_resolve(page):
    bad = []
    for line, target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = f"{page.relative_to(REPO)}:{line}: ({target})"
        if not dest.exists():
            bad.append(f"{where} no such file {dest}")
            continue
        if anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            bad.append(f"{where} no heading or <a id> '#{anchor}' in {dest.relative_to(REPO)}")
    assert not bad, "\n".join(bad)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in relative_links(README)}
    missing = [str(p.relative_to(REPO)) for p in DOCS if p.resolve() not in linked]
    assert not missing, f"README.md does not link {missing}"


def test_slugs_follow_github():
    assert slug("Calling kernels: clamp, Inf/NaN, out=, threads") == \
        "calling-kernels-clamp-infnan-out-threads"
    assert slug("`--tuned` and `--tuned-pairs`") == "--tuned-and---tuned-pairs"
    assert slug("The best gemm and the best gemv on their own layouts: `for_ops`") == \
        "the-best-gemm-and-the-best-gemv-on-their-own-layouts-for_ops"
    assert slug("llama.cpp as a client") == "llamacpp-as-a-client"
    assert slug("`f32p<nr>x1b` — f32 RHS panels with bias") == \
        "f32pnrx1b--f32-rhs-panels-with-bias"
    assert slug("[`tilegen tune`](x.md) <em>now</em>") == "tilegen-tune-now"


def test_links_are_found():
    """The link scanner sees the links (a scanner that finds none would pass every page)."""
    readme = [t for _, t in relative_links(README)]
    assert "docs/code-map.md" in readme and len(readme) >= 10
    layouts = [t for _, t in relative_links(REPO / "docs" / "layouts.md")]
    assert "#ggml-q4_0" in layouts
    assert not any("kernels[name]" in t for _, t in relative_links(REPO / "docs" / "calling.md"))


def _section(text: str, heading: str) -> str:
    m = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"README.md has no '## {heading}' section"
    return m.group(1)


def test_readme_names_the_two_commands():
    two = _section(README.read_text(), "The two commands")
    assert "bash scripts/demo.sh" in two and "bash scripts/test.sh" in two


def test_readme_families_line_names_every_family():
    """The README's "Families:" paragraph omitted q4_K and q6_K: it names every family of the
    records."""
    from tilegen.families import FAMILIES
    m = re.search(r"^Families: (.*?)\n\n", README.read_text(), re.M | re.S)
    assert m, "README.md: no 'Families: ...' paragraph"
    named = set(re.findall(r"`([\w.]+)`", m.group(1)))
    assert set(FAMILIES) <= named, f"README's Families line misses {sorted(set(FAMILIES) - named)}"


def test_demo_runs_every_weight_format_it_shows(tmp_path):
    """scripts/demo.py (what `bash scripts/demo.sh` runs after its set-up) ends in OK, and its
    GGUF part shows a Q4_K_M-style file (Q4_K and Q6_K tensors through load_tensor, gemm, gemv,
    get_rows) next to f32 and q4_0 -- it showed f32 and q4_0 only."""
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py")], cwd=tmp_path,
                       env=dict(_env(), OUT=str(tmp_path / "demo")), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0 and p.stdout.rstrip().endswith("\nOK"), p.stdout + p.stderr
    assert "3. f32: " in p.stdout and "4. q4_0 from GGUF: " in p.stdout, p.stdout
    assert "5. Q4_K_M-style GGUF" in p.stdout, p.stdout
    for name, typ in (("blk.0.ffn_gate.weight", "Q4_K"), ("blk.0.ffn_down.weight", "Q6_K")):
        line = next((ln for ln in p.stdout.splitlines() if ln.strip().startswith(f"{name} {typ}: ")), "")
        assert re.search(r"gemm matmul_clamp_f32_q8kp\w+ .*gemv matmul_clamp_f32_q8kp1x\w+: .*"
                         r"largest error / bound 0\.\d\d; get_rows exact: True$", line), p.stdout


def tour_block(marker: str, lang: str) -> str:
    """The fenced ``lang`` block right after the README's ``<!-- tour: marker`` comment."""
    text = README.read_text()
    m = re.search(rf"<!-- tour: {re.escape(marker)}\b[^\n]*-->\s*\n```{lang}\n(.*?)^```",
                  text, re.M | re.S)
    assert m, f"README.md: no ```{lang} block after <!-- tour: {marker} -->"
    return m.group(1)


def _env() -> dict[str, str]:
    """This checkout's tilegen first (the tests run from a temporary directory)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    return env


def _run(argv: list[str], cwd: Path, what: str) -> None:
    p = subprocess.run(argv, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (f"README tour: `{what}` exited {p.returncode}\n"
                               f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")


def test_readme_tour_cli(tmp_path):
    lines = [ln for ln in tour_block("cli", "sh").splitlines() if ln.strip()]
    assert len(lines) >= 5
    for line in lines:
        argv = shlex.split(line, comments=True)
        assert argv and argv[0] == "tilegen", f"README tour: not a tilegen command: {line!r}"
        _run([sys.executable, "-m", "tilegen", *argv[1:]], tmp_path, " ".join(argv))
    assert list((tmp_path / "out").glob("*.S")), "generate wrote no out/<name>.S"
    assert (tmp_path / "out" / "lib" / "manifest.json").is_file()
    assert (tmp_path / "out" / "kai" / "TILEGEN_EXPORT.json").is_file()


def test_readme_tour_python(tmp_path):
    host = tmp_path / "tour_host.py"
    host.write_text(tour_block("python host", "python"))
    _run([sys.executable, str(host)], tmp_path, "python tour_host.py")
    assert (tmp_path / "out" / "api" / "manifest.json").is_file()

    guest = tmp_path / "tour_aarch64.py"
    guest.write_text(tour_block("python aarch64", "python"))
    if platform.machine().lower() in ("aarch64", "arm64"):
        argv = [sys.executable, str(guest)]
    else:
        argv = [sys.executable, "-m", "tilegen", "emulate", "--cpu", "neoverse-n1", "--quiet",
                "--", "python", str(guest)]
    _run(argv, tmp_path, "python tour_aarch64.py")
    assert (tmp_path / "out" / "w.tgpw").is_file()


# -- the code map ------------------------------------------------------------------------------
_PATH_TOKEN = re.compile(r"`((?:tilegen|scripts|tests|bench|docs)/[^`\s]*)`")


def _code_map_paths() -> set[str]:
    return set(_PATH_TOKEN.findall(CODE_MAP.read_text()))


def _package_files() -> list[str]:
    pkg = REPO / "tilegen"
    files = [p for p in pkg.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.suffix in (".py", ".j2")]
    return sorted(str(p.relative_to(REPO)) for p in files)


def test_code_map_paths_exist():
    missing = sorted(p for p in _code_map_paths() if not (REPO / p).exists())
    assert not missing, f"docs/code-map.md names paths that do not exist: {missing}"


def test_code_map_names_every_module():
    named = _code_map_paths()
    missing = [f for f in _package_files() if f not in named]
    assert not missing, ("docs/code-map.md: add a line (`path` | what it owns) for "
                         f"{missing}")


_DOTTED = re.compile(r"(?<![\w/.-])tilegen(?:\.[A-Za-z_]\w*)+\*?")


def _resolves(dotted: str) -> bool:
    """``tilegen.a.b.Name`` is an importable module and its attributes (``Name_*``: some
    attribute of that prefix)."""
    import importlib
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            if p.endswith("*"):
                return any(a.startswith(p[:-1]) for a in dir(obj))
            if not hasattr(obj, p):
                return False
            obj = getattr(obj, p)
        return True
    return False


def test_dotted_names_resolve():
    """#31: every dotted ``tilegen.…`` name in the pages and in the templates' comments names
    a module or attribute that exists (a class that moved to its family plugin is not named
    at its old place)."""
    files = PAGES + sorted((REPO / "tilegen" / "templates").rglob("*.j2"))
    stale = sorted({(m[0], str(f.relative_to(REPO))) for f in files
                    for m in _DOTTED.finditer(f.read_text()) if not _resolves(m[0])})
    assert not stale, f"names that do not resolve: {stale}"


def test_code_map_has_the_stage_order():
    text = CODE_MAP.read_text()
    order = ["spec", "layout", "register allocation", "template", "toolchain",
             "library + manifest", "runtime", "cpu", "select", "pack", "partition", "call"]
    flow = re.search(r"```\n(.*?)```", text, re.S)
    assert flow, "docs/code-map.md: the stage order block"
    pos = [flow.group(1).find(s) for s in order]
    assert -1 not in pos and pos == sorted(pos), flow.group(1)
    assert "export" in text and "emulate" in text


def test_llama_patch_apply_commands_run(llama_cpp_src, tmp_path):
    """docs/llama_cpp_check.md gave no command to apply llama-kquants.patch to one's own
    llama.cpp: its "apply" block exports a tree and applies the patch the export wrote from the
    llama.cpp root.  Its lines before the first cmake run in a copy of the vendored llama.cpp's
    KleidiAI backend directory (`tilegen` = this checkout); the block names the version the
    check builds and llama.cpp's CMake options for the tree."""
    import shutil
    from tilegen.emulate.provision import LLAMA_CPP_PYTHON_VERSION
    text = (REPO / "docs" / "llama_cpp_check.md").read_text()
    m = re.search(r"<!-- apply:[^\n]*-->\s*\n```sh\n(.*?)^```", text, re.M | re.S)
    assert m, "docs/llama_cpp_check.md: no ```sh block after <!-- apply: -->"
    block = m.group(1)
    section = text[text.index("### Applying it to your own llama.cpp"):m.start()]
    assert f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist" in section, section
    assert "-DGGML_CPU_KLEIDIAI=ON" in block and "-DFETCHCONTENT_SOURCE_DIR_KLEIDIAI=" in block
    lines = block.split("\ncmake", 1)[0].splitlines()
    assert any(ln.startswith("tilegen export kleidiai ") for ln in lines), block
    assert any(ln.startswith("patch -p1 ") and "--dry-run" not in ln for ln in lines), block
    rel = Path("ggml", "src", "ggml-cpu", "kleidiai")
    root = tmp_path / "llama.cpp"
    shutil.copytree(llama_cpp_src / rel, root / rel)
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "tilegen").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tilegen "$@"\n')
    (shim / "tilegen").chmod(0o755)
    env = dict(_env(), HOME=str(tmp_path / "home"), PATH=f"{shim}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "home").mkdir()
    for line in lines:
        p = subprocess.run(["bash", "-c", f"set -euo pipefail; {line}"], cwd=root, env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"`{line}` exited {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert (tmp_path / "home" / "kai-tree" / "TILEGEN_EXPORT.json").is_file()
    kernels = (root / rel / "kernels.cpp").read_text()
    assert "gemm_gemv_kernels_kquant" in kernels and "kai_run_matmul_clamp_f32_q8kp" in kernels
