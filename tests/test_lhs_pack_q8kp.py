"""The generated NEON q8kp packer (the K-quant kernels' activations, docs/layouts.md#q8kp).

One shared library with a packer per (mr, kr) the K-quant kernels use (mr 1..16, kr 8 and
16), run in the emulated aarch64 Python (cortex-a53: baseline NEON, and max): byte-identical
with a numpy model written from the design (per row per 256-value super-block: amax, f32
inv = 127/amax, flushed (d = 0, q = 0) when inv = +inf, else d = 1/inv and FCVTNS(x * inv) (ties
to even) clamped to +-127, bsums per 32 split into hi = bsum >> 7 and lo = bsum - 128 hi) and with :class:`tilegen.layout.kquant.Q8KP`'s pack, for
any m_idx_start and row stride.  At the edges (issue #30 items 2 and 9: 1e-38, subnormal and
zero super-blocks, both sides of the flush threshold, ties) every packer holds ggml's Q8_K values
in q8kp's sign convention (q8kp_edges.expected_q8kp).  Only the slots of real rows are written (the rest keeps the
buffer's prefill); source rows end at a guard page, the packed region ends at one.

The VL-scaled packers (``q8kp1vlx<L>``: the SME2 K-quant kernels' row blocks of SVL/32 rows,
mr taken at run time) give the same bytes at the row counts of several SVLs, and write nothing
for an mr that is no SVL's.
"""
from __future__ import annotations

import numpy as np
import pytest

from tilegen.generator.packers import PackerSpec, packer_for, render
from tilegen.layout.kquant import Q8KP
from tilegen.records import SpecError

from conftest import guest
from q8kp_edges import KINDS as EDGE_KINDS, check_q8kp, edge_rows, expected_q8kp
from test_lhs_pack_neon import (MARGIN, PREFILLS, _case, _check, _rows_bytes, build_packers,
                                hot_loop)

F = np.float32
CPUS = ("cortex-a53", "max")
SPECS = [PackerSpec("q8kp", mr, kr, 2) for kr in (16, 8) for mr in range(1, 17)]
# VL-scaled (mr in SVL/32-row units at run time): kr 4 is the SME2 kernels' (L = 2)
VL_SPECS = [PackerSpec("q8kp", 1, kr, 2, mr_vl=True) for kr in (4, 16)] + [
    PackerSpec("q8kp", 2, 8, 2, mr_vl=True)]
VL_SVLS = (128, 256, 512, 2048)


