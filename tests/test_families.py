"""The family registry (tilegen.families): one plugin module per weight family, and every
client finds the families through the registry — the spec grammar, the layout and allocator
registries, the runtime's kinds and its one packing protocol, the GGUF type table, the default
kernels, the export's tilegen-family entries and C packers, the CLI help and docs/specs.md's table."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tilegen.families as F
from tilegen.build.targets import DEFAULT_KERNELS
from tilegen.export import kleidiai as K
from tilegen.export import packers_c as PC
from tilegen.generator import regalloc
from tilegen.generator.validate import parse_spec
from tilegen.layout.base import LayoutError
from tilegen.layout.registry import LAYOUTS, layout_class
from tilegen.records import ISAS

DOCS = Path(__file__).resolve().parent.parent / "docs"
PLUGIN_ATTRS = ("ORDER", "RECORDS", "LAYOUTS", "ALLOCATOR_MODULES", "DEFAULT_KERNELS", "pack")


def test_every_plugin_module_is_found_and_complete():
    pkg = Path(F.__file__).parent
    modules = sorted([p.stem for p in pkg.glob("*.py") if not p.stem.startswith("_")]
                     + [p.parent.name for p in pkg.glob("*/__init__.py")])   # plugin packages
    assert sorted(p.__name__.rpartition(".")[2] for p in F.PLUGINS) == modules
    for p in F.PLUGINS:
        missing = [a for a in PLUGIN_ATTRS if not hasattr(p, a)]
        assert not missing, (p.__name__, missing)
        for rec in p.RECORDS:
            assert F.plugin(rec.name) is p
    assert [F.plugin(f).ORDER for f in F.FAMILIES] == sorted(F.plugin(f).ORDER for f in F.FAMILIES)


def test_layouts_and_allocators_come_from_the_plugins():
    for fam in F.FAMILIES.values():
        for isa, impl in fam.impls.items():
            rhs = impl.rhs or fam.rhs
            assert layout_class("rhs", rhs) in F.LAYOUTS, (fam.name, isa, rhs)
            assert impl.allocator in regalloc.ALLOCATORS, (fam.name, isa)
        assert F.rhs_layout_class(fam.name) is layout_class("rhs", fam.rhs)
    registered = {c for reg in LAYOUTS.values() for c in reg.values()}
    assert set(F.LAYOUTS) <= registered


def test_default_kernels_are_the_plugins_and_each_is_its_own_family():
    assert DEFAULT_KERNELS == F.DEFAULT_KERNELS
    for p in F.PLUGINS:
        own = {r.name for r in p.RECORDS}
        for s in p.DEFAULT_KERNELS:
            assert parse_spec(s).family in own, (p.__name__, s)


def test_kinds_and_ggml_types_come_from_the_records():
    kinds = {k for f in F.FAMILIES.values() for k in f.kinds}
    assert set(F.KIND_FAMILY) == kinds == set(F.FLOAT_KINDS) | set(F.GGML_KINDS)
    assert set(F.GGML_TYPES.values()) <= kinds
    for kind, fams in F.KIND_FAMILIES.items():
        assert fams[-1] == F.KIND_FAMILY[kind] and len(set(fams)) == len(fams)
    assert F.KIND_FAMILIES["f16"] == ("bf16", "f32")
    assert F.KIND_FAMILIES["q4_0"] == ("q4_0_f16", "q4_0")


def test_the_export_kquant_entries_and_packers_are_the_plugins():
    fams = [parse_spec(k.spec).family for k in K.KQUANT_KERNELS]
    assert list(dict.fromkeys(fams)) == list(F.LLAMA_KERNELS)
    specs = [K.KQUANT_KERNELS[i].spec for i in range(len(K.KQUANT_KERNELS))]
    want = [f"{fam}:{isa}:{tile}" for fam, entries in F.LLAMA_KERNELS.items()
            for isa, gemm, gemv, *_ in entries for tile in (gemm, gemv)]
    assert specs == want
    assert K.KQUANT_ENTRIES == tuple((K.KQUANT_KERNELS[i].name, K.KQUANT_KERNELS[i + 1].name)
                                     for i in range(0, len(K.KQUANT_KERNELS), 2))
    assert set(F.C_PACKERS) <= set(PC.KQUANT_PACKERS)


@pytest.mark.parametrize("kind", sorted({k for f in F.FAMILIES.values() for k in f.kinds}))
def test_the_packing_protocol_refuses_what_the_family_cannot_take(kind):
    """Every kind goes through its family's one ``pack``; the quantised families' refusals come
    back as LayoutError (the runtime turns them into ArgumentError)."""
    fam = F.KIND_FAMILY[kind]
    # a fixed-width default kernel where the family has one (its layout at VL 32 otherwise)
    spec = min((parse_spec(s) for s in F.DEFAULT_KERNELS if parse_spec(s).family == fam),
               key=lambda sp: sp.vl_scaled)
    from tilegen.layout.base import rhs_layout_for
    lay = rhs_layout_for(spec, 32, vl=32)
    rng = np.random.default_rng(3)
    n, k = 8, 256
    w = (rng.standard_normal((n, k)) + 0.5).astype(np.float32)
    if lay.ggml_only:     # the formats that take ggml blocks only (K-quants, iq4_nl, mxfp4)
        with pytest.raises(LayoutError, match="only as ggml"):
            F.pack(fam, lay, kind, w, None, n, k, None, "nk")
        raw = F.plugin(fam).__dict__[f"random_{kind.lower()}"](n, k, 5)
        data = F.pack(fam, lay, kind, None, raw, n, k, None, "nk")
        assert data.size == lay.packed_size(n, k)
        assert lay.dequantize_rows(data, n, k, range(n)).tobytes() == \
            F.plugin(fam).__dict__[f"dequantize_{kind.lower()}"](raw, n, k).tobytes()
        with pytest.raises(LayoutError, match="bias"):
            F.pack(fam, lay, kind, None, raw, n, k, np.ones(n, np.float32), "nk")
        return
    if kind == "f16":
        with pytest.raises(LayoutError, match="float16"):
            F.pack(fam, lay, kind, w, None, n, k, None, "nk")
        w = w.astype(np.float16)
    bad = w.copy()
    bad[3, 7] = np.nan
    data = F.pack(fam, lay, kind, w, None, n, k, None, "nk")
    assert data.size and np.asarray(data).any()
    if kind in ("q4_0", "q4_0_dx", "q8_0"):
        with pytest.raises(LayoutError):
            F.pack(fam, lay, kind, bad, None, n, k, None, "nk")


def _specs_family_table() -> dict[str, set[str]]:
    """docs/specs.md's family table: family -> the ISAs its last column names."""
    text = (DOCS / "specs.md").read_text()
    head = text.index("| family | what |")
    rows = {}
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        fam = cells[0].strip("`")
        same = re.match(r"as `([^`]+)`", cells[-1])
        isas = rows[same.group(1)] if same else {t for t in re.findall(r"`([^`]+)`", cells[-1])
                                                 if t in ISAS}
        rows[fam] = isas
    return rows


