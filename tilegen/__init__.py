"""tilegen: generate, build and call Arm64 matrix-multiply micro-kernels."""
from .generator import KernelSpec, generate, parse_spec
from .layout import LayoutError
from .records import SpecError, __version__


def __getattr__(name):
    # Lazy imports keep `import tilegen` light (the emulated Python imports it often).
    if name == "build_library":
        from .build import build_library
        return build_library
    if name in ("load", "Library", "PackedWeights", "PackedLayouts"):
        from . import runtime
        return getattr(runtime, name)
    if name in ("pack_rhs", "pack_lhs", "dequantize_rows"):
        from .layout import api
        return getattr(api, name)
    if name in ("ArgumentError", "LoadError"):
        from .runtime import errors
        return getattr(errors, name)
    if name in ("BuildError", "TargetError", "ToolchainError"):
        from . import build
        return getattr(build, name)
    if name == "EmulateError":
        from .emulate.runner import EmulateError
        return EmulateError
    raise AttributeError(f"module 'tilegen' has no attribute {name!r}")


__all__ = ["KernelSpec", "SpecError", "LayoutError", "parse_spec", "generate", "build_library",
           "load", "pack_rhs", "pack_lhs", "dequantize_rows", "Library", "PackedWeights", "PackedLayouts",
           "ArgumentError", "LoadError", "BuildError", "TargetError", "ToolchainError",
           "EmulateError", "__version__"]
