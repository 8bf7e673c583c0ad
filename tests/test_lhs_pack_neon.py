"""Generated NEON LHS quantize-and-pack routines (qai8dxp, qsi8d32p) against KleidiAI.

Builds one shared library with every variant below, runs it in the emulated aarch64 Python
through ctypes (golden vectors on every EXEC cpu, the random sweep on cortex-a53 and max), and checks byte identity with KleidiAI's golden vectors
(under ``written_mask``: bytes KleidiAI does not write must stay untouched) and with a numpy
model of the spec on a seeded random sweep.  Source rows end at a guard page (no over-read),
the packed region ends at one (no over-write) and a margin before it must stay untouched.
"""
from __future__ import annotations

import re
import subprocess

import numpy as np
import pytest

from tilegen.build.toolchain import discover
from tilegen.generator.packers import ELEMS_PER_ITER, MR_MAX, PackerSpec, render
from tilegen.records import SpecError

from conftest import EXEC_CPUS, VECTORS, guest

CPUS = ("cortex-a53", "max")
PREFILLS = (0x00, 0xFF)
MARGIN = 64

# (mr, kr, sr) per format; the golden vectors need (1,8,2) (4,8,2) (4,16,2) for qai8dxp and
# (1,8,2) (1,16,2) (4,8,2) (4,16,2) for qsi8d32p.
QAI8DXP_TILES = [(1, 8, 2), (4, 8, 2), (4, 16, 2), (1, 16, 2), (8, 4, 1), (4, 32, 2), (2, 2, 1),
                 (3, 1, 1), (2, 64, 2), (16, 16, 2), (5, 8, 1)]
QSI8D32P_TILES = [(1, 8, 2), (1, 16, 2), (4, 8, 2), (4, 16, 2), (8, 4, 1), (3, 32, 2),
                  (2, 32, 1), (16, 8, 1), (4, 32, 2), (8, 16, 1), (4, 32, 1)]
QSI8D32P_EVEN_TILES = [(4, 16, 2), (1, 16, 2), (4, 8, 2), (8, 32, 1)]

SPECS = ([PackerSpec("qai8dxp", *t) for t in QAI8DXP_TILES]
         + [PackerSpec("qsi8d32p", *t) for t in QSI8D32P_TILES]
         + [PackerSpec("qsi8d32p", *t, rounding="even") for t in QSI8D32P_EVEN_TILES])


# --------------------------------------------------------------------------------------------
# numpy model (written from docs/layouts.md#qai8dxp and #qsi8d32p); tilegen.layout.lhs_int8 is used
# as well when it exists.
F = np.float32


def _sat_round_away_i32(y: np.ndarray) -> np.ndarray:
    """(int32_t)roundf(y) as AArch64 computes it (FCVTAS: NaN -> 0, saturating)."""
    y64 = np.where(np.isnan(y), 0.0, y.astype(np.float64))
    r = np.trunc(y64 + np.copysign(0.5, y64))
    return np.clip(r, -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64)


