"""llvm-mca model of every preset's default kernels (static model, see shared PERF.md).

    python bench/analyze_presets.py [OUTDIR]      # default bench/results

For each CPU preset of tilegen.build.TARGETS (aliases once) that has an llvm-mca model, runs
tilegen.analysis.mca on the preset's default kernels with -mcpu=<the preset's llvm_cpu> and writes
OUTDIR/analyze_<preset>.json, then OUTDIR/ANALYZE.md: one table of every (kernel, model) row
with the PERF.md anchor's efficiency where one applies.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's tilegen
import tilegen  # noqa: E402
from tilegen.analysis.mca import MODEL_SVE_VL, LoopReport, analyze, instruction_mix  # noqa: E402
from tilegen.build import TARGETS, Target, default_specs  # noqa: E402
from tilegen.generator.spec import KernelSpec  # noqa: E402

PERF_MODELS = ("neoverse-v2", "neoverse-n2", "neoverse-v1", "apple-m4")
# PERF.md anchors (KleidiAI v1.30 / XNNPACK hot loops, efficiency %), keyed by the tilegen
# tiles with the same shape, ISA and kr; values in PERF_MODELS order.
_ANCHORS: list[tuple[str, tuple[str, ...], tuple[int, ...]]] = [
    ("KleidiAI f32 6x16 NEON", ("f32:neon:6x16",), (99, 100, 50, 100)),
    ("XNNPACK f32 6x8 NEON ld128", ("f32:neon:6x8",), (100, 100, 75, 100)),
    ("KleidiAI q4 gemm dotprod 16x4 (kr8)", ("q4_0:dotprod:16x4", "q4_0_dx:dotprod:16x4"),
     (93, 93, 93, 93)),
    ("KleidiAI q4 gemm i8mm 8x4x32", ("q4_0:i8mm:8x4", "q4_0_dx:i8mm:8x4"), (79, 80, 66, 80)),
    ("KleidiAI q4 gemm i8mm 4x8", ("q4_0:i8mm:4x8", "q4_0_dx:i8mm:4x8"), (66, 67, 66, 67)),
    ("KleidiAI q4 gemv dotprod 1x8 (kr16)",
     ("q4_0:dotprod:1x8:k16:s2", "q4_0_dx:dotprod:1x8:k16:s2"), (44, 44, 44, 19)),
    ("KleidiAI q4 gemv dotprod 1x4 (kr8)", ("q4_0:dotprod:1x4", "q4_0_dx:dotprod:1x4"),
     (25, 17, 12, 17)),
]
ANCHORS: dict[tuple[str, str], tuple[str, int]] = {
    (spec, model): (name, pct) for name, specs, pcts in _ANCHORS for spec in specs
    for model, pct in zip(PERF_MODELS, pcts)}


def presets() -> list[Target]:
    seen: dict[str, Target] = {}
    for t in TARGETS.values():
        if t.llvm_cpu and t.name not in seen:
            seen[t.name] = t
    return list(seen.values())


def block_macs_per_cycle(spec: KernelSpec, r: LoopReport) -> float | None:
    if r.block32_cycles is None:
        return None
    rows = r.macs_per_iter // (spec.nr * (32 if spec.info.quantized else 4))
    return 32 * rows * spec.nr / r.block32_cycles


def row(t: Target, spec: KernelSpec, r: LoopReport) -> dict:
    d = r.as_dict()
    anchor = ANCHORS.get((spec.spec_string, r.model))
    d.update(preset=t.name, spec=spec.spec_string, regime="gemv" if spec.mr == 1 else "gemm",
             family=spec.family, block32_macs_per_cycle=block_macs_per_cycle(spec, r),
             anchor=anchor[0] if anchor else None, anchor_efficiency=anchor[1] / 100 if anchor else None)
    return d


def _git_rev() -> str:
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                       cwd=Path(__file__).resolve().parent)
    return p.stdout.strip() or "?"


def markdown(rows: list[dict]) -> str:
    out = ["# llvm-mca model of each preset's default kernels", "",
           f"`python bench/analyze_presets.py` at tilegen {tilegen.__version__} (commit "
           f"{_git_rev()}); static model, `llvm-mca-19 -mcpu=<preset's model> -iterations=200`. "
           "Efficiency = MAC-port bound / cycles per hot-loop iteration; block-32 = one 32-k block "
           "of the tile (q4: scale loads and conversion included; f32: 8 hot-loop iterations). "
           "Anchor = PERF.md's efficiency of the KleidiAI/XNNPACK kernel of the same tile, where one "
           "applies (PERF.md targets: f32 gemm >= 98%, f32 gemv >= 90%, q4 gemm >= 90%, q4 gemv "
           ">= 2x the anchor's MACs/cycle).", "",
           "| preset | kernel | spec | model | cycles/iter | efficiency | MACs/cycle | block-32 cycles "
           "| block-32 MACs/cycle | anchor |",
           "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for d in rows:
        blk = f"{d['block32_cycles']:.1f}" if d["block32_cycles"] is not None else "–"
        bm = f"{d['block32_macs_per_cycle']:.2f}" if d["block32_macs_per_cycle"] is not None else "–"
        anc = f"{100 * d['anchor_efficiency']:.0f}% ({d['anchor']})" if d["anchor"] else "–"
        out.append(f"| {d['preset']} | `{d['kernel']}` | {d['spec']} | {d['model']} | "
                   f"{d['cycles_per_iter']:.2f} | {100 * d['efficiency']:.1f}% | "
                   f"{d['macs_per_cycle']:.1f} | {blk} | {bm} | {anc} |")
    out += ["", "## Best default kernel per family and regime (block-32 MACs/cycle)", "",
            "| preset | family | regime | best kernel | block-32 MACs/cycle | hot-loop efficiency |",
            "|---|---|---|---|---:|---:|"]
    best: dict[tuple, dict] = {}
    for d in rows:
        k = (d["preset"], d["family"], d["regime"])
        if k not in best or (d["block32_macs_per_cycle"] or 0) > (best[k]["block32_macs_per_cycle"] or 0):
            best[k] = d
    for (p, f, reg), d in best.items():
        out.append(f"| {p} | {f} | {reg} | {d['spec']} | {d['block32_macs_per_cycle']:.2f} | "
                   f"{100 * d['efficiency']:.1f}% |")
    return "\n".join(out) + "\n"


def main(outdir: str = "bench/results") -> int:
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    every: list[dict] = []
    sme_rows: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as ex:
        for t in presets():
            every_spec = default_specs(t)
            # llvm-mca models SVE loops only on CPUs with SVE, and has no SME model: SME
            # kernels are reported by their hot loop's instruction mix instead
            sme = [s for s in every_spec if s.isa.startswith("sme")]
            specs = [s for s in every_spec if s not in sme and
                     (not s.isa.startswith("sve") or t.llvm_cpu in MODEL_SVE_VL)]
            reports = list(ex.map(lambda s: analyze(s, t.llvm_cpu), specs))
            rows = [row(t, s, r) for s, r in zip(specs, reports)]
            mixes = [dict(instruction_mix(s).as_dict(), spec=s.spec_string) for s in sme]
            (out / f"analyze_{t.name}.json").write_text(json.dumps(
                {"preset": t.name, "model": t.llvm_cpu, "features": sorted(t.features),
                 "kernels": rows, "sme_instruction_mix": mixes}, indent=2) + "\n")
            print(f"{t.name:<14} {t.llvm_cpu:<12} {len(rows)} kernels, {len(mixes)} SME", flush=True)
            every += rows
            sme_rows.update({m["kernel"]: m for m in mixes})
    md = markdown(every)
    if sme_rows:
        md += ("\n## SME kernels (no llvm-mca model): MAC instructions per hot-loop instruction\n\n"
               "| kernel | spec | MAC instructions | instructions | MAC/instruction |\n"
               "|---|---|---:|---:|---:|\n")
        for m in sorted(sme_rows.values(), key=lambda m: m["kernel"]):
            md += (f"| `{m['kernel']}` | {m['spec']} | {m['mac_insns']} | {m['insns']} | "
                   f"{m['mac_per_insn']:.3f} |\n")
    (out / "ANALYZE.md").write_text(md)
    print(f"wrote {out}/analyze_<preset>.json and {out / 'ANALYZE.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
