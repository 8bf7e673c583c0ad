"""The templates take every packed-format offset from the layout objects (ruy's
static_assert(offsetof) idea, run the other way round): perturb one layout fact and the
rendered assembly must change where that fact is used -- or the template must refuse the
layout.  A template that writes a format fact as a literal instead of reading it from the
layout fails here: the fact's perturbation leaves its output unchanged (the fact is required
for the kernel variant but never read, or read and ignored).

Kernels: one representative of every (template, ISA, family, allocation mode, streamed /
frame-accumulator variant, LHS rows per block, kr, sr, VL scaling, row-block grouping) in the
tuner's grid over every target plus every target's default kernels; packers: every packer
those kernels use plus both qsi8d32p roundings and a spread of mr x L.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import re

import pytest

from tilegen.generator import packers
from tilegen.generator.regalloc import allocate
from tilegen.generator.spec import parse_unchecked
from tilegen.generator.validate import validate
from tilegen.records import SpecError
from tilegen.analysis.tune import grid_specs

render_mod = importlib.import_module("tilegen.generator.render")   # the package exports render()

# Layout facts each template kind must read (per layout class).  Perturbing any of them must
# change the rendered text of every kernel that reads the layout, except where EXEMPT says
# why a variant's instruction sequence does not depend on that fact.
KERNEL_FACTS = {
    "F32PackedRHS": {"bias_bytes", "row_bytes"},
    "F32PackedLHS": {"k_step_bytes"},
    "QSI4C32P": {"chunk_k", "chunk_bytes", "chunk_k_step", "pair_distance", "segment_bytes",
                 "scale_offset_in_block", "block_scales_bytes", "rsum_offset_in_tail",
                 "bias_offset_in_tail", "tail_bytes"},
    "QSI4C32PScaleF16": {"chunk_k", "chunk_bytes", "chunk_k_step", "pair_distance_bl_shift",
                         "segment_bytes", "scale_offset_in_block", "data_offset_in_block",
                         "scale_bytes"},
    "QAI8DXP": {"row_tail_bytes", "rscale_after_offset", "offset_bytes", "chunk_bytes",
                "k_span_bytes"},
    "QSI8D32P": {"scale_bytes", "data_offset_in_block", "chunk_bytes", "k_span_bytes"},
    "QSI8CXP": {"k_multiple", "chunk_bytes", "rsum_offset_in_tail", "scale_offset_in_tail",
                "bias_offset_in_tail", "tail_bytes"},
    "BF16PRhs4B": {"chunk_bytes", "bias_bytes", "data_offset", "group_stride"},
    "BF16PLhs4": {"chunk_bytes", "row_block_stride"},
    "BF16PRhs2B": {"chunk_bytes", "bias_bytes"},
    "BF16PLhs2": {"chunk_bytes"},
    "QSI4C32PS1S0ScaleF16": {"chunk_bytes", "scale_bytes", "data_bytes"},
    "QSI8D32PScaleTail": {"chunk_bytes", "scale_bytes", "data_bytes"},
    "F16PLhs2": {"chunk_bytes", "row_block_stride", "element_offset"},
    # the K-quant layouts: one record per 256-k super-block (docs/layouts.md#q8kp, #q4kp, #q6kp)
    "Q8KP": {"sb_record_bytes", "d_offset", "bsum_hi_offset", "bsum_lo_offset"},
    "Q4KP": {"sb_record_bytes", "d_offset", "d_bytes", "dmin_offset", "nibbles_offset",
             "subblock_bytes", "subblocks", "chunk_bytes"},
    "Q6KP": {"sb_record_bytes", "d_offset", "d_bytes", "scales_offset", "low_plane_offset",
             "high_plane_offset", "sub_k6", "subblocks"},
    "Q5KP": {"sb_record_bytes", "d_offset", "d_bytes", "dmin_offset",
             "nibbles_offset", "subblock_bytes", "subblocks", "chunk_bytes"},
    "IQ4XSP": {"sb_record_bytes", "d_offset", "d_bytes", "nibbles_offset", "subblock_bytes",
               "subblocks", "chunk_bytes"},
}


def _row(table: dict, lay) -> str:
    """The row of ``lay``'s class, or of the nearest base class with one (a family's layout on
    a shared base: IQ4NLP / MXFP4P on QSI4C32PScaleF16)."""
    return next(c.__name__ for c in type(lay).__mro__ if c.__name__ in table)
PACKER_FACTS = {
    "QAI8DXP": {"k_multiple", "row_block_tail_bytes", "chunk_bytes",
                "offset_bytes", "rscale_after_offset"},
    "QSI8D32P": {"scale_bytes", "data_offset_in_block", "chunk_bytes", "scale_offset"},
    "BF16PLhs4": {"chunk_bytes", "element_offset", "row_block_stride"},
    # the VL-scaled packers of the SME kernels' LHS (mr at run time)
    "BF16PLhs2": {"chunk_bytes", "element_offset", "row_block_stride"},
    "F32PackedLHS": {"chunk_bytes", "element_offset", "row_block_stride"},
    "F16PLhs2": {"chunk_bytes", "element_offset", "row_block_stride"},
    # the qsi8d32p template's scale-tail mode (mr = 1)
    "QSI8D32PScaleTail": {"scale_bytes", "data_bytes", "scale_offset", "element_offset",
                          "row_block_stride"},
    "Q8KP": {"sb_record_bytes", "values_bytes", "chunk_bytes", "d_offset", "bsum_hi_offset",
             "bsum_lo_offset", "row_block_stride"},
}


def _exempt(spec, R, cls: str, fact: str) -> bool:
    """Variants whose code does not depend on a fact (each with its reason)."""
    neon = spec.template.startswith("q4_0")
    if cls == "QSI4C32PScaleF16" and fact == "scale_bytes":
        # read only where the scales are addressed by offset (NEON, streamed); elsewhere they
        # are walked by post-indexed f16 loads (fcvtl/fcvt fix the 2-byte width)
        return not (neon and getattr(R, "streamed", False))
    if cls == "QAI8DXP" and fact == "offset_bytes":
        # only the SME kernel steps through the offsets row by row; the others load all P
        return not spec.template.startswith("q4_sme")
    if cls == "Q8KP" and fact in ("bsum_hi_offset", "bsum_lo_offset"):
        # the activation sums serve the min term (Q4_K, Q5_K); the families without one
        # (Q6_K unpacks q - 32, IQ4_XS looks up signed values) need none
        from tilegen.families import rhs_layout_class
        return not hasattr(rhs_layout_class(spec.family), "dmin_offset")
    if cls in ("QAI8DXP", "QSI8D32P") and fact == "chunk_bytes":
        # one-row LHS (P = 1) in dot4/neon4 mode: one 16-byte load covers 4 chunks (lanes)
        return getattr(R, "lhs_mr", None) == 1 and R.mode in ("dot4", "neon4", "za4")
    return False


class _Probe:
    """Forwards attribute reads to a layout object and records their names."""

    def __init__(self, lay, seen: set):
        self._lay, self._seen = lay, seen

    def __getattr__(self, name):
        self._seen.add(name)
        return getattr(self._lay, name)


def _perturbed(lay, fact: str):
    """A copy of ``lay`` (same geometry) whose ``fact`` has another value, through a subclass
    so that the layout's own derived offsets follow it.  Values stay powers of two / multiples
    of the 16-byte granule where the original was one (shift and VL-unit operands)."""
    cls = type(lay)
    orig = getattr(cls, fact)
    if isinstance(orig, (property, int)):                           # a property or a constant
        v = orig.fget(lay) if isinstance(orig, property) else orig
        new = 2 * v if v else 16
        over = property(lambda self, new=new: new)
    else:                                                           # a method of one int
        over = lambda self, *a, f=orig: 2 * f(self, *a) or 16       # noqa: E731
    sub = type(cls.__name__, (cls,), {fact: over})
    return sub(**{f.name: getattr(lay, f.name) for f in dataclasses.fields(lay)})


def _grid() -> list:
    out = grid_specs()
    reps = {}
    for key, s in sorted(out.items()):
        R = allocate(s)
        variant = (s.template, s.isa, s.family, getattr(R, "mode", None),
                   getattr(R, "streamed", None), getattr(R, "acc_mem", None),
                   getattr(R, "lhs_mr", None), s.kr, s.sr, s.vl_scaled,
                   getattr(R, "groups", 1) > 1, getattr(R, "mu", 1))
        reps.setdefault(variant, s)
    return list(reps.values())


# plus the tiles grid_specs leaves out: the K-quant SME2 row-group gemms, on q8kp and on its
# int16 widening q8ki16p; and the 1x1vl gemvs, which share a representative with 1x2vl (their
# own hot loop and store)
GRID = _grid() + [validate(parse_unchecked(t)) for t in ("q4_K:sme2:4vlx1vl",
                                                          "q4_K:sme2:4vlx1vl:i16",
                                                          "q4_K:sme2:1x1vl",
                                                          "iq4_xs:sme2:1x1vl")]


def _packer_grid() -> list:
    out = {}
    for s in GRID:
        p = packers.packer_for(s)
        if p is not None:
            out.setdefault(p.name, p)
    for mr in (1, 4, 8):
        for L in (4, 8, 16, 32):
            out.setdefault(f"a{mr}x{L}", packers.PackerSpec("qai8dxp", mr, L, 1))
            for rounding in packers.ROUNDINGS:
                out.setdefault(f"s{mr}x{L}{rounding}",
                               packers.PackerSpec("qsi8d32p", mr, 2 * L, 2, rounding))
    return list(out.values())


PACKERS = _packer_grid()

_MNEMONIC = re.compile(r"^\s*([a-z][\w.]*)")


def _check_substitution(before: str, after: str, what: str) -> None:
    """Where the outputs have the same shape, every changed line is the same instruction with
    other operands: the perturbed value took the original's place."""
    a, b = before.splitlines(), after.splitlines()
    if len(a) != len(b):
        return                      # e.g. an addvl rebase moved: shape follows the offsets
    for x, y in zip(a, b):
        if x != y:
            mx, my = _MNEMONIC.match(x), _MNEMONIC.match(y)
            same = {mx.group(1), my.group(1)} <= {"addvl", "addpl"} if mx and my else False
            # (a VL-unit offset step: a multiple of the vector length or of a predicate length)
            assert mx and my and (mx.group(1) == my.group(1) or same), f"{what}: {x!r} -> {y!r}"


