import pytest

import tilegen
from tilegen import KernelSpec, SpecError, parse_spec
from tilegen.generator import allocate, validate


def test_name_grammar_matches_kleidiai():
    assert KernelSpec("f32", "neon", 6, 16).name == "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"
    assert KernelSpec("f32", "neon", 5, 12).name == "matmul_clamp_f32_f32_f32p12x1b_5x12_neon_mla"


def test_spec_is_frozen_and_hashable():
    s = KernelSpec("f32", "neon", 4, 8)
    with pytest.raises(Exception):
        s.mr = 5
    assert {s: 1}[KernelSpec("f32", "neon", 4, 8)] == 1
    assert s.kr == 1 and s.sr == 1 and s.m_step == 4 and s.n_step == 8


@pytest.mark.parametrize("text,tile", [("f32:neon:6x16", (6, 16, 1, 1)),
                                       ("f32:neon:1x4:k1:s1", (1, 4, 1, 1))])
def test_parse_spec(text, tile):
    s = parse_spec(text)
    assert (s.mr, s.nr, s.kr, s.sr) == tile
    assert parse_spec(s.spec_string) == s


def test_register_budget_message():
    with pytest.raises(SpecError) as e:
        validate(KernelSpec("f32", "neon", 8, 16))
    msg = str(e.value)
    assert "mr=8, nr=16 needs 42 vector registers" in msg and "32 exist" in msg


@pytest.mark.parametrize("nr", [2, 6, 10, 18])
def test_nr_must_be_multiple_of_4(nr):
    with pytest.raises(SpecError, match=f"nr={nr} must be a multiple of 4"):
        validate(KernelSpec("f32", "neon", 4, nr))


@pytest.mark.parametrize("kw,match", [
    (dict(family="f64", isa="neon", mr=1, nr=4), "unknown family"),
    (dict(family="f32", isa="avx", mr=1, nr=4), "unknown isa"),
    (dict(family="q4_0", isa="sve", mr=1, nr=4), "no template"),
    (dict(family="q4_0", isa="sve_i8mm", mr=8, nr=1, nr_vl=True, acc_mem=True), "NEON q4 option"),
    (dict(family="q4_0", isa="sme", mr=2, nr=2, mr_vl=True, nr_vl=True), "1vlx1vl or 1vlx2vl"),
    (dict(family="q4_0", isa="sme2", mr=4, nr=4, nr_vl=True), "gemv"),
    (dict(family="q4_0_dx", isa="sve_i8mm", mr=6, nr=1, nr_vl=True), "multiple of 4"),
    (dict(family="f32", isa="sme", mr=1, nr=4), "give nr in VL units"),
    (dict(family="f32", isa="neon", mr=1, nr=4, nr_vl=True), "fixed length"),
    (dict(family="f32", isa="sve", mr=9, nr=2, nr_vl=True), "z0-z7"),
    (dict(family="f32", isa="sve", mr=2, nr=2, mr_vl=True, nr_vl=True), "fixed row count"),
    (dict(family="f32", isa="sve", mr=7, nr=4, nr_vl=True), "vector registers"),
    (dict(family="f32", isa="sve", mr=1, nr=9, nr_vl=True), "exceeds 8vl"),
    (dict(family="f32", isa="sme", mr=4, nr=2, mr_vl=True, nr_vl=True), "ZA f32 tiles"),
    (dict(family="f32", isa="sme2", mr=3, nr=1, mr_vl=True, nr_vl=True), "group of 3"),
    (dict(family="f32", isa="sme", mr=2, nr=2, nr_vl=True), "whole ZA tiles"),
    (dict(family="f32", isa="neon", mr=0, nr=4), "mr must be >= 1"),
    (dict(family="f32", isa="neon", mr=2.0, nr=4), "mr must be an int"),
    (dict(family="f32", isa="neon", mr=2, nr=4, kr=2), "kr and sr must be 1"),
])
def test_invalid_specs(kw, match):
    with pytest.raises(SpecError, match=match):
        validate(KernelSpec(**kw))


