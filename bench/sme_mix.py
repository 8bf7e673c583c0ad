"""SME2 rows of issue #15 item 5: tilegen's kernels and KleidiAI's, counted by one static model
(tilegen/analyze_sme.py: instruction mix per hot-loop iteration and per 32-k block, MACs per
128-bit SVL granule).

    python bench/sme_mix.py --kleidiai /tmp/kai [--out bench/results/sme_mix]

KleidiAI's kernels are read from a directory outside this repository (excerpts of their
public sources: the hot loop and, for q4, the block loop, taken from ARM-software/kleidiai at
the commits named below); none of their code is kept here.  Each entry names the file, the
label of its hot loop, k per iteration, and for q4 the block loop and its inner loops' trips.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilegen.analyze_sme import SME_HEADER, count_kleidiai, sme_report  # noqa: E402

_KAI = "kai/ukernels/matmul"
# row -> (tilegen spec strings, KleidiAI kernel: file in --kleidiai, source path@commit,
#         hot-loop label, k per iteration, block label, block inner-loop trips)
ROWS = {
    "SME2 f32 gemm (FMOPA)": (
        ["f32:sme2:2vlx2vl", "f32:sme2:1vlx4vl"],
        ("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa.c.excerpt",
         f"{_KAI}/matmul_clamp_f32_f32p_f32p/kai_matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_"
         f"sme2_mopa.c", "7", 4, None, None)),
    "SME2 f32 gemv (ZA FMLA)": (
        ["f32:sme2:1x4vl", "f32:sme2:1x16vl"],
        ("f32_f32p16vlx1b_1x16vl_sme2_mla.c.excerpt",
         f"{_KAI}/matmul_clamp_f32_f32_f32p/kai_matmul_clamp_f32_f32_f32p16vlx1b_1x16vl_sme2_mla.c"
         "@e4e3c5495611e49df41d34ac4cdb38552b0dd761 (width 4)", "23", 4, None, None)),
    "SME2 q4 gemm": (
        ["q4_0:sme:1vlx2vl", "q4_0_s1s0:sme2:1vlx4vl"],
        ("qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa.c.excerpt",
         f"{_KAI}/matmul_clamp_f32_qsi8d32p_qsi4c32p/kai_matmul_clamp_f32_qsi8d32p1vlx4_"
         "qsi4c32p4vlx4_1vlx4vl_sme2_mopa.c@50fc897953c1cd7530f109ed39f2161384b7a395",
         "4", 4, "3", {"4": "32//4", "5": "svl//32"})),
    "SME2 q4 gemv": (
        ["q4_0:sme2:1x2vl", "q4_0:sme2:1x4vl", "q4_0_s1s0:sme2:1x4vl"],
        ("qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot.c.excerpt",
         f"{_KAI}/matmul_clamp_f32_qsi8d32p_qsi4c32p/kai_matmul_clamp_f32_qsi8d32p1x4_"
         "qsi4c32p4vlx4_1x4vl_sme2_sdot.c@202e455f2b2f44a6cb2ffadcc94396f21636b743",
         "3", 16, "2", {"3": "32//16"})),
}


def collect(kai_dir: Path | None) -> list[dict]:
    out = []
    for row, (specs, kai) in ROWS.items():
        for s in specs:
            try:
                r = sme_report(s)
            except Exception as e:      # a tile this branch does not generate
                out.append({"row": row, "spec": s, "source": "tilegen", "error": str(e)})
                continue
            out.append({"row": row, "spec": s, **r.as_dict()})
        if kai_dir is not None:
            fname, src, hot, k, blk, trips = kai
            text = (kai_dir / fname).read_text()
            r = count_kleidiai(Path(src.split("@")[0]).name.removesuffix(".c"), text, hot, k,
                               blk, trips)
            out.append({"row": row, "spec": src, **r.as_dict(), "hot_label": hot,
                        "block_label": blk, "block_trips": trips})
    return out


def markdown(rows: list[dict], cmd: str) -> str:
    lines = ["# SME2 kernels: static instruction mix (tilegen vs KleidiAI)", "",
             f"Command: `{cmd}`", "",
             "Model: tilegen/analyze_sme.py (counting rule in its docstring): MACs per 128-bit "
             "SVL granule (SVL = 128); per-32-k-block figures at SVL = 512 (block loops "
             "expanded).", "",
             "| row | kernel | source | k/iter | insns | MAC insns | MAC ins / ins | MACs/ins "
             "(128) | loads | loads/kMAC | block insns (512) | block MACs/ins (512) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['row']} | {r['spec']} | tilegen | – | – | – | – | – | – | – | – "
                         f"| ({r['error'][:60]}) |")
            continue
        blk = (f"{r['block_insns']} | {r['block_macs_per_insn']}" if "block_insns" in r
               else "– | –")
        lines.append(f"| {r['row']} | {r['kernel']} | {r['source']} | {r['k_per_iter']} | "
                     f"{r['insns']} | {r['mac_insns']} | {r['mac_per_insn']:.3f} | "
                     f"{r['macs_per_insn_128']:.2f} | {r['loads']} | "
                     f"{1000 * r['loads_per_mac_128']:.2f} | {blk} |")
    lines += ["", "Notes:",
              "- `MAC ins / ins`: MAC instructions per hot-loop instruction (loop control and "
              "pointer steps included); `MACs/ins (128)`: multiply-accumulates per instruction "
              "at SVL = 128 (outer products x g^2, ZA-array and Z-register ops x g at "
              "SVL = 128 g).",
              "- Block figures: one 32-k block (q4_0 scale block) of the whole tile with the "
              "block's loops expanded at SVL = 512 (ZA row-slice loops run SVL/32 times), "
              "scale handling included; per-tile passes outside the block loop (tilegen's "
              "q4_0_s1s0 gemm zeroes and clamps its dst rows once per tile, KleidiAI's takes "
              "the first-block path once) are not in them.",
              "- KleidiAI's q4 gemm block is its K-loop body on the path of every block after "
              "the first (`.ACCUMULATE`); KleidiAI's kernels were read from "
              "ARM-software/kleidiai (paths and commits in the `spec` column) into a directory "
              "outside this repository, hot loop and block loop only."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kleidiai", type=Path, help="directory of the KleidiAI excerpts")
    ap.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    a = ap.parse_args()
    rows = collect(a.kleidiai)
    cmd = "python bench/sme_mix.py" + (f" --kleidiai {a.kleidiai}" if a.kleidiai else "") + (
        f" --out {a.out}" if a.out else "")
    print(SME_HEADER.replace("kernel (SME static model: per 128-bit SVL granule)", "row / kernel"))
    for r in rows:
        if "error" in r:
            print(f"{r['spec']:<62} error: {r['error'][:80]}")
        else:
            print(f"{r['kernel'][:62]:<62} {r['k_per_iter']:4d} {r['insns']:5d} "
                  f"{r['mac_insns']:5d} {r['mac_per_insn']:7.3f} {r['macs_per_insn_128']:8.2f} "
                  f"{r['loads']:5d} "
                  f"{1000 * r['loads_per_mac_128']:8.2f} {r.get('block_insns', '-'):>6} "
                  f"{r.get('block_macs_per_insn', '-'):>8}")
    if a.out:
        doc = {"command": cmd, "rows": rows}
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(markdown(rows, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
