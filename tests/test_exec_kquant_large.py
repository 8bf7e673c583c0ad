"""The K-quant SME2 large-m gemm in the runtime (issue #34): an entry's gemm hands over to the
large-m gemm its ISA record names (``IsaImpl.large_gemm``: ``4vlx1vl``, its ``:i16`` variant where the family has one) once m exceeds
``large_after`` tiles of the gemm's rows, on the packing they share (nr = 1vl: the default
entry, 1vlx2vl with the 1x2vl gemv, reads the 2vl packing and has none); the families with the
1x1vl gemv (on the 1vl packing) run it at m = 1 in that entry.  Under qemu ``max``
with SME at SVL 128 and 512, for every family whose record has it: the kernel picked at m just
below, at and above the threshold (and m = 1, and m past the large tile, off its rows), by
``select``, a plan made for the most rows and called with fewer, and ``matmul_experts``; every
result (matmul at 1 and 3 threads, the plan; the expert call, which has no clamp) bit-exact with
:func:`tilegen.reference.kquant.matmul_blocks` from the float activations and the ggml blocks;
n off the tile; ``set_table`` refuses a large-m gemm on another packing."""
from __future__ import annotations

import numpy as np
import pytest

import tilegen
from tilegen.families import FAMILIES, rhs_layout_class
from tilegen.generator.spec import parse_tile
from tilegen.reference.kquant import matmul_blocks

from conftest import SME_ON, guest
from test_kquant_weights import KQ

#: the families whose SME2 record names a large-m gemm (from the registry: a family that gains
#: one is tested here with no edit)
LARGE = tuple(f for f in KQ if "sme2" in FAMILIES[f].impls
              and FAMILIES[f].impls["sme2"].large_gemm is not None)
SVLS = (128, 512)
FMAX = 3.4028234663852886e38


def _has_gemv_1vl(family: str) -> bool:
    """The family's allocator serves the 1x1vl SME2 gemv (the gemv on the 1vl packing)."""
    try:
        tilegen.parse_spec(f"{family}:sme2:1x1vl")
    except tilegen.SpecError:
        return False
    return True


#: the families with a gemv on the 1vl packing: their 1vl entry pairs with it
GEMV_1VL = tuple(f for f in LARGE if _has_gemv_1vl(f))


def _specs(family: str) -> list[str]:
    impl = FAMILIES[family].impls["sme2"]
    extra = ("1x1vl",) if family in GEMV_1VL else ()
    return [f"{family}:sme2:{t}" for t in ("1vlx2vl", "1x2vl", "1vlx1vl", impl.large_gemm)
            + extra]


def test_gemv_1vl_families():
    """q4_K and iq4_xs (LUTI4) have the 1x1vl gemv (multi-vector SDOT vgx4 on broadcast LHS
    quads); q5_K's and q6_K's allocators refuse it."""
    assert set(GEMV_1VL) >= {"q4_K", "iq4_xs"} and not {"q5_K", "q6_K"} & set(GEMV_1VL), GEMV_1VL


@pytest.fixture(scope="module")
def large_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("kqlarge")
    tilegen.build_library([s for f in LARGE for s in _specs(f)], target="linux-aarch64-all",
                          out_dir=out)
    return out


def test_large_families_from_the_records():
    """q4_K, iq4_xs and q6_K name the 4vlx1vl gemm; q5_K's reads its own packing (q5kps)."""
    assert set(LARGE) >= {"q4_K", "iq4_xs", "q6_K"} and "q5_K" not in LARGE, LARGE


@pytest.mark.parametrize("svl", SVLS)
@pytest.mark.parametrize("family", LARGE)
def test_large_m_gemm_by_rows(family, svl, large_lib):
    impl = FAMILIES[family].impls["sme2"]
    rows = svl // 32                          # rows of one VL unit (SME: SVL/32)
    lmr, lmr_vl, lnr, lnr_vl = parse_tile(impl.large_gemm.split(":")[0])
    assert lmr_vl and lnr_vl and lnr == 1
    nr, gemm_mr, large_mr = rows, rows, lmr * rows
    t = impl.large_after * gemm_mr + 1       # the first m the large-m gemm runs
    ms = sorted({1, t - 1, t, t + 1, large_mr + 3})
    n, k = 2 * nr + 3, 512
    rng = np.random.default_rng(34 + svl)
    x = (rng.normal(size=(max(ms), k)) * rng.uniform(0.1, 8.0, size=(max(ms), 1))).astype(np.float32)
    raw = KQ[family][2](n, k, 3400 + svl)
    free = matmul_blocks(rhs_layout_class(family), x, raw, n, -FMAX, FMAX)
    lo, hi = (float(np.float32(q)) for q in np.quantile(free, [0.1, 0.9]))
    res = guest("max", None, svl, SME_ON).call("guest_kquant:large_m", str(large_lib), family,
                                               raw, n, k, x, ms, (lo, hi), nr)
    assert isinstance(res, dict), res
    names = {t_: tilegen.parse_spec(s).name
             for t_, s in zip(("2vl", "gemv", "1vl", "large", "gemv1vl"), _specs(family))}
    gemv1 = names.get("gemv1vl")              # the 1vl entry's gemv (None: the family has none)
    # the default entry (2vl packing, with the gemv) has no large-m gemm: no gemv reads 1vl
    d = res["default"]
    assert (d["gemm"], d["gemv"], d["large"], d["big"]) == (names["2vl"], names["gemv"], None,
                                                            names["2vl"]), d
    e = res["entry"]
    assert (e["gemm"], e["gemv"], e["large"]) == (names["1vl"], gemv1, names["large"]), e
    assert (e["gemm_mr"], e["large_after"], e["large_from"]) == (gemm_mr, impl.large_after, t), e
    # the large-m gemm heads no entry of its own
    assert not any(r.startswith(f"KernelPair(gemm={names['large']}") for r in e["table"]), e
    for m in ms:
        r = res["runs"][m]
        cls = "large" if m >= t else "gemv" if (m == 1 and gemv1) else "gemm"
        want = {"large": names["large"], "gemv": gemv1, "gemm": names["1vl"]}[cls]
        where = f"{family} svl={svl} m={m} (threshold {t})"
        assert (r["kernel"], r["plan_kernel"]) == (want, want), (where, r["kernel"], r["plan_kernel"])
        assert r["row_class"] == cls, where
        ref = matmul_blocks(rhs_layout_class(family), x[:m], raw, n, lo, hi)
        unclamped = matmul_blocks(rhs_layout_class(family), x[:m], raw, n, -FMAX, FMAX)
        for what, want_y in (("y", ref), ("y1", ref), ("plan", ref), ("experts", unclamped)):
            np.testing.assert_array_equal(np.asarray(r[what]).view(np.uint32),
                                          want_y.view(np.uint32), err_msg=f"{where} {what}")
    assert res["mixed"].startswith("ArgumentError: large ") and "does not read" in res["mixed"], \
        res["mixed"]


