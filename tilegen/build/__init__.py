"""Toolchain discovery, assembling, linking and the library manifest."""
from .library import BuildError, BuildResult, build_library, library_filename, MANIFEST_NAME
from .defaults import default_specs
from .targets import DEFAULT_KERNELS, TARGETS, Target, TargetError, get_target
from .toolchain import Toolchain, ToolchainError, discover

__all__ = ["BuildError", "BuildResult", "build_library", "library_filename", "MANIFEST_NAME",
           "DEFAULT_KERNELS", "TARGETS", "Target", "TargetError", "default_specs", "get_target",
           "Toolchain", "ToolchainError", "discover"]
