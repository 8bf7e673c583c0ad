"""Runtime: CPU features, ctypes loading, numpy packing, calling kernels."""
from .cpu import CpuInfo, detect
from .library import ArgumentError, Kernel, Library, LoadError, PackedWeights, load, pack_rhs

__all__ = ["CpuInfo", "detect", "ArgumentError", "Kernel", "Library", "LoadError",
           "PackedWeights", "load", "pack_rhs"]
