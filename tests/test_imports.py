"""The imports of ``tilegen/`` run one way, and no module takes another's private names.

Every module of the package is parsed with :mod:`ast` (imports inside functions and classes
included, relative imports resolved) into a module-level import graph.

Rules of the graph:

* A node is a module; a package is its ``__init__``.
* ``import a.b.c`` and ``from a.b import c`` (``c`` a submodule) add one edge, to the most
  specific module named (``a.b.c``), not to the parent packages ``a`` and ``a.b`` whose
  ``__init__`` Python runs first: a package ``__init__`` that imports (re-exports) its
  children is therefore no cycle by itself.  ``from a.b import name`` (``name`` not a
  submodule) is an edge to ``a.b``, the ``__init__`` that defines or re-exports ``name``: a
  child that takes a name from its package's ``__init__`` back (``from .. import
  __version__`` below an ``__init__`` that imports that child) closes a cycle and fails.
* ``if TYPE_CHECKING:`` blocks are not imports at run time and are skipped.

The test fails on (a) any cycle of that graph (every strongly connected component of more
than one module, and any module importing itself), (b) any import of a private name --
a leading underscore, not a dunder -- from another module of tilegen: ``from .x import _y``,
``from . import _mod``, and ``m._y`` where ``m`` is a name bound to a tilegen module by an
import, and (c) any import against the stage order (:data:`STAGES`): a module may import
modules of its own stage and of the stages before it, never of a later one; every module
has a stage.
"""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parent.parent / "tilegen"
PKG = "tilegen"

# The stage order of the imports, bottom first (docs/code-map.md#stage-order).  A module's stage
# is the stage of the longest prefix that names it ("tilegen.layout": the package and every
# module under it; "=tilegen": that module only, ahead of an equal prefix; a pattern with "*":
# the modules it matches, each "*" within one name).  A module may import its own stage and the
# stages before it.  A prefix that names no module yet is allowed (a package not written yet).
STAGES: dict[str, tuple[str, ...]] = {
    # the facts every stage shares: errors, ISA/family records, calling conventions (and the
    # plan driver's ABI tables), CPU feature names and the host's features
    "records": ("tilegen.records", "tilegen.callconv", "tilegen.cpufeatures"),
    # the packed layouts, the one source of truth (the spec reads its formats' labels from
    # them, so they sit below the spec); fma_f32 is the binary32 FMA their packers use
    "layout": ("tilegen.layout", "tilegen.reference.f32"),
    # numpy references of the kernels' arithmetic (they read the packed layouts)
    "reference": ("tilegen.reference",),
    # the weight-family plugins (#31 item 1, tilegen/families/): on the shared layout bases and
    # the references, below the registries and dispatchers that find them
    "families": ("tilegen.families",),
    # the layout registries and dispatchers by format (they may read the plugins)
    "registries": ("tilegen.layout.registry", "tilegen.layout.api", "=tilegen.layout"),
    # generator: spec -> register allocation -> checks -> rendering, packers, descriptor, manifest
    "spec": ("tilegen.generator.spec", "tilegen.generator.tile_layouts"),
    # (and a family plugin package's own allocator submodules, regalloc*.py: #31 item 4)
    "regalloc": ("tilegen.generator.regalloc", "tilegen.families.*.regalloc*"),
    "validate": ("tilegen.generator.validate",),
    "generator": ("tilegen.generator", "tilegen.templates"),
    "build": ("tilegen.build",),
    "runtime": ("tilegen.runtime",),
    # the side exits and tools above the runtime
    "export": ("tilegen.export",),
    "gguf": ("tilegen.gguf",),
    "emulate": ("tilegen.emulate",),
    "analysis": ("tilegen.analysis",),
    "bench": ("tilegen.bench",),
    "cli": ("tilegen.cli", "tilegen.__main__"),
    # the public API (lazy imports of every stage)
    "api": ("=tilegen",),
}


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PKG_DIR.rglob("*.py"))}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


class _Imports(ast.NodeVisitor):
    """The tilegen imports of one module: edges (target module, line) and private names."""

    def __init__(self, name: str, is_pkg: bool, modules: dict[str, Path]) -> None:
        self.name, self.modules = name, modules
        self.package = name if is_pkg else name.rpartition(".")[0]
        self.edges: list[tuple[str, int]] = []
        self.private: list[tuple[int, str, str]] = []      # (line, source module, name)
        self.bound: dict[str, str] = {}                     # local name -> tilegen module

    def _resolve(self, module: str | None, level: int) -> str:
        if not level:
            return module or ""
        base = self.package.split(".")
        if level > 1:
            base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node):
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            target = alias.name
            if target != PKG and not target.startswith(PKG + "."):
                continue
            self.edges.append((target, node.lineno))
            for part in target.split("."):
                if _is_private(part):
                    self.private.append((node.lineno, target, part))
            if alias.asname:
                self.bound[alias.asname] = target

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self._resolve(node.module, node.level)
        if source != PKG and not source.startswith(PKG + "."):
            return
        for part in source.split(".")[1:]:
            if _is_private(part):
                self.private.append((node.lineno, source, part))
        for alias in node.names:
            sub = f"{source}.{alias.name}"
            if sub in self.modules:               # a submodule: the edge goes to it
                self.edges.append((sub, node.lineno))
                self.bound[alias.asname or alias.name] = sub
            else:
                self.edges.append((source, node.lineno))
            if _is_private(alias.name):
                self.private.append((node.lineno, source, alias.name))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.bound \
                and _is_private(node.attr):
            self.private.append((node.lineno, self.bound[node.value.id], node.attr))
        self.generic_visit(node)


