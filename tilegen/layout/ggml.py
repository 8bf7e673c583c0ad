"""ggml's block formats in numpy: ``block_q4_0`` (docs/layouts.md#ggml-q4_0) and ``block_q8_0``
(docs/layouts.md#ggml-q8_0), their quantisers, dequantisers and byte splitters, the checks
the packers reading them share (finite f16 block scales, the weight range a block scale holds),
and what the K-quant super-block codecs share (``QK_K``, :func:`kquant_blocks`; each K-quant
format's own codec is in its family plugin, :mod:`tilegen.families`).

A Q4_0 row of ``k`` values (k a multiple of 32) is ``k/32`` blocks of 18 bytes::

    struct block_q4_0 { uint16_t d;  /* f16 */  uint8_t qs[16]; };

byte ``qs[j]`` holds element ``j`` in its low nibble and element ``j + 16`` in its high nibble,
unsigned with zero point 8: ``x_j = (q_j - 8) * f32(d)``.

:func:`quantize_q4_0` reproduces ggml's ``quantize_row_q4_0_ref`` (and, byte for byte, the
``gguf`` Python package's ``gguf.quants.quantize(w, GGMLQuantizationType.Q4_0)``):

* ``max`` = the element of largest magnitude **with its sign** (the first one on equal
  magnitudes, ggml's strict ``amax < |v|`` scan);
* ``d = max / -8`` (f32), ``id = 1/d`` (f32, 0 if d == 0);
* ``q = min(15, (int)(x*id + 8.5f))`` (f32 multiply, f32 add, truncation);
* ``d`` stored as f16 (round to nearest even; ``max = +0.0`` gives ``d = -0.0`` = 0x8000 like ggml).

Both functions also take ``bl`` (a multiple of 32) for the "q4_0-style" rows with longer blocks
that ``kai_run_rhs_pack_nxk_qsi4c32pscalef16_qsu4c32s16s0`` reads (docs/layouts.md#qsi4c32pscalef16):
``[f16 d][bl/2 bytes]`` per block, byte ``j`` = element ``j`` (low) | element ``j + bl/2`` (high).
Only ``bl = 32`` is a ggml format.

A Q8_0 row of ``k`` values is ``k/32`` blocks of 34 bytes::

    struct block_q8_0 { uint16_t d;  /* f16 */  int8_t qs[32]; };     x_j = f32(d) * qs[j]

:func:`quantize_q8_0` reproduces ggml's ``quantize_row_q8_0_ref``.
"""
from __future__ import annotations

import numpy as np

from .base import LayoutError, round_half_away

QK4_0 = 32
BLOCK_Q4_0_BYTES = 18
QK8_0 = 32
BLOCK_Q8_0_BYTES = 34

__all__ = ["QK4_0", "BLOCK_Q4_0_BYTES", "quantize_q4_0", "dequantize_q4_0", "q4_0_row_bytes",
           "split_q4_0", "join_q4_0", "as_bytes", "F16_MAX", "check_weight_range",
           "check_block_scales", "Q4_0_MAX", "f16_bits_to_f32",
           "QK8_0", "BLOCK_Q8_0_BYTES", "quantize_q8_0", "split_q8_0", "join_q8_0",
           "dequantize_q8_0", "Q8_0_MAX"]

F16_MAX = 65504.0       # largest finite f16: the block scales of ggml's Q4_0 and Q8_0
Q4_0_MAX = 8 * F16_MAX  # largest |w| Q4_0 packers take: a block's scale is max|w| / -8, an f16
Q8_0_MAX = 127 * F16_MAX    # largest |w| strict quantize_q8_0 takes (a scale max|w|/127 is f16)


def f16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """raw IEEE half bits (ggml's block scales) -> float32 (exact)."""
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint16)).view(np.float16).astype(np.float32)


def _check_bl(bl: int) -> int:
    bl = int(bl)
    if bl < 32 or bl % 32:
        raise LayoutError(f"block length bl={bl} must be a positive multiple of 32")
    return bl


def check_weight_range(w: np.ndarray, limit: float, why: str) -> None:
    """LayoutError unless every weight of float32 (n, k) ``w`` is finite with |w| <= ``limit``
    (``why``: what sets the limit); names the first offending row and its max |w|."""
    a = np.abs(np.asarray(w, dtype=np.float32))
    bad = ~(a <= np.float32(limit))                 # NaN fails too
    if bad.any():
        r = int(np.argwhere(bad)[0][0])
        raise LayoutError(f"weights must be finite with |w| <= {limit:g} ({why}); row {r} of "
                          f"the (n, k) weights has max |w| = {float(a[r].max()):g}")


