"""Guest-side helpers for the generated LHS packers (run via GuestSession.call).

Every source and destination buffer is placed so that it ends exactly at a PROT_NONE guard
page: a packer that reads past the last source row or writes past the packed region faults
(the session reports GuestCrashed).  Kept free of pytest so that the guest imports little.
"""
from __future__ import annotations

import ctypes
import mmap

import numpy as np

_LIBS: dict[str, ctypes.CDLL] = {}
_PAGE = mmap.PAGESIZE
_PROT_NONE = 0
_KEEP: list = []          # guarded mappings stay alive for the life of the guest


def _lib(path: str) -> ctypes.CDLL:
    lib = _LIBS.get(path)
    if lib is None:
        lib = _LIBS[path] = ctypes.CDLL(path)
    return lib


def _func(path: str, name: str, nargs: int):
    f = getattr(_lib(path), name)
    f.restype = None
    f.argtypes = [ctypes.c_size_t] * nargs
    return f


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int


class _Guarded:
    """``n`` bytes ending at a PROT_NONE page, preceded by ``before`` accessible bytes."""

    def __init__(self, n: int, before: int = 0) -> None:
        body = -(-(n + before) // _PAGE) * _PAGE
        self.mm = mmap.mmap(-1, body + _PAGE)
        self._cbuf = (ctypes.c_char * (body + _PAGE)).from_buffer(self.mm)
        self.base = ctypes.addressof(self._cbuf)
        if _libc.mprotect(self.base + body, _PAGE, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect failed")
        self.addr = self.base + body - n            # first byte of the region
        self.n, self.before = n, before
        self.whole = np.frombuffer(self.mm, dtype=np.uint8, count=body)
        _KEEP.append(self)

    def view(self) -> np.ndarray:
        """The region with its ``before`` leading bytes."""
        off = self.addr - self.base
        return self.whole[off - self.before: off + self.n]


def run_cases(so: str, cases: list[dict]) -> list[list[np.ndarray]]:
    """Run each case once per prefill byte.

    case keys: name, fmt (with bl: 'qsi8d32p', 'qsi8d32pscaletail'; without: 'qai8dxp',
    'bf16px2', ...), args (dict of the C integer arguments),
    src (uint8: the bytes from the lhs pointer to the end of the last row read),
    dst_size (bytes from the lhs_packed pointer), prefills (list of ints), margin (bytes before
    lhs_packed that must stay untouched).  Returns, per case and prefill, the margin + region.
    """
    out = []
    for c in cases:
        a = c["args"]
        src = _Guarded(len(c["src"]))
        src.view()[:] = c["src"]
        res = []
        for fill in c["prefills"]:
            dst = _Guarded(max(c["dst_size"], 1), before=c["margin"])
            dst.view()[:] = fill
            if c["fmt"] not in ("qsi8d32p", "qsi8d32pscaletail"):   # no bl argument
                f = _func(so, c["name"], 9)
                f(a["m"], a["k"], a["mr"], a["kr"], a["sr"], a["m_idx_start"], src.addr,
                  a["lhs_stride"], dst.addr)
            else:
                f = _func(so, c["name"], 10)
                f(a["m"], a["k"], a["bl"], a["mr"], a["kr"], a["sr"], a["m_idx_start"], src.addr,
                  a["lhs_stride"], dst.addr)
            res.append(dst.view().copy())
        out.append(res)
    return out


# -- guard-page placement of kernel buffers (tests/test_guard_pages.py) ------------------------

def _placed(n: int, at: str, slack: int = 0) -> tuple[np.ndarray, int]:
    """``n`` bytes flush against a PROT_NONE page, plus ``slack`` accessible bytes on the far side.

    at='end': the guard page directly follows the last byte (slack bytes precede the first);
    at='start': the guard page directly precedes the first byte (slack bytes follow the last).
    Returns (the n + slack accessible bytes, offset of the n bytes in them).  The mapping is
    released with the returned array (it is not kept in _KEEP).
    """
    total = n + slack
    body = max(-(-total // _PAGE), 1) * _PAGE
    mm = mmap.mmap(-1, body + _PAGE)
    whole = np.frombuffer(mm, dtype=np.uint8)
    base = whole.ctypes.data
    guard = base + body if at == "end" else base
    if _libc.mprotect(guard, _PAGE, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed")
    if at == "end":
        region = whole[body - total: body]
        return region, slack
    region = whole[_PAGE: _PAGE + total]
    return region, 0


def _strided_f32(n_rows: int, n_cols: int, stride: int, at: str, slack_floats: int, fill):
    """A (n_rows, n_cols) float32 view with row stride ``stride`` floats whose first (at='start')
    or last (at='end') element touches a guard page; returns (view, region floats, offset)."""
    from numpy.lib.stride_tricks import as_strided
    extent = (n_rows - 1) * stride + n_cols
    raw, off = _placed(4 * extent, at, 4 * slack_floats)
    region = raw.view(np.float32)
    region[:] = fill
    off //= 4
    view = as_strided(region[off:], shape=(n_rows, n_cols), strides=(4 * stride, 4))
    return view, region, off


def _bytes_at(data: np.ndarray, need: int, at: str) -> np.ndarray:
    if data.nbytes != need:
        raise ValueError(f"packed buffer has {data.nbytes} bytes, the kernel needs {need}")
    raw, off = _placed(need, at)
    buf = raw[off: off + need]
    buf[:] = data
    return buf


def guarded_f32_cases(libdir: str, name: str, cases: list[dict], placements=("end", "start")):
    """Run f32 kernel ``name`` on each case once per placement ('end': every buffer's last byte
    is followed by a PROT_NONE page; 'start': every buffer's first byte is preceded by one).

    case keys: m, n, k, lhs (m, k float32), packed (uint8), lhs_stride, dst_stride (floats),
    clamp_min, clamp_max, sentinel.  Gaps between LHS rows are filled with NaN; dst is a strided
    view into a sentinel-filled region with one extra dst row of slack on the side away from the
    guard page.  Returns per case and placement (region floats, dst offset in floats).
    """
    from guest_calls import _lib
    kern = _lib(libdir).kernel(name)
    out = []
    for c in cases:
        m, n, k = c["m"], c["n"], c["k"]
        res = []
        for at in placements:
            if kern.spec.packs_f32_lhs:     # SME outer products: the packed LHS is guarded
                lhs = _bytes_at(kern.lhs_layout().pack(c["lhs"]), kern.lhs_packed_size(m, k), at)
            else:
                lhs, _, _ = _strided_f32(m, k, c["lhs_stride"], at, 0, np.nan)
                lhs[:] = c["lhs"]
            rhs = _bytes_at(c["packed"], kern.rhs_packed_size(n, k), at)
            dst, region, off = _strided_f32(m, n, c["dst_stride"], at, c["dst_stride"],
                                            c["sentinel"])
            kern(lhs, rhs, dst, c["clamp_min"], c["clamp_max"], k=k)
            res.append((region.copy(), off))
        out.append(res)
    return out


def guarded_q4_cases(libdir: str, name: str, cases: list[dict], placements=("end", "start")):
    """As guarded_f32_cases for a q4 kernel; case keys: m, n, k, bl, lhs_packed, rhs_packed,
    dst_stride, clamp_min, clamp_max, sentinel (packed buffers must have exactly the sizes
    the kernel reports)."""
    from guest_calls import _lib
    kern = _lib(libdir).kernel(name)
    out = []
    for c in cases:
        m, n, k, bl = c["m"], c["n"], c["k"], c["bl"]
        res = []
        for at in placements:
            lhs = _bytes_at(c["lhs_packed"], kern.lhs_packed_size(m, k, bl), at)
            rhs = _bytes_at(c["rhs_packed"], kern.rhs_packed_size(n, k, bl), at)
            dst, region, off = _strided_f32(m, n, c["dst_stride"], at, c["dst_stride"],
                                            c["sentinel"])
            kern(lhs, rhs, dst, c["clamp_min"], c["clamp_max"], k=k, bl=bl)
            res.append((region.copy(), off))
        out.append(res)
    return out


def guarded_lib_pack_cases(libdir: str, fmt: str, mr: int, kr: int, sr: int, cases: list[dict],
                           placements=("end", "start")):
    """The library's LHS packers with source rows and packed output flush against guard pages
    (both placements).  case keys: x (float32 rows), bl, m_idx_start, pad (row-stride floats)."""
    import tilegen
    lib = tilegen.load(libdir)
    p = lib.packer(fmt, mr, kr, sr)
    out = []
    for c in cases:
        x = c["x"]
        m, k = x.shape
        for at in placements:
            src, _, _ = _strided_f32(m, k, k + c["pad"], at, 0, np.float32("nan"))
            src[:] = x
            lay = p.layout(c["bl"])
            need = lay.region_size(m, k, c["m_idx_start"])
            raw, off = _placed(need, at)
            buf = raw[off: off + need]
            buf[:] = 0
            p(src, bl=c["bl"], m_idx_start=c["m_idx_start"], out=buf)
            out.append(buf.copy())
    return out


# -- the runtime's LHS packing (tests/test_lhs_pack_vl.py) ---------------------------------------

def ops_packers(libdir: str, kind: str, w, x, threads=(1, 2)) -> dict:
    """lib.matmul on ``kind`` weights with every generated packer call recorded (name, mr) and
    every numpy LHS packer refusing (so a hot path that packs in numpy fails); then the
    selected kernel on the layout's numpy-packed LHS, single-threaded, for comparison."""
    import tilegen
    from tilegen.layout.registry import LHS_LAYOUTS
    from tilegen.runtime import binding

    used = []
    invoke = binding.Packer._invoke
    packs = {cls: cls.__dict__.get("pack") for cls in set(LHS_LAYOUTS.values())}

    def record(self, *args):
        used.append((self.name, self.mr))
        return invoke(self, *args)

    def refuse(self, *a, **kw):
        raise AssertionError(f"numpy LHS packer {type(self).__name__}.pack on the hot path")

    lib = tilegen.load(libdir)
    pw = lib.pack_weights(w, kind=kind)
    binding.Packer._invoke = record
    for cls in packs:
        cls.pack = refuse
    try:
        outs = [lib.matmul(x, pw, threads=t) for t in threads]
    finally:
        binding.Packer._invoke = invoke
        for cls, fn in packs.items():
            if fn is None:
                del cls.pack
            else:
                cls.pack = fn
    kern = lib.select(pw, x.shape[0])
    lay = kern.lhs_layout(pw.bl or 32)
    ref = np.zeros((x.shape[0], pw.n), np.float32)
    kern(lay.pack(x), pw, ref)
    p = lib.lhs_packer(kern, pw.bl or 32)
    res = {"kernel": kern.name, "spec": kern.spec.spec_string, "mr": lay.mr, "used": used,
           "outs": outs, "ref": ref, "packer": None if p is None else (p.name, p.mr),
           "found": lib.packer(p.spec.fmt, lay.mr, p.spec.kr, p.spec.sr).name if p else None}
    if p is not None:       # the library's pack_lhs and an unbound call
        base = lib.packers[p.name]
        bl = pw.bl or 32
        res["pack_lhs_same"] = bool(np.array_equal(
            lib.pack_lhs(p.spec.fmt, x, mr=lay.mr, kr=p.spec.kr, sr=p.spec.sr, bl=bl),
            lay.pack(x)))
        res["call_mr_same"] = bool(np.array_equal(base(x, bl=bl, mr=lay.mr), lay.pack(x)))
        try:
            base(x, bl=bl) if base.mr is None else base(x, bl=bl, mr=lay.mr + 1)
            res["unbound"] = ""
        except Exception as e:  # noqa: BLE001 - the message is the result
            res["unbound"] = f"{type(e).__name__}: {e}"
    return res