def _render_with(monkeypatch, spec, rhs, lhs) -> str:
    monkeypatch.setattr(render_mod, "template_layouts", lambda s: (rhs, lhs))
    return render_mod.render(spec).text


def _outcome(fn):
    try:
        return fn()
    except SpecError as e:          # a template guard refused the layout
        return f"refused: {e}"


@pytest.mark.parametrize("spec", GRID, ids=lambda s: s.spec_string)
def test_kernel_offsets_come_from_layouts(spec, monkeypatch):
    R = allocate(spec)
    rhs, lhs = render_mod.template_layouts(spec)
    base = render_mod.render(spec).text
    seen_r, seen_l = set(), set()
    probed = _render_with(monkeypatch, spec, _Probe(rhs, seen_r),
                          None if lhs is None else _Probe(lhs, seen_l))
    assert probed == base
    checked = 0
    for lay, seen, side in ((rhs, seen_r, "RHS"), (lhs, seen_l, "LHS")):
        if lay is None:
            continue
        cls = _row(KERNEL_FACTS, lay)
        facts = KERNEL_FACTS[cls]
        required = {f for f in facts if not _exempt(spec, R, cls, f)}
        missing = required - seen
        assert not missing, (f"{spec.spec_string}: template {spec.template} does not read "
                             f"{side} {cls}.{sorted(missing)} (a format literal?)")
        for fact in sorted(required):
            p = _perturbed(lay, fact)
            args = (p, lhs) if side == "RHS" else (rhs, p)
            out = _outcome(lambda: _render_with(monkeypatch, spec, *args))
            assert out != base, (f"{spec.spec_string}: perturbing {side} {cls}.{fact} leaves "
                                 f"the asm unchanged (read but not used: a literal?)")
            if not out.startswith("refused"):
                _check_substitution(base, out, f"{spec.spec_string} {cls}.{fact}")
            checked += 1
    assert checked


