"""Charts of llvm-mca reports (`tilegen analyze --plot`); needs matplotlib (``tilegen[plot]``)."""
from __future__ import annotations

import os
from typing import Sequence

__all__ = ["PlotError", "efficiency_chart"]


class PlotError(RuntimeError):
    """A chart that cannot be drawn (matplotlib missing)."""


def efficiency_chart(reports: Sequence, models: Sequence[str], path: str | os.PathLike) -> None:
    """Write a PNG bar chart of hot-loop efficiency per kernel, one bar per llvm-mca model
    (``reports``: :class:`tilegen.analysis.mca.LoopReport`; a kernel without a report for a model
    gets no bar)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError("plotting needs matplotlib: pip install 'tilegen[plot]'") from None
    names = sorted({r.kernel for r in reports})
    eff = {(r.kernel, r.model): 100 * r.efficiency for r in reports}
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.9), 4.5))
    width = 0.8 / max(1, len(models))
    for i, m in enumerate(models):
        ax.bar([j + i * width for j in range(len(names))],
               [eff.get((nm, m), 0.0) for nm in names], width, label=m)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))])
    ax.set_xticklabels([nm.replace("matmul_clamp_f32_", "") for nm in names], rotation=60,
                       ha="right", fontsize=7)
    ax.set_ylabel("hot-loop efficiency (%)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