def test_docs_specs_family_table_is_the_registry():
    rows = _specs_family_table()
    assert sorted(rows) == sorted(F.FAMILIES), "docs/specs.md's family table lists other families"
    for name, fam in F.FAMILIES.items():
        assert rows[name] == set(fam.impls), (name, "docs/specs.md names other ISAs")


@pytest.mark.parametrize("cmd", ["generate", "tune"])
def test_cli_help_names_every_family(cmd, capsys):
    from tilegen.cli import main
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert ", ".join(F.FAMILIES) in text


_NEW_PLUGIN = '''"""A test family: q8_0's kernels under another name (tests/test_families.py)."""
from dataclasses import replace

from . import q8_0

ORDER = 99
RECORDS = (replace(q8_0.RECORDS[0], name="q8_0_alias", kinds=("q8_0_alias",)),)
LAYOUTS = ()
ALLOCATOR_MODULES = ("q8",)
DEFAULT_KERNELS = ("q8_0_alias:neon:4x4", "q8_0_alias:dotprod:1x4")
GGML_TYPES = {"Q8_0_ALIAS": "q8_0_alias"}
pack = q8_0.pack
gguf_layout = q8_0.gguf_layout
'''

_NEW_PLUGIN_CHECKS = '''
import io, contextlib
import numpy as np
import tilegen.families as F
from tilegen.build.targets import DEFAULT_KERNELS
from tilegen.cli import main
from tilegen.generator import regalloc
from tilegen.generator.render import render
from tilegen.generator.validate import parse_spec
from tilegen.layout.base import rhs_layout_for
from tilegen.runtime.select import KIND_FAMILIES
assert "q8_0_alias" in F.FAMILIES and F.KIND_FAMILY["q8_0_alias"] == "q8_0_alias"
assert KIND_FAMILIES["q8_0_alias"] == ("q8_0_alias",)
assert "q8_0_alias" in F.GGML_KINDS and F.GGML_TYPES["Q8_0_ALIAS"] == "q8_0_alias"
assert DEFAULT_KERNELS[-2:] == ("q8_0_alias:neon:4x4", "q8_0_alias:dotprod:1x4")
a, b = parse_spec("q8_0_alias:i8mm:8x4"), parse_spec("q8_0:i8mm:8x4")
assert regalloc.allocate(a) is not None        # the same asm but the spec in the header line
assert render(a).text.replace("spec: q8_0_alias:", "spec: q8_0:") == render(b).text
w = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32) + 0.5
lay = rhs_layout_for(a, 32)
assert np.array_equal(F.pack("q8_0_alias", lay, "q8_0_alias", w, None, 8, 64, None, "nk"),
                      F.pack("q8_0", lay, "q8_0", w, None, 8, 64, None, "nk"))
out = io.StringIO()
with contextlib.redirect_stdout(out):
    try:
        main(["generate", "--help"])
    except SystemExit:
        pass
assert "q8_0_alias" in out.getvalue()
print("OK")
'''