def check_block_scales(d_f16: np.ndarray, what: str, field: str = "scale") -> None:
    """LayoutError naming the first ggml block (its index, row and block within the row) of
    f16 scale bits ``d_f16`` (n, blocks per row) that is NaN or Inf: such a block has no
    values (ggml's dequantisation gives NaN rows), so raw-block packers refuse it.  ``field``
    names the f16 field in the message (``"scale"``; Q4_K's ``"dmin"``)."""
    d = np.asarray(d_f16, dtype=np.uint16)
    bad = (d & 0x7C00) == 0x7C00
    if bad.any():
        r, b = (int(i) for i in np.argwhere(bad)[0])
        val = "NaN" if d[r, b] & 0x03FF else ("-Inf" if d[r, b] & 0x8000 else "+Inf")
        raise LayoutError(f"ggml {what} block {r * d.shape[1] + b} (row {r}, block {b} of the "
                          f"row) has a non-finite f16 {field} ({val}, bits 0x{int(d[r, b]):04x}); "
                          f"{field}s must be finite")


def q4_0_row_bytes(k: int, bl: int = QK4_0) -> int:
    """Bytes of one q4_0(-style) row of k values."""
    bl = _check_bl(bl)
    if k % bl:
        raise LayoutError(f"k={k} is not a multiple of the block length bl={bl}")
    return k // bl * (2 + bl // 2)


