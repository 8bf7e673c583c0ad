"""The generated C packers of the KleidiAI export (tilegen.export.packers_c).

Every generated ``.c`` is compiled with clang for aarch64 (-O2 -Wall -Wextra -Werror) into one
shared library, which the emulated aarch64 Python calls through ctypes (``-cpu max``; the SME
packers at SVL 128 and 512 bits, bf16 also 256).  Each packer must give, on the bytes it writes,
exactly the bytes of the tilegen layout object's numpy packer (seeded random inputs, edge
shapes: n, m, k off the block multiples, m_idx_start > 0, row strides above the row size), write
nothing before its buffer, nothing past it (guard pages) and leave unwritten only the slots of
missing rows; the golden vectors' packed arrays from KleidiAI's own packers are reproduced, and
the getters agree with the layout objects and with KleidiAI's getter values in the vectors.
The LHS quantisers are also called next to KleidiAI v1.24.0's own packers (its library,
``kleidiai_ref``) at the tiny-activation edges.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tilegen.build.toolchain import discover
from tilegen.export.files import ExportFile
from tilegen.export.packers_c import (ALL_PACKERS, KQUANT_PACKERS, PACK_DIR, PACKERS, PARAMS_HEADER,
                                     SME_PACKERS, packer_sources)
from tilegen.layout.base import LayoutError
from tilegen.layout.bf16 import BF16PLhs2, BF16PRhs2B
from tilegen.layout.f16 import F16PLhs2
from tilegen.layout.f32 import F32PackedLHS, F32PackedRHS
from tilegen.layout.ggml import quantize_q4_0
from tilegen.layout.kquant import Q8KP, Q8KPI16
from tilegen.layout.lhs_int8 import QAI8DXP, QSI8D32P, QSI8D32PScaleTail
from tilegen.layout.rhs_int4 import QSI4C32PS1S0ScaleF16, QSI4C32PScaleF16
from tilegen.layout.rhs_int8 import QSI8CXP

from conftest import guest, vector_files
from guest_kai_pack import MARGIN, PREFILLS
from q8kp_edges import KINDS as EDGE_KINDS, check_q8kp, edge_rows, expected_q8kp

F = np.float32
SVLS = (16, 64)          # bytes: 128 and 512 bits


# --------------------------------------------------------------------------------------------
# build

def _build(root: Path, *flags: str, names=None) -> str:
    """The generated packers (``names``: only those) compiled with clang for aarch64 into one
    shared library under ``root``; ``flags`` go to every compile."""
    tc = discover("elf")
    assert tc.kind in ("clang", "custom-clang", "custom"), f"needs clang, found {tc.kind}"
    for f in packer_sources():
        p = root / f.path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f.text)
    objs = []
    for c in sorted((root / PACK_DIR).glob("*.c")):
        if names is not None and c.stem not in names:
            continue
        obj = c.with_suffix(".o")
        r = subprocess.run(tc.assemble_cmd(c, obj, "-ffreestanding", "-std=c11", "-O2", "-Wall",
                                           "-Wextra", "-Werror", "-fPIC", f"-I{root}", *flags),
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{c.name}:\n{r.stderr}"
        objs.append(obj)
    so = root / "libkai_packers.so"
    subprocess.run(tc.link_cmd(objs, so), check=True, capture_output=True)
    return str(so)


@pytest.fixture(scope="session")
def lib(tmp_path_factory) -> str:
    return _build(tmp_path_factory.mktemp("kai_export"))


#: the LHS quantisers with a NEON path (the MoE path's packers), and their scalar loops
NEON_QUANTISERS = ("kai_lhs_quant_pack_qai8dxp_f32", "kai_lhs_quant_pack_qsi8d32p_f32",
                   "kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon", "kai_lhs_quant_pack_q8kp_f32",
                   "kai_lhs_quant_pack_q8ki16p_f32")


@pytest.fixture(scope="session")
def lib_scalar(tmp_path_factory) -> str:
    """NEON_QUANTISERS built without their NEON paths (-U__ARM_NEON): the scalar loops."""
    return _build(tmp_path_factory.mktemp("kai_scalar"), "-U__ARM_NEON", names=NEON_QUANTISERS)


def _declared() -> dict[str, list[str]]:
    """Function names declared by each generated header."""
    out = {}
    for f in packer_sources():
        if f.path.endswith(".h") and f.path != PARAMS_HEADER:
            out[Path(f.path).stem] = re.findall(r"\b(kai_\w+)\(", f.text)
    return out


def test_tree_files():
    files = packer_sources()
    assert all(isinstance(f, ExportFile) for f in files)
    paths = [f.path for f in files]
    assert len(paths) == len(set(paths)) == 2 * len(ALL_PACKERS) + 1
    for name in ALL_PACKERS:
        assert f"{PACK_DIR}/{name}.h" in paths and f"{PACK_DIR}/{name}.c" in paths
    assert packer_sources() == files                       # deterministic


def test_headers_declare_what_llama_cpp_calls(llama_kai):
    used = set(re.findall(r"\bkai_\w+", (llama_kai / "kernels.cpp").read_text()))
    declared = {n for names in _declared().values() for n in names}
    packer_fns = {u for u in used if any(u.endswith(p[4:]) for p in PACKERS)} - set(PACKERS)
    assert len(packer_fns) >= 40
    assert packer_fns <= declared, sorted(packer_fns - declared)
    assert {p for p in PACKERS} <= {u for u in used}


def test_headers_compile_as_cpp(tmp_path):
    """llama.cpp includes the headers from C++ (kernels.cpp): all together, with the structs."""
    tc = discover("elf")
    assert tc.kind in ("clang", "custom-clang", "custom"), f"needs clang, found {tc.kind}"
    for f in packer_sources():
        p = tmp_path / f.path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f.text)
    tu = tmp_path / "all.cpp"
    tu.write_text("".join(f'#include "{PACK_DIR}/{n}.h"\n' for n in PACKERS)
                  + "int f(void) { kai_rhs_pack_qs4cxs1s0_param a{1, 8}; "
                  "kai_rhs_pack_qsi8cx_params b{1, 1.0f}; return a.lhs_zero_point + b.lhs_zero_point; }\n")
    cxx = [tc.driver[0].replace("clang", "clang++", 1), *tc.driver[1:]]
    r = subprocess.run([*cxx, *tc.target_flags, "-ffreestanding", "-std=c++17", "-Wall", "-Wextra",
                        "-Werror", "-fsyntax-only", f"-I{tmp_path}", str(tu)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_library_exports_every_declared_function(lib):
    names = [n for ns in _declared().values() for n in ns]
    assert guest("max").call("guest_kai_pack:missing", lib, names) == []


# --------------------------------------------------------------------------------------------
# helpers

def _rows_bytes(x: np.ndarray, stride: int) -> np.ndarray:
    """f32 rows ``stride`` bytes apart (garbage between rows), up to the last row's end."""
    n, k = x.shape
    size = (n - 1) * stride + 4 * k
    buf = np.full(size, 0x7F, np.uint8)
    for i in range(n):
        buf[i * stride:i * stride + 4 * k] = x[i].astype("<f4").view(np.uint8)
    return buf


def _split(outs, label):
    for fill, o in zip(PREFILLS, outs):
        assert (o[:MARGIN] == fill).all(), f"{label}: wrote before the buffer"
    a, b = outs[0][MARGIN:], outs[1][MARGIN:]
    return a, a == b


