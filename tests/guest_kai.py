"""Guest side of tests/test_export_kleidiai.py: call the exported KleidiAI functions of a
shared library (built from the export tree) through ctypes, inside the emulated aarch64 Python."""
from __future__ import annotations

import ctypes as C

import numpy as np

_LIBS: dict[str, C.CDLL] = {}
SZ, VP, F = C.c_size_t, C.c_void_p, C.c_float


def _lib(path: str) -> C.CDLL:
    if path not in _LIBS:
        _LIBS[path] = C.CDLL(path)
    return _LIBS[path]


def getters(path: str, name: str, lhs_getter: str, lhs_args: list[int], rhs_args: list[int]) -> dict:
    """Every getter of micro-kernel ``name``; the offset getters at the given arguments."""
    lib = _lib(path)
    out = {}
    for g in ("m_step", "n_step", "mr", "nr", "kr", "sr"):
        f = getattr(lib, f"kai_get_{g}_{name}")
        f.restype, f.argtypes = SZ, []
        out[g] = f()
    f = getattr(lib, f"kai_{lhs_getter}_{name}")
    f.restype, f.argtypes = SZ, [SZ] * len(lhs_args)
    out["lhs_offset"] = f(*lhs_args)
    f = getattr(lib, f"kai_get_rhs_packed_offset_{name}")
    f.restype, f.argtypes = SZ, [SZ] * len(rhs_args)
    out["rhs_offset"] = f(*rhs_args)
    f = getattr(lib, f"kai_get_dst_offset_{name}")
    f.restype, f.argtypes = SZ, [SZ, SZ, SZ]
    out["dst_offset"] = f(3, 8, 100)
    f = getattr(lib, f"kai_get_dst_size_{name}")
    f.restype, f.argtypes = SZ, [SZ, SZ]
    out["dst_size"] = f(3, 5)
    return out


def run(path: str, name: str, kind: str, cases: list[dict]) -> list[np.ndarray]:
    """``kai_run_<name>`` on each case; dst is a view into a sentinel-filled buffer.

    kind: "bl" (m, n, k, bl, lhs_packed, rhs_packed, dst, ...), "packed" (no bl) or
    "rows" (m, n, k, lhs, lhs_stride, rhs_packed, dst, ...)."""
    f = getattr(_lib(path), f"kai_run_{name}")
    f.restype = None
    outs = []
    for c in cases:
        m, n, k = c["m"], c["n"], c["k"]
        base = np.full((m + 2, n + 3), c["sentinel"], np.float32)
        lhs = np.ascontiguousarray(c["lhs"])
        rhs = np.ascontiguousarray(c["rhs"])
        tail = [VP(base.ctypes.data), SZ(base.strides[0]), SZ(4), F(c["clamp_min"]),
                F(c["clamp_max"])]
        if kind == "bl":
            f(SZ(m), SZ(n), SZ(k), SZ(c["bl"]), VP(lhs.ctypes.data), VP(rhs.ctypes.data), *tail)
        elif kind == "packed":
            f(SZ(m), SZ(n), SZ(k), VP(lhs.ctypes.data), VP(rhs.ctypes.data), *tail)
        elif kind == "rows":
            f(SZ(m), SZ(n), SZ(k), VP(lhs.ctypes.data), SZ(lhs.strides[0]), VP(rhs.ctypes.data),
              *tail)
        else:
            raise ValueError(kind)
        outs.append(base)
    return outs


class _P4(C.Structure):
    _fields_ = [("lhs_zero_point", C.c_int8), ("rhs_zero_point", C.c_uint8)]


class _P8(C.Structure):
    _fields_ = [("lhs_zero_point", C.c_int32), ("scale_multiplier", C.c_float)]


def _fn(lib, name, restype=None):
    f = getattr(lib, name)
    f.restype = restype
    return f


