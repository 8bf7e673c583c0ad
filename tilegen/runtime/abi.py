"""ABI conformance: every kernel and packer of a library once through the AAPCS64 probe.

The probe trampoline (``templates/abi_probe.S.j2``) fills the callee-saved registers with
known values, calls the routine with the argument block and returns a bit mask of the state
the routine did not preserve (bits in :data:`ABI_BITS` order)."""
from __future__ import annotations

import numpy as np

from .binding import Kernel, Packer
from .errors import ArgumentError, LoadError

__all__ = ["ABI_BITS", "check_abi"]

ABI_BITS = ([f"x{19 + i}" for i in range(10)] + [f"d{8 + i}" for i in range(8)] +
            ["sp", "fpcr", "svcr"])


def _probe_call(lib, obj, args) -> int:
    """Call ``obj``'s function with ``args`` through the probe; the mask it returns."""
    block = np.zeros(15, np.uint64)
    ints, floats, stack = [], [], []
    for p, v in zip(obj.entry["params"], args):
        if p["ctype"] == "float":
            floats.append(int(np.float32(v).view(np.uint32)))
        else:
            (ints if len(ints) < 8 else stack).append(int(v) & (2**64 - 1))
    if len(floats) > 2 or len(stack) > 4:
        raise ArgumentError(f"{obj.name}: signature does not fit the ABI probe")
    block[:len(ints)] = ints
    block[8:8 + len(floats)] = floats
    block[10:10 + len(stack)] = stack
    block[14] = 1 if "sme" in lib.cpu.features else 0     # SVCR readable: check it
    return int(lib.abi_probe(obj.address, block.ctypes.data))


def _exercise(obj, rng) -> None:
    """One small call of ``obj`` (random inputs) that runs its whole body."""
    m, n, k = 5, 7, 64
    x = rng.normal(size=(m, k)).astype(np.float32)
    if isinstance(obj, Packer):     # bf16 and f32 packers start at a row block
        whole = obj.spec.fmt in ("bf16px4", "bf16px2", "f32p")
        # a streaming packer packs this CPU's row blocks (units x SVL/32) only
        mr = (obj.spec.svl_rows(obj.svl_bytes) if obj.spec.streaming else obj.spec.vl_rows[0])
        qk = getattr(obj.spec.layout(32, mr), "qk", None)     # q8kp: whole 256-k super-blocks
        if qk:
            x = rng.normal(size=(m, qk)).astype(np.float32)
        obj(x, bl=32, m_idx_start=0 if whole else 1, mr=mr)
        return
    dst = np.zeros((m, n), np.float32)
    rhs_lay = obj.rhs_layout(32)
    qk = getattr(rhs_lay, "qk", None)
    if qk or rhs_lay.ggml_only:     # ggml blocks only (no float packer; K-quants: k whole
        k = qk or k                 # super-blocks): any bytes run
        x = rng.normal(size=(m, k)).astype(np.float32)
        rhs = rng.integers(0, 256, rhs_lay.packed_size(n, k), dtype=np.uint8)
    else:
        w = rng.normal(size=(n, k)).astype(np.float32)
        rhs = rhs_lay.pack_from_float(w) if obj.spec.info.quantized else rhs_lay.pack(w)
    # f32 rows as they are (the binding packs them for packed-f32 kernels), else packed here
    lhs = x if obj.abi.lhs_rows else obj.lhs_layout(32).pack(x)
    obj(lhs, rhs, dst, k=k, bl=32)


def check_abi(lib) -> dict[str, list[str]]:
    """Run every kernel and packer of ``lib`` the CPU supports once through the ABI probe;
    return, per routine, the callee-saved state it failed to preserve (empty = conforms)."""
    if lib.abi_probe is None:
        raise LoadError(f"{lib.path.name} has no ABI probe (rebuild it with this tilegen)")
    rng = np.random.default_rng(0)
    results: dict[str, list[str]] = {}
    for obj in [*lib.kernels.values(), *lib.packers.values()]:
        if not (lib.runnable(obj) if isinstance(obj, Kernel) else obj.features <= lib.cpu.features):
            continue
        masks: list[int] = []
        obj.probe = lambda o, a: masks.append(_probe_call(lib, o, a))
        try:
            _exercise(obj, rng)
        finally:
            obj.probe = None
        bad = 0
        for mk in masks:
            bad |= mk
        results[obj.name] = [b for i, b in enumerate(ABI_BITS) if bad >> i & 1]
    return results