def _check(outs, expected, label, unwritten: int = 0, mask=None):
    """The written bytes equal ``expected``; ``unwritten`` bytes (zero in ``expected``) or
    exactly those outside ``mask`` are left alone."""
    got, written = _split(outs, label)
    expected = np.asarray(expected, np.uint8).reshape(-1)
    assert got.size == expected.size, label
    bad = np.flatnonzero(written & (got != expected))
    assert bad.size == 0, (f"{label}: {bad.size} bytes differ, first at {bad[:8].tolist()}: "
                           f"got {got[bad[:8]].tolist()} want {expected[bad[:8]].tolist()}")
    if mask is not None:
        assert np.array_equal(written, np.asarray(mask).astype(bool)), f"{label}: written bytes"
    else:
        assert int((~written).sum()) == unwritten, f"{label}: {(~written).sum()} bytes unwritten"
        assert not expected[~written].any(), label


def U(v):
    return ("u", int(v))


def IN(a):
    return ("in", np.ascontiguousarray(a).view(np.uint8).reshape(-1))


NULL = ("null",)


def OUT(n):
    return ("out", int(n))


def _lhs_rows(rng, m, k):
    x = (rng.normal(size=(m, k)) * 3).astype(F)
    for i in range(m):
        kind = int(rng.integers(0, 9))
        if kind == 0:
            x[i] = 0
        elif kind == 1:
            x[i] = np.abs(x[i]) + F(0.1)
        elif kind == 2:
            x[i] = -np.abs(x[i]) - F(0.1)
        elif kind == 3:                      # ties on a 0.25 grid (scale 2)
            x[i] = rng.integers(-255, 256, size=k) * F(0.25)
            x[i, 0] = -63.75
        elif kind == 4:
            x[i] *= F(10.0) ** rng.integers(-4, 5)
        elif kind == 5 and k >= 32:          # integer values with amax 254: exact .5 ties
            x[i] = rng.integers(-254, 255, size=k)
            x[i, ::32] = 254
    return x


def _specials(x, vals):
    flat = x.reshape(-1)
    n = min(flat.size, len(vals))
    flat[:n] = vals[:n]


def _run(lib, calls, cpu="max", svl=None):
    g = guest(cpu) if svl is None else guest(cpu, None, svl * 8)
    return g.call("guest_kai_pack:run", lib, calls)


def _batch(lib, cases, svl=None):
    """cases: (call, check kwargs, label); runs all calls in one guest round trip."""
    outs = _run(lib, [c for c, _, _ in cases], svl=svl)
    for (call, kw, label), o in zip(cases, outs):
        if call[2]:
            assert o == kw["value"], f"{label}: got {o}, want {kw['value']}"
        else:
            _check(o, label=label, **kw)


def _getter(name, args, value, label):
    return ((name, [U(a) for a in args], True), dict(value=value), label)


# --------------------------------------------------------------------------------------------
# LHS quantisers: qai8dxp, qsi8d32p (generic, 4x8sb), qsi8d32p_f32_neon (scales last)

QAI8DXP_TILES = [(1, 8, 2), (4, 8, 2), (4, 16, 2), (1, 4, 1), (4, 4, 1), (4, 8, 1), (8, 4, 1)]


def test_qai8dxp(lib):
    rng = np.random.default_rng(1401)
    name = "kai_run_lhs_quant_pack_qai8dxp_f32"
    cases = []
    for mr, kr, sr in QAI8DXP_TILES:
        lay = QAI8DXP(mr, kr, sr)
        for k in (1, 3, 32, 33, 64, 100):
            m, ms = int(rng.integers(1, 11)), int(rng.integers(0, mr + 2))
            stride = 4 * k + int(rng.choice([0, 4, 12]))
            x = _lhs_rows(rng, m, k)
            exp = lay.pack(x, m_idx_start=ms)
            size = lay.region_size(m, k, ms)
            missing = size // lay.row_block_stride(k) * mr - m
            call = (name, [U(m), U(k), U(mr), U(kr), U(sr), U(ms), IN(_rows_bytes(x, stride)),
                           U(stride), OUT(size)], False)
            cases.append((call, dict(expected=exp, unwritten=missing * lay.row_block_stride(k) // mr),
                          f"qai8dxp {mr}x{kr}/{sr} m={m} k={k} ms={ms} stride={stride}"))
            n4 = name[8:]
            cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, mr, kr, sr),
                                 lay.packed_size(m, k), "size"))
            cases.append(_getter(f"kai_get_lhs_packed_offset_{n4}", (ms, k, mr, kr, sr),
                                 lay.packed_offset(ms, k), "offset"))
        cases.append(_getter(f"kai_get_m_step_{name[8:]}", (mr,), mr, "m_step"))
    cases.append(_getter(f"kai_get_lhs_offset_{name[8:]}", (3, 400), 1200, "lhs_offset"))
    _batch(lib, cases)


def _qsi8d32p_name(rounding):
    return ("kai_run_lhs_quant_pack_qsi8d32p_f32" if rounding == "away"
            else "kai_run_lhs_quant_pack_qsi8d32p4x8sb_f32_neon")


@pytest.mark.parametrize("rounding", ["away", "even"])
def test_qsi8d32p(lib, rounding):
    rng = np.random.default_rng(1402 + (rounding == "even"))
    name = _qsi8d32p_name(rounding)
    cases = []
    for mr, kr, sr in [(1, 8, 2), (1, 16, 2), (4, 8, 2), (4, 16, 2)]:
        for bl in (32, 64):
            lay = QSI8D32P(mr, kr, sr, bl, rounding)
            for nb in (1, 3):
                k = bl * nb
                m, ms = int(rng.integers(1, 10)), int(rng.integers(0, mr + 2))
                stride = 4 * k + int(rng.choice([0, 4, 20]))
                x = _lhs_rows(rng, ms + m, k)        # whole matrix: the packer reads from row ms
                exp = lay.pack(x[ms:], m_idx_start=ms)
                size = lay.region_size(m, k, ms)
                S = lay.row_block_stride(k)
                call = (name, [U(m), U(k), U(bl), U(mr), U(kr), U(sr), U(ms),
                               IN(_rows_bytes(x, stride)), U(stride), OUT(size)], False)
                cases.append((call, dict(expected=exp, unwritten=(size // S * mr - m) * S // mr),
                              f"{name} {mr}x{kr}/{sr} bl={bl} m={m} k={k} ms={ms}"))
                n4 = name[8:]
                cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, bl, mr, kr, sr),
                                     lay.packed_size(m, k), "size"))
                cases.append(_getter(f"kai_get_lhs_packed_offset_{n4}", (ms, k, bl, mr, kr, sr),
                                     lay.packed_offset(ms, k), "offset"))
    _batch(lib, cases)