def _scan() -> dict[str, _Imports]:
    modules = _modules()
    out = {}
    for name, path in modules.items():
        v = _Imports(name, path.name == "__init__.py", modules)
        v.visit(ast.parse(path.read_text(), str(path)))
        out[name] = v
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a self-import (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _graph(scan: dict[str, _Imports]) -> dict[str, set[str]]:
    return {name: {t for t, _ in v.edges if t in scan} for name, v in scan.items()}


def test_modules_found():
    scan = _scan()
    assert "tilegen.records" in scan and "tilegen.generator.spec" in scan


def test_no_import_cycle():
    scan = _scan()
    cycles = _cycles(_graph(scan))
    if cycles:
        lines = []
        for comp in cycles:
            members = set(comp)
            lines.append(f"cycle of {len(comp)} modules: {', '.join(comp)}")
            for m in comp:
                for t, line in sorted(set(scan[m].edges)):
                    if t in members:
                        lines.append(f"    {m}:{line} -> {t}")
        pytest.fail("\n".join(lines))


def test_no_private_import():
    scan = _scan()
    bad = [f"{name}:{line}: {attr} from {source}"
           for name, v in sorted(scan.items())
           for line, source, attr in v.private if source != name]
    assert not bad, f"{len(bad)} imports of private names:\n" + "\n".join(bad)


def _rank() -> dict[str, int]:
    return {stage: i for i, stage in enumerate(STAGES)}


def stage_of(module: str) -> str | None:
    """The stage of ``module``: the one whose longest prefix names it (None: no stage)."""
    best, best_len = None, -1
    for stage, prefixes in STAGES.items():
        for p in prefixes:
            exact = p.startswith("=")
            p = p.lstrip("=")
            score = len(p) + (0.5 if exact else 0)      # "=m" before "m" for m itself
            if "*" in p:            # a glob over one name each: "tilegen.families.*.regalloc*"
                match = fnmatch.fnmatchcase(module, p) and module.count(".") == p.count(".")
            else:
                match = module == p or (not exact and module.startswith(p + "."))
            if match and score > best_len:
                best, best_len = stage, score
    return best


def stage_violations(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """One line per import against the stage order (``edges``: module -> (imported module,
    line)), naming the importing module and line, the imported module and both stages."""
    rank = _rank()
    bad = []
    for name in sorted(edges):
        src = stage_of(name)
        for target, line in sorted(set(edges[name])):
            dst = stage_of(target)
            if src is not None and dst is not None and rank[dst] > rank[src]:
                bad.append(f"{name}:{line} imports {target}: stage {dst!r} is above {name}'s "
                           f"stage {src!r}")
    return bad


def test_every_module_has_a_stage():
    missing = [name for name in sorted(_scan()) if stage_of(name) is None]
    assert not missing, ("modules in no stage of STAGES (declare them in tests/test_imports.py): "
                         + ", ".join(missing))


def test_imports_follow_the_stage_order():
    scan = _scan()
    bad = stage_violations({name: [(t, line) for t, line in v.edges if t in scan]
                            for name, v in scan.items()})
    assert not bad, f"{len(bad)} imports against the stage order:\n" + "\n".join(bad)


def test_stage_check_names_the_offending_import():
    """The rule itself, on made-up edges: down the order passes, up it fails with the line."""
    assert stage_of("tilegen.build.driver") == "build"
    assert stage_of("tilegen.generator.regalloc.pool") == "regalloc"
    assert stage_of("tilegen.generator.descriptor") == "generator"
    assert stage_of("tilegen.reference.f32") == "layout"
    assert stage_of("tilegen") == "api" and stage_of("tilegen.nosuch") is None
    assert stage_of("tilegen.families.q4_k") == "families"
    assert stage_of("tilegen.families.q4_k.regalloc") == "regalloc"
    assert stage_of("tilegen.families.q6_k.regalloc_sme2") == "regalloc"
    assert stage_of("tilegen.families.q4_k.layout") == "families"
    # a plugin's record may not import its allocator (it sits above the registries)
    assert len(stage_violations({"tilegen.families.q4_k": [
        ("tilegen.families.q4_k.regalloc", 1)]})) == 1
    assert stage_of("tilegen.layout") == stage_of("tilegen.layout.api") == "registries"
    assert stage_of("tilegen.layout.kquant") == "layout"
    assert stage_violations({"tilegen.runtime.binding": [("tilegen.build.library", 3)]}) == []
    assert stage_violations({"tilegen.build.driver": [("tilegen.runtime.driver", 9)]}) == [
        "tilegen.build.driver:9 imports tilegen.runtime.driver: stage 'runtime' is above "
        "tilegen.build.driver's stage 'build'"]
    assert len(stage_violations({"tilegen.layout.base": [("tilegen.families.q4_k", 1),
                                                          ("tilegen.records", 2)]})) == 1
