"""Guest side of tests/test_kleidiai_diff.py: the same C calls into two shared objects that
define the same ``kai_`` names -- KleidiAI's own library (the reference, index 0) and tilegen's
export (index 1) -- each loaded under its own ctypes handle.  Both are linked ``-Bsymbolic``, so
each one's calls between its own functions stay inside it.

Every buffer a function writes ends at a PROT_NONE guard page (``guest_pack._Guarded``): a write
past it kills the guest.  Packed buffers are written twice, over 0x00 and over 0xFF: a byte that
comes out the same both times is one the packer wrote.
"""
from __future__ import annotations

import ctypes as C

import numpy as np

from guest_pack import _Guarded

SZ, VP, F32 = C.c_size_t, C.c_void_p, C.c_float
FILLS = (0x00, 0xFF)
_LIBS: dict[str, C.CDLL] = {}


def _fn(path: str, name: str, argtypes: list, restype=SZ):
    lib = _LIBS.get(path)
    if lib is None:
        lib = _LIBS[path] = C.CDLL(path)
    f = getattr(lib, name)
    f.argtypes, f.restype = argtypes, restype
    return f


def _get(path: str, name: str, *args: int) -> int:
    return int(_fn(path, name, [SZ] * len(args))(*args))


def getters(paths: list[str], calls: list) -> list[list[int]]:
    """``[name, [size_t args]]`` -> per call, the value each library returns."""
    return [[_get(p, name, *args) for p in paths] for name, args in calls]


def _buffer(data: np.ndarray) -> _Guarded:
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    g = _Guarded(max(raw.size, 1))
    g.view()[:raw.size] = raw
    return g


def _arg(a, keep: list):
    kind = a[0]
    if kind == "u":
        return SZ(a[1])
    if kind == "null":
        return VP(None)
    g = _buffer(a[1])                  # "in": a pointer to a copy of the array
    keep.append(g)
    return VP(g.addr + (a[2] if len(a) > 2 else 0))


def packers(paths: list[str], calls: list) -> list:
    """``[name, args, out_bytes, out_offset]``: args as for :func:`_arg` plus one ``("out",)``,
    the destination, a buffer of ``out_bytes`` passed at ``out_offset`` bytes in (either a number
    or ``(getter, args)``, the value of KleidiAI's getter, paths[0]).  Returns per call, per
    library, per fill the whole destination buffer."""
    res = []
    for name, args, nbytes, offset in calls:
        nbytes, offset = (v if isinstance(v, int) else _get(paths[0], v[0], *v[1])
                          for v in (nbytes, offset))
        per_lib = []
        for p in paths:
            outs = []
            for fill in FILLS:
                keep: list = []
                dst = _Guarded(max(nbytes, 1))
                dst.view()[:] = fill
                vals = [VP(dst.addr + offset) if a[0] == "out" else _arg(a, keep) for a in args]
                _fn(p, name, [type(v) for v in vals], None)(*vals)
                outs.append(dst.view()[:nbytes].copy())
            per_lib.append(outs)
        res.append(per_lib)
    return res


# -- one matmul as llama.cpp's kleidiai.cpp drives it -------------------------------------

class _P4(C.Structure):
    _fields_ = [("lhs_zero_point", C.c_int8), ("rhs_zero_point", C.c_uint8)]


class _P8(C.Structure):
    _fields_ = [("lhs_zero_point", C.c_int32), ("scale_multiplier", C.c_float)]


def geometry(path: str, kernel: str, lhs_packer: str | None) -> dict:
    g = {x: _get(path, f"kai_get_{x}_{kernel}") for x in ("m_step", "n_step", "nr", "kr", "sr")}
    g["mr"] = _get(path, f"kai_get_mr_{kernel}") if lhs_packer else 1
    return g