def test_lhs_golden_vectors(lib):
    """KleidiAI's qai8dxp and qsi8d32p (generic and 4x8sb) vectors, as the NEON packer tests
    collect them (same C API)."""
    from test_lhs_pack_neon import GOLDEN
    assert len(GOLDEN) >= 13, f"{len(GOLDEN)} LHS golden vectors"
    cases = []
    for spec, a, src, exp, mask, label in GOLDEN:
        if spec.fmt == "qai8dxp":
            call = ("kai_run_lhs_quant_pack_qai8dxp_f32",
                    [U(a["m"]), U(a["k"]), U(a["mr"]), U(a["kr"]), U(a["sr"]), U(a["m_idx_start"]),
                     IN(src), U(a["lhs_stride"]), OUT(len(exp))], False)
        else:
            call = (_qsi8d32p_name(spec.rounding),
                    [U(a["m"]), U(a["k"]), U(a["bl"]), U(a["mr"]), U(a["kr"]), U(a["sr"]),
                     U(a["m_idx_start"]), IN(src), U(a["lhs_stride"]), OUT(len(exp))], False)
        cases.append((call, dict(expected=exp, mask=mask), f"{call[0]} {label}"))
    # the Q8 vectors: every kernel's LHS, and m_idx_start = 2
    for f in vector_files("q8_qai8dxp_qsi8cxp_*.npz"):
        z = np.load(f)
        x = z["lhs_f32"]
        m, k = x.shape
        for key in [s[:-len("__lhs_packed")] for s in z.files if s.endswith("__lhs_packed")]:
            if key.startswith("mstart2"):
                mr, kr, sr, ms = 4, 8, 1, int(z[f"{key}__m_idx_start"])
                exp, mask = z[f"{key}__lhs_packed"], z[f"{key}__lhs_packed_written"]
                off = QAI8DXP(mr, kr, sr).packed_offset(ms, k)
                exp, mask = exp[off:], mask[off:]
            else:
                _, _, mr, _, kr, sr = (int(v) for v in z[f"{key}__params"])
                ms, exp, mask = 0, z[f"{key}__lhs_packed"], z[f"{key}__lhs_packed_written"]
                cases.append(_getter("kai_get_lhs_packed_size_lhs_quant_pack_qai8dxp_f32",
                                     (m, k, mr, kr, sr), int(z[f"{key}__lhs_packed_size"]), key))
                cases.append(_getter("kai_get_lhs_packed_offset_lhs_quant_pack_qai8dxp_f32",
                                     (mr, k, mr, kr, sr),
                                     int(z[f"{key}__lhs_packed_offset_at_m_idx_mr"]), key))
            call = ("kai_run_lhs_quant_pack_qai8dxp_f32",
                    [U(m), U(k), U(mr), U(kr), U(sr), U(ms), IN(_rows_bytes(x, 4 * k)), U(4 * k),
                     OUT(len(exp))], False)
            cases.append((call, dict(expected=exp, mask=mask), f"{Path(f).name} {key}"))
    assert len(cases) >= 40
    _batch(lib, cases)


def test_qsi8d32p_f32_neon(lib):
    rng = np.random.default_rng(1404)
    name = "kai_run_lhs_quant_pack_qsi8d32p_f32_neon"
    n4 = name[8:]
    cases = []
    for mr in (1, 2, 4):
        for bl in (32, 64):
            lay = QSI8D32PScaleTail(mr, 4, 1, bl)
            for nb in (1, 2, 4):
                k = bl * nb
                m, ms = int(rng.integers(1, 8)), int(rng.integers(0, mr + 2))
                stride = 4 * k + int(rng.choice([0, 8]))
                x = _lhs_rows(rng, m, k)
                exp = lay.pack(x, m_idx_start=ms)
                size, S = lay.region_size(m, k, ms), lay.row_block_stride(k)
                call = (name, [U(m), U(k), U(bl), U(mr), U(4), U(2), U(ms),
                               IN(_rows_bytes(x, stride)), U(stride), OUT(size)], False)
                cases.append((call, dict(expected=exp, unwritten=(size // S * mr - m) * S // mr),
                              f"{name} mr={mr} bl={bl} m={m} k={k} ms={ms}"))
                cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, bl, mr, 4, 2),
                                     lay.packed_size(m, k), "size"))
    cases.append(_getter(f"kai_get_m_step_{n4}", (4,), 1, "m_step"))
    _batch(lib, cases)


def test_lhs_quantisers_at_tiny_activations(lib, kleidiai_ref):
    """Issue #30 item 2: the four LHS quantisers (qai8dxp, qsi8d32p generic and 4x8sb, the
    scale-tail _neon) at the small edges of test_lhs_pack_neon.TINY_KINDS (1e-38, subnormals,
    a few ulps, +-0, either side of 127/FLT_MAX and 255/FLT_MAX, a normal control): the export's
    C packer, KleidiAI v1.24.0's own packer (its library, called by name) and the numpy layout
    packer write the same bytes.  (There KleidiAI's stored reciprocal scale is 0 -- qai8dxp's
    1/inf, qsi8d32p's f16(d) -- so the int8 bytes are whatever its conversions give, and these
    are matched too: docs/layouts.md#qai8dxp-tiny, #qsi8d32p-tiny.)"""
    from test_lhs_pack_neon import tiny_rows
    rng = np.random.default_rng(3040)
    k = 96
    x = tiny_rows(rng, k)
    m = x.shape[0]
    calls, exps = [], []

    def add(name, args, exp, what):
        calls.append((name, [("u", a) if isinstance(a, int) else a for a in args], exp.size, 0))
        exps.append((np.asarray(exp, np.uint8).reshape(-1), what))

    for mr, kr, sr in QAI8DXP_TILES:
        for kk in (k, 67):
            xr = np.ascontiguousarray(x[:, :kk])
            add("kai_run_lhs_quant_pack_qai8dxp_f32", [m, kk, mr, kr, sr, 0, ("in", xr), 4 * kk,
                                                        ("out",)],
                QAI8DXP(mr, kr, sr).pack(xr), f"qai8dxp {mr}x{kr}/{sr} k={kk}")
    for rounding, tiles in (("away", [(1, 8, 2), (1, 16, 2), (4, 8, 2), (4, 16, 2)]),
                            ("even", [(4, 16, 2)])):
        for mr, kr, sr in tiles:
            add(_qsi8d32p_name(rounding), [m, k, 32, mr, kr, sr, 0, ("in", x), 4 * k, ("out",)],
                QSI8D32P(mr, kr, sr, 32, rounding).pack(x), f"qsi8d32p {rounding} {mr}x{kr}/{sr}")
    add("kai_run_lhs_quant_pack_qsi8d32p_f32_neon", [m, k, 32, 1, 4, 1, 0, ("in", x), 4 * k,
                                                       ("out",)],
        QSI8D32PScaleTail(1).pack(x), "qsi8d32p scale tail")
    res = guest("max").call("guest_kaidiff:packers", [str(kleidiai_ref.shared), lib], calls)
    for (exp, what), (kai, ours) in zip(exps, res):
        written = kai[0] == kai[1]                 # the slots of the missing rows stay unwritten
        assert np.array_equal(ours[0] == ours[1], written), f"{what}: written bytes"
        assert not exp[~written].any() and written.sum() > exp.size // 2, what
        assert np.array_equal(ours[0][written], exp[written]), f"{what}: the C packer != numpy"
        bad = np.flatnonzero(kai[0][written] != exp[written])
        assert bad.size == 0, f"{what}: KleidiAI differs at {bad[:8].tolist()}"


def test_qsi8d32p_scale_tail_quantisation_is_qsi8d32p():
    """Same values and scales as the generic packer, other byte order (mr = 1, one block:
    the scale moves from the front to the back)."""
    x = _lhs_rows(np.random.default_rng(5), 1, 32)
    a = QSI8D32P(1, 4, 1, 32).pack(x)
    b = QSI8D32PScaleTail(1).pack(x)
    assert np.array_equal(a[2:], b[:32]) and np.array_equal(a[:2], b[32:])


# --------------------------------------------------------------------------------------------
# LHS f16p<mr>x2

