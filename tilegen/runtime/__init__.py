"""Runtime: CPU features, ctypes loading, numpy packing, calling kernels."""
from .cpu import CpuInfo, detect
from .library import ArgumentError, Kernel, Library, LoadError, PackedWeights, Packer, load
from ..layout.api import pack_lhs, pack_rhs, dequantize_rows

__all__ = ["CpuInfo", "detect", "ArgumentError", "Kernel", "Library", "LoadError",
           "PackedWeights", "Packer", "load", "pack_rhs", "pack_lhs",
           "dequantize_rows"]