def _qai8dxp_row(x: np.ndarray):
    """The C packer's arithmetic, KAI_MAX(a, b) = a > b ? a : b, KAI_MIN(a, b) = a < b ? a : b."""
    k = x.shape[0]
    with np.errstate(all="ignore"):
        mx, mn = x.max(), x.min()
        rmax = F(0) if not F(0) < mx else mx
        rmin = F(0) if not F(0) > mn else mn
        scale = F(1) if rmin == rmax else F(255) / F(rmax - rmin)
        rscale = F(1) / scale if scale != 0 else F(0)
        dmin, dmax = F(rmin * scale), F(rmax * scale)
        e = F(F(F(-128) + dmin) + F(F(127) + dmax))
        zp = F(F(-128) - dmin) if e > 0 else F(F(127) - dmax)
        zp = zp if zp > F(-128) else F(-128)
        zp = zp if zp < F(127) else F(127)
        nzp = int(np.rint(zp))
        v = _sat_round_away_i32((x * scale).astype(F)) + nzp
        v = (v + 2 ** 31) % 2 ** 32 - 2 ** 31          # int32 wrap-around of the C add
        q = np.clip(v, -128, 127)
    k32 = -(-k // 32) * 32
    q = np.concatenate([q, np.full(k32 - k, q[-1])]).astype(np.int8)
    return q, -nzp, rscale


def model_qai8dxp(x: np.ndarray, mr: int, L: int, m_idx_start: int = 0):
    """(packed region from the lhs_packed pointer, written mask); x = the rows to pack."""
    m, k = x.shape
    k32 = -(-k // 32) * 32
    S = mr * (k32 + 8)
    R = -(-((m_idx_start % mr) + m) // mr) * S
    out = np.zeros(R, np.uint8)
    mask = np.zeros(R, np.uint8)
    for r in range(m):
        g = m_idx_start + r
        base = (g // mr - m_idx_start // mr) * S
        slot = g % mr
        q, off, rs = _qai8dxp_row(x[r])
        t = np.arange(k32)
        pos = base + (t // L) * mr * L + slot * L + t % L
        out[pos] = q.view(np.uint8)
        mask[pos] = 1
        o = base + mr * k32 + 4 * slot
        out[o:o + 4] = np.array([off], "<i4").view(np.uint8)
        out[o + 4 * mr:o + 4 * mr + 4] = np.array([rs], "<f4").view(np.uint8)
        mask[o:o + 4] = mask[o + 4 * mr:o + 4 * mr + 4] = 1
    return out, mask


def model_qsi8d32p(x: np.ndarray, m: int, bl: int, mr: int, L: int, m_idx_start: int = 0,
                   rounding: str = "away"):
    """(region, mask); x = the whole matrix (rows m_idx_start .. m_idx_start+m-1 are packed)."""
    k = x.shape[1]
    nb = k // bl
    BB = mr * (bl + 2)
    S = nb * BB
    R = -(-((m_idx_start % mr) + m) // mr) * S
    out = np.zeros(R, np.uint8)
    mask = np.zeros(R, np.uint8)
    for r in range(m):
        g = m_idx_start + r
        base = (g // mr - m_idx_start // mr) * S
        slot = g % mr
        for b in range(nb):
            xb = x[g, b * bl:(b + 1) * bl]
            with np.errstate(all="ignore"):
                amax = max(F(0), np.abs(xb).max())
                d = F(amax / F(127))
                inv = F(F(1) / d) if d != 0 else F(0)
                y = (xb * inv).astype(F)
                if rounding == "away":
                    qi = _sat_round_away_i32(y)
                else:
                    y64 = np.where(np.isnan(y), 0.0, y.astype(np.float64))
                    qi = np.clip(np.rint(y64), -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64)
            q = (qi & 0xFF).astype(np.uint8)
            B = base + b * BB
            with np.errstate(over="ignore"):
                h = np.array([d], np.float16)
            out[B + 2 * slot:B + 2 * slot + 2] = h.view(np.uint8)
            mask[B + 2 * slot:B + 2 * slot + 2] = 1
            e = np.arange(bl)
            pos = B + 2 * mr + (e // L) * mr * L + slot * L + e % L
            out[pos] = q
            mask[pos] = 1
    return out, mask


# --------------------------------------------------------------------------------------------
# build

def build_packers(specs, out) -> str:
    """A shared library (ELF) of the packers ``specs``, built in directory ``out``."""
    tc = discover("elf")
    objs = []
    for s in specs:
        src = out / f"{s.name}.S"
        src.write_text(render(s, "elf"))
        obj = out / f"{s.name}.o"
        subprocess.run(tc.assemble_cmd(src, obj), check=True, capture_output=True)
        objs.append(obj)
    so = out / "libpack.so"
    subprocess.run(tc.link_cmd(objs, so), check=True, capture_output=True)
    return str(so)


@pytest.fixture(scope="session")
def pack_lib(tmp_path_factory) -> str:
    return build_packers(SPECS, tmp_path_factory.mktemp("packlib"))


def _case(spec: PackerSpec, args: dict, src_bytes: np.ndarray, dst_size: int) -> dict:
    return dict(name=spec.name, fmt=spec.fmt, args=args, src=src_bytes, dst_size=dst_size,
                prefills=list(PREFILLS), margin=MARGIN)


def _rows_bytes(x: np.ndarray, stride: int, first: int = 0, nrows: int | None = None) -> np.ndarray:
    """Bytes from row ``first`` to the end of the last row's k values, rows ``stride`` apart."""
    n, k = x.shape
    nrows = n - first if nrows is None else nrows
    size = (nrows - 1) * stride + 4 * k if nrows else 0
    buf = np.full(size, 0x7F, np.uint8)       # padding between rows: NaN-ish garbage
    for i in range(nrows):
        buf[i * stride:i * stride + 4 * k] = x[first + i].astype("<f4").view(np.uint8)
    return buf


def _check(outs, expected, mask, what):
    for fill, got in zip(PREFILLS, outs):
        assert (got[:MARGIN] == fill).all(), f"{what}: wrote before lhs_packed (prefill {fill:#x})"
        got = got[MARGIN:]
        want = np.where(mask.astype(bool), expected, np.uint8(fill))
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{what}: {bad.size} bytes differ (prefill {fill:#x}), first at "
                               f"{bad[:8].tolist()}: got {got[bad[:8]].tolist()} "
                               f"want {want[bad[:8]].tolist()} written={mask[bad[:8]].tolist()}")


# --------------------------------------------------------------------------------------------
# golden vectors

def _golden_cases():
    """(spec, args, src bytes, expected, mask, label) for every applicable golden vector."""
    out = []
    for f in sorted(VECTORS.glob("*.npz")):   # none: GOLDEN is empty and the tests below fail
        name = f.name
        z = np.load(f, allow_pickle=False)
        files = set(z.files)
        I = lambda key: int(z[key])  # noqa: E731
        if name.startswith("lhs_qai8dxp_") or (name.startswith("matmul_clamp_f32_qai8dxp")
                                               and "lhs_packed" in files):
            spec = PackerSpec("qai8dxp", I("mr"), I("kr"), I("sr"))
            x = z["lhs"]
            ms = I("m_idx_start") if "m_idx_start" in files else 0
            stride = I("lhs_stride") if "lhs_stride" in files else 4 * x.shape[1]
            exp = z["packed"] if "packed" in files else z["lhs_packed"]
            mask = z["written_mask"] if "written_mask" in files else np.ones_like(exp)
            if "written_mask" not in files:   # zero-filled buffer: unwritten slots read as 0
                mask = model_qai8dxp(x, spec.mr, spec.L, ms)[1]
                assert not exp[~mask.astype(bool)].any()
            args = dict(m=x.shape[0], k=x.shape[1], mr=spec.mr, kr=spec.kr, sr=spec.sr,
                        m_idx_start=ms, lhs_stride=stride)
            out.append((spec, args, _rows_bytes(x, stride), exp, mask, name))
            continue
        qsi = (name.startswith("lhs_qsi8d32p") or name.startswith("qsi8d32p_lhs_")
               or name.startswith("qsi8d32p_mm_")
               or (name.startswith("matmul_clamp_f32_qsi8d32p") and "lhs_packed" in files))
        if not qsi:
            continue
        x = z["lhs"]
        ms = I("m_idx_start") if "m_idx_start" in files else 0
        m = I("m") if "m" in files else x.shape[0] - ms
        stride = I("lhs_stride") if "lhs_stride" in files else 4 * x.shape[1]
        variants = []
        if "packed" in files:          # lhs_qsi8d32p*_ files
            prod = str(z["producer"])
            variants.append(("even" if "4x8sb" in prod else "away", z["packed"],
                             z["written_mask"], ""))
        elif "lhs_packer" in files:    # qsi8d32p_mm_ files
            prod = str(z["lhs_packer"])
            variants.append(("even" if "4x8sb" in prod else "away", z["lhs_packed"], None, ""))
        elif "function" in files:      # qsi8d32p_lhs_ files
            variants.append(("even" if "4x8sb" in str(z["function"]) else "away",
                             z["lhs_packed"], z["written_mask"], ""))
            if "lhs_packed_sb" in files:
                variants.append(("even", z["lhs_packed_sb"], z["written_mask_sb"], " [sb]"))
        else:                          # matmul_clamp_f32_qsi8d32p*: generic packer (README)
            variants.append(("away", z["lhs_packed"], None, ""))
        for rounding, exp, mask, tag in variants:
            spec = PackerSpec("qsi8d32p", I("mr"), I("kr"), I("sr"), rounding=rounding)
            if mask is None:
                mask = model_qsi8d32p(x, m, I("bl"), spec.mr, spec.L, ms, rounding)[1]
                assert not exp[~mask.astype(bool)].any()
            args = dict(m=m, k=x.shape[1], bl=I("bl"), mr=spec.mr, kr=spec.kr, sr=spec.sr,
                        m_idx_start=ms, lhs_stride=stride)
            out.append((spec, args, _rows_bytes(x, stride), exp, mask, name + tag))
    return out


GOLDEN = _golden_cases()


def test_golden_vectors_found():
    labels = [g[-1] for g in GOLDEN]
    assert sum(lbl.startswith("lhs_qai8dxp_") for lbl in labels) >= 3
    assert sum("qsi8d32p" in lbl for lbl in labels) >= 10
    assert any("_special_" in lbl for lbl in labels) and any("_ties_" in lbl for lbl in labels)
    names = {s.name for s in SPECS}
    assert len(names) == len(SPECS)
    for spec, *_ in GOLDEN:
        assert spec.name in names, spec


def test_model_matches_golden():
    """The numpy model used by the random sweep reproduces every golden vector."""
    assert GOLDEN, f"no golden vectors in {VECTORS}"
    for spec, a, _, exp, mask, label in GOLDEN:
        nrows = a["m"] + (a["m_idx_start"] if spec.fmt == "qsi8d32p" else 0)
        stride = a["lhs_stride"]
        src = np.load(VECTORS / label.split(" ")[0])["lhs"][:nrows]
        if spec.fmt == "qai8dxp":
            got, gmask = model_qai8dxp(src, spec.mr, spec.L, a["m_idx_start"])
        else:
            got, gmask = model_qsi8d32p(src, a["m"], a["bl"], spec.mr, spec.L, a["m_idx_start"],
                                        spec.rounding)
        assert stride == 4 * a["k"]
        assert np.array_equal(gmask, mask), label
        assert np.array_equal(got[mask == 1], exp[mask == 1]), label


@pytest.mark.parametrize("cpu", EXEC_CPUS)
def test_golden_vectors(cpu, pack_lib):
    assert GOLDEN, f"no golden vectors in {VECTORS}"
    cases = [_case(spec, a, src, len(exp)) for spec, a, src, exp, _, _ in GOLDEN]
    outs = guest(cpu).call("guest_pack:run_cases", pack_lib, cases)
    for (spec, a, _, exp, mask, label), o in zip(GOLDEN, outs):
        _check(o, exp, mask, f"{spec.name} {label}")


# --------------------------------------------------------------------------------------------
# random sweep

def _qai8dxp_rows(rng, m, k):
    x = np.empty((m, k), F)
    for i in range(m):
        kind = int(rng.integers(0, 12))
        if kind == 0:
            v = rng.normal(size=k) * 10.0 ** rng.uniform(-3, 3)
        elif kind == 1:
            v = rng.uniform(0.1, 5, size=k)
        elif kind == 2:
            v = -rng.uniform(0.1, 5, size=k)
        elif kind == 3:   # 0.25 grid, scale exactly 2, zero-point and value ties
            v = rng.integers(-255, 256, size=k) * 0.25
            v[0] = -63.75
            if k > 1:
                v[-1] = 63.75
        elif kind == 4:
            v = np.zeros(k)
        elif kind == 5:
            v = np.full(k, rng.normal())
        elif kind == 6:
            v = rng.uniform(-1, 9, size=k)
        elif kind == 8:   # rmax - rmin overflows: scale 0, rscale 0
            v = rng.choice([-3e38, 3e38, 1.0, 0.0], size=k)
        elif kind == 9:   # tiny range: 255 / (rmax - rmin) overflows to +inf
            v = rng.normal(size=k) * 1e-39
            v[rng.random(k) < 0.2] = 0
        elif kind == 10:  # tiny one-signed rows (0 * inf = NaN in the zero-point math)
            v = rng.uniform(0, 1, size=k) * 1e-39 * rng.choice([-1, 1])
        else:
            v = rng.normal(size=k)
        x[i] = v
    return x


def _qsi8d32p_rows(rng, rows, k, bl):
    x = (rng.normal(size=(rows, k)) * 3).astype(F)
    for i in range(rows):
        for b in range(k // bl):
            kind = int(rng.integers(0, 11))
            s = slice(b * bl, (b + 1) * bl)
            if kind == 0:
                x[i, s] = 0
            elif kind == 1:
                x[i, s] = -0.0
            elif kind == 2:   # integer values, d = 2: many exact .5 ties
                x[i, s] = rng.integers(-254, 255, size=bl)
                x[i, b * bl] = 254
            elif kind == 3:
                x[i, s] *= F(1e-6)
            elif kind == 4:
                x[i, s] *= F(1e7)   # f16 scale overflows to inf
            elif kind == 5:
                x[i, s] *= F(1e-8)
            elif kind == 7:   # subnormal scale: 1/d overflows to +inf
                x[i, s] *= F(1e-40)
                x[i, b * bl + 1] = 0
            elif kind == 6:   # 0.25 grid with amax 63.5 -> scale 0.5
                x[i, s] = rng.integers(-254, 255, size=bl) * 0.25
                x[i, b * bl] = -63.5
    return x


#: the small edges of the int8 LHS quantisers (issue #30 item 2), one row each (k a multiple
#: of 32; qsi8d32p's blocks of 32 take the row's kind, except in "tiny block").  Below
#: 127/FLT_MAX (qsi8d32p's amax) or 255/FLT_MAX (qai8dxp's range) the reciprocal scale
#: overflows to +inf; "few ulps" blocks have amax/127 = 0 in f32, as the zero block.
TINY_KINDS = ("1e-38", "few ulps", "1e-38 positive", "1e-38 negative", "subnormal", "+0", "-0",
              "below the edge", "above the edge", "tiny block", "normal")


def tiny_rows(rng, k: int) -> np.ndarray:
    """One float32 row of each of TINY_KINDS (random non-zero values where non-zero)."""
    x = np.empty((len(TINY_KINDS), k), F)
    for i, kind in enumerate(TINY_KINDS):
        v = rng.normal(size=k)
        if kind == "1e-38":
            v *= 1e-38
        elif kind == "few ulps":                      # amax <= 60 * 2^-149: amax / 127 == 0
            v = rng.integers(-60, 61, size=k) * 2.0 ** -149
            v[::32] = 2.0 ** -149 * 60
        elif kind == "1e-38 positive":
            v = np.abs(v) * 1e-38 + 1e-39
        elif kind == "1e-38 negative":
            v = -np.abs(v) * 1e-38 - 1e-39
        elif kind == "subnormal":
            v *= 1e-41
        elif kind == "+0":
            v = np.zeros(k)
        elif kind == "-0":
            v = np.full(k, -0.0)
        elif kind == "below the edge":                # max|x| = 3e-37: 127/amax, 255/range = inf
            v = v / np.abs(v).max() * 3e-37
        elif kind == "above the edge":                # range <= 2e-36: finite scales
            v = v / np.abs(v).max() * 1e-36
        elif kind == "tiny block":                    # a normal row, its second block 1e-38
            v[32:64] *= 1e-38
        x[i] = v
    assert np.all(np.isfinite(x)) and np.count_nonzero(x[[0, 1, 2, 3, 4, 7, 8]], axis=1).min() > 0
    return x


def flushed_rows(x: np.ndarray, fmt: str) -> np.ndarray:
    """Per row of ``x``: does ``fmt``'s scale hold nothing of it (the row's result is then
    exactly the bias)?  qai8dxp: 255 / (rmax - rmin) overflows f32, so the stored 1/scale is 0
    (rmin == rmax takes scale 1); qsi8d32p: f16(amax / 127) is 0 in every block of 32."""
    with np.errstate(over="ignore", divide="ignore"):
        if fmt == "qai8dxp":
            span = np.maximum(x.max(axis=1), 0) - np.minimum(x.min(axis=1), 0)
            return (span > 0) & (F(255) / span == np.inf)
        d = (np.abs(x).reshape(x.shape[0], -1, 32).max(axis=2) / F(127)).astype(np.float16)
        return (d == 0).all(axis=1)


def test_tiny_activations(pack_lib):
    """Every generated packer at TINY_KINDS: the bytes of the layout object's numpy packer
    (and of the model above, KleidiAI's C arithmetic), m_idx_start 0 and 1, k 96 (and 67 for
    qai8dxp: the staging path).  Before the fix the 4-row qsi8d32p path wrote -1 for the
    positive values of a "few ulps" block (1/0 = inf, no d ? 1/d : 0 select)."""
    from tilegen.layout.lhs_int8 import QAI8DXP, QSI8D32P
    rng = np.random.default_rng(3038)
    cases, refs = [], []
    for spec in SPECS:
        for k in ((96, 67) if spec.fmt == "qai8dxp" else (96,)):
            x = tiny_rows(rng, 96)[:, :k]
            for ms in (0, 1):
                m = x.shape[0]
                if spec.fmt == "qai8dxp":
                    exp, mask = model_qai8dxp(x, spec.mr, spec.L, ms)
                    lay = QAI8DXP(spec.mr, spec.kr, spec.sr).pack(x, m_idx_start=ms)
                    args = dict(m=m, k=k, mr=spec.mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                                lhs_stride=4 * k)
                    src = _rows_bytes(x, 4 * k)
                else:
                    xs = np.concatenate([np.zeros((ms, k), F), x])     # lhs = row 0
                    exp, mask = model_qsi8d32p(xs, m, 32, spec.mr, spec.L, ms, spec.rounding)
                    lay = QSI8D32P(spec.mr, spec.kr, spec.sr, 32, spec.rounding).pack(
                        x, m_idx_start=ms)
                    args = dict(m=m, k=k, bl=32, mr=spec.mr, kr=spec.kr, sr=spec.sr,
                                m_idx_start=ms, lhs_stride=4 * k)
                    src = _rows_bytes(xs, 4 * k)
                assert np.array_equal(lay, np.where(mask == 1, exp, 0)), (spec.name, k, ms)
                cases.append(_case(spec, args, src, exp.size))
                refs.append((exp, mask, f"{spec.name} k={k} m_idx_start={ms}"))
    outs = guest("max").call("guest_pack:run_cases", pack_lib, cases)
    for (exp, mask, what), o in zip(refs, outs):
        _check(o, exp, mask, f"tiny activations {what}")


def _sweep_cases(spec: PackerSpec, rng):
    cases, refs = [], []
    if spec.fmt == "qai8dxp":
        ks = [1, 2, 3, 4, 5, 7, 16, 31, 32, 33, 48, 64, 67, 100, 129, 200]
        for i in range(28):
            k = ks[i % len(ks)]
            m = int(rng.integers(1, 14))
            ms = int(rng.integers(0, spec.mr + 1))
            pad = int(rng.choice([0, 4, 12, 64, 3]))     # 3: stride not a multiple of 4
            stride = 4 * k + pad
            x = _qai8dxp_rows(rng, m, k)
            eff = stride & ~3                            # KleidiAI: lhs_stride / sizeof(float)
            exp, mask = model_qai8dxp(x, spec.mr, spec.L, ms)
            src = _rows_bytes(x, eff)
            args = dict(m=m, k=k, mr=spec.mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                        lhs_stride=stride)
            cases.append(_case(spec, args, src, len(exp)))
            refs.append((exp, mask, f"m={m} k={k} ms={ms} stride={stride}", x))
    else:
        for i in range(20):
            bl = [32, 64, 128][i % 3]
            k = bl * int(rng.integers(1, 4))
            m = int(rng.integers(1, 14))
            ms = int(rng.integers(0, spec.mr + 1))
            pad = int(rng.choice([0, 4, 20, 128]))
            stride = 4 * k + pad
            x = _qsi8d32p_rows(rng, ms + m, k, bl)
            exp, mask = model_qsi8d32p(x, m, bl, spec.mr, spec.L, ms, spec.rounding)
            src = _rows_bytes(x, stride)
            args = dict(m=m, k=k, bl=bl, mr=spec.mr, kr=spec.kr, sr=spec.sr, m_idx_start=ms,
                        lhs_stride=stride)
            cases.append(_case(spec, args, src, len(exp)))
            refs.append((exp, mask, f"m={m} k={k} bl={bl} ms={ms} stride={stride}", x))
    return cases, refs


@pytest.mark.parametrize("cpu", CPUS)
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_random_sweep(spec, cpu, pack_lib):
    rng = np.random.default_rng(sum(map(ord, spec.name + cpu)))
    cases, refs = _sweep_cases(spec, rng)
    outs = guest(cpu).call("guest_pack:run_cases", pack_lib, cases)
    for c, (exp, mask, what, x), o in zip(cases, refs, outs):
        _check(o, exp, mask, f"{spec.name} {what}")


def test_sweep_against_q4_reference():
    """Cross-check the local model with tilegen.layout.lhs_int8's packers."""
    from tilegen.layout import lhs_int8 as q4
    rng = np.random.default_rng(5)
    checked = 0
    for spec in SPECS:
        cases, refs = _sweep_cases(spec, rng)
        for c, (exp, mask, what, x) in zip(cases[:8], refs[:8]):
            a = c["args"]
            if spec.fmt == "qai8dxp":
                if a["lhs_stride"] % 4:
                    continue
                got = q4.QAI8DXP(spec.mr, spec.kr, spec.sr).pack(x, m_idx_start=a["m_idx_start"])
            else:
                rows = x[a["m_idx_start"]:a["m_idx_start"] + a["m"]]
                got = q4.QSI8D32P(spec.mr, spec.kr, spec.sr, a["bl"], spec.rounding).pack(
                    rows, m_idx_start=a["m_idx_start"])
            got = np.asarray(got).view(np.uint8).ravel()
            if got.size == exp.size:          # the region from the lhs_packed pointer
                g = got
            else:                             # or the whole buffer from row block 0
                off = spec.packed_offset(a["m_idx_start"], a["k"], a.get("bl"))
                assert got.size >= off + exp.size, (spec.name, what, got.size, exp.size)
                g = got[off:off + exp.size]
            assert np.array_equal(g[mask == 1], exp[mask == 1]), (spec.name, what)
            checked += 1
    assert checked >= 6 * len(SPECS), checked


@pytest.mark.parametrize("cpu", ["cortex-a53"])
def test_nothing_written_on_bad_arguments(cpu, pack_lib):
    rng = np.random.default_rng(3)
    x = _qai8dxp_rows(rng, 5, 40)
    s = PackerSpec("qai8dxp", 4, 8, 2)
    q = PackerSpec("qsi8d32p", 4, 16, 2)
    src = _rows_bytes(x, 160)
    base = dict(m=5, k=40, mr=4, kr=8, sr=2, m_idx_start=0, lhs_stride=160)
    xq = _qsi8d32p_rows(rng, 5, 64, 32)
    srcq = _rows_bytes(xq, 256)
    baseq = dict(m=5, k=64, bl=32, mr=4, kr=16, sr=2, m_idx_start=0, lhs_stride=256)
    bad = [(s, {**base, "m": 0}, src), (s, {**base, "k": 0}, src), (s, {**base, "mr": 8}, src),
           (s, {**base, "kr": 16}, src), (s, {**base, "sr": 0, "kr": 0}, src),
           (q, {**baseq, "m": 0}, srcq), (q, {**baseq, "bl": 48}, srcq),
           (q, {**baseq, "bl": 0}, srcq), (q, {**baseq, "k": 96, "bl": 64}, srcq),
           (q, {**baseq, "mr": 1}, srcq), (q, {**baseq, "kr": 8, "sr": 2}, srcq)]
    cases = [_case(sp, a, b, 512) for sp, a, b in bad]
    # an equivalent (kr, sr) with the same L is accepted and gives the same bytes
    cases.append(_case(s, {**base, "kr": 4, "sr": 1}, src, s.packed_size(5, 40)))
    outs = guest(cpu).call("guest_pack:run_cases", pack_lib, cases)
    for (sp, a, _), o in zip(bad, outs):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), (sp.name, a)
    exp, mask = model_qai8dxp(x, 4, 4)
    _check(outs[-1], exp, mask, "kr=4 sr=1")


def test_scale_tail_packer(tmp_path):
    """The qsi8d32p scale-tail packer (the q4_0_s1s0 gemv's LHS; the qsi8d32p template's ST
    mode, mr = 1): byte-identical to QSI8D32PScaleTail.pack at bl 32 and 64, any m_idx_start,
    padded row strides, blocks with ties and zeros, the rows of tiny_rows; nothing written on
    bad arguments."""
    from tilegen.layout.lhs_int8 import QSI8D32PScaleTail
    spec = PackerSpec("qsi8d32pscaletail", 1, 4, 1)
    assert spec.name == "lhs_quant_pack_qsi8d32p1x4scaletail_f32_neon" and spec.takes_bl
    tc = discover("elf")
    src, obj, so = tmp_path / "st.S", tmp_path / "st.o", tmp_path / "libst.so"
    src.write_text(render(spec, "elf"))
    subprocess.run(tc.assemble_cmd(src, obj), check=True, capture_output=True)
    subprocess.run(tc.link_cmd([obj], so), check=True, capture_output=True)
    rng = np.random.default_rng(1404)
    cases, refs = [], []
    for i, (bl, nb) in enumerate([(32, 1), (32, 3), (64, 2), (32, 4), (64, 1), (32, 2)]):
        k, ms, m = bl * nb, i % 4, 1 + i % 3
        x = _qsi8d32p_rows(rng, ms + m, k, bl)
        stride = 4 * k + [0, 4, 12, 64][i % 4]
        exp = QSI8D32PScaleTail(1, 4, 1, bl).pack(x[ms:ms + m], m_idx_start=ms)
        args = dict(m=m, k=k, bl=bl, mr=1, kr=4, sr=1, m_idx_start=ms, lhs_stride=stride)
        cases.append(_case(spec, args, _rows_bytes(x, stride), exp.size))
        refs.append((exp, f"bl={bl} k={k} m={m} ms={ms} stride={stride}"))
    x = tiny_rows(rng, 96)                   # the small edges (issue #30 item 2), m_idx_start 2
    xs = np.concatenate([np.zeros((2, 96), F), x])
    exp = QSI8D32PScaleTail(1, 4, 1, 32).pack(x, m_idx_start=2)
    args = dict(m=len(x), k=96, bl=32, mr=1, kr=4, sr=1, m_idx_start=2, lhs_stride=4 * 96)
    cases.append(_case(spec, args, _rows_bytes(xs, 4 * 96), exp.size))
    refs.append((exp, "tiny activations"))
    base = cases[1]["args"]
    bad = [{"mr": 2}, {"kr": 8}, {"sr": 2}, {"bl": 48}, {"bl": 0}, {"m": 0}, {"k": 48}]
    for b in bad:
        cases.append(_case(spec, {**base, **b}, cases[1]["src"], 256))
    outs = guest("cortex-a53").call("guest_pack:run_cases", str(so), cases)
    for (exp, what), o in zip(refs, outs):
        _check(o, exp, np.ones_like(exp), f"scale tail {what}")
    for b, o in zip(bad, outs[len(refs):]):
        for fill, got in zip(PREFILLS, o):
            assert (got == fill).all(), b


# --------------------------------------------------------------------------------------------
# rendering, validation, object formats, instruction counts

def test_spec_validation():
    with pytest.raises(SpecError, match="unknown LHS packer format"):
        PackerSpec("qai4", 4, 8, 2)
    with pytest.raises(SpecError, match="multiple of sr"):
        PackerSpec("qai8dxp", 4, 7, 2)
    with pytest.raises(SpecError, match="divide 32"):
        PackerSpec("qai8dxp", 4, 12, 2)
    with pytest.raises(SpecError, match="multiple of 4 dividing 32"):
        PackerSpec("qsi8d32p", 4, 4, 2)
    with pytest.raises(SpecError, match="must divide bl=32"):
        PackerSpec("qsi8d32p", 4, 12, 1)
    with pytest.raises(SpecError, match="mr must be >= 1"):
        PackerSpec("qai8dxp", 0, 8, 2)
    with pytest.raises(SpecError, match=f"mr must be <= {MR_MAX}"):
        PackerSpec("qai8dxp", MR_MAX + 1, 8, 2)
    with pytest.raises(SpecError, match="must be an int"):
        PackerSpec("qai8dxp", 4.0, 8, 2)
    with pytest.raises(SpecError, match="rounding must be 'away'"):
        PackerSpec("qai8dxp", 4, 8, 2, rounding="even")
    with pytest.raises(SpecError, match="rounding must be one of"):
        PackerSpec("qsi8d32p", 4, 8, 2, rounding="down")
    assert PackerSpec("qai8dxp", MR_MAX, 8, 1).name == f"lhs_quant_pack_qai8dxp{MR_MAX}x8_f32_neon"


def test_names_and_signatures():
    assert PackerSpec("qai8dxp", 4, 16, 2).name == "lhs_quant_pack_qai8dxp4x8_f32_neon"
    assert PackerSpec("qsi8d32p", 4, 16, 2).name == "lhs_quant_pack_qsi8d32p4x8_f32_neon"
    assert PackerSpec("qsi8d32p", 4, 16, 2, "even").name == "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
    assert PackerSpec("qai8dxp", 1, 8, 2).name == "lhs_quant_pack_qai8dxp1x4_f32_neon"
    s = PackerSpec("qai8dxp", 4, 8, 2).signature
    assert [n for n, _ in s] == ["m", "k", "mr", "kr", "sr", "m_idx_start", "lhs", "lhs_stride",
                                 "lhs_packed"]
    assert dict(s)["lhs"] == "const void*" and dict(s)["lhs_packed"] == "void*"
    q = PackerSpec("qsi8d32p", 4, 8, 2).signature
    assert [n for n, _ in q][:3] == ["m", "k", "bl"] and len(q) == 10
    assert {t for _, t in s + q} == {"size_t", "const void*", "void*"}
    assert PackerSpec("qai8dxp", 4, 8, 2).packed_size(5, 40) == 2 * 4 * (64 + 8)
    assert PackerSpec("qsi8d32p", 4, 8, 2).packed_offset(5, 64, 32) == 4 * 2 * 34


_REG = re.compile(r"\b([xwvqdsbh])(\d+)\b")


def _instructions(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        s = line.split("//")[0].strip()
        if not s or s.endswith(":") or s.startswith("."):
            continue
        out.append(s)
    return out


def hot_loop(text: str) -> list[str]:
    return _instructions(text.split("tilegen:hot-loop-begin")[1].split("tilegen:hot-loop-end")[0]
                         .split("\n", 1)[1])


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_render_both_formats(spec, tmp_path):
    for fmt, target in (("elf", "--target=aarch64-linux-gnu"),
                        ("macho", "--target=arm64-apple-macos")):
        text = render(spec, fmt)
        assert text.count("tilegen:hot-loop-begin") == 1 and text.count("tilegen:hot-loop-end") == 1
        sym = spec.symbol(fmt)
        assert f".globl {sym}\n" in text and (sym.startswith("_") == (fmt == "macho"))
        src = tmp_path / f"{spec.name}.{fmt}.S"
        src.write_text(text)
        p = subprocess.run(["clang-19", target, "-c", str(src), "-o", str(src) + ".o"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        body = text.split(f"{sym}:\n", 1)[1]
        for kind, num in _REG.findall(body):
            n = int(num)
            assert not (kind in "xw" and 18 <= n <= 30), f"{kind}{n} used"
            assert not (kind in "vqdsbh" and 8 <= n <= 15), f"{kind}{n} used (callee-saved)"
    # one template serves every shape: the loop differs only in its stores
    loop = hot_loop(render(spec))
    assert sum(i.startswith("fmul") for i in loop) == ELEMS_PER_ITER // 4
    cvt = "fcvtns" if spec.rounding == "even" else "fcvtas"
    assert sum(i.startswith(cvt) for i in loop) == ELEMS_PER_ITER // 4


def hot_loop_stats(spec: PackerSpec) -> tuple[int, float]:
    n = len(hot_loop(render(spec)))
    return n, n / ELEMS_PER_ITER


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_hot_loop_instruction_budget(spec):
    n, per = hot_loop_stats(spec)
    if spec.mr == 1 or spec.L == 32:
        stores = 1                                   # 32 contiguous bytes / one 32-byte chunk
    else:
        stores = ELEMS_PER_ITER // min(spec.L, 16)   # one st1 per L-byte chunk (16-byte max)
    fixed = 2 + 8 + 8 + 4 + 2 + (4 + 2 if spec.fmt == "qai8dxp" else 0) + 2
    assert n == fixed + stores, (spec.name, n)
    if spec.L >= 4:
        assert per <= (1.25 if spec.fmt == "qai8dxp" else 1.0625), (spec.name, per)


def _quad_block(text: str) -> list[str]:
    return _instructions(text.split("tilegen:quad-block-begin")[1]
                         .split("tilegen:quad-block-end")[0].split("\n", 1)[1])


@pytest.mark.parametrize("spec", [s for s in SPECS if s.fmt == "qsi8d32p"], ids=lambda s: s.name)
def test_qsi8d32p_four_row_path(spec):
    """mr a multiple of 4: rows 4i..4i+3 of a block together, their 4 scales one vector fdiv
    (and one for the reciprocals), only full-vector stores; other mr: the one-row path only."""
    text = render(spec)
    if spec.mr % 4:
        assert "tilegen:quad-block-begin" not in text and ".Lquad:" not in text
        return
    body = _quad_block(text)
    assert [i.split()[0] for i in body if i.startswith("fdiv")] == ["fdiv", "fdiv"]
    assert all(".4s" in i for i in body if i.startswith("fdiv"))
    cvt = "fcvtns" if spec.rounding == "even" else "fcvtas"
    assert sum(i.startswith(cvt) for i in body) == 4 * ELEMS_PER_ITER // 4
    assert sum(i.startswith("fmul") for i in body) == 4 * ELEMS_PER_ITER // 4
    stores = [i for i in body if i.startswith(("st", "str"))]
    assert stores and all(i.startswith(("stp q", "st1 {v")) and "[" in i or i.startswith("str d")
                          for i in stores), stores
    assert not any(re.match(r"st1 \{v\d+\.[sd]\}\[", i) for i in stores)   # no lane stores
    assert sum(i.startswith("str d") for i in stores) == 1                  # 4 f16 scales