def _pack_rhs(lib, rhs_kernel: str, rhs_packer: str, rhs_kind: str, k: int, w) -> tuple[np.ndarray, int]:
    """The RHS of a table entry packed as kleidiai.cpp's repack does (at the nr/kr/sr of
    ``rhs_kernel``, the entry's gemm): (packed bytes, n)."""
    rgeo = {g: _fn(lib, f"kai_get_{g}_{rhs_kernel}", SZ)() for g in ("nr", "kr", "sr")}
    nr, rkr, rsr = rgeo["nr"], rgeo["kr"], rgeo["sr"]
    if rhs_kind == "q4":
        raw, n = np.ascontiguousarray(w["raw"]), int(w["n"])
        size = _fn(lib, f"kai_get_rhs_packed_size_{rhs_packer}", SZ)(SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(32))
        rp = np.zeros(size, np.uint8)
        p = _P4(1, 8)
        _fn(lib, f"kai_run_{rhs_packer}")(SZ(1), SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr), SZ(32),
                                          VP(raw.ctypes.data), VP(None), VP(rp.ctypes.data), SZ(0),
                                          C.byref(p))
    elif rhs_kind == "q8":
        q, sc = np.ascontiguousarray(w["q"], np.int8), np.ascontiguousarray(w["scale"], np.float32)
        n = q.shape[0]
        size = _fn(lib, f"kai_get_rhs_packed_size_{rhs_packer}", SZ)(SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr))
        rp = np.zeros(size, np.uint8)
        p = _P8(1, 1.0)
        _fn(lib, f"kai_run_{rhs_packer}")(SZ(1), SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr),
                                          VP(q.ctypes.data), VP(None), VP(sc.ctypes.data),
                                          VP(rp.ctypes.data), SZ(0), C.byref(p))
    elif rhs_kind == "kq":    # ggml block_q4_K / block_q6_K rows (tilegen's K-quant packers)
        raw, n = np.ascontiguousarray(w["raw"], np.uint8), int(w["n"])
        size = _fn(lib, f"kai_get_rhs_packed_size_{rhs_packer}", SZ)(SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr))
        rp = np.zeros(size, np.uint8)
        _fn(lib, f"kai_run_{rhs_packer}")(SZ(1), SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr), SZ(0),
                                          VP(raw.ctypes.data), VP(None), VP(None),
                                          VP(rp.ctypes.data), SZ(0), VP(None))
    else:   # "kxn" / "nxk" float weights (f32 values; bf16 packer rounds), zero bias
        wf = np.ascontiguousarray(w["w"], np.float32)
        n = wf.shape[0]
        src = np.ascontiguousarray(wf.T) if rhs_kind == "kxn" else wf
        bias = np.zeros(n, np.float32)
        size = _fn(lib, f"kai_get_rhs_packed_size_{rhs_packer}", SZ)(SZ(n), SZ(k))
        rp = np.zeros(size, np.uint8)
        _fn(lib, f"kai_run_{rhs_packer}")(SZ(1), SZ(n), SZ(k), SZ(nr), SZ(rkr), SZ(rsr),
                                          SZ(src.strides[0]), VP(src.ctypes.data),
                                          VP(bias.ctypes.data), VP(None), VP(rp.ctypes.data), SZ(0),
                                          VP(None))
    return rp, n


def pack_rhs(path: str, rhs_kernel: str, rhs_packer: str, rhs_kind: str, k: int, w) -> bytes:
    """``_pack_rhs`` of the library at ``path`` (one expert's packed weights for the C harness
    of the patch's MUL_MAT_ID)."""
    return _pack_rhs(_lib(path), rhs_kernel, rhs_packer, rhs_kind, k, w)[0].tobytes()


def llama_flow(path: str, kernel: str, kind: str, rhs_kernel: str, lhs_packer: str | None,
               lhs_bl: bool, rhs_packer: str, rhs_kind: str, x, w) -> np.ndarray:
    """What llama.cpp's kleidiai.cpp does for one matmul: RHS packed with the packer of the
    table entry at the nr/kr/sr of ``rhs_kernel`` (the entry's gemm), LHS packed with the
    entry's packer at the mr/kr/sr of ``kernel``, then ``kai_run_<kernel>``; returns dst."""
    lib = _lib(path)
    geo = {g: _fn(lib, f"kai_get_{g}_{kernel}", SZ)() for g in ("mr", "kr", "sr")}
    x = np.ascontiguousarray(x, np.float32)
    m, k = x.shape
    rp, n = _pack_rhs(lib, rhs_kernel, rhs_packer, rhs_kind, k, w)
    # LHS
    if lhs_packer is None:
        lp = x
    else:
        bl = [SZ(32)] if lhs_bl else []
        g3 = [SZ(geo["mr"]), SZ(geo["kr"]), SZ(geo["sr"])]
        size = _fn(lib, f"kai_get_lhs_packed_size_{lhs_packer}", SZ)(SZ(m), SZ(k), *bl, *g3)
        lp = np.zeros(size, np.uint8)
        _fn(lib, f"kai_run_{lhs_packer}")(SZ(m), SZ(k), *bl, *g3, SZ(0), VP(x.ctypes.data),
                                          SZ(x.strides[0]), VP(lp.ctypes.data))
    case = dict(m=m, n=n, k=k, bl=32, lhs=lp, rhs=rp, clamp_min=-3.4e38, clamp_max=3.4e38,
                sentinel=-4242.25)
    return run(path, kernel, kind, [case])[0][:m, :n]