def test_f16pmrx2(lib):
    rng = np.random.default_rng(1405)
    name = "kai_run_lhs_pack_f16pmrx2_f32_neon"
    n4 = name[8:]
    cases = []
    for mr in (1, 4, 8, 16):
        lay = F16PLhs2(mr)
        for k in (1, 7, 32, 64, 96):
            m, ms = int(rng.integers(1, 20)), int(rng.integers(0, mr + 2))
            stride = 4 * k + int(rng.choice([0, 3, 4, 16]))      # 3: rows at odd addresses
            x = (rng.normal(size=(m, k)) * F(10.0) ** rng.integers(-3, 4, size=(m, 1))).astype(F)
            x[0, :1] = 70000.0                      # f16 overflow -> inf
            size, S = lay.region_size(m, k, ms), lay.row_block_stride(k)
            call = (name, [U(m), U(k), U(32), U(mr), U(4), U(2), U(ms), IN(_rows_bytes(x, stride)),
                           U(stride), OUT(size)], False)
            cases.append((call, dict(expected=lay.pack(x, m_idx_start=ms),
                                     unwritten=(size // S * mr - m) * S // mr),
                          f"f16pmrx2 mr={mr} m={m} k={k} ms={ms}"))
            cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, 32, mr, 4, 2),
                                 lay.packed_size(m, k), "size"))
            cases.append(_getter(f"kai_get_lhs_packed_offset_{n4}", (mr, k, 32, mr, 4, 2),
                                 lay.packed_offset(mr, k), "offset"))
    _batch(lib, cases)


# --------------------------------------------------------------------------------------------
# SME LHS: bf16p2vlx2, f32p2vlx1

def _sme_lhs_cases(rng, cls, svl):
    name = ("kai_run_lhs_pack_bf16p2vlx2_f32_sme" if cls is BF16PLhs2
            else "kai_run_lhs_pack_f32p2vlx1_f32_sme")
    n4 = name[8:]
    mr = 2 * svl // 4
    lay = cls.for_vl(svl, 2) if cls is BF16PLhs2 else cls(mr)
    assert lay.mr == mr
    cases = [_getter(f"kai_get_m_step_{n4}", (mr,), mr, "m_step")]
    for m in (1, mr - 1, mr + 3, 2 * mr + 1):
        for k in (1, 3, 64):
            ms = int(rng.choice([0, mr]))
            stride = 4 * k + int(rng.choice([0, 5, 8]))
            x = (rng.normal(size=(m, k)) * 4).astype(F)
            if cls is BF16PLhs2:
                _specials(x, [np.nan, 1 + 2 ** -8, 1 + 3 * 2 ** -8])   # NaN, ties to even
            size = lay.packed_size(m, k)
            call = (name, [U(m), U(k), U(mr), U(lay.kr), U(1), U(ms), IN(_rows_bytes(x, stride)),
                           U(stride), OUT(size)], False)
            cases.append((call, dict(expected=lay.pack(x)), f"{name} svl={svl} m={m} k={k} ms={ms}"))
            cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, mr, lay.kr, 1),
                                 lay.packed_size(m, k), "size"))
            cases.append(_getter(f"kai_get_lhs_packed_offset_{n4}", (ms, k, mr, lay.kr, 1),
                                 lay.packed_offset(ms, k), "offset"))
    return cases


@pytest.mark.parametrize("svl", SVLS)
def test_sme_lhs(lib, svl):
    rng = np.random.default_rng(1406 + svl)
    _batch(lib, _sme_lhs_cases(rng, BF16PLhs2, svl) + _sme_lhs_cases(rng, F32PackedLHS, svl), svl)


# --------------------------------------------------------------------------------------------
# RHS int4: qsi4c32pscalef16, qsi4c32ps1s0scalef16

_Q4_PARAMS = np.array([1, 8], np.uint8)          # struct kai_rhs_pack_qs4cxs1s0_param {1, 8}


def _q4_call(name, n, k, nr, kr, bl, raw, size):
    return (name, [U(1), U(n), U(k), U(nr), U(kr), U(2), U(bl), IN(raw), NULL, OUT(size), U(0),
                   IN(_Q4_PARAMS)], False)


def test_qsi4c32pscalef16(lib):
    rng = np.random.default_rng(1407)
    name = "kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0"
    n4 = name[8:]
    cases = []
    for nr, kr in [(4, 8), (4, 16), (8, 8), (16, 4)]:
        for bl in (32, 64):
            lay = QSI4C32PScaleF16(nr, kr, 2, bl)
            for nb in (1, 3):
                n, k = int(rng.integers(1, 3 * nr)), bl * nb
                raw = quantize_q4_0((rng.normal(size=(n, k)) * 2).astype(F), bl=bl)
                size = lay.packed_size(n, k)
                cases.append((_q4_call(name, n, k, nr, kr, bl, raw, size),
                              dict(expected=lay.pack(raw)), f"scalef16 nr={nr} kr={kr} bl={bl} n={n} k={k}"))
                cases.append(_getter(f"kai_get_rhs_packed_size_{n4}", (n, k, nr, kr, bl), size, "size"))
                cases.append(_getter(f"kai_get_rhs_packed_stride_{n4}", (k, nr, kr, bl),
                                     lay.group_stride(k), "stride"))
                cases.append(_getter(f"kai_get_rhs_packed_offset_{n4}", (nr, k, nr, kr, bl),
                                     lay.packed_offset(nr, k), "offset"))
    # golden vectors from KleidiAI's packer
    golden = 0
    for f in vector_files("*.npz"):
        z = np.load(f)
        stem = f.stem
        if stem.startswith("rhs_qsi4c32pscalef16"):
            raw, exp = z["rhs_bytes"], z["packed"]
        elif "rhs_packed" in z.files and ("rhs_bytes" in z.files or "rhs_q4_0" in z.files) \
                and "qsi8d32p" in stem:
            raw = z["rhs_bytes"] if "rhs_bytes" in z.files else z["rhs_q4_0"]
            exp = z["rhs_packed"]
        else:
            continue
        I = lambda key: int(z[key])  # noqa: E731
        n, k, nr, kr, bl = I("n"), I("k"), I("nr"), I("kr"), I("bl")
        assert np.array_equal(QSI4C32PScaleF16(nr, kr, 2, bl).pack(raw), exp), stem
        cases.append((_q4_call(name, n, k, nr, kr, bl, raw, len(exp)), dict(expected=exp), stem))
        golden += 1
    assert golden >= 8, f"{golden} q4 RHS golden vectors, expected 8"
    assert sum(1 for c in cases if not c[0][2]) >= 20
    _batch(lib, cases)


def test_qsi4c32ps1s0scalef16(lib):
    rng = np.random.default_rng(1408)
    name = "kai_run_rhs_pack_nxk_qsi4c32ps1s0scalef16_qsu4c32s16s0_neon"
    n4 = name[8:]
    cases = []
    for nr in (4, 16, 64):
        for bl in (32, 64):
            lay = QSI4C32PS1S0ScaleF16(nr, 4, 2, bl)
            for nb in (1, 2, 4):
                n, k = int(rng.integers(1, 2 * nr + 3)), bl * nb
                raw = quantize_q4_0((rng.normal(size=(n, k)) * 2).astype(F), bl=bl)
                size = lay.packed_size(n, k)
                exp = lay.pack(raw)
                cases.append((_q4_call(name, n, k, nr, 4, bl, raw, size),
                              dict(expected=exp, mask=lay.written_mask(n, k)),
                              f"s1s0scalef16 nr={nr} bl={bl} n={n} k={k}"))
                cases.append(_getter(f"kai_get_rhs_packed_size_{n4}", (n, k, nr, 4, bl), size, "size"))
                cases.append(_getter(f"kai_get_rhs_packed_stride_{n4}", (k, nr, 4, bl),
                                     lay.group_stride(k), "stride"))
    _batch(lib, cases)


