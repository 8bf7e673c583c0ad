"""The unit of an exported source tree: one file, its path and its text.

Shared by the tree writer (`tilegen.export.kleidiai`) and the packer generator
(`tilegen.export.packers_c`): each produces a list of `ExportFile`, and the writer puts
every one at `root / path`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportFile:
    """`path` is relative to the export root, with `/` separators
    (e.g. ``kai/ukernels/matmul/pack/kai_lhs_quant_pack_qai8dxp_f32.h``); `text` is the
    whole file."""

    path: str
    text: str
