"""The kernel descriptor (tilegen.generator.descriptor): computed without register allocation or
rendering, its getters' C expressions equal to the layout objects at every edge (row block
starts, VLs, block lengths), and rendered -- not recomputed -- by the C header, the manifest and
the KleidiAI export (all on the host)."""
from __future__ import annotations

import re

import pytest

from tilegen.build import cheader
from tilegen.build.defaults import default_specs
from tilegen.build.targets import get_target
from tilegen.export import kleidiai as K
from tilegen.generator import descriptor as D
from tilegen.generator.manifest import kernel_entry
from tilegen.generator.spec import parse_unchecked
from tilegen.layout import lhs_layout_for, rhs_layout_for

# every exported kernel (fixed and VL-scaled, every family the export maps) and the defaults
# of two presets (f32 rows, the q4/q8/bf16/K-quant NEON and SVE tiles)
SPECS = sorted({kk.spec for kk in K.KERNELS + K.KQUANT_KERNELS}
               | {s.spec_string for t in ("linux-aarch64-all", "neoverse-v1")
                  for s in default_specs(get_target(t))})


def _eval(body: str, vl: int | None, **args: int) -> int:
    """A getter's C body evaluated over size_t (unsigned division) with the given arguments."""
    text = body.replace("sizeof(float)", "4")
    text = re.sub(r"tg_s?vl_bytes\(\)", str(vl), text).replace("/", "//")
    return int(eval(text, {"__builtins__": {}}, args))  # noqa: S307 - own expressions


def test_specs_cover_every_case():
    ds = [D.descriptor(parse_unchecked(s)) for s in SPECS]
    assert {d.vl_kind for d in ds} == {None, "sve", "sme"}
    assert {d.getters[6].slot for d in ds} == {"get_lhs_offset", "get_lhs_packed_offset"}
    assert {d.family for d in ds} >= {"f32", "q4_0", "q8_0", "bf16", "q4_K", "q6_K"}


def test_descriptor_needs_no_allocator_and_renders_nothing(monkeypatch):
    import importlib
    from tilegen.generator.regalloc.pool import RegisterPool

    def refuse(*a, **kw):
        raise AssertionError("descriptor() allocated registers or rendered")

    render = importlib.import_module("tilegen.generator.render")
    packers = importlib.import_module("tilegen.generator.packers")
    validate = importlib.import_module("tilegen.generator.validate")
    regalloc = importlib.import_module("tilegen.generator.regalloc")
    for mod, names in ((regalloc, ("allocate",)), (validate, ("allocate",)),
                       (render, ("allocate", "render", "render_template", "template_env")),
                       (packers, ("render", "template_env"))):
        for n in names:
            monkeypatch.setattr(mod, n, refuse)
    monkeypatch.setattr(RegisterPool, "__init__", refuse)
    D.descriptor.cache_clear()
    try:
        for s in SPECS:
            d = D.descriptor(parse_unchecked(s))
            assert d.spec_string == s and d.getters
    finally:
        D.descriptor.cache_clear()


@pytest.mark.parametrize("text", SPECS)
def test_getters_are_the_layouts(text):
    """Every getter of the descriptor, evaluated as C, gives what the layout objects give: at
    the first and later row blocks and column panels, every VL the tile scales with, and two
    block lengths."""
    spec = parse_unchecked(text)
    d = D.descriptor(spec)
    g = {x.slot: x.body for x in d.getters}
    for vl in ((16, 64, 256) if spec.vl_scaled else (None,)):
        mr, nr = spec.mr_at(vl), spec.nr_at(vl)
        assert _eval(g["get_m_step"], vl) == mr and _eval(g["get_nr"], vl) == nr
        assert _eval(g["get_n_step"], vl) == nr
        assert (_eval(g["get_kr"], vl), _eval(g["get_sr"], vl)) == (spec.kr, spec.sr)
        for bl in (32, 64):
            k = 512
            rhs = rhs_layout_for(spec, bl, vl)
            for n_idx in (0, nr, 3 * nr):
                assert _eval(g["get_rhs_packed_offset"], vl, n_idx=n_idx, k=k, bl=bl) == \
                    rhs.packed_offset(n_idx, k), (vl, bl, n_idx)
            lhs = lhs_layout_for(spec, bl, vl)
            if lhs is None:
                assert "get_lhs_offset" in g and _eval(g["get_mr"], vl) == mr
                assert _eval(g["get_lhs_offset"], vl, m_idx=5, stride=4 * k) == 5 * 4 * k
                continue
            lmr = spec.lhs_mr_at(vl)
            assert _eval(g["get_mr"], vl) == lmr
            for m_idx in (0, lmr, 7 * lmr):
                assert _eval(g["get_lhs_packed_offset"], vl, m_idx=m_idx, k=k, bl=bl) == \
                    lhs.packed_offset(m_idx, k), (vl, bl, m_idx)
    assert _eval(g["get_dst_offset"], None, m_idx=3, n_idx=8, dst_stride=100) == 332
    assert _eval(g["get_dst_size"], None, m=3, n=5) == 60


def test_for_interface_changes_only_n_step_and_sr():
    d = D.descriptor(parse_unchecked("f32:sme2:1x2vl"))
    i = d.for_interface(n_step_tiles=8, sr=2)
    assert _eval(i.getter("get_n_step").body, 32) == 8 * _eval(d.getter("get_nr").body, 32)
    assert i.getter("get_sr").body == "2"
    assert [x for x in i.getters if x.slot not in ("get_n_step", "get_sr")] == \
        [x for x in d.getters if x.slot not in ("get_n_step", "get_sr")]
    assert d.for_interface() is d


def test_clients_render_the_descriptor():
    """The manifest entry, the library's getters and the export's ukernels carry the
    descriptor's expressions (the export with KleidiAI's n_step and sr where they differ)."""
    for s in SPECS:
        spec = parse_unchecked(s)
        d = D.descriptor(spec)
        e = kernel_entry(spec, spec.name)
        assert e["descriptor"] == d.manifest_fields()
        assert e["params"] == [{"name": p.name, "ctype": p.ctype} for p in d.params]
        assert e["descriptor"]["getters"]["get_rhs_packed_offset"]["body"] == \
            d.getter("get_rhs_packed_offset").body
        if not spec.vl_scaled:
            src = cheader.getters_c([spec])
            for x in d.getters:
                assert f"{x.slot}_{d.name}(" in src
                assert f"{{ return {x.spelled(dst_stride='stride').body}; }}" in src
    for kk in K.KERNELS + K.KQUANT_KERNELS:
        d = D.descriptor(kk.kernel_spec).for_interface(kk.n_step_tiles, kk.getter_sr)
        src = K.ukernel_source(kk)
        for x in d.getters:
            assert x.body in src, (kk.name, x.slot)


def test_vl_scaled_strides_are_linear_in_the_vl(monkeypatch):
    """check_vl_scaling holds for every VL-scaled spec (the export calls it before writing the
    getters) and refuses a stride that is not vl/16 times the one at 16 bytes."""
    scaled = [parse_unchecked(s) for s in SPECS if parse_unchecked(s).vl_scaled]
    assert scaled
    for spec in scaled:
        D.check_vl_scaling(spec)
    from types import SimpleNamespace
    monkeypatch.setattr(D, "rhs_layout_for",
                        lambda spec, bl, vl: SimpleNamespace(stride_expr=f"{vl} * k + 1"))
    with pytest.raises(D.SpecError, match=r"RHS: stride '32 \* k \+ 1' at VL 32 is not 2 x"):
        D.check_vl_scaling.__wrapped__(scaled[0])
