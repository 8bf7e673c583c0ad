"""Error table of the K-quant matmuls (issue #24): tilegen's kernel arithmetic and ggml's Q8_K
reference arithmetic, each against the float64 product of the dequantised weights and the float
activations (tilegen.reference.kquant; numpy only, no build, no emulation).

    python bench/kquant_error.py                  # markdown table on stdout
    python bench/kquant_error.py --json out.json  # the figures as JSON too

Weights: seeded random valid ggml blocks of every K-quant family of the registry (the RHS
layouts that take only their ggml blocks: q4_K, q5_K, q6_K; each layout's ``random_ggml``).
ggml's arithmetic: the family plugin's own ``matmul_ggml`` where it has one (iq4_xs: the Arm
NEON ``vec_dot_iq4_xs_q8_K`` float order), else tilegen.reference.kquant.matmul_ggml (the
generic K-quant lanes of Q4_K / Q5_K / Q6_K).
Activations: seeded, two kinds per shape — ``normal`` (standard normal) and ``heavy``
(Student t with 3 degrees of freedom: a few large values per row, as LLM activations have).
Figures: ``rms`` = RMS(error) / RMS(float64 result), ``max`` = max |error| / max |float64 result|;
``tg-gg`` = max |tilegen - ggml| / max |float64 result|.  Both paths quantise each activation row
per 256-k super-block to the same int8 values and scale (q8kp takes ggml's Q8_K rounding, up to
ggml's sign convention: docs/layouts.md#q8kp), so they differ only in the float order.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilegen.families import FAMILIES, plugin, rhs_layout_class  # noqa: E402
from tilegen.reference.kquant import (error_summary, matmul_f64_kquant, matmul_ggml,  # noqa: E402
                                      matmul_tilegen)

SHAPES = [(1, 256, 256), (1, 512, 4096), (8, 128, 1024), (16, 256, 4096), (32, 64, 2048)]
#: the K-quant kinds (their layouts take only ggml blocks) -> seeded random valid blocks
RAND = {f: rhs_layout_class(f).random_ggml for f in FAMILIES
        if getattr(rhs_layout_class(f), "ggml_only", None) == f}


def ggml_product(wkind: str, x, raw, n: int) -> np.ndarray:
    """ggml's arithmetic for family ``wkind``: the plugin's ``matmul_ggml`` or the shared one."""
    own = getattr(plugin(wkind), "matmul_ggml", None)
    return own(x, raw, n) if own else matmul_ggml(rhs_layout_class(wkind), x, raw, n)


def activations(kind: str, m: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal((m, k)).astype(np.float32)
    return rng.standard_t(3, (m, k)).astype(np.float32)


def rows() -> list[dict]:
    out = []
    for wkind in RAND:
        for i, (m, n, k) in enumerate(SHAPES):
            raw = rhs_layout_class(wkind).random_ggml(n, k, 100 + i)
            for akind in ("normal", "heavy"):
                x = activations(akind, m, k, 200 + i)
                rhs = rhs_layout_class(wkind)
                ref = matmul_f64_kquant(rhs, x, raw, n)
                tg, gg = matmul_tilegen(rhs, x, raw, n), ggml_product(wkind, x, raw, n)
                e_tg, e_gg = error_summary(tg, ref), error_summary(gg, ref)
                out.append({"kind": wkind, "m": m, "n": n, "k": k, "x": akind,
                            "tilegen": e_tg, "ggml": e_gg,
                            "tg_vs_gg": error_summary(tg, gg.astype(np.float64))["max_abs"]
                            / float(np.abs(ref).max())})
    return out


def table(res: list[dict]) -> str:
    lines = ["| kind | m x n x k | x | tilegen rms | tilegen max | ggml rms | ggml max | tg-gg max |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res:
        lines.append(f"| {r['kind']} | {r['m']}x{r['n']}x{r['k']} | {r['x']} | "
                     f"{r['tilegen']['rms_rel']:.3e} | {r['tilegen']['max_rel']:.3e} | "
                     f"{r['ggml']['rms_rel']:.3e} | {r['ggml']['max_rel']:.3e} | "
                     f"{r['tg_vs_gg']:.2e} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args(argv)
    res = rows()
    print(table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