def model_q8kp(x: np.ndarray, mr: int, L: int, m_idx_start: int = 0):
    """(packed region from the lhs_packed pointer, written mask) of rows ``x``."""
    m, k = x.shape
    nsb = k // 256
    S = 276 * mr * nsb
    R = -(-((m_idx_start % mr) + m) // mr) * S
    out = np.zeros(R, np.uint8)
    mask = np.zeros(R, np.uint8)
    t = np.arange(256)
    for r in range(m):
        g = m_idx_start + r
        slot = g % mr
        for s in range(nsb):
            rec = (g // mr - m_idx_start // mr) * S + s * 276 * mr
            v = x[r, 256 * s:256 * s + 256]
            amax = F(np.abs(v).max())
            with np.errstate(all="ignore"):
                inv = F(F(127) / amax)
                if np.isinf(inv):                                   # flushed: d 0, q 0
                    d, inv = F(0), F(0)
                else:
                    d = F(F(1) / inv)
                y = (v * inv).astype(F).astype(np.float64)
            y = np.where(np.isnan(y), 0.0, y)                       # FCVTNS: NaN -> 0
            q = np.clip(np.rint(y), -127, 127).astype(np.int64)     # ties to even
            pos = rec + (t // L) * mr * L + slot * L + t % L
            out[pos] = q.astype(np.int8).view(np.uint8)
            mask[pos] = 1
            o = rec + 256 * mr + 4 * slot
            out[o:o + 4] = np.array([d], "<f4").view(np.uint8)
            mask[o:o + 4] = 1
            bsum = q.reshape(8, 32).sum(axis=1)
            hi = bsum >> 7
            for off, part in ((260 * mr, hi), (268 * mr, bsum - 128 * hi)):
                o = rec + off + 8 * slot
                out[o:o + 8] = part.astype(np.int8).view(np.uint8)
                mask[o:o + 8] = 1
    return out, mask


def _rows(rng, m: int, k: int) -> np.ndarray:
    """Rows whose super-blocks are of every kind the arithmetic distinguishes."""
    x = (rng.standard_normal((m, k)) * 2).astype(F)
    for i in range(m):
        for s in range(k // 256):
            sb = x[i, 256 * s:256 * s + 256]
            kind = int(rng.integers(0, 10))
            if kind == 0:
                sb[:] = 0                             # amax 0: d 0, every q 0 (inv = +inf)
            elif kind == 1:
                sb[:] = -0.0
            elif kind == 2:                           # amax 127, inv 1: exact .5 ties (even)
                sb[:] = rng.integers(-254, 255, 256) * F(0.5)
                sb[int(rng.integers(0, 256))] = -127
            elif kind == 3:                           # inv = 127/amax overflows: flushed
                sb *= F(1e-38)
                sb[rng.random(256) < 0.2] = 0
            elif kind == 4:
                sb *= F(1e37)
            elif kind == 5:                           # one spike, the rest small
                sb *= F(1e-3)
                sb[int(rng.integers(0, 256))] = F(rng.choice([-1, 1]) * 40)
            elif kind == 6:                           # one-signed: bsums near +-4064
                sb[:] = np.abs(sb) * rng.choice([-1, 1])
            elif kind == 7:
                sb *= F(1e-30)
    return x


@pytest.fixture(scope="module")
def q8kp_lib(tmp_path_factory) -> str:
    return build_packers(SPECS + VL_SPECS, tmp_path_factory.mktemp("q8kplib"))


def _sweep(spec: PackerSpec, rng, n: int = 6, mr: int | None = None):
    """``n`` cases of ``spec`` at ``mr`` rows per block (default: the spec's mr)."""
    mr = spec.mr if mr is None else mr
    cases, refs = [], []
    for i in range(n):
        k = 256 * (1 + i % 3)
        m = int(rng.integers(1, 2 * mr + 3))
        ms = int(rng.integers(0, 2 * mr + 1))
        stride = 4 * k + int(rng.choice([0, 4, 20, 256]))
        x = _rows(rng, m, k)
        exp, mask = model_q8kp(x, mr, spec.L, ms)
        args = dict(m=m, k=k, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                    lhs_stride=stride)
        cases.append(_case(spec, args, _rows_bytes(x, stride), len(exp)))
        refs.append((exp, mask, f"m={m} k={k} ms={ms} stride={stride}", x))
    return cases, refs


def test_model_matches_layout():
    """The model above and Q8KP.pack (the runtime's numpy packer) give the same bytes; Q8KP's
    padding slots are zero."""
    rng = np.random.default_rng(240)
    checked = 0
    for spec in SPECS[::3]:
        for c, (exp, mask, what, x) in zip(*_sweep(spec, rng, 3)):
            got = Q8KP(spec.mr, spec.kr).pack(x, m_idx_start=c["args"]["m_idx_start"])
            assert got.size == exp.size, (spec.name, what)
            assert np.array_equal(got, np.where(mask == 1, exp, 0)), (spec.name, what)
            checked += 1
    assert checked == 3 * len(SPECS[::3])


@pytest.mark.parametrize("cpu", CPUS)
def test_packer_bit_exact(cpu, q8kp_lib):
    rng = np.random.default_rng(sum(map(ord, cpu)) + 24)
    cases, refs = [], []
    for spec in SPECS:
        c, r = _sweep(spec, rng, 6 if cpu == "max" else 3)
        cases += c
        refs += [(spec, *ref) for ref in r]
    outs = guest(cpu).call("guest_pack:run_cases", q8kp_lib, cases)
    for (spec, exp, mask, what, _), o in zip(refs, outs):
        _check(o, exp, mask, f"{spec.name} {what}")


def test_nothing_written_on_bad_arguments(q8kp_lib):
    spec = PackerSpec("q8kp", 4, 16, 2)
    x = _rows(np.random.default_rng(7), 5, 512)
    src = _rows_bytes(x, 2048)
    base = dict(m=5, k=512, mr=4, kr=16, sr=2, m_idx_start=0, lhs_stride=2048)
    bad = [{"m": 0}, {"k": 0}, {"k": 384}, {"k": 128}, {"mr": 8}, {"kr": 8}, {"sr": 0},
           {"kr": 0, "sr": 0}, {"kr": 12, "sr": 1}]
    cases = [_case(spec, {**base, **b}, src, 1024) for b in bad]
    # an equivalent (kr, sr) with the same L is accepted and gives the same bytes
    cases.append(_case(spec, {**base, "kr": 8, "sr": 1}, src, spec.packed_size(5, 512)))
    outs = guest("cortex-a53").call("guest_pack:run_cases", q8kp_lib, cases)
    for b, o in zip(bad, outs):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), b
    exp, mask = model_q8kp(x, 4, 8)
    _check(outs[-1], exp, mask, "kr=8 sr=1")


def test_names_geometry_and_hot_loop():
    s = PackerSpec("q8kp", 4, 16, 2)
    assert s.name == "lhs_quant_pack_q8kp4x8_f32_neon" and not s.takes_bl
    assert [n for n, _ in s.signature] == ["m", "k", "mr", "kr", "sr", "m_idx_start", "lhs",
                                           "lhs_stride", "lhs_packed"]
    assert s.packed_size(5, 512) == 2 * 2 * 276 * 4
    assert s.packed_offset(5, 512) == 2 * 276 * 4
    with pytest.raises(SpecError):
        PackerSpec("q8kp", 4, 12, 2)          # L = 6 does not divide 32
    for spec in (s, PackerSpec("q8kp", 1, 8, 2), PackerSpec("q8kp", 16, 8, 2)):
        loop = hot_loop(render(spec))
        assert sum(i.startswith("fmul") for i in loop) == 8
        assert sum(i.startswith("fcvtns") for i in loop) == 8
        assert sum(i.startswith("uzp1") for i in loop) == 6
        stores = 1 if spec.mr == 1 else 32 // spec.L
        assert len(loop) == 2 + 8 + 8 + 6 + 4 + stores + 2, (spec.name, len(loop))



def test_kernels_read_this_packer():
    """Every K-quant kernel spec names a q8kp packer of its mr and kr (packer_for)."""
    from tilegen.generator.validate import parse_spec
    from tilegen.families import FAMILIES
    specs = []
    for fam in (f for f in FAMILIES if FAMILIES[f].lhs == "q8kp"):     # every K-quant family
        for isa in FAMILIES[fam].impls:
            for tile in ("4x4", "1x4", "1vlx2vl"):
                try:
                    specs.append(parse_spec(f"{fam}:{isa}:{tile}"))
                except SpecError:
                    pass
    assert specs
    for sp in specs:
        p = packer_for(sp)
        assert p is not None and p.fmt == "q8kp" and p.kr == sp.kr and p.mr == sp.lhs_mr, sp
        assert p.mr_vl == sp.mr_vl, sp
    assert any(sp.mr_vl for sp in specs)


@pytest.mark.parametrize("cpu", CPUS)
def test_vl_packer_bit_exact(cpu, q8kp_lib):
    """The runtime-mr packers at the row counts of several SVLs (units x SVL/32 rows, 4..128):
    the model's bytes where it writes, Q8KP.pack's (at that mr) on every written byte."""
    rng = np.random.default_rng(sum(map(ord, cpu)) + 32)
    cases, refs = [], []
    for spec in VL_SPECS:
        for svl in VL_SVLS:
            mr = spec.svl_rows(svl // 8)
            assert spec.accepts_mr(mr)
            c, r = _sweep(spec, rng, 2 if mr >= 64 else 3, mr=mr)
            cases += c
            refs += [(spec, mr, *ref) for ref in r]
    outs = guest(cpu).call("guest_pack:run_cases", q8kp_lib, cases)
    for (spec, mr, exp, mask, what, x), c, o in zip(refs, cases, outs):
        _check(o, exp, mask, f"{spec.name} mr={mr} {what}")
        lay = Q8KP(mr, spec.kr).pack(x, m_idx_start=c["args"]["m_idx_start"])
        assert np.array_equal(lay, np.where(mask == 1, exp, 0)), (spec.name, mr, what)
        assert lay.size == spec.packed_size(c["args"]["m"] + c["args"]["m_idx_start"] % mr,
                                            c["args"]["k"], mr=mr), (spec.name, mr, what)


@pytest.mark.parametrize("cpu", CPUS)
def test_edges_are_ggml_q8_k(cpu, q8kp_lib):
    """Issue #30 items 2 and 9, every generated packer (fixed mr; VL-scaled at SVL 128 and 512
    rows): 1e-38, subnormal and zero super-blocks are flushed (d = 0, q = 0; they were +-127
    with d ~ amax/127), both sides of the flush threshold, 1e-36 (d subnormal), ties to even and
    control blocks hold ggml's Q8_K values (q8kp_edges.expected_q8kp), read back through
    Q8KP.unpack."""
    rng = np.random.default_rng(sum(map(ord, cpu)) + 3001)
    k = 256 * len(EDGE_KINDS)
    todo = [(spec, spec.mr) for spec in SPECS if spec.mr in (1, 3, 4, 8)] + [
        (spec, spec.svl_rows(svl // 8)) for spec in VL_SPECS for svl in (128, 512)]
    cases, refs = [], []
    for i, (spec, mr) in enumerate(todo):
        m, ms = int(rng.integers(1, mr + 3)), int(rng.integers(0, mr + 1))
        x = edge_rows(rng, m, k, first=i)
        stride = 4 * k + 4 * int(rng.integers(0, 3))
        size = Q8KP(mr, spec.kr).region_size(m, k, ms)
        cases.append(_case(spec, dict(m=m, k=k, mr=mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                                      lhs_stride=stride), _rows_bytes(x, stride), size))
        refs.append((spec, mr, m, ms, x))
    outs = guest(cpu).call("guest_pack:run_cases", q8kp_lib, cases)
    failed = []
    for (spec, mr, m, ms, x), o in zip(refs, outs):
        want = expected_q8kp(x)
        for got in o:                              # one output per prefill of the buffer
            region = np.asarray(got, np.uint8)[MARGIN:]
            try:
                check_q8kp(Q8KP(mr, spec.kr).unpack(region, m, k, ms), want,
                           f"{spec.name} mr={mr} m={m} ms={ms}")
            except AssertionError as e:
                failed.append(str(e))
    assert not failed, f"{len(failed)} of {2 * len(refs)} packs differ:\n" + "\n".join(failed)


def test_vl_packer_refuses_other_row_counts(q8kp_lib):
    """mr not a positive multiple of units x 4 rows, or beyond SVL 2048's: nothing written."""
    x = _rows(np.random.default_rng(9), 9, 256)
    src = _rows_bytes(x, 1024)
    cases, what = [], []
    for spec in VL_SPECS:
        unit, limit = spec.vl_rows[0], spec.vl_rows[-1]
        base = dict(m=9, k=256, mr=unit, kr=spec.kr, sr=spec.sr, m_idx_start=0, lhs_stride=1024)
        for b in ({"mr": 0}, {"mr": unit + 1}, {"mr": unit // 2}, {"mr": limit + unit},
                  {"mr": 2 * limit}, {"k": 384}, {"kr": 2 * spec.kr}):
            cases.append(_case(spec, {**base, **b}, src, 2048))
            what.append((spec.name, b))
    outs = guest("max").call("guest_pack:run_cases", q8kp_lib, cases)
    for w, o in zip(what, outs):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), w


def test_vl_names_and_render():
    s = PackerSpec("q8kp", 1, 4, 2, mr_vl=True)
    assert s.name == "lhs_quant_pack_q8kp1vlx2_f32_neon"
    assert s.vl_rows == tuple(range(4, 65, 4))
    text = render(s)
    assert "cmp x2, #64\n" in text and "#276\n" in text
    # the hot loop of the compile-time mr of the same L: the row count only sets the strides
    assert hot_loop(text) == hot_loop(render(PackerSpec("q8kp", 4, 4, 2)))
    with pytest.raises(SpecError, match="VL units"):
        PackerSpec("q8kp", 3, 4, 2, mr_vl=True)
