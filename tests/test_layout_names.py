"""One name for a format: every layout class owns its ``format`` stem (registry key), its
KleidiAI ``label`` and its unique ``name``; both dispatchers (by kernel spec, by format) build
layouts through the registry and ``for_geometry``."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from tilegen.generator.packers import PackerSpec
from tilegen.families import FAMILIES
from tilegen.layout import LayoutError, lhs_layout_for, rhs_layout_for
from tilegen.layout.api import layout_for
from tilegen.layout.base import PackedLayout
from tilegen.layout.registry import LAYOUTS, LHS_LAYOUTS, RHS_LAYOUTS, layout_class
from tilegen.analysis.tune import grid_specs

_GEOMETRIES = [(rows, kr, sr) for rows in (1, 4, 8, 12, 16)
               for kr, sr in ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 2), (4, 2))]


def _samples(cls) -> list:
    out = []
    for rows, kr, sr in _GEOMETRIES:
        try:
            out.append(cls.for_geometry(rows, kr, sr, 32))
        except LayoutError:
            pass
    return out


ALL = [(role, cls) for role, reg in LAYOUTS.items() for cls in reg.values()]


def test_registry_keys_are_the_classes_formats():
    for role, reg in LAYOUTS.items():
        for fmt, cls in reg.items():
            assert issubclass(cls, PackedLayout) and cls.format == fmt and cls.role == role
    assert set(RHS_LAYOUTS) == {"f32p", "qsi4c32p", "qsi4c32pscalef16", "qsi8cxp", "bf16px4b",
                                "bf16px2b", "qsi4c32ps1s0scalef16", "q4kp", "q5kp", "q5kps", "q6kp", "iq4nlp",
                                "iq4xsp", "mxfp4p"}
    assert set(LHS_LAYOUTS) == {"f32p", "qai8dxp", "qsi8d32p", "bf16px4", "bf16px2",
                                "qsi8d32pscaletail", "f16px2", "q8kp", "q8ki16p"}


@pytest.mark.parametrize("role,cls", ALL, ids=lambda x: getattr(x, "__name__", x))
def test_label_name_format_of_each_layout(role, cls):
    lays = _samples(cls)
    assert lays, cls
    for lay in lays:
        assert lay.format == cls.format
        assert lay.label == cls.label_for(lay.rows, lay.kr, lay.sr)
        assert lay.name == lay.label + cls.name_suffix
        assert cls.parse_name(lay.name) == (lay.rows, lay.kr // lay.sr)
        # the full name is accepted wherever a format is, and gives the same layout
        extra = {k: getattr(lay, k) for k in ("kr", "sr", "bl", "rounding")
                 if k in {f.name for f in dataclasses.fields(lay)}}
        assert layout_for(lay.name, **extra) == lay
        assert layout_for(cls.format, **{"nr" if role == "rhs" else "mr": lay.rows}, **extra) == lay


@pytest.mark.parametrize("role", list(LAYOUTS))
def test_names_are_unique_across_the_registry(role):
    """No two formats of a role share a name (labels may: both int4 RHS formats are
    ``qsi4c32p<nr>x<L>`` in KleidiAI's kernel names)."""
    owners: dict[str, str] = {}
    for cls in LAYOUTS[role].values():
        for lay in _samples(cls):
            assert owners.setdefault(lay.name, cls.format) == cls.format, (lay.name, cls.format)
    for a, b in itertools.permutations(LAYOUTS[role].values(), 2):
        for lay in _samples(a):
            parsed = b.parse_name(lay.name)
            if parsed is not None:      # b's grammar reads the name: b must refuse the geometry
                with pytest.raises(LayoutError):
                    b.for_geometry(parsed[0], lay.kr, lay.sr, 32)


def test_int4_labels_coincide_names_differ():
    a, b = layout_for("qsi4c32p", nr=4, kr=16, sr=2), layout_for("qsi4c32pscalef16", nr=4, kr=16)
    assert a.label == b.label == "qsi4c32p4x8"
    assert (a.name, b.name) == ("qsi4c32p4x8", "qsi4c32p4x8scalef16")
    assert layout_for("qsi4c32p4x8scalef16", kr=16) == b


def test_families_name_registered_formats():
    for fam in FAMILIES.values():
        assert layout_class("rhs", fam.rhs) and layout_class("lhs", fam.lhs)


def _grid():
    return list(grid_specs().values())


def test_spec_labels_and_both_dispatchers_agree():
    """Over the tuner's grid: the kernel name's format tokens are the layouts' labels, and the
    layout by spec is the layout by format at the same geometry."""
    for s in _grid():
        vl = 64 if s.vl_scaled else None
        rhs, lhs = rhs_layout_for(s, 32, vl), lhs_layout_for(s, 32, vl)
        assert f"_{s.rhs_format}_" in s.name and f"_{s.lhs_format}_" in s.name
        assert type(rhs).label_for(s.nr_str, s.kr, s.sr) == s.rhs_format
        if not s.vl_scaled:
            assert rhs.label == s.rhs_format
        assert layout_for(rhs.format, nr=rhs.nr, kr=s.kr, sr=s.sr, bl=32) == rhs
        if lhs is None:
            assert s.lhs_format == "f32" and not s.packs_lhs
            continue
        assert type(lhs).label_for(s.lhs_mr_str, s.kr, s.sr) == s.lhs_format
        assert layout_for(lhs.format, mr=lhs.mr, kr=s.kr, sr=s.sr, bl=32) == lhs


def test_packer_names_are_layout_labels():
    assert PackerSpec("qai8dxp", 4, 16, 2).name == \
        f"lhs_quant_pack_{layout_for('qai8dxp', mr=4, kr=16, sr=2).label}_f32_neon"
    assert PackerSpec("qsi8d32p", 4, 16, 2, "even").name == "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"


def test_fixed_and_unexpected_geometry():
    with pytest.raises(LayoutError, match="fixed sr"):
        layout_for("f32p", nr=16, sr=2)
    with pytest.raises(LayoutError, match="fixed rounding"):
        layout_for("qai8dxp", mr=4, kr=8, sr=2, rounding="even")
    with pytest.raises(LayoutError, match="unexpected geometry"):
        layout_for("qsi4c32p", nr=4, kr=8, sr=2, rounding="even")
    with pytest.raises(LayoutError, match="has L=8"):
        layout_for("qsi4c32p4x8", kr=8, sr=2)
    with pytest.raises(LayoutError, match="unknown layout"):
        layout_for("qsi4c32p4x8b")
    assert layout_for("f32p", nr=16, bl=64) == layout_for("f32p16x1b")     # no blocks: bl ignored
