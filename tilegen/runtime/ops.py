"""The ops over a loaded library: matmul (LHS packed per thread over m, the matmul split over
n in multiples of n_step) and the workspace it needs."""
from __future__ import annotations

import math

import numpy as np

from .checks import clamp_pair, positive_int, thread_count
from .errors import ArgumentError
from .packed import PackedLayouts, PackedWeights
from .threads import default_threads, run_parallel, split

__all__ = ["matmul", "workspace_size"]

INF = math.inf


def workspace_size(lib, op: str, m: int, n: int, k: int) -> int:
    """Bytes of packed activations a matmul on ``op`` weights of shape (n, k) needs for m rows
    with the library's preferred kernel (0 when the kernel reads f32 rows as they are)."""
    m, n, k = (positive_int(nm, v) for nm, v in (("m", m), ("n", n), ("k", k)))
    kern = lib._pairs(op)[0].pick(m, lib.gemv_threshold)
    if kern.family == "f32" and not kern.spec.packs_f32_lhs:
        return 0
    return kern.lhs_packed_size(m, k, 32)


def matmul(lib, x: np.ndarray, packed: PackedWeights, bias: np.ndarray | None = None,
           clamp: tuple[float, float] | None = None, threads: int | None = None,
           out: np.ndarray | None = None) -> np.ndarray:
    """See :meth:`tilegen.runtime.library.Library.matmul`."""
    lib.ensure_open()
    if not isinstance(packed, (PackedWeights, PackedLayouts)):
        raise ArgumentError(f"weights must be PackedWeights or PackedLayouts (see lib.pack_weights), "
                            f"got {type(packed).__name__}")
    if bias is not None:
        bias = np.asarray(bias)
        if bias.dtype != np.float32 or bias.shape != (packed.n,):
            raise ArgumentError(f"bias must be float32 of shape ({packed.n},), "
                                f"got {bias.dtype} {bias.shape}")
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise ArgumentError(f"x must be a float32 numpy array, got "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.ndim < 2:
        raise ArgumentError(f"x must have shape (m, k) or (..., m, k), got {x.shape}")
    if x.shape[-1] != packed.k:
        raise ArgumentError(f"x has k={x.shape[-1]}, packed weights have k={packed.k}")
    nthreads = default_threads() if threads is None else thread_count(threads)
    clamp = clamp_pair(clamp)
    cmin, cmax = (-INF, INF) if clamp is None else clamp     # no clamp: Inf/NaN pass
    lead = x.shape[:-1]
    x2 = np.ascontiguousarray(x.reshape(-1, packed.k))
    m = x2.shape[0]
    if m == 0:
        raise ArgumentError(f"x has no rows (shape {x.shape})")
    shape = (*lead, packed.n)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    elif not isinstance(out, np.ndarray) or out.shape != shape or out.dtype != np.float32 \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise ArgumentError(f"out must be a writeable C-contiguous float32 array of shape {shape}")
    elif any(a is not None and np.shares_memory(out, a) for a in (x, bias, *_datas(packed))):
        # the kernels read x while they write out, and the bias is read after them
        out[...] = matmul(lib, x, packed, bias, clamp, threads)
        return out
    packed = lib.adopt(packed)       # a repack per call when no kernel reads its layout
    dst = out.reshape(m, packed.n)
    if bias is None:
        _run(lib, x2, packed, dst, cmin, cmax, nthreads)
    else:
        _run(lib, x2, packed, dst, -INF, INF, nthreads)
        dst += bias
        if clamp is not None:
            np.minimum(np.maximum(dst, np.float32(cmin), out=dst), np.float32(cmax), out=dst)
    return out


def _datas(packed) -> tuple:
    return packed.datas if isinstance(packed, PackedLayouts) else (packed.data,)


def _run(lib, x2: np.ndarray, packed, dst: np.ndarray, cmin: float,
         cmax: float, nthreads: int) -> None:
    """dst = clamp(x2 @ W.T) for contiguous rows x2 (m, k), split over nthreads
    (PackedLayouts: on the packing of the op m selects, :meth:`Library.route`)."""
    m = x2.shape[0]
    packed, kern = lib.route(packed, m)
    k, bl = packed.k, packed.bl or 32
    lay = kern.lhs_layout(bl)
    if lay is None:     # f32 rows as they are
        lhs = x2
    else:   # packed activations (q4: quantised), split over m in multiples of m_step
        limit = getattr(lay, "activation_limit", None)
        if limit is not None:
            amax = float(np.abs(x2).max())      # NaN when x has a NaN
            if not amax <= limit[0]:
                raise ArgumentError(f"{packed.kind} activations must be finite with |x| <= "
                                    f"{limit[0]:g} ({limit[1]}); got max |x| = {amax:g}")
        lhs = np.zeros(lay.packed_size(m, k), np.uint8)
        neon = lib.lhs_packer(kern, bl)     # generated packer (VL-scaled: bound to lay.mr)

        def pack_part(m0, m1):    # m0 is a multiple of m_step (and so of the LHS mr)
            off = lay.packed_offset(m0, k)
            if neon is not None:
                neon(x2[m0:m1], bl=bl, out=lhs[off:])
            else:
                lhs[off:off + lay.region_size(m1 - m0, k)] = lay.pack(x2[m0:m1])
        run_parallel([lambda a=a, b=b: pack_part(a, b)
                      for a, b in split(m, kern.m_step, nthreads)], lib.workers)
    rhs = packed.data

    def part(n0, n1):       # the kernel on columns n0..n1: bytes from their panel onwards
        kern(lhs, rhs[kern.rhs_packed_offset(n0, k, bl):], dst[:, n0:n1], cmin, cmax, k=k, bl=bl)
    run_parallel([lambda a=a, b=b: part(a, b) for a, b in split(packed.n, kern.n_step, nthreads)],
                 lib.workers)