def test_qsi4c32ps1s0scalef16_layout_facts():
    """s1s0 order: the packed nibbles of slot 0 are the row's u4 values in k order, 2 per byte,
    4 per uint16 unit; the f16 scales are raw copies behind the data."""
    rng = np.random.default_rng(3)
    n, k, nr = 5, 64, 4
    u = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    from tilegen.layout.ggml import join_q4_0
    d = rng.integers(0, 2 ** 15, size=(n, 2)).astype(np.uint16)
    lay = QSI4C32PS1S0ScaleF16(nr)
    p = lay.pack(join_q4_0(u, d), n, k)
    G0 = p[:lay.group_stride(k)]
    for i in range(nr):
        for t in range(0, k, 2):
            byte = G0[lay.byte_offset(i, t)]
            assert int(byte) == int(u[i, t]) | int(u[i, t + 1]) << 4
        for b in range(2):
            o = lay.scale_offset(i, b, k)
            assert int(G0[o]) | int(G0[o + 1]) << 8 == d[i, b]
    assert lay.byte_offset(1, 0) == 2 and lay.byte_offset(0, 4) == 2 * nr


# --------------------------------------------------------------------------------------------
# RHS int8: qsi8cxp

def _qsi8cx_params(lzp, mult):
    """struct kai_rhs_pack_qsi8cx_params {int32_t lhs_zero_point; float scale_multiplier;}"""
    return np.concatenate([np.array([lzp], "<i4").view(np.uint8),
                           np.array([mult], "<f4").view(np.uint8)])


def _qsi8cxp_call(n, k, nr, kr, q, bias, scale, size, params):
    return ("kai_run_rhs_pack_nxk_qsi8cxp_qsi8cx_neon",
            [U(1), U(n), U(k), U(nr), U(kr), U(1), IN(q), NULL if bias is None else IN(bias),
             IN(scale), OUT(size), U(0), NULL if params is None else IN(_qsi8cx_params(*params))],
            False)


def test_qsi8cxp(lib):
    rng = np.random.default_rng(1409)
    n4 = "rhs_pack_nxk_qsi8cxp_qsi8cx_neon"
    cases = []
    for nr, kr in [(4, 4), (4, 8), (16, 4), (64, 4), (8, 16)]:
        lay = QSI8CXP(nr, kr)
        for k in (1, 31, 32, 70, 100):
            n = int(rng.integers(1, 2 * nr + 3))
            q = rng.integers(-127, 128, size=(n, k)).astype(np.int8)
            scale = (rng.uniform(0.5, 2, size=n) * 1e-2).astype(F)
            bias = None if rng.random() < 0.3 else rng.normal(size=n).astype(F)
            params = [(1, 1.0), (3, 0.5), (-300, 2.0), None][int(rng.integers(0, 4))]
            lzp, mult = params or (1, 1.0)
            exp = lay.pack(q, scale, bias, lhs_zero_point=lzp, scale_multiplier=mult)
            size = lay.packed_size(n, k)
            cases.append((_qsi8cxp_call(n, k, nr, kr, q, bias, scale, size, params),
                          dict(expected=exp), f"qsi8cxp nr={nr} kr={kr} n={n} k={k} {params}"))
            cases.append(_getter(f"kai_get_rhs_packed_size_{n4}", (n, k, nr, kr, 1), size, "size"))
            cases.append(_getter(f"kai_get_rhs_packed_stride_{n4}", (k, nr, kr, 1),
                                 lay.group_stride(k), "stride"))
    for f in vector_files("q8_qai8dxp_qsi8cxp_*.npz"):
        z = np.load(f)
        q, scale, bias = z["rhs_qs8"], z["rhs_scale"], z["bias"]
        n, k = q.shape
        params = (int(z["lhs_zero_point_param"]), float(z["scale_multiplier_param"]))
        for key in [s[:-len("__rhs_packed")] for s in z.files if s.endswith("__rhs_packed")]:
            _, _, _, nr, kr, sr = (int(v) for v in z[f"{key}__params"])
            exp = z[f"{key}__rhs_packed"]
            cases.append((_qsi8cxp_call(n, k, nr, kr, q, bias, scale, len(exp), params),
                          dict(expected=exp), f"{Path(f).name} {key}"))
            cases.append(_getter(f"kai_get_rhs_packed_size_{n4}", (n, k, nr, kr, sr),
                                 int(z[f"{key}__rhs_packed_size"]), key))
            cases.append(_getter(f"kai_get_rhs_packed_stride_{n4}", (k, nr, kr, sr),
                                 int(z[f"{key}__rhs_packed_stride"]), key))
            cases.append(_getter(f"kai_get_rhs_packed_offset_{n4}", (nr, k, nr, kr, sr),
                                 int(z[f"{key}__rhs_packed_offset_at_n_idx_nr"]), key))
    _batch(lib, cases)


# --------------------------------------------------------------------------------------------
# SME RHS: bf16p2vlx2b (k x n), f32p2vlx1biasf32 (n x k)

def _sme_rhs_run(name, n, k, stride, w_bytes, bias, size):
    return (name, [U(1), U(n), U(k), U(0), U(0), U(1), U(stride), IN(w_bytes),
                   NULL if bias is None else IN(bias), NULL, OUT(size), U(0), NULL], False)


def _sme_rhs_cases(rng, svl):
    cases = []
    nr = 2 * svl // 4
    b16 = "kai_run_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme"
    f32 = "kai_run_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"
    lb, lf = BF16PRhs2B.for_vl(svl, 2), F32PackedRHS(nr)
    assert lb.nr == nr
    cases.append(_getter(f"kai_get_n_step_{b16[8:]}", (), nr, "n_step"))
    cases.append(_getter(f"kai_get_n_step_{f32[8:]}", (), nr, "n_step"))
    for n in (1, nr - 1, nr + 5, 2 * nr + 3):
        for k in (1, 3, 64):
            bias = None if rng.random() < 0.3 else rng.normal(size=n).astype(F)
            w = (rng.normal(size=(n, k)) * 3).astype(F)
            _specials(w, [np.nan, 1 + 2 ** -8])
            pad = int(rng.choice([0, 3, 4, 12]))
            cases.append((_sme_rhs_run(b16, n, k, 4 * n + pad, _rows_bytes(np.ascontiguousarray(w.T), 4 * n + pad),
                                       bias, lb.packed_size(n, k)),
                          dict(expected=lb.pack(w, bias)), f"bf16p2vlx2b svl={svl} n={n} k={k}"))
            cases.append((_sme_rhs_run(f32, n, k, 4 * k + pad, _rows_bytes(w, 4 * k + pad), bias,
                                       lf.packed_size(n, k)),
                          dict(expected=lf.pack(w, bias)), f"f32p2vlx1biasf32 svl={svl} n={n} k={k}"))
            cases.append(_getter(f"kai_get_rhs_packed_size_{b16[8:]}", (n, k), lb.packed_size(n, k), "size"))
            cases.append(_getter(f"kai_get_rhs_packed_stride_{b16[8:]}", (k,), lb.group_stride(k), "stride"))
            cases.append(_getter(f"kai_get_rhs_packed_offset_{b16[8:]}", (nr, k), lb.packed_offset(nr, k), "off"))
            cases.append(_getter(f"kai_get_rhs_packed_size_{f32[8:]}", (n, k), lf.packed_size(n, k), "size"))
            # KleidiAI's stride getter of this packer is per column
            cases.append(_getter(f"kai_get_rhs_packed_stride_{f32[8:]}", (k,), lf.panel_stride(k) // nr,
                                 "stride"))
            cases.append(_getter(f"kai_get_rhs_packed_offset_{f32[8:]}", (nr, k), lf.packed_offset(nr, k),
                                 "off"))
    return cases