def test_a_new_family_is_its_plugin_module_alone(tmp_path):
    """A copy of the package with one more module in tilegen/families/ (and no other change):
    the spec grammar, the allocator registry, the kinds, the GGUF types, the default kernels,
    the packing protocol and the CLI help all know the new family."""
    import shutil
    import subprocess
    import sys
    src = Path(F.__file__).resolve().parents[1]
    shutil.copytree(src, tmp_path / "tilegen", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "tilegen" / "families" / "q8_0_alias.py").write_text(_NEW_PLUGIN)
    r = subprocess.run([sys.executable, "-c", _NEW_PLUGIN_CHECKS], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]


_PACKAGE_PLUGIN = '''"""A test family as a plugin package whose allocators are its own submodule."""
from dataclasses import replace

from .. import q4_k, q8_0

ORDER = 99
_Q8 = q8_0.RECORDS[0]
RECORDS = (replace(_Q8, name="q8_0_pkg", kinds=("q8_0_pkg",),
                   impls={isa: replace(impl, allocator="pkg_" + impl.allocator)
                          for isa, impl in _Q8.impls.items()}),)
LAYOUTS = ()
ALLOCATOR_MODULES = (__name__ + ".regalloc",)
DEFAULT_KERNELS = ()
pack = q8_0.pack
C_PACKERS = {"kai_rhs_pack_nxk_pkg_test": q4_k.c_packer}     # (not rendered here)
LLAMA_QUANTIZE = {"q8_0_pkg_m": 0.125}
LLAMA_QUANTIZE_ARGS = {"q8_0_pkg_m": ("Q8_0", ("--tensor-type", "weight=q8_0_pkg"))}
LLAMA_MOE = {"q8_0_pkg_m": None, "q8_0_pkg_moe": 0.25}
'''

_PACKAGE_PLUGIN_REGALLOC = '''"""The test family's allocators: q8_0's under the names its record gives."""
from ...generator.regalloc import q8, q8_sme

ALLOCATORS = {"pkg_" + name: fn for m in (q8, q8_sme) for name, fn in m.ALLOCATORS.items()}
'''