def _fake(spec: str, mr: int):
    """A stand-in for a runtime Kernel: what build_table and KernelPair read (no library)."""
    from types import SimpleNamespace
    s = tilegen.parse_spec(spec)
    return SimpleNamespace(spec=s, family=s.family, name=s.name, entry={}, mr=mr,
                           features=frozenset(s.features))


def test_table_attaches_the_record_large_gemm(monkeypatch):
    """On the host: build_table gives the 1vl gemm the large-m gemm its ISA record names (and
    drops the large gemm's own entry), none to the 2vl pair (another packing); without the
    record's large_gemm nothing is attached (the record is the rule's one source)."""
    import dataclasses
    from tilegen.runtime.select import build_table
    ks = [_fake(f"q4_K:sme2:{t}", mr) for t, mr in (("1vlx2vl", 16), ("1x2vl", 1),
                                                    ("1vlx1vl", 16), ("4vlx1vl:i16", 64))]
    table = build_table(ks, "q4_K")
    got = [(p.gemm.spec.spec_string, p.gemv and p.gemv.spec.spec_string,
            p.large and p.large.spec.spec_string) for p in table]
    assert got == [("q4_K:sme2:1vlx2vl", "q4_K:sme2:1x2vl", None),
                   ("q4_K:sme2:1vlx1vl", None, "q4_K:sme2:4vlx1vl:i16")], got
    assert table[1].large_from == FAMILIES["q4_K"].impls["sme2"].large_after * 16 + 1
    impl = FAMILIES["q4_K"].impls["sme2"]
    monkeypatch.setitem(FAMILIES["q4_K"].impls, "sme2", dataclasses.replace(impl, large_gemm=None))
    assert all(p.large is None for p in build_table(ks, "q4_K"))
    assert len(build_table(ks, "q4_K")) == 3       # 4vlx1vl:i16 heads its own entry again
    # the record names the :i16 variant: the q8kp 4vlx1vl is not taken for it
    monkeypatch.setitem(FAMILIES["q4_K"].impls, "sme2", impl)
    plain = ks[:3] + [_fake("q4_K:sme2:4vlx1vl", 64)]
    assert all(p.large is None for p in build_table(plain, "q4_K"))
    # with the 1x1vl gemv in the library the 1vl entry pairs with it (same RHS), the 2vl pair
    # keeps 1x2vl and still comes first
    table = build_table(ks + [_fake("q4_K:sme2:1x1vl", 1)], "q4_K")
    got = [(p.gemm.spec.spec_string, p.gemv and p.gemv.spec.spec_string,
            p.large and p.large.spec.spec_string) for p in table]
    assert got == [("q4_K:sme2:1vlx2vl", "q4_K:sme2:1x2vl", None),
                   ("q4_K:sme2:1vlx1vl", "q4_K:sme2:1x1vl", "q4_K:sme2:4vlx1vl:i16")], got


@pytest.mark.parametrize("after", (0, 1, 2))
def test_pair_rule_by_rows(after):
    """KernelPair.op: the gemv up to the gemv threshold (it wins over the large-m gemm), the
    large-m gemm from large_after x mr + 1 rows, the gemm between; no large-m gemm: gemv/gemm."""
    from tilegen.runtime.select import KernelPair
    g, v, big = (_fake(s, mr) for s, mr in (("q4_K:sme2:1vlx1vl", 4), ("q4_K:sme2:1x2vl", 1),
                                              ("q4_K:sme2:4vlx1vl", 16)))
    p = KernelPair(g, None, big, after)
    t = after * 4 + 1
    assert p.large_from == t
    for m in range(1, 40):
        assert p.op(m, 0) == ("large" if m >= t else "gemm"), m
        assert p.pick(m, 0) is (big if m >= t else g)
    q = KernelPair(g, v, big, after)
    for gt in (1, 8):
        for m in range(1, 40):
            want = "gemv" if m <= gt else "large" if m >= t else "gemm"
            assert q.op(m, gt) == want, (m, gt)
    assert KernelPair(g, v).op(39, 1) == "gemm" and KernelPair(g, None).op(1, 1) == "gemm"