@pytest.mark.parametrize("svl", SVLS)
def test_sme_rhs(lib, svl):
    _batch(lib, _sme_rhs_cases(np.random.default_rng(1410 + svl), svl), svl)


def _bf16_sme_vectors():
    return vector_files("bf16_*.npz", keep=lambda f: "sme2_mopa__lhs_packed" in np.load(f).files)


def test_bf16_sme_golden_vectors(lib):
    """KleidiAI's kai_run_lhs_pack_bf16p2vlx2_f32_sme / kai_run_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme
    outputs and getter values, at each vector's SVL."""
    paths = _bf16_sme_vectors()
    assert len(paths) >= 4
    by_svl: dict[int, list] = {}
    for p in paths:
        z = np.load(p)
        svl = int(z["sme2_mopa__svl_bits"]) // 8
        x, w, bias = z["lhs_f32"], z["rhs_kxn_f32"], z["bias"]
        m, k = x.shape
        n = w.shape[1]
        mr, nr = int(z["sme2_mopa__mr"]), int(z["sme2_mopa__nr"])
        lp, lw = z["sme2_mopa__lhs_packed"], z["sme2_mopa__lhs_packed_written"]
        rp, rw = z["sme2_mopa__rhs_packed"], z["sme2_mopa__rhs_packed_written"]
        c = by_svl.setdefault(svl, [])
        c.append((("kai_run_lhs_pack_bf16p2vlx2_f32_sme",
                   [U(m), U(k), U(mr), U(2), U(1), U(0), IN(_rows_bytes(x, 4 * k)), U(4 * k),
                    OUT(len(lp))], False), dict(expected=np.where(lw, lp, 0), unwritten=int((~lw).sum())),
                  f"{p.stem} lhs"))
        c.append((_sme_rhs_run("kai_run_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", n, k, 4 * n,
                               _rows_bytes(w, 4 * n), bias, len(rp)),
                  dict(expected=np.where(rw, rp, 0), unwritten=int((~rw).sum())), f"{p.stem} rhs"))
        c.append(_getter("kai_get_lhs_packed_size_lhs_pack_bf16p2vlx2_f32_sme", (m, k, mr, 2, 1),
                         int(z["sme2_mopa__lhs_packed_size"]), p.stem))
        c.append(_getter("kai_get_lhs_packed_offset_lhs_pack_bf16p2vlx2_f32_sme", (mr, k, mr, 2, 1),
                         int(z["sme2_mopa__lhs_packed_offset_at_m_idx_mr"]), p.stem))
        c.append(_getter("kai_get_rhs_packed_size_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", (n, k),
                         int(z["sme2_mopa__rhs_packed_size"]), p.stem))
        c.append(_getter("kai_get_rhs_packed_stride_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", (k,),
                         int(z["sme2_mopa__rhs_packed_stride"]), p.stem))
        c.append(_getter("kai_get_rhs_packed_offset_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", (nr, k),
                         int(z["sme2_mopa__rhs_packed_offset_at_n_idx_nr"]), p.stem))
        c.append(_getter("kai_get_n_step_rhs_pack_kxn_bf16p2vlx2b_f32_x32_sme", (), nr, p.stem))
    assert set(by_svl) >= {16, 32, 64}
    for svl, cases in sorted(by_svl.items()):
        assert guest("max", None, svl * 8).call("guest_kai_pack:svl_bytes") == svl
        _batch(lib, cases, svl)


def test_sme_packers_listed():
    assert set(SME_PACKERS) == {p for p in PACKERS if p.endswith("_sme")} and len(SME_PACKERS) == 4


@pytest.mark.parametrize("bl", [32, 64])
def test_qsi4c32ps1s0scalef16_dequantizes_like_q4_0(bl):
    """Read back the way llama.cpp's dequantize_row_qsi4c32ps1s0scalef16 reads it, the packed
    weights are exactly the q4_0(-style) source's."""
    from tilegen.layout.ggml import dequantize_q4_0
    rng = np.random.default_rng(bl)
    n, k = 37, 4 * bl
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(F), bl=bl)
    lay = QSI4C32PS1S0ScaleF16(16, 4, 2, bl)
    got = lay.dequantize_rows(lay.pack(raw), n, k, np.arange(n))
    assert np.array_equal(got, dequantize_q4_0(raw, n, k, bl=bl))


def test_f32p2vlx1biasf32_golden_at_svl256(lib):
    """At SVL 256 bits the SME f32 RHS tile is 16 columns: f32p2vlx1biasf32 is then KleidiAI's
    f32p16x1b, and the n x k packer reproduces the rhs_f32p16x1b vectors (KleidiAI's NEON
    packers, whose n x k twin gives the same bytes)."""
    name = "kai_run_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme"
    cases = []
    for f in vector_files("rhs_f32p16x1b_*.npz"):
        z = np.load(f)
        w = np.ascontiguousarray(z["rhs_kxn"].T)
        n, k = w.shape
        bias = z["bias"] if int(z["has_bias"]) else None
        exp = z["packed"]
        assert np.array_equal(F32PackedRHS(16).pack(w, bias), exp)
        cases.append((_sme_rhs_run(name, n, k, 4 * k, _rows_bytes(w, 4 * k), bias, len(exp)),
                      dict(expected=exp), Path(f).stem))
        cases.append(_getter("kai_get_rhs_packed_size_rhs_pack_nxk_f32p2vlx1biasf32_f32_f32_sme",
                             (n, k), int(z["packed_size"]), Path(f).stem))
    assert len(cases) >= 4
    _batch(lib, cases, svl=32)


# --------------------------------------------------------------------------------------------
# K-quants: q8kp (LHS), q4kp / q6kp (RHS from ggml blocks) and their row dequantisers

KQ_TILES = ((1, 8), (1, 16), (4, 8), (4, 16), (8, 16), (16, 4), (3, 32), (2, 2))


def test_q8kp(lib):
    """The C quantisers write Q8KP.pack's and Q8KPI16.pack's bytes: rows m off mr,
    m_idx_start > 0 (the slots before it untouched), padded row strides, the slots after the
    last row zeroed."""
    _check_q8kp(lib, Q8KP, "kai_run_lhs_quant_pack_q8kp_f32", 2501)
    _check_q8kp(lib, Q8KPI16, "kai_run_lhs_quant_pack_q8ki16p_f32", 2502)


def _check_q8kp(lib, cls, name, seed):
    rng = np.random.default_rng(seed)
    n4 = name[8:]
    cases = []
    for mr, kr in KQ_TILES:
        lay = cls(mr, kr)
        for k in (256, 512, 768):
            m, ms = int(rng.integers(1, 2 * mr + 3)), int(rng.integers(0, mr + 2))
            stride = 4 * k + int(rng.choice([0, 4, 12]))
            x = _lhs_rows(rng, m, k)
            exp = lay.pack(x, m_idx_start=ms)
            size = lay.region_size(m, k, ms)
            call = (name, [U(m), U(k), U(mr), U(kr), U(2), U(ms), IN(_rows_bytes(x, stride)),
                           U(stride), OUT(size)], False)
            skipped = (ms % mr) * lay.row_block_stride(k) // mr
            cases.append((call, dict(expected=exp, unwritten=skipped),
                          f"{cls.format} {mr}x{kr} m={m} k={k} ms={ms} stride={stride}"))
            cases.append(_getter(f"kai_get_lhs_packed_size_{n4}", (m, k, mr, kr, 2),
                                 lay.packed_size(m, k), "size"))
            cases.append(_getter(f"kai_get_lhs_packed_offset_{n4}", (ms, k, mr, kr, 2),
                                 lay.packed_offset(ms, k), "offset"))
        cases.append(_getter(f"kai_get_m_step_{n4}", (mr,), mr, "m_step"))
    _batch(lib, cases)