def quantize_q4_0(w: np.ndarray, *, bl: int = QK4_0, strict: bool = False) -> np.ndarray:
    """float32 (n, k) -> uint8 (n, k/bl*(2+bl/2)): ggml ``quantize_row_q4_0_ref`` per row.

    ``strict``: refuse (LayoutError) weights that are not finite or have |w| > :data:`Q4_0_MAX`
    (8 x 65504), whose blocks ggml turns into an Inf scale and Inf/NaN values."""
    bl = _check_bl(bl)
    w = np.asarray(w)
    if w.dtype != np.float32:
        raise LayoutError(f"weights must be float32, got {w.dtype}")
    if w.ndim != 2:
        raise LayoutError(f"weights must be 2-D (n, k), got shape {w.shape}")
    n, k = w.shape
    if k == 0 or k % bl:
        raise LayoutError(f"k={k} must be a positive multiple of the block length bl={bl}")
    if strict:
        check_weight_range(w, Q4_0_MAX, "8 x 65504: Q4_0 stores each block's scale max|w|/8 "
                                        "as f16")
    nb = k // bl
    blocks = np.ascontiguousarray(w).reshape(n, nb, bl)
    imax = np.abs(blocks).argmax(axis=-1)[..., None]           # first of equal magnitudes
    vmax = np.take_along_axis(blocks, imax, axis=-1)           # (n, nb, 1), keeps its sign
    d = (vmax / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        # 1/d overflows only for |d| < 2**-128, whose f16 is 0: the block dequantises to 0
        # whatever q is, so q = 8 there (ggml casts inf and NaN to int: undefined)
        inv = np.where(np.isinf(inv), np.float32(0), inv)
        v = (blocks * inv).astype(np.float32) + np.float32(8.5)
    q = np.minimum(np.trunc(v), np.float32(15)).astype(np.uint8)   # v >= 0 for finite input
    half = bl // 2
    qs = q[..., :half] | (q[..., half:] << np.uint8(4))
    with np.errstate(over="ignore"):
        dh = d.astype(np.float16)
    out = np.concatenate([dh.view(np.uint8).reshape(n, nb, 2), qs], axis=-1)
    return out.reshape(n, nb * (2 + half))


def as_bytes(raw) -> np.ndarray:
    """ggml block data as a numpy array: bytes and bytearray as flat uint8 (no copy),
    anything else (uint8 arrays, memoryviews) through ``np.asarray``."""
    if isinstance(raw, (bytes, bytearray)):
        return np.frombuffer(raw, np.uint8)
    return np.asarray(raw)


def split_q4_0(raw: np.ndarray, n: int, k: int, *, bl: int = QK4_0) -> tuple[np.ndarray, np.ndarray]:
    """q4_0(-style) bytes -> (u4 uint8 (n, k) in k order, d f16 bits uint16 (n, k/bl))."""
    bl = _check_bl(bl)
    rb = q4_0_row_bytes(k, bl)
    raw = as_bytes(raw)
    if raw.dtype != np.uint8:
        raise LayoutError(f"q4_0 data must be uint8 bytes, got {raw.dtype}")
    if raw.size != n * rb:
        raise LayoutError(f"q4_0 data for n={n}, k={k}, bl={bl} must hold {n * rb} bytes "
                          f"({n} rows of {rb}), got shape {raw.shape}")
    nb, half = k // bl, bl // 2
    b = np.ascontiguousarray(raw).reshape(n, nb, 2 + half)
    d = np.ascontiguousarray(b[..., :2]).view("<u2").reshape(n, nb)
    qs = b[..., 2:]
    u = np.concatenate([qs & np.uint8(0x0F), qs >> np.uint8(4)], axis=-1)   # (n, nb, bl)
    return u.reshape(n, k), d


def join_q4_0(u4: np.ndarray, d_f16: np.ndarray, *, bl: int = QK4_0) -> np.ndarray:
    """Inverse of :func:`split_q4_0`: u4 (n, k) + f16 bits (n, k/bl) -> uint8 (n, row bytes)."""
    bl = _check_bl(bl)
    u4 = np.asarray(u4, dtype=np.uint8)
    n, k = u4.shape
    nb, half = k // bl, bl // 2
    u = u4.reshape(n, nb, bl)
    qs = (u[..., :half] & 0x0F) | ((u[..., half:] & 0x0F) << 4)
    d = np.ascontiguousarray(np.asarray(d_f16, dtype="<u2").reshape(n, nb))
    return np.concatenate([d.view(np.uint8).reshape(n, nb, 2), qs.astype(np.uint8)],
                          axis=-1).reshape(n, nb * (2 + half))


def dequantize_q4_0(raw: np.ndarray, n: int, k: int, *, bl: int = QK4_0) -> np.ndarray:
    """q4_0(-style) bytes (n rows, or flat) -> float32 (n, k): ``(q - 8) * f32(d)``."""
    u, d = split_q4_0(raw, n, k, bl=bl)
    df = d.view(np.float16).astype(np.float32)
    vals = (u.astype(np.int16) - 8).astype(np.float32).reshape(n, k // bl, bl)
    with np.errstate(invalid="ignore"):          # inf scale * 0 = NaN, as in ggml/gguf
        return (df[..., None] * vals).astype(np.float32).reshape(n, k)


# ----------------------------------------------------------------------------------------
# ggml block_q8_0
# ----------------------------------------------------------------------------------------
def _check_q8_k(k: int) -> int:
    k = int(k)
    if k < 1 or k % QK8_0:
        raise LayoutError(f"k={k} must be a positive multiple of {QK8_0} for Q8_0 rows")
    return k


def quantize_q8_0(w: np.ndarray, *, strict: bool = False) -> np.ndarray:
    """float32 (n, k) -> uint8 (n, k/32*34): ggml ``quantize_row_q8_0_ref`` per row.

    Per block of 32: ``amax = max|x|``, ``d = amax / 127`` (f32), ``id = 1/d`` (0 if d == 0),
    ``qs = roundf(x * id)`` (f32 product, ties away), ``d`` stored as f16 (nearest even).
    ``strict``: refuse (LayoutError) weights that are not finite or have |w| > :data:`Q8_0_MAX`
    (127 x 65504), whose blocks get an Inf scale."""
    w = np.asarray(w)
    if w.dtype != np.float32 or w.ndim != 2:
        raise LayoutError(f"weights must be 2-D float32 (n, k), got {w.dtype} {w.shape}")
    n, k = w.shape
    _check_q8_k(k)
    if strict:
        check_weight_range(w, Q8_0_MAX, "127 x 65504: Q8_0 stores each block's scale "
                                        "max|w|/127 as f16")
    nb = k // QK8_0
    blocks = np.ascontiguousarray(w).reshape(n, nb, QK8_0)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)
        # 1/d overflows only for d < 2**-128, whose f16 is 0: q = 0 there (ggml casts inf)
        inv = np.where(np.isinf(inv), np.float32(0), inv)
        q = round_half_away((blocks * inv[..., None]).astype(np.float32))
        dh = d.astype(np.float16)
    qs = q.astype(np.int8)
    out = np.concatenate([dh.view(np.uint8).reshape(n, nb, 2), qs.view(np.uint8)], axis=-1)
    return out.reshape(n, nb * BLOCK_Q8_0_BYTES)


def split_q8_0(raw: np.ndarray, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes -> (qs int8 (n, k), d f16 bits uint16 (n, k/32))."""
    k = _check_q8_k(k)
    raw = as_bytes(raw)
    if raw.dtype != np.uint8:
        raise LayoutError(f"Q8_0 data must be uint8 bytes, got {raw.dtype}")
    nb = k // QK8_0
    if raw.size != n * nb * BLOCK_Q8_0_BYTES:
        raise LayoutError(f"Q8_0 data for n={n}, k={k} must hold {n * nb * BLOCK_Q8_0_BYTES} bytes, "
                          f"got shape {raw.shape}")
    b = np.ascontiguousarray(raw).reshape(n, nb, BLOCK_Q8_0_BYTES)
    d = np.ascontiguousarray(b[..., :2]).view("<u2").reshape(n, nb)
    qs = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, k)
    return qs, d


def join_q8_0(qs: np.ndarray, d_f16: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_q8_0`."""
    qs = np.asarray(qs, dtype=np.int8)
    n, k = qs.shape
    nb = _check_q8_k(k) // QK8_0
    d = np.ascontiguousarray(np.asarray(d_f16, dtype="<u2").reshape(n, nb))
    return np.concatenate([d.view(np.uint8).reshape(n, nb, 2),
                           np.ascontiguousarray(qs).view(np.uint8).reshape(n, nb, QK8_0)],
                          axis=-1).reshape(n, nb * BLOCK_Q8_0_BYTES)


def dequantize_q8_0(raw: np.ndarray, n: int, k: int) -> np.ndarray:
    """Q8_0 bytes -> float32 (n, k) = f32(d) * qs (one f32 multiply, exact here: 11 x 8 bits)."""
    qs, d = split_q8_0(raw, n, k)
    df = d.view(np.float16).astype(np.float32)
    with np.errstate(invalid="ignore"):
        return (df[..., None] * qs.astype(np.float32).reshape(n, -1, QK8_0)).astype(np.float32).reshape(n, k)


# ----------------------------------------------------------------------------------------
# ggml K-quants: what every super-block format shares (QK_K = 256 weights per block).  Each
# format's own block layout, split/join, dequantisation and checks are in its family plugin
# (tilegen.families.q4_k, tilegen.families.q6_k).
# ----------------------------------------------------------------------------------------
QK_K = 256

__all__ += ["QK_K", "check_superblocks", "kquant_blocks", "random_f16_scales",
            "refuse_float_kquant"]


def check_superblocks(k) -> int:
    """Super-blocks per row of k values; LayoutError unless k is a positive multiple of 256."""
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1 or k % QK_K:
        raise LayoutError(f"k={k!r}: k must be a multiple of 256 (QK_K, the K-quant "
                          f"super-block), and positive")
    return int(k) // QK_K


def kquant_blocks(raw, n, k, block_bytes: int, what: str) -> np.ndarray:
    """ggml K-quant rows as uint8 (n, k/256, block_bytes); LayoutError on size or dtype."""
    S = check_superblocks(k)
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise LayoutError(f"n must be a positive integer, got {n!r}")
    raw = as_bytes(raw)
    if raw.dtype != np.uint8:
        raise LayoutError(f"{what} data must be uint8 bytes, got {raw.dtype}")
    need = int(n) * S * block_bytes
    if raw.size != need:
        short = " (truncated)" if raw.size < need else ""
        raise LayoutError(f"{what} data for n={n}, k={k} must hold {need} bytes ({n} rows of "
                          f"{S} blocks of {block_bytes}), got {raw.size}{short}")
    return np.ascontiguousarray(raw).reshape(int(n), S, block_bytes)


def random_f16_scales(rng, shape, scale: float) -> np.ndarray:
    """Positive finite f16 bits, magnitudes around ``scale`` (never zero)."""
    v = (rng.uniform(0.25, 1.0, shape) * scale).astype(np.float16)
    return v.view(np.uint16)


def refuse_float_kquant(kind: str) -> None:
    """K-quant weights come only as ggml blocks: float input is refused (LayoutError)."""
    raise LayoutError(f"{kind} weights are taken only as ggml {kind} blocks (from_ggml= / "
                      f"pack_from_ggml, e.g. from a GGUF file): tilegen does not quantise float "
                      f"weights to {kind} (ggml's quantize_row_{kind}_ref is not ported)")
