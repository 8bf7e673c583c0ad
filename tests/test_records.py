"""One record per ISA and per family (records.ISAS, records.FAMILIES): every stage reads them, and
the predicates that used to drift (gemv tile, same packed RHS) have one definition."""
from __future__ import annotations

import json

import pytest

from tilegen.build import get_target
from tilegen.build.tuned import read_tuned
from tilegen.generator import regalloc
from tilegen.generator.render import TEMPLATE_DIR, render
from tilegen.generator.spec import KernelSpec
from tilegen.generator.validate import parse_spec, validate
from tilegen.layout.base import rhs_identity, same_rhs
from tilegen.families import FAMILIES
from tilegen.records import ISAS
from tilegen.runtime.select import KIND_FAMILY


def test_every_family_isa_pair_has_its_template_and_allocator():
    for fam in FAMILIES.values():
        for isa, impl in fam.impls.items():
            assert isa in ISAS
            assert (TEMPLATE_DIR / f"{impl.template}.S.j2").is_file(), (fam.name, isa)
            assert impl.allocator in regalloc.ALLOCATORS, (fam.name, isa)
            if impl.gemv_template:
                assert (TEMPLATE_DIR / f"{impl.gemv_template}.S.j2").is_file()


@pytest.mark.parametrize("text", ["f32:neon:6x16", "q4_0:dotprod:4x4", "q4_0:i8mm:8x4:k16",
                                  "f32:sve:6x4vl", "q4_0_dx:sve_i8mm:8x1vl", "f32:sme2:2vlx2vl",
                                  "q4_0:sme:1vlx2vl", "q4_0:sme2:1x2vl", "f32:sme2:1x4vl"])
def test_asm_arch_line_comes_from_the_isa_record(text):
    spec = parse_spec(text)
    assert f"    .arch {ISAS[spec.isa].arch}\n" in render(spec).text


def test_isa_ranks_are_a_total_order_and_features_cover_the_name():
    ranks = [i.rank for i in ISAS.values()]
    assert len(set(ranks)) == len(ranks)
    for i in ISAS.values():
        assert i.features and (i.scalable == (i.vl_kind in ("sve", "sme")))
    assert KIND_FAMILY == {"f32": "f32", "f16": "f32", "q4_0": "q4_0", "q4_0_dx": "q4_0_dx",
                           "q8_0": "q8_0", "bf16": "bf16", "q4_K": "q4_K", "q5_K": "q5_K",
                           "q6_K": "q6_K", "iq4_nl": "iq4_nl", "iq4_xs": "iq4_xs",
                           "mxfp4": "mxfp4"}


def test_acc_mem_follows_the_isa_record():
    for isa in ISAS.values():
        if "q4_0" not in FAMILIES or isa.name not in FAMILIES["q4_0"].impls or isa.scalable:
            continue
        assert isa.acc_mem
    with pytest.raises(Exception, match="acc_mem"):
        validate(KernelSpec("q4_0", "sve_i8mm", 8, 1, nr_vl=True, acc_mem=True))


def test_is_gemv_is_mr_one_in_row_units():
    assert parse_spec("q4_0:dotprod:1x4").is_gemv
    assert parse_spec("f32:sme2:1x4vl").is_gemv
    assert not parse_spec("q4_0:sme:1vlx2vl").is_gemv      # 1 x VL rows: a gemm tile
    assert not parse_spec("f32:neon:6x16").is_gemv


def test_tuned_file_accepts_an_sme_gemm_with_one_vl_of_rows(tmp_path):
    """The tuned-file check once compared mr == 1 and refused SME gemm tiles of 1vl rows."""
    (tmp_path / "apple-m4.json").write_text(json.dumps({
        "tilegen_tuned": 1, "target": "apple-m4", "model": "apple-m4",
        "families": {"q4_0": {"gemm": "q4_0:sme:1vlx2vl", "gemv": "q4_0:sme2:1x2vl",
                              "shared_rhs": True, "scores": {"gemm": 1.0, "gemv": 1.0}}}}))
    tf = read_tuned(get_target("apple-m4"), tmp_path)
    assert tf.families["q4_0"].gemm.spec_string == "q4_0:sme:1vlx2vl"


@pytest.mark.parametrize("a,b,same", [
    ("f32:sve:6x4vl", "f32:sve:1x4vl", True),
    ("f32:sve:6x4vl", "f32:sve:1x8vl", False),
    ("f32:sve:1x4vl", "f32:sme2:1x4vl", False),      # SVE VL vs streaming VL
    ("f32:neon:6x16", "f32:sve:1x4vl", False),       # equal only at VL 128
    ("f32:neon:6x16", "f32:neon:1x16", True),
    ("q4_0:i8mm:8x4:k16", "q4_0:dotprod:1x4:k16", True),
    ("q4_0:i8mm:8x4:k16", "q4_0:dotprod:1x4", False),   # kr 16 vs 8
    ("q4_0:i8mm:8x4:k16", "q4_0_dx:i8mm:8x4:k16", False),   # another format
])
def test_same_rhs_is_layout_equality(a, b, same):
    sa, sb = parse_spec(a), parse_spec(b)
    assert same_rhs(sa, sb) is same
    assert (rhs_identity(sa) == rhs_identity(sb)) is same


def test_same_rhs_at_one_vector_length():
    assert same_rhs(parse_spec("f32:neon:6x16"), parse_spec("f32:sve:1x4vl"), vl=16)
    assert not same_rhs(parse_spec("f32:neon:6x16"), parse_spec("f32:sve:1x4vl"), vl=32)