def test_q8kp_row_blocks(lib, lib_scalar):
    """q8kp's NEON path for whole row blocks (mr 4, kr 8 or 16: the 4 slots quantised, then
    their values stored together by ST4), including blocks ending in zero slots past m and
    blocks after a partial first one (m_idx_start off mr): the layout's bytes on random rows,
    the scalar loop's bytes on rows with NaNs, infinities and subnormals."""
    rng = np.random.default_rng(2503)
    name = "kai_run_lhs_quant_pack_q8kp_f32"
    calls, labels, exps = [], [], []
    for kr in (8, 16):
        lay = Q8KP(4, kr)
        for m, ms, k in ((4, 0, 256), (8, 0, 512), (7, 0, 256), (1, 0, 256), (9, 2, 768),
                         (6, 4, 256), (3, 1, 512), (13, 3, 256)):
            stride = 4 * k + 4 * int(rng.integers(0, 3))
            for special in (False, True):
                x = _special_rows(rng, m, k) if special else _lhs_rows(rng, m, k)
                calls.append((name, [U(m), U(k), U(4), U(kr), U(2), U(ms), IN(_rows_bytes(x, stride)),
                                     U(stride), OUT(lay.region_size(m, k, ms))], False))
                labels.append(f"q8kp 4x{kr} m={m} k={k} ms={ms} special={special}")
                exps.append(None if special else
                            (lay.pack(x, m_idx_start=ms), (ms % 4) * lay.row_block_stride(k) // 4))
    got, want = _run(lib, calls), _run(lib_scalar, calls)
    bad = []
    for label, exp, g, w in zip(labels, exps, got, want):
        if not all(np.array_equal(a, b) for a, b in zip(g, w)):
            bad.append(f"{label}: not the scalar loop's bytes")
        elif exp is not None:
            try:
                _check(g, exp[0], label, unwritten=exp[1])
            except AssertionError as e:
                bad.append(f"{label}: not the layout's bytes ({e})")
    assert len(calls) == 32 and not bad, bad


def test_q8kp_edges_are_ggml_q8_k(lib):
    """Issue #30 items 2 and 9, the C quantiser llama.cpp runs: 1e-38, subnormal and zero
    super-blocks are flushed (d = 0, every q = 0; they were +-127), both sides of the flush
    threshold, 1e-36 (d subnormal), ties to even and control blocks hold ggml's Q8_K values
    (q8kp_edges.expected_q8kp), read back through Q8KP.unpack."""
    rng = np.random.default_rng(2502)
    name = "kai_run_lhs_quant_pack_q8kp_f32"
    k = 256 * len(EDGE_KINDS)
    calls, refs = [], []
    for i, (mr, kr) in enumerate(KQ_TILES):
        lay = Q8KP(mr, kr)
        m, ms = int(rng.integers(1, mr + 3)), int(rng.integers(0, mr + 1))
        x = edge_rows(rng, m, k, first=i)
        stride = 4 * k + 4 * int(rng.integers(0, 3))
        calls.append((name, [U(m), U(k), U(mr), U(kr), U(2), U(ms), IN(_rows_bytes(x, stride)),
                             U(stride), OUT(lay.region_size(m, k, ms))], False))
        refs.append((lay, m, ms, x, f"q8kp {mr}x{kr} m={m} ms={ms}"))
    failed = []
    for (lay, m, ms, x, label), o in zip(refs, _run(lib, calls)):
        got, _ = _split(o, label)
        try:
            check_q8kp(lay.unpack(got, m, k, ms), expected_q8kp(x), label)
        except AssertionError as e:
            failed.append(str(e))
    assert not failed, f"{len(failed)} of {len(refs)} packs differ:\n" + "\n".join(failed)



#: f32 bit patterns the quantisers' fast paths must treat as their scalar loops do: quiet and
#: signalling NaN (either sign), +-inf, subnormals, the largest finite, -0
SPECIAL_BITS = (0x7FC00000, 0xFFC00001, 0x7F800001, 0x7F800000, 0xFF800000, 0x00000001, 0x000B5E61,
                0x80400000, 0x7F7FFFFF, 0xFF7FFFFF, 0x80000000)


def _special_rows(rng, m, k):
    """_lhs_rows with, per row, one of: clean, a few specials, a tiny (subnormal-scale) row,
    a row of one special."""
    x = _lhs_rows(rng, m, k)
    bits = x.view(np.uint32)
    for i in range(m):
        kind = int(rng.integers(0, 5))
        if kind in (1, 2):
            at = rng.choice(k, size=min(k, int(rng.integers(1, 4))), replace=False)
            bits[i, at] = rng.choice(SPECIAL_BITS, size=at.size)
        elif kind == 3:
            bits[i] = rng.integers(0, 0x00100000, size=k, dtype=np.uint32) | (
                rng.integers(0, 2, size=k, dtype=np.uint32) << 31)
        elif kind == 4:
            bits[i] = rng.choice(SPECIAL_BITS)
    return x


def test_qai8dxp_scalar_loop(lib_scalar):
    """Built without NEON (-U__ARM_NEON) the qai8dxp quantiser writes the layout's bytes too."""
    test_qai8dxp(lib_scalar)


@pytest.mark.parametrize("rounding", ["away", "even"])
def test_qsi8d32p_scalar_loop(lib_scalar, rounding):
    """Built without NEON (-U__ARM_NEON) the qsi8d32p quantisers write the layout's bytes too."""
    test_qsi8d32p(lib_scalar, rounding)


def test_q8kp_scalar_loop(lib_scalar):
    """Built without NEON the q8kp quantiser writes the layout's bytes and ggml's Q8_K edges."""
    test_q8kp(lib_scalar)
    test_q8kp_edges_are_ggml_q8_k(lib_scalar)


def test_neon_quantisers_are_their_scalar_loops(lib, lib_scalar):
    """The NEON paths of the LHS quantisers (unsigned |x| max, FMAX/FMIN, FCVTAS/FCVTNS,
    narrowing, chunked stores) write exactly the bytes of the scalar loops, on rows with NaNs (quiet,
    signalling), infinities, subnormals, all-tiny and all-special rows, for chunk lengths 1 to
    32, blocks of 32 (unrolled), 64, 128 and 512 (value by value), several super-blocks, qai8dxp
    rows of any k (padding past k)."""
    rng = np.random.default_rng(3301)
    calls, labels = [], []
    for rounding in ("away", "even"):
        name = _qsi8d32p_name(rounding)
        for mr, kr, sr in [(1, 4, 1), (4, 8, 2), (3, 16, 1), (8, 32, 1), (4, 64, 2), (2, 4, 2),
                           (4, 16, 2)]:
            for bl in (32, 64, 128, 512):
                if bl % (kr // sr):
                    continue
                k = bl * int(rng.integers(1, 4))
                m, ms = int(rng.integers(1, 2 * mr + 2)), int(rng.integers(0, mr + 2))
                stride = 4 * k + int(rng.choice([0, 4]))
                x = _special_rows(rng, ms + m, k)
                size = QSI8D32P(mr, kr, sr, bl, rounding).region_size(m, k, ms)
                calls.append((name, [U(m), U(k), U(bl), U(mr), U(kr), U(sr), U(ms),
                                     IN(_rows_bytes(x, stride)), U(stride), OUT(size)], False))
                labels.append(f"{name} {mr}x{kr}/{sr} bl={bl} m={m} k={k} ms={ms}")
    name = "kai_run_lhs_quant_pack_qai8dxp_f32"
    for mr, kr, sr in QAI8DXP_TILES + [(3, 32, 1), (2, 2, 1)]:
        for k in (1, 15, 32, 33, 100, 256, 300, 544):
            m, ms = int(rng.integers(1, 2 * mr + 2)), int(rng.integers(0, mr + 2))
            stride = 4 * k + int(rng.choice([0, 4]))
            x = _special_rows(rng, m, k)
            size = QAI8DXP(mr, kr, sr).region_size(m, k, ms)
            calls.append((name, [U(m), U(k), U(mr), U(kr), U(sr), U(ms), IN(_rows_bytes(x, stride)),
                                 U(stride), OUT(size)], False))
            labels.append(f"{name} {mr}x{kr}/{sr} m={m} k={k} ms={ms}")
    for cls in (Q8KP, Q8KPI16):
        name = f"kai_run_lhs_quant_pack_{cls.format}_f32"
        for mr, kr in KQ_TILES:
            lay = cls(mr, kr)
            for k in (256, 768):
                m, ms = int(rng.integers(1, 2 * mr + 3)), int(rng.integers(0, mr + 2))
                stride = 4 * k + int(rng.choice([0, 4]))
                x = _special_rows(rng, m, k)
                calls.append((name, [U(m), U(k), U(mr), U(kr), U(2), U(ms),
                                     IN(_rows_bytes(x, stride)), U(stride),
                                     OUT(lay.region_size(m, k, ms))], False))
                labels.append(f"{cls.format} {mr}x{kr} m={m} k={k} ms={ms}")
    got, want = _run(lib, calls), _run(lib_scalar, calls)
    bad = [label for label, g, w in zip(labels, got, want)
           if not all(np.array_equal(a, b) for a, b in zip(g, w))]
    assert not bad, f"{len(bad)} of {len(calls)} calls differ from the scalar loops: {bad[:6]}"

def _kq_rhs_cases(cls, random_blocks, block_bytes, tag, seed):
    """Pack calls (checked against the layout's pack_from_ggml) and row dequantiser calls
    (checked against dequantize_rows, i.e. gguf.quants, bit for bit) of one K-quant RHS."""
    rng = np.random.default_rng(seed)
    name = f"kai_run_rhs_pack_nxk_{tag}"
    n4 = name[8:]
    packs, rows = [], []
    import gguf
    qk = cls.ggml_block[1]                      # k per ggml block: 256 (K-quants), 32 (IQ4_NL)
    qtype = gguf.GGMLQuantizationType[cls.ggml_block[0]]
    for nr, kr in KQ_TILES:
        try:
            lay = cls(nr, kr)
        except LayoutError:                     # a tile the layout refuses (iq4nlp: kr > 16)
            assert qk != 256, (cls, nr, kr)
            continue
        for k in sorted({256, 768, qk, 3 * qk}):
            n = int(rng.integers(1, 3 * nr + 2))
            raw = random_blocks(n, k, int(rng.integers(1 << 30))).reshape(n, -1)
            pad = int(rng.choice([0, 16]))
            stride = k // qk * block_bytes + pad
            src = np.zeros((n, stride), np.uint8)
            src[:, :raw.shape[1]] = raw
            exp = lay.pack_from_ggml(raw, n, k)
            call = (name, [U(1), U(n), U(k), U(nr), U(kr), U(2), U(stride if pad else 0), IN(src),
                           NULL, NULL, OUT(lay.packed_size(n, k)), U(0), NULL], False)
            packs.append((call, dict(expected=exp), f"{tag} {nr}x{kr} n={n} k={k} pad={pad}"))
            packs.append(_getter(f"kai_get_rhs_packed_size_{n4}", (n, k, nr, kr, 2),
                                 lay.packed_size(n, k), "size"))
            packs.append(_getter(f"kai_get_rhs_packed_offset_{n4}", (nr, k, nr, kr, 2),
                                 lay.packed_offset(nr, k), "offset"))
            for row in sorted({0, n - 1, int(rng.integers(n))}):
                want = gguf.quants.dequantize(raw[row], qtype).reshape(-1)
                assert np.array_equal(lay.dequantize_rows(exp, n, k, [row])[0].view(np.uint32),
                                      want.astype(np.float32).view(np.uint32))
                rows.append(((f"kai_run_dequant_row_{n4}", [U(row), U(k), U(nr), U(kr), IN(exp),
                                                             OUT(4 * k)], False),
                             want, f"{tag} dequant {nr}x{kr} n={n} k={k} row={row}"))
        packs.append(_getter(f"kai_get_n_step_{n4}", (nr,), nr, "n_step"))
    return packs, rows


def _kq_rhs_packers() -> list[tuple]:
    """(layout class, random blocks, block bytes, tag, seed) of every family's K-quant RHS
    packer (the registry's C_PACKERS; block bytes from gguf's table)."""
    import gguf
    from tilegen.families import PLUGINS
    out = []
    for p in PLUGINS:
        for name in getattr(p, "C_PACKERS", {}):
            cls = next(c for c in p.LAYOUTS if c.role == "rhs")
            blk = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[cls.ggml_block[0]]][1]
            out.append((cls, cls.random_ggml, blk, name[len("kai_rhs_pack_nxk_"):],
                        2502 + len(out)))
    return out


@pytest.mark.parametrize("args", _kq_rhs_packers(), ids=lambda a: a[3])
def test_kquant_rhs(lib, args):
    """The C repacks of every family's ggml blocks (block_q4_K, block_q5_K, block_q6_K,
    block_iq4_nl) write the layout object's bytes (whole groups, padding columns as the layout
    fills them; rows with a padded stride), and the row dequantisers give the layout's
    dequantize_rows floats, which are gguf.quants.dequantize's of the source row, bit for
    bit."""
    tag = args[3]
    packs, rows = _kq_rhs_cases(*args)
    _batch(lib, packs)
    outs = _run(lib, [c for c, _, _ in rows])
    for (call, want, label), o in zip(rows, outs):
        got, written = _split(o, label)
        assert written.all(), label
        got = got.view(np.float32)
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), label


def test_kquant_packers_listed():
    assert set(KQUANT_PACKERS) <= set(ALL_PACKERS) and not set(KQUANT_PACKERS) & set(PACKERS)


def test_mxfp4_rhs_every_scale(lib):
    """The C repack of block_mxfp4 over every E8M0 byte 0..255 (the random blocks of
    test_kquant_rhs draw e from 118..130): the table lookup to the bf16 scale 2^(e - 128) for
    the subnormal scales (e < 2), the smallest and largest normal ones and those whose products
    overflow (12 * 2^127 is inf, as in ggml), packed as the layout object packs them and
    dequantised as gguf.quants.dequantize does, bit for bit."""
    from tilegen.families.mxfp4 import MXFP4_BLOCK_BYTES, MXFP4P, random_mxfp4
    blocks = lambda n, k, seed: random_mxfp4(n, k, seed, e_range=(0, 255))  # noqa: E731
    packs, rows = _kq_rhs_cases(MXFP4P, blocks, MXFP4_BLOCK_BYTES, "mxfp4p_mxfp4", 2609)
    _batch(lib, packs)
    outs = _run(lib, [c for c, _, _ in rows])
    for (call, want, label), o in zip(rows, outs):
        got, written = _split(o, label)
        assert written.all(), label
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), label