@pytest.mark.parametrize("text", ["f32:neon:6", "f32-neon-6x16", "f32:neon:6x16:q2", ""])
def test_unparsable(text):
    with pytest.raises(SpecError, match="cannot parse"):
        parse_spec(text)


def test_gpr_budget_refused():
    # 14 rows x 4 columns fits the vector file (14 + 14 + 2 = 30) but not the GPRs
    with pytest.raises(SpecError, match="general-purpose registers"):
        validate(KernelSpec("f32", "neon", 14, 4))


def test_allocation_is_disjoint_and_saves_callee_saved():
    for mr, nr in [(6, 16), (4, 24), (8, 8), (1, 4), (13, 4)]:
        r = allocate(KernelSpec("f32", "neon", mr, nr))
        vecs = [v for row in r.acc for v in row] + list(r.lhs) + list(r.rhs)
        assert len(vecs) == len(set(vecs)) and all(0 <= v < 32 for v in vecs)
        assert set(r.saved_d) == {v for v in vecs if 8 <= v <= 15}
        gprs = list(r.gpr.values()) + list(r.lhs_ptr)
        assert len(gprs) == len(set(gprs)) and not set(gprs) & set(range(8)) and 18 not in gprs
        assert set(r.saved_x) == {x for x in gprs if 19 <= x <= 28}
        assert r.frame_bytes % 16 == 0


def test_public_api():
    assert tilegen.generate and tilegen.build_library and tilegen.load and tilegen.pack_rhs


@pytest.mark.parametrize("kw,match", [
    (dict(family="q4_0", isa="dotprod", mr=4, nr=6), "nr=6 must be a multiple of 4"),
    (dict(family="q4_0", isa="dotprod", mr=6, nr=4), "mr=6 must be 1"),
    (dict(family="q4_0", isa="i8mm", mr=4, nr=4, kr=8, sr=2), "i8mm .* kr/sr = 8"),
    (dict(family="q4_0", isa="i8mm", mr=1, nr=4, kr=4, sr=2), "mr a multiple of 4"),
    (dict(family="q4_0", isa="dotprod", mr=4, nr=4, kr=16, sr=2), "kr/sr = 8 for gemv"),
    (dict(family="q4_0", isa="dotprod", mr=4, nr=4, kr=8, sr=1), "needs sr=2"),
    (dict(family="q4_0_dx", isa="dotprod", mr=4, nr=4, kr=9, sr=2), "multiple of sr"),
    (dict(family="q4_0", isa="dotprod", mr=4, nr=64), "vector registers"),
])
def test_q4_invalid_tiles(kw, match):
    with pytest.raises(SpecError, match=match):
        validate(KernelSpec(**kw))


def test_q4_names_and_register_blocking():
    s = parse_spec("q4_0:i8mm:16x4")
    assert s.name == "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm"
    assert (s.kr, s.sr, s.lhs_mr, s.m_step, s.n_step) == (16, 2, 4, 16, 4)
    assert parse_spec("q4_0_dx:dotprod:1x4").name == \
        "matmul_clamp_f32_qai8dxp1x4_qsi4c32p4x4_1x4_neon_dotprod"
    r = allocate(parse_spec("q4_0:dotprod:16x4"))
    assert r.mr_reg == 8 and r.needs.total <= 32      # 16 rows = 2 register blocks of 8


@pytest.mark.parametrize("text,name,mr,nr", [
    ("f32:sve:6x4vl", "matmul_clamp_f32_f32_f32p4vlx1b_6x4vl_sve_mla", 6, 32),
    ("f32:sme:2vlx2vl", "matmul_clamp_f32_f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa", 16, 16),
    ("f32:sme2:1vlx4vl", "matmul_clamp_f32_f32p1vlx1_f32p4vlx1b_1vlx4vl_sme2_mopa", 8, 32),
])
def test_vl_scaled_specs(text, name, mr, nr):
    s = parse_spec(text)
    assert s.name == name and s.spec_string == text and s.vl_scaled
    assert (s.mr_at(32), s.nr_at(32)) == (mr, nr)          # 256-bit vectors: 8 f32 lanes
    assert s.vl_kind == ("sme" if s.isa.startswith("sme") else "sve")
    with pytest.raises(SpecError, match="vector length"):
        s.n_step
    with pytest.raises(SpecError, match="16..256 bytes"):
        s.nr_at(24)


