"""The ops over a loaded library: matmul (LHS packed per thread over m, the matmul split over
n in multiples of n_step) and the workspace it needs.

``matmul`` checks its arguments as a plan does (:class:`tilegen.runtime.request.Request`) and
runs :func:`run` once; a plan without the native driver runs :func:`run` too."""
from __future__ import annotations

import numpy as np

from .checks import positive_int
from .request import Request, check_activations
from .threads import run_parallel, split

__all__ = ["matmul", "run", "workspace_size", "lhs_tasks", "kernel_tasks"]


def workspace_size(lib, op: str, m: int, n: int, k: int) -> int:
    """Bytes of packed activations a matmul on ``op`` weights of shape (n, k) needs for m rows
    with the library's preferred kernel (0 when the kernel reads f32 rows as they are)."""
    m, n, k = (positive_int(nm, v) for nm, v in (("m", m), ("n", n), ("k", k)))
    table = lib.kernel_table
    kern = table.pairs(op)[0].pick(m, table.gemv_threshold)
    if kern.abi.lhs_rows and not kern.spec.packs_f32_lhs:
        return 0
    return kern.lhs_packed_size(m, k, 32)


def matmul(lib, x: np.ndarray, packed, bias: np.ndarray | None = None,
           clamp: tuple[float, float] | None = None, threads: int | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """See :meth:`tilegen.runtime.library.Library.matmul`."""
    lib.ensure_open()
    req = Request(packed, bias, clamp, threads)
    lead, m = req.rows(x)
    given = out
    out = req.output(out, lead, x)
    if out is None:
        # the kernels read x while they write out, and the bias is read after them
        given[...] = matmul(lib, x, packed, bias, clamp, threads)
        return given
    x2 = np.ascontiguousarray(x.reshape(m, req.k))
    packed = lib.adopt(packed)       # a repack per call when no kernel reads its layout
    dst = out.reshape(m, req.n)
    run(lib, x2, packed, dst, req.kcmin, req.kcmax, req.threads)
    req.finish(dst)
    return out


def run(lib, x2: np.ndarray, packed, dst: np.ndarray, cmin: float, cmax: float,
        nthreads: int) -> None:
    """dst = clamp(x2 @ W.T) for contiguous rows x2 (m, k), split over nthreads
    (PackedLayouts: on the packing of the op m selects, :meth:`Library.route`)."""
    packed, kern = lib.route(packed, x2.shape[0])
    bl = packed.bl or 32
    lhs, packs = lhs_tasks(lib, packed.kind, kern, x2, bl, nthreads)
    run_parallel(packs, lib.workers)
    run_parallel(kernel_tasks(kern, lhs, packed, dst, bl, cmin, cmax, nthreads), lib.workers)


def lhs_tasks(lib, kind: str, kern, x2: np.ndarray, bl: int, parts: int) -> tuple:
    """(lhs, tasks): the LHS ``kern`` reads for contiguous rows x2 (m, k) -- x2 itself when
    the kernel reads f32 rows, else a zeroed buffer of its packed size -- and the tasks that
    fill it, split over m in multiples of m_step into at most ``parts`` (none for f32 rows).
    Activations over the LHS format's limit are refused here (ArgumentError)."""
    m, k = x2.shape
    lay = kern.lhs_layout(bl)
    if lay is None:     # f32 rows as they are
        return x2, []
    # packed activations (q4: quantised), split over m in multiples of m_step
    check_activations(kind, getattr(lay, "activation_limit", None), x2)
    lhs = np.zeros(lay.packed_size(m, k), np.uint8)
    neon = lib.lhs_packer(kern, bl)     # generated packer (VL-scaled: bound to lay.mr)

    def pack_part(m0, m1):    # m0 is a multiple of m_step (and so of the LHS mr)
        off = lay.packed_offset(m0, k)
        if neon is not None:
            neon(x2[m0:m1], bl=bl, out=lhs[off:])
        else:
            lhs[off:off + lay.region_size(m1 - m0, k)] = lay.pack(x2[m0:m1])
    return lhs, [lambda a=a, b=b: pack_part(a, b) for a, b in split(m, kern.m_step, parts)]


def kernel_tasks(kern, lhs: np.ndarray, packed, dst: np.ndarray, bl: int, cmin: float,
                 cmax: float, parts: int) -> list:
    """The kernel over all of dst's columns (dst = clamp(lhs @ W.T), W one matrix of
    PackedWeights in ``kern``'s layout), as at most ``parts`` tasks over n in multiples of
    n_step: each from the bytes of its panel onwards."""
    rhs, k = packed.data, packed.k

    def part(n0, n1):
        kern(lhs, rhs[kern.rhs_packed_offset(n0, k, bl):], dst[:, n0:n1], cmin, cmax, k=k, bl=bl)
    return [lambda a=a, b=b: part(a, b) for a, b in split(packed.n, kern.n_step, parts)]
