"""Source-tree exports of tilegen kernels for other projects' builds."""

from .files import ExportFile

__all__ = ["ExportFile"]