def test_q4_acc_mem_parameter():
    s = parse_spec("q4_0:i8mm:24x4:am")
    assert s.acc_mem and s.spec_string == "q4_0:i8mm:24x4:am"
    assert s.name == "matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_24x4_neon_i8mm_am"
    r = allocate(s)
    assert r.mr_reg == 24 and r.needs.total <= 32 and r.acc_bytes == 24 * 16
    assert r.frame_bytes % 16 == 0 and r.acc_offset % 16 == 0
    assert r.acc_offset >= r.clamp_offset + 8 and r.acc_offset + r.acc_bytes <= r.frame_bytes
    d = parse_spec("q4_0:i8mm:24x4")      # default: registers, KleidiAI name, 12-row blocks
    rd = allocate(d)                      # (one LHS register pair, one row block's scales)
    assert not d.acc_mem and d.name.endswith("_neon_i8mm") and rd.mr_reg == 12 and rd.dl_shared
    assert rd.needs.total <= 32 and rd.frame_bytes >= rd.zero_offset + 32
    assert parse_spec("q4_0_dx:dotprod:12x4").spec_string == "q4_0_dx:dotprod:12x4"
    assert allocate(parse_spec("q4_0:dotprod:12x4")).mr_reg == 12
    for bad, match in (("f32:neon:4x8:am", "q4 families"), ("q4_0:dotprod:1x8:am", "multi-row"),
                       ("q4_0:neon:4x4:am", "multi-row")):
        with pytest.raises(SpecError, match=match):
            parse_spec(bad)


@pytest.mark.parametrize("text,block", [
    ("q4_0:i8mm:8x12", "a block of 4 of its 8 rows"),
    ("q4_0:i8mm:4x12", "mr=4, nr=12 needs"),
    ("q4_0:sve_i8mm:8x7vl", "a block of 4 of its 8 rows"),
    ("q4_0_dx:dotprod:12x32", "a block of 4 of its 12 rows")])
def test_q4_refusal_names_the_tile_and_the_block_tried(text, block):
    with pytest.raises(SpecError) as e:
        parse_spec(text)
    msg = str(e.value)
    tile = text.split(":")[2]
    assert msg.startswith(f"tile {tile}") and block in msg and "vector registers" in msg, msg


def test_register_pool_keeps_the_accounts():
    from tilegen.generator.regalloc import RegisterPool
    pool = RegisterPool(("accumulators", "LHS", "RHS"))
    assert pool.v.take(2, "RHS") == [0, 1]
    assert pool.v.take(8, "LHS") == [2, 3, 4, 5, 6, 7, 16, 17]     # caller-saved first
    assert pool.v.reuse([0, 1], 3, "RHS") == [0, 1, 18]          # only the fresh one counts
    assert pool.fits and pool.frame()["saved_d"] == ()
    pool.v.take(14, "accumulators")                              # v19-v31, then v8
    assert pool.fits and pool.frame()["saved_d"] == (8,)
    assert pool.frame()["needs"].parts == (("accumulators", 14), ("LHS", 8), ("RHS", 3))
    pool.v.take(10, "accumulators")                              # 35 > 32: still counted
    assert not pool.fits
    assert str(pool.refusal("mr=8, nr=12")) == (
        "mr=8, nr=12 needs 35 vector registers (24 accumulators + 8 LHS + 3 RHS), 32 exist")
    with pytest.raises(AssertionError, match="not an account"):
        pool.v.take(1, "scratch")
    gprs = RegisterPool(("LHS",))
    gprs.scalars(tuple(f"s{i}" for i in range(7)))
    gprs.x.take(14, "LHS row pointers")
    assert str(gprs.refusal("mr=14, nr=4")) == (
        "mr=14, nr=4 needs 21 general-purpose registers (7 scalars + 14 LHS row pointers), "
        "20 are free besides the arguments")


