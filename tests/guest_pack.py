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

    case keys: name, fmt ('qai8dxp' | 'qsi8d32p'), args (dict of the C integer arguments),
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
            if c["fmt"] == "qai8dxp":
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