@pytest.mark.parametrize("pspec", PACKERS, ids=lambda p: p.spec_string)
def test_packer_offsets_come_from_layouts(pspec, monkeypatch):
    base = packers.render(pspec)
    lay = pspec.layout(32 if pspec.takes_bl else None)
    seen = set()
    monkeypatch.setattr(packers.PackerSpec, "layout", lambda self, bl=None: _Probe(lay, seen))
    assert packers.render(pspec) == base
    cls = type(lay).__name__
    # one row per block (mr = 1): rows are stored back to back, no chunk stride
    one_row = pspec.mr == 1 and not pspec.mr_vl
    required = PACKER_FACTS[cls] - ({"chunk_bytes"} if one_row else set())
    missing = required - seen
    assert not missing, f"{pspec.name} does not read {cls}.{sorted(missing)} (a format literal?)"
    for fact in sorted(PACKER_FACTS[cls] & seen):
        p = _perturbed(lay, fact)
        monkeypatch.setattr(packers.PackerSpec, "layout", lambda self, bl=None, p=p: p)
        out = _outcome(lambda: packers.render(pspec))
        assert out != base, f"{pspec.name}: perturbing {cls}.{fact} leaves the asm unchanged"
        if not out.startswith("refused"):
            _check_substitution(base, out, f"{pspec.name} {cls}.{fact}")


def test_perturbation_shows_up_as_the_value():
    """One hand-checked case: the qai8dxp row tail is the immediate of the row-block stride."""
    from tilegen import KernelSpec
    spec = validate(KernelSpec("q4_0_dx", "dotprod", 4, 4))
    rhs, lhs = render_mod.template_layouts(spec)
    assert lhs.row_tail_bytes == 8
    base = render_mod.render(spec).text
    p = _perturbed(lhs, "row_tail_bytes")
    mp = pytest.MonkeyPatch()
    try:
        out = _render_with(mp, spec, rhs, p)
    finally:
        mp.undo()
    diff = [ln for ln in difflib.unified_diff(base.splitlines(), out.splitlines(), lineterm="", n=0)
            if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert len(diff) == 2 and diff[0].endswith(", x2, #8") and diff[1].endswith(", x2, #16"), diff
