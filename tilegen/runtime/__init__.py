"""Runtime: CPU features, ctypes loading, numpy packing, calling kernels."""
from .cpu import CpuInfo, detect
from .binding import Kernel, Packer
from .errors import ArgumentError, LoadError
from .library import Library, load
from .packed import PackedLayouts, PackedWeights
from ..layout.api import pack_lhs, pack_rhs, dequantize_rows

__all__ = ["CpuInfo", "detect", "ArgumentError", "Kernel", "Library", "LoadError",
           "PackedWeights", "PackedLayouts", "Packer", "load", "pack_rhs", "pack_lhs",
           "dequantize_rows"]