_PACKAGE_PLUGIN_CHECKS = '''
import tilegen.families as F
from tilegen.generator import regalloc
from tilegen.generator.render import render
from tilegen.generator.validate import parse_spec
assert "q8_0_pkg" in F.FAMILIES and "tilegen.families.q8_0_pkg.regalloc" in F.ALLOCATOR_MODULES
assert "pkg_q8_neon" in regalloc.ALLOCATORS and "pkg_q8_sme2" in regalloc.ALLOCATORS
from tilegen.export.packers_c import KQUANT_PACKER_FOR
assert KQUANT_PACKER_FOR[F.FAMILIES["q8_0_pkg"].rhs] == "kai_rhs_pack_nxk_pkg_test"
for tile in ("i8mm:8x4", "dotprod:1x4", "sme2:1vlx4vl"):
    a, b = parse_spec("q8_0_pkg:" + tile), parse_spec("q8_0:" + tile)
    assert render(a).text.replace("spec: q8_0_pkg:", "spec: q8_0:") == render(b).text, tile
import sys
sys.argv = ["llama_cpp_check"]
sys.path.insert(0, "scripts")
import llama_cpp_check as L      # the copy of the script next to the copied package
assert L.REPO.resolve() == __import__("pathlib").Path.cwd().resolve()
assert "q8_0_pkg_m" in L.KQUANT_TYPES and L.REF_TOLERANCE["q8_0_pkg_m"] == 0.125
assert L.LOGITS_PROMPT["q8_0_pkg_m"] == L.sg.LONG_PROMPT
assert L.quantize_args("q8_0_pkg_m") == ("Q8_0", ("--tensor-type", "weight=q8_0_pkg"))
assert L.MOE_TYPES[-2:] == ("moe_q8_0_pkg_m", "moe_q8_0_pkg_moe") and L.MOE_TYPES[-2] in L.TYPES
assert L.REF_TOLERANCE["moe_q8_0_pkg_m"] == 0.125 and L.TOLERANCE["moe_q8_0_pkg_moe"] == 0.25
assert L.quantize_args("moe_q8_0_pkg_moe") == ("Q8_0_PKG_MOE", ()) and L.quantized("moe_q8_0_pkg_moe")
assert L.LOGITS_PROMPT["moe_q8_0_pkg_moe"] == L.sg.LONG_PROMPT
print("OK")
'''


def test_a_new_family_brings_its_allocators_in_its_plugin_package(tmp_path):
    """#31 item 4: a family plugin that is a package (tilegen/families/<fam>/) with its
    register allocators in its own submodule ``regalloc.py`` (named in its ALLOCATOR_MODULES
    by dotted path), and no other change to the package: the allocator registry finds them,
    its kernels render, the export maps its RHS format to its C packer, the llama.cpp check
    runs its llama-quantize types (``LLAMA_QUANTIZE``, with its ``LLAMA_QUANTIZE_ARGS``) and its
    mixture-of-experts variants (``LLAMA_MOE``); the import test puts such a submodule in
    the regalloc stage."""
    import shutil
    import subprocess
    import sys
    from test_imports import stage_of
    assert stage_of("tilegen.families.q8_0_pkg.regalloc") == "regalloc"
    assert stage_of("tilegen.families.q8_0_pkg") == "families"
    src = Path(F.__file__).resolve().parents[1]
    shutil.copytree(src, tmp_path / "tilegen", ignore=shutil.ignore_patterns("__pycache__"))
    pkg = tmp_path / "tilegen" / "families" / "q8_0_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(_PACKAGE_PLUGIN)
    (pkg / "regalloc.py").write_text(_PACKAGE_PLUGIN_REGALLOC)
    (tmp_path / "scripts").mkdir()
    shutil.copy(src.parent / "scripts" / "llama_cpp_check.py", tmp_path / "scripts")
    r = subprocess.run([sys.executable, "-c", _PACKAGE_PLUGIN_CHECKS], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), r.stderr[-3000:]
