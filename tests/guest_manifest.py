"""Guest-side helpers for the manifest-integrity tests (run in the emulated aarch64 Python)."""
from __future__ import annotations

import numpy as np

import tilegen


def load_and_run(libdir: str, name: str) -> str:
    """Load the library and call kernel `name` once through Library.kernel; returns
    'ok' or 'ExceptionType: message' (a SIGILL/SIGBUS kills the guest: GuestCrashed)."""
    try:
        lib = tilegen.load(libdir)
        return call_kernel(lib.kernel(name))
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return f"{type(e).__name__}: {e}"


def call_direct(libdir: str, name: str) -> str:
    """Call ``lib.kernels[name]`` directly (no Library.kernel gating)."""
    try:
        return call_kernel(tilegen.load(libdir).kernels[name])
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def call_packer_direct(libdir: str, name: str, features: list[str] | None = None) -> str:
    """Call packer `name`; with ``features``, on a CPU that has only those."""
    import dataclasses
    from tilegen.runtime.cpu import detect
    cpu = None if features is None else dataclasses.replace(detect(), features=frozenset(features))
    try:
        p = tilegen.load(libdir, cpu=cpu).packers[name]
        p(np.ones((4, 64), np.float32), bl=32)
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def call_kernel(kern) -> str:
    rng = np.random.default_rng(0)
    m, n, k = 5, 8, 64
    x = rng.normal(size=(m, k)).astype(np.float32)
    w = rng.normal(size=(n, k)).astype(np.float32)
    dst = np.zeros((m, n), np.float32)
    if kern.family == "f32":
        kern(x, kern.rhs_layout().pack(w), dst)
    else:
        kern(kern.lhs_layout(32).pack(x), kern.rhs_layout(32).pack_from_float(w), dst, k=k, bl=32)
    ref = x @ w.T
    err = float(np.max(np.abs(dst - ref)) / (np.max(np.abs(ref)) + 1e-6))
    return "ok" if err < 0.1 else f"wrong result (relative error {err:.3g})"


def load_without_generating(libdir: str, names: list[str]) -> str:
    """Load the library and call the kernels ``names`` with the register allocator and every
    renderer replaced (in every tilegen module that holds them) by functions that raise:
    loading and calling must use what the manifest and the spec strings give, never
    regenerate.  'ok', or the first refusal or error as 'ExceptionType: message'."""
    import importlib
    import sys
    from tilegen.generator.regalloc.pool import RegisterPool
    packers, regalloc, render = (importlib.import_module(f"tilegen.generator.{m}")
                                 for m in ("packers", "regalloc", "render"))
    importlib.import_module("tilegen.generator.validate")

    def refuse(what):
        def f(*args, **kwargs):
            raise AssertionError(f"{what} called while loading a library")
        return f

    originals = {regalloc.allocate: "the register allocator",
                 render.render: "the kernel renderer", render.generate: "the kernel renderer",
                 render.render_template: "the template renderer",
                 render.template_env: "the template environment",
                 render.render_abi_probe: "the ABI-probe renderer",
                 render.render_vl_query: "the VL-query renderer",
                 packers.render: "the packer renderer"}
    patched = []
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").startswith("tilegen"):
            for attr, value in list(vars(mod).items()):
                if callable(value) and any(value is o for o in originals):
                    what = next(w for o, w in originals.items() if value is o)
                    patched.append((mod, attr, value))
                    setattr(mod, attr, refuse(what))
    pool_init = RegisterPool.__init__
    RegisterPool.__init__ = refuse("RegisterPool (register allocation)")
    try:
        lib = tilegen.load(libdir)
        for name in names:
            got = call_kernel(lib.kernel(name))
            if got != "ok":
                return got
        return "ok" if patched else "nothing patched"
    except BaseException as e:  # noqa: BLE001 - the exception is the result
        return f"{type(e).__name__}: {e}"
    finally:
        RegisterPool.__init__ = pool_init
        for mod, attr, value in patched:
            setattr(mod, attr, value)