def _split_m(total: int, step: int, parts: int) -> list[tuple[int, int]]:
    """kleidiai.cpp's split of ``total`` LHS rows over up to ``parts`` threads: (start, count),
    every count but the last a multiple of ``step``."""
    blocks = -(-total // step)
    parts = max(1, min(blocks, parts))
    per = blocks * step // parts // step * step
    return [(i * per, per) for i in range(parts - 1)] + [((parts - 1) * per,
                                                          total - (parts - 1) * per)]


def _split_n(total: int, step: int, parts: int) -> list[tuple[int, int]]:
    """kleidiai.cpp's split of the matmul's ``total`` columns over up to ``parts`` threads."""
    parts = max(1, min(total // step, parts))
    per = total // parts // step * step
    return [(i * per, per) for i in range(parts - 1)] + [((parts - 1) * per,
                                                          total - (parts - 1) * per)]


def _pack_rhs(p: str, c: dict, g: dict, fill: int) -> np.ndarray:
    r, n, k = c["rhs"], c["n"], c["k"]
    pk = r["packer"][4:]
    if r["kind"] == "q4":
        size = _get(p, f"kai_get_rhs_packed_size_{pk}", n, k, g["nr"], g["kr"], 32)
    elif r["kind"] == "q8":
        size = _get(p, f"kai_get_rhs_packed_size_{pk}", n, k, g["nr"], g["kr"], g["sr"])
    else:
        size = _get(p, f"kai_get_rhs_packed_size_{pk}", n, k)
    out = _Guarded(max(size, 1))
    out.view()[:] = fill
    keep = [_buffer(r["w"])]
    bias = VP(None)
    if r.get("bias") is not None:
        keep.append(_buffer(r["bias"]))
        bias = VP(keep[-1].addr)
    geo = [SZ(1), SZ(n), SZ(k), SZ(g["nr"]), SZ(g["kr"]), SZ(g["sr"])]
    if r["kind"] == "q4":
        prm = _P4(1, 8)
        args = [*geo, SZ(32), VP(keep[0].addr), bias, VP(out.addr), SZ(0), C.cast(C.byref(prm), VP)]
    elif r["kind"] == "q8":
        prm = _P8(1, 1.0)
        keep.append(_buffer(r["scale"]))
        args = [*geo, VP(keep[0].addr), bias, VP(keep[-1].addr), VP(out.addr), SZ(0),
                C.cast(C.byref(prm), VP)]
    else:                               # kxn / nxk float rows of rhs_stride bytes
        args = [*geo, SZ(r["stride"]), VP(keep[0].addr), bias, VP(None), VP(out.addr), SZ(0),
                VP(None)]
    _fn(p, f"kai_run_{pk}", [type(a) for a in args], None)(*args)
    return out.view()[:size].copy()


def _lhs_getter_args(c: dict, g: dict) -> list[int]:
    return ([c["k"], 32] if c["lhs"]["bl"] else [c["k"]]) + [g["mr"], g["kr"], g["sr"]]


def _pack_lhs(p: str, c: dict, g: dict, fill: int) -> np.ndarray:
    """The LHS packed over ``threads`` as kleidiai.cpp does: each thread packs its rows (a
    multiple of mr, from get_lhs_packed_offset) from its first row with m_idx_start 0."""
    pk, m, x = c["lhs"]["packer"][4:], c["m"], c["x"]
    ga = _lhs_getter_args(c, g)
    size = _get(p, f"kai_get_lhs_packed_size_{pk}", m, *ga)
    out = _Guarded(max(size, 1))
    out.view()[:] = fill
    src = _buffer(x)
    stride = c["lhs_stride"]
    for m0, cnt in _split_m(m, g["mr"], c["threads"]):
        off = _get(p, f"kai_get_lhs_packed_offset_{pk}", m0, *ga)
        src_off = _get(p, f"kai_get_lhs_offset_{pk}", m0, stride)
        args = [SZ(cnt), *(SZ(v) for v in ga[:-3]), *(SZ(v) for v in ga[-3:]), SZ(0),
                VP(src.addr + src_off), SZ(stride), VP(out.addr + off)]
        _fn(p, f"kai_run_{pk}", [type(a) for a in args], None)(*args)
    return out.view()[:size].copy()


def _matmul(p: str, c: dict, g: dict, lhs: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """dst over an m x n grid of calls: m in ``m_parts`` multiples of m_step (LHS through
    get_lhs_packed_offset / get_lhs_offset), n as kleidiai.cpp splits it over ``threads``
    (multiples of n_step, RHS through get_rhs_packed_offset), dst through get_dst_offset."""
    name, m, n, k, ds = c["kernel"], c["m"], c["n"], c["k"], c["dst_stride"]
    bl = [32] if c["run"] == "bl" else []
    dst = _Guarded((m - 1) * ds + 4 * n)
    dst.view()[:] = np.frombuffer(np.float32(c["sentinel"]).tobytes() * ((dst.n + 3) // 4),
                                  np.uint8)[:dst.n]
    lb, rb = _buffer(lhs), _buffer(rhs)
    lo, hi = c["clamp"]
    for m0, mc in _split_m(m, g["m_step"], c["m_parts"]):
        if c["run"] == "rows":
            loff = _get(p, f"kai_get_lhs_offset_{name}", m0, c["lhs_stride"])
        else:
            loff = _get(p, f"kai_get_lhs_packed_offset_{name}", m0, k, *bl)
        for n0, nc in _split_n(n, g["n_step"], c["threads"]):
            roff = _get(p, f"kai_get_rhs_packed_offset_{name}", n0, k, *bl)
            doff = _get(p, f"kai_get_dst_offset_{name}", m0, n0, ds)
            head = [SZ(mc), SZ(nc), SZ(k), *(SZ(b) for b in bl)]
            if c["run"] == "rows":
                head += [VP(lb.addr + loff), SZ(c["lhs_stride"])]
            else:
                head += [VP(lb.addr + loff)]
            args = [*head, VP(rb.addr + roff), VP(dst.addr + doff), SZ(ds), SZ(4), F32(lo), F32(hi)]
            _fn(p, f"kai_run_{name}", [type(a) for a in args], None)(*args)
    return dst.view().copy()


def flow(paths: list[str], cases: list[dict]) -> list[dict]:
    """Per case and library: its geometry (from its own getters), its packed RHS and LHS (over
    0x00 and over 0xFF) and dst; plus ``cross``: the export's kernel (paths[1]) on KleidiAI's
    packed buffers, where both geometries agree."""
    out = []
    for c in cases:
        res = {"libs": []}
        for p in paths:
            g = geometry(p, c["kernel"], c["lhs"] and c["lhs"]["packer"])
            rhs = [_pack_rhs(p, c, g, f) for f in FILLS]
            lhs = [_pack_lhs(p, c, g, f) for f in FILLS] if c["lhs"] else [c["x"]] * 2
            res["libs"].append(dict(geo=g, rhs=rhs, lhs=lhs if c["lhs"] else None,
                                    dst=_matmul(p, c, g, lhs[0], rhs[0])))
        g0, g1 = (r["geo"] for r in res["libs"])
        if g0 == g1:
            k0 = res["libs"][0]
            res["cross"] = _matmul(paths[1], c, g1, k0["lhs"][0] if c["lhs"] else c["x"],
                                   k0["rhs"][0])
        out.append(res)
    return out