_HUGE = ["f32:neon:1000000000x16", "f32:neon:99999999999999999999x16", "f32:neon:10000000x16",
         "q4_0:i8mm:4000000x4", "q4_0:i8mm:68x4", "q8_0:i8mm:400000x4", "q4_0:sve_i8mm:400000x1vl",
         "q8_0:sve_i8mm:40000x1vl", "f32:neon:4x1000000000", "bf16:bf16:1x99999999",
         "f32:sme:99999vlx1vl", "f32:sme2:1x99999999999vl", "bf16:sme2:17vlx1vl",
         "q4_0:i8mm:4x4:k99999999999999999999:s2", "q4_0_dx:i8mm:4x4:k32:s99999999999",
         "q8_0:neon:4x4:k4096:s1", "f32:neon:4x" + "9" * 5000]


@pytest.mark.parametrize("text", _HUGE, ids=lambda t: t[:40])
def test_huge_tiles_are_refused_at_once(text):
    """Numbers past the bounds are refused before any register is counted (they used to be
    taken one register at a time: minutes and gigabytes; q4/q8 tiles taller than a register
    block were even accepted, as the same code with an absurd m step)."""
    import time
    from tilegen.generator.spec import KernelSpec
    fam, isa, tile, *rest = text.split(":")
    for call in (lambda: parse_spec(text), lambda: tilegen.generate(text)):
        t = time.perf_counter()
        with pytest.raises(SpecError, match="out of range: tiles have mr <= 64, nr <= 128"):
            call()
        assert time.perf_counter() - t < 1
    if len(text) < 100:    # the KernelSpec constructor: the same bound on the ints
        from tilegen.generator.spec import _SPEC_RE, _tile
        m = _SPEC_RE.match(text)
        kw = dict(kr=int(m["kr"]) if m["kr"] else None, sr=int(m["sr"]) if m["sr"] else None)
        mr, mr_vl, nr, nr_vl = (int(m["mr"]), bool(m["mrvl"]), int(m["nr"]), bool(m["nrvl"]))
        t = time.perf_counter()
        with pytest.raises(SpecError, match="out of range"):
            validate(KernelSpec(fam, isa, mr, nr, mr_vl=mr_vl, nr_vl=nr_vl, **kw))
        assert time.perf_counter() - t < 1


@pytest.mark.parametrize("text", ["f32:neon:1x116", "bf16:bf16:1x108", "f32:sme2:1x16vl",
                                  "q4_0:i8mm:64x4", "q8_0:i8mm:64x4", "q4_0_dx:dotprod:1x32"])
def test_largest_tiles_stay_within_the_bounds(text):
    assert parse_spec(text).spec_string == text


def test_error_types_are_exported_from_the_package():
    """Every error the public API raises is importable from ``tilegen`` (and in __all__)."""
    from tilegen import (ArgumentError, BuildError, EmulateError, LayoutError, LoadError,  # noqa: F401
                         TargetError, ToolchainError)
    from tilegen.build import BuildError as B, TargetError as T, ToolchainError as TC
    from tilegen.emulate.runner import EmulateError as E
    from tilegen.records import SpecError as S
    from tilegen.layout.base import LayoutError as L
    from tilegen.runtime.errors import ArgumentError as A, LoadError as LE
    assert (tilegen.SpecError, ArgumentError, LoadError, LayoutError, EmulateError, BuildError,
            TargetError, ToolchainError) == (S, A, LE, L, E, B, T, TC)
    names = {"SpecError", "ArgumentError", "LoadError", "LayoutError", "EmulateError",
             "BuildError", "TargetError", "ToolchainError"}
    assert names <= set(tilegen.__all__)
    assert all(getattr(tilegen, n) is not None for n in tilegen.__all__)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        tilegen.NoSuchError
