"""SME/SME2 kernels by one static model (tilegen/analysis/sme.py): tilegen against the KleidiAI
kernel llama.cpp runs, per exported SME name, plus reference rows.

    python bench/sme_mix.py [--kleidiai TREE_OR_TARBALL ...] [--out bench/results/sme_mix]

KleidiAI's side is read from real KleidiAI source trees: each ``--kleidiai`` is an extracted
tree (its root: ``CMakeLists.txt``, ``kai/``) or a release tarball, which is extracted once into
the tilegen cache (``tilegen.emulate.provision.ensure_kleidiai_source``).  Without
``--kleidiai`` the two release tarballs next to the repository are used
(``../shared/thirdparty/kleidiai``: v1.24.0, the release llama.cpp pins, and v1.30.0).  Each
kernel's file is found in the tree by its name (``kai_<name>_asm.S``, else the inline asm of
``kai_<name>.c``); which loop is its hot loop and its 32-k block is in
``tilegen.analysis.sme.KAI_RECIPES``.  Nothing of KleidiAI's code is kept in this repository.

Every kernel (tilegen's and KleidiAI's) also goes through the SME-unit model: its block's
instructions on the SME unit and on the core, by class, and the block's bound in cycles on
Apple M4 (``tilegen.analysis.sme.M4_UNITS``, the per-class table with its sources).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilegen.analysis.sme import (KAI_PACKERS, M4_UNITS, SME_HEADER, SME_LEGEND,  # noqa: E402
                                 UNIT_HEADER, UNIT_LEGEND, kleidiai_packer_mix, kleidiai_report,
                                 kleidiai_version, packer_call_insns, packer_mix, sme_report)
from tilegen.generator import parse_spec  # noqa: E402
from tilegen.generator.packers import packer_for, streaming_packer_for  # noqa: E402
from tilegen.export.kleidiai import KERNELS  # noqa: E402
from tilegen.analysis.tune import grid_specs  # noqa: E402
from tilegen.families import KQUANT_FAMILIES  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "kleidiai"
DEFAULT_TARBALLS = ("kleidiai-v1.24.0.tar.gz", "kleidiai-v1.30.0.tar.gz")

# exported names with no tilegen kernel behind them: the tilegen kernel compared instead
CLOSEST = {
    "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa": (
        "q4_0_s1s0:sme2:1vlx4vl",
        "the export runs generated portable C for this name; tilegen's SME2 q4 gemm "
        "(int8 LHS, LUTI4 + SMOPA, f32 sums in dst between blocks) for comparison"),
}
# reference rows: (row, tilegen specs, KleidiAI kernel or None)
REFERENCE = (
    ("SME2 f32 gemv, 16vl panels", ["f32:sme2:1x16vl", "f32:sme2:1x4vl"],
     "matmul_clamp_f32_f32_f32p16vlx1b_1x16vl_sme2_mla"),
    ("SME2 q4 gemm, int8 LHS", ["q4_0_s1s0:sme2:1vlx4vl", "q4_0:sme:1vlx2vl"],
     "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa"),
    ("SME2 q4 gemv, tilegen's other tiles", ["q4_0:sme2:1x2vl", "q4_0:sme2:1x4vl"], None),
    ("SME2 bf16 / f32 gemm, tilegen's other tiles",
     ["bf16:sme2:1vlx4vl", "bf16:sme2:4vlx1vl", "f32:sme2:1vlx4vl"], None),
)


def reference_rows() -> tuple:
    """:data:`REFERENCE`, then every K-quant family: the SME2 tiles the tuner's grid accepts,
    gemms by falling nr, then gemvs by rising nr."""
    grid = sorted(grid_specs(KQUANT_FAMILIES).items(), key=lambda kv: (
        kv[1].is_gemv, kv[1].nr if kv[1].is_gemv else -kv[1].nr))
    return REFERENCE + tuple(
        (f"SME2 {fam} (block: one 256-k super-block)",
         [s for s, spec in grid if spec.family == fam and spec.isa == "sme2"], None)
        for fam in KQUANT_FAMILIES)


def trees(args: list[str] | None) -> list[tuple[str, Path, str]]:
    """(version, tree, what was given) per KleidiAI source."""
    from tilegen.emulate.provision import ensure_kleidiai_source
    given = args or [str(SHARED / t) for t in DEFAULT_TARBALLS]
    out = []
    for g in given:
        p = Path(g)
        tree = ensure_kleidiai_source(p, quiet=True) if p.is_file() else p
        out.append((kleidiai_version(tree), tree, g))
    return out


def _tilegen(spec: str) -> dict:
    return sme_report(spec).as_dict()


def collect(kai: list[tuple[str, Path, str]]) -> list[dict]:
    rows = []
    for k in KERNELS:
        if "_sme" not in k.name:
            continue
        spec, note = (k.spec, k.note) if k.spec else CLOSEST[k.name]
        rows.append({"group": "exported", "name": k.name, "spec": spec,
                     "exported": k.spec is not None, "note": note, "tilegen": _tilegen(spec),
                     "kleidiai": {v: kleidiai_report(t, k.name).as_dict() for v, t, _ in kai}})
    for row, specs, kname in reference_rows():
        for s in specs:
            rows.append({"group": "reference", "row": row, "name": kname, "spec": s,
                         "tilegen": _tilegen(s),
                         "kleidiai": ({v: kleidiai_report(t, kname).as_dict() for v, t, _ in kai}
                                      if kname else {})})
    return rows


SVLS = (128, 256, 512, 1024, 2048)
# the SME kernels whose LHS the VL packers write, for the share of a whole matmul
PACKER_KERNELS = (("f32p", 1, "f32:sme2:2vlx2vl"), ("bf16px2", 2, "bf16:sme2:2vlx2vl"))
SHARE_N, SHARE_K = 4096, 4096


def packers(kai: list[tuple[str, Path, str]]) -> list[dict]:
    """Instructions per packed element of the SME kernels' LHS packers (2vl row blocks): NEON,
    the streaming twin, KleidiAI's (each tree); per call at m = 1 and m = mr (k = SHARE_K); and
    the packer's share of packer + kernel instructions at n = SHARE_N."""
    rows = []
    for fmt, kr, kspec in PACKER_KERNELS:
        neon, twin = packer_for(parse_spec(kspec)), streaming_packer_for(parse_spec(kspec))
        assert (neon.fmt, neon.kr, twin.fmt) == (fmt, kr, fmt)
        for spec in (neon, twin):
            isa = spec.isa
            for svl in SVLS:
                d = packer_mix(spec, svl).as_dict()
                kern = sme_report(kspec, block_svl=svl)
                mr = 2 * svl // 32
                per_elem_kernel = SHARE_N / kern.block_macs_per_insn   # kernel insns per LHS element
                calls = {m: packer_call_insns(spec, svl, m, SHARE_K) for m in (1, mr)}
                d.update({"fmt": fmt, "isa": isa, "kernel": kspec,
                          "call_insns_m1": calls[1], "call_insns_mr": calls[mr],
                          "kernel_insns_m1": round(per_elem_kernel * SHARE_K * mr),
                          "share_mr": round(d["insns_per_element"]
                                            / (d["insns_per_element"] + per_elem_kernel), 4),
                          "share_m1": round(calls[1] / (calls[1] + per_elem_kernel * SHARE_K * mr),
                                            4),
                          "runtime_uses": spec.streaming == (svl >= twin.streaming_from_svl)})
                rows.append(d)
    for v, t, _ in kai:
        for name in KAI_PACKERS:
            for svl in SVLS:
                try:
                    d = kleidiai_packer_mix(t, name, svl).as_dict()
                except FileNotFoundError:
                    continue
                rows.append({**d, "version": v})
    return rows


def _f(v, fmt: str) -> str:
    return "–" if v is None else format(v, fmt)


def _each_kernel(rows: list[dict], last: str):
    """(source, report) of each distinct kernel of the rows: tilegen's, then KleidiAI's of
    release ``last``."""
    seen = set()
    for r in rows:
        items = [("tilegen", r["tilegen"])] + [(f"KleidiAI v{last}", r["kleidiai"][last])
                                               for _ in [0] if r["kleidiai"]]
        for src, d in items:
            if (d["kernel"], src) not in seen:
                seen.add((d["kernel"], src))
                yield src, d


def header(title: str, kai: list[tuple[str, Path, str]], cmd: str) -> list[str]:
    """The first lines of a results file: its title, the command that wrote it, the trees."""
    return [f"# {title}", "", f"Command: `{cmd}`", "",
            "KleidiAI source trees: " + ", ".join(f"v{v} (`{Path(g).name}`)" for v, _, g in kai)
            + ". llama.cpp pins v1.24.0.", ""]


def kleidiai_option(ap: argparse.ArgumentParser) -> None:
    """The ``--kleidiai`` option (the trees :func:`trees` reads)."""
    ap.add_argument("--kleidiai", action="append", metavar="TREE_OR_TARBALL",
                    help="a KleidiAI source tree or release tarball (repeatable; default: the "
                         "v1.24.0 and v1.30.0 tarballs in ../shared/thirdparty/kleidiai)")


def markdown(rows: list[dict], pk: list[dict], kai: list[tuple[str, Path, str]], cmd: str) -> str:
    vers = [v for v, _, _ in kai]
    last = vers[-1]
    out = header("SME/SME2 kernels: static model, tilegen vs KleidiAI", kai, cmd) + [
           "Model: `tilegen/analysis/sme.py` (counting rule in its docstring). `MACi/i`: MAC "
           "instructions per hot-loop instruction; `blk MAC/i`: MACs per instruction over one "
           "32-k block at SVL 512 (the issue's rule; derived from the hot loop, x 32 / k per "
           "iteration, where a kernel has no per-block work); bytes per 32-k block of one "
           "tile at SVL 512.", "",
           "## Per exported SME/SME2 name: tilegen vs the KleidiAI kernel llama.cpp runs", "",
           "| exported name (`matmul_clamp_f32_` …) | tilegen kernel | tilegen MACi/i | "
           + " | ".join(f"KleidiAI v{v} MACi/i" for v in vers) + " | tilegen blk MAC/i | "
           + " | ".join(f"KleidiAI v{v} blk MAC/i" for v in vers)
           + f" | tilegen / KleidiAI v{last} (blk) |",
           "|---|---|---|" + "---|" * len(vers) + "---|" + "---|" * len(vers) + "---|"]
    for r in rows:
        if r["group"] != "exported":
            continue
        t, ks = r["tilegen"], r["kleidiai"]
        spec = r["spec"] if r["exported"] else f"({r['spec']}: not exported, see notes)"
        ratio = t["block_macs_per_insn"] / ks[last]["block_macs_per_insn"]
        out.append(f"| {r['name'].removeprefix('matmul_clamp_f32_')} | {spec} | "
                   f"{t['mac_per_insn']:.3f} | "
                   + " | ".join(f"{ks[v]['mac_per_insn']:.3f}" for v in vers)
                   + f" | {t['block_macs_per_insn']:.1f} | "
                   + " | ".join(f"{ks[v]['block_macs_per_insn']:.1f}" for v in vers)
                   + f" | {ratio:.2f} |")
    out += ["", "## SME unit vs core: the Apple M4 table (per block at SVL 512)", "",
            "Each block's instructions split into those the SME unit runs (they touch Z, ZA, ZT0 "
            "or a predicate) and the core's (general registers only), and its bound in cycles "
            "by the per-class table below (`tilegen.analysis.sme.M4_UNITS`, docs/tuning.md): "
            "each SME class on its own pipe, the core beside it, and the longest chain of MACs "
            "into one accumulator x latency; the binding class sets the bound; MAC/cycle: the "
            "block's MACs / bound (tiles of different sizes compare by it). `tilegen / KleidiAI` "
            "is the ratio of the MACs per cycle (above 1: tilegen's kernel is faster by the "
            "table).", "",
            "| exported name (`matmul_clamp_f32_` …) | tilegen kernel | tilegen SME / core | "
            "tilegen bound (binding) | "
            + " | ".join(f"KleidiAI v{v} SME / core | KleidiAI v{v} bound (binding)" for v in vers)
            + f" | tilegen / KleidiAI v{last} (MAC/cycle) |",
            "|---|---|---|---|" + "---|---|" * len(vers) + "---|"]
    for r in rows:
        if r["group"] != "exported":
            continue
        t, ks = r["tilegen"]["m4"], {v: r["kleidiai"][v]["m4"] for v in vers}
        out.append(f"| {r['name'].removeprefix('matmul_clamp_f32_')} | {r['spec']} | "
                   f"{t['sme_insns']} / {t['core_insns']} | {t['bound_cycles']:.0f}, "
                   f"{t['macs_per_cycle']:.1f} MAC/cycle ({t['binding']}) | "
                   + " | ".join(f"{ks[v]['sme_insns']} / {ks[v]['core_insns']} | "
                                f"{ks[v]['bound_cycles']:.0f}, {ks[v]['macs_per_cycle']:.1f} "
                                f"MAC/cycle ({ks[v]['binding']})" for v in vers)
                   + f" | {t['macs_per_cycle'] / ks[last]['macs_per_cycle']:.2f} |")
    out += ["", "SME-unit instructions by class per block (loads and stores: element width, "
            "vectors per instruction):", "",
            "| kernel | source | SME-unit classes | core | chain cycles | serial cycles |",
            "|---|---|---|---|---|---|"]
    for src, d in _each_kernel(rows, last):
        m = d["m4"]
        cl = ", ".join(f"{c} {n}" for c, n in m["classes"].items() if c != "core")
        out.append(f"| {d['kernel']} | {src} | {cl} | {m['core_insns']} | "
                   f"{m['chain_cycles']:.0f} | {m['serial_cycles']:.0f} |")
    out += ["", "The table (cycles per instruction, or per vector written or moved; a cycle is "
            "one f32 FMOPA issue with 4 tiles, 3.91 G per second):", "",
            "| class | unit | cycles | per | latency | source |", "|---|---|---|---|---|---|"]
    out += [u.table_row() for u in M4_UNITS.values()]
    out += ["", "## Memory per 32-k block and accumulators (SVL 512, one tile)", "",
            "| kernel | source | loads | bytes loaded | stores | bytes stored | dst bytes "
            "(loaded + stored) | stack bytes | accumulators |", "|---|---|---|---|---|---|---|---|---|"]
    for src, d in _each_kernel(rows, last):
        out.append(f"| {d['kernel']} | {src} | {d['block_loads']} | "
                   f"{d['block_load_bytes']} | {d['block_stores']} | "
                   f"{d['block_store_bytes']} | "
                   f"{d['block_dst_load_bytes'] + d['block_dst_store_bytes']} | "
                   f"{d['block_stack_load_bytes'] + d['block_stack_store_bytes']} | "
                   f"{d['accumulators']} |")
    out += ["", "## Every row", "",
            "| group | row / exported name | kernel | source | k/iter | insns | MAC insns | "
            "MACi/i | MACs/ins (128) | loads | block insns (512) | blk MAC/i (512) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        label = r.get("row") or r["name"].removeprefix("matmul_clamp_f32_")
        items = [("tilegen", r["tilegen"])] + [(f"KleidiAI v{v}", r["kleidiai"][v])
                                               for v in vers if v in r["kleidiai"]]
        for src, d in items:
            out.append(f"| {r['group']} | {label} | {d['kernel']} | {src} | {d['k_per_iter']} | "
                       f"{d['insns']} | {d['mac_insns']} | {d['mac_per_insn']:.3f} | "
                       f"{d['macs_per_insn_128']:.2f} | {d['loads']} | "
                       f"{d['block_insns']}{' (derived)' if d['block_derived'] else ''} | "
                       f"{d['block_macs_per_insn']:.1f} |")
    out += ["", "## LHS packers of the SME kernels (2vl row blocks)", "",
            f"Instructions per packed f32 element (steady state; tilegen: "
            f"`tilegen.analysis.sme.packer_mix`, KleidiAI: the main loop of its packer), per call "
            f"(m = 1 and m = mr, k = {SHARE_K}: `packer_call_insns`) and the packer's share of "
            f"packer + kernel instructions (the kernel `blk MAC/i` at that SVL, n = {SHARE_N}). "
            "`*`: what tilegen's runtime packs with at that SVL.", "",
            "| packer | SVL | insns / element | call m = 1 | call m = mr | share m = mr | "
            "share m = 1 |", "|---|---|---|---|---|---|---|"]
    for p in pk:
        if p["source"] != "tilegen":
            continue
        star = " *" if p["runtime_uses"] else ""
        out.append(f"| {p['packer']}{star} | {p['svl']} | {p['insns_per_element']:.3f} | "
                   f"{p['call_insns_m1']} | {p['call_insns_mr']} | {100 * p['share_mr']:.1f} % | "
                   f"{100 * p['share_m1']:.1f} % |")
    out += ["", "| KleidiAI packer | release | " + " | ".join(f"SVL {v}" for v in SVLS) + " |",
            "|---|---|" + "---|" * len(SVLS)]
    kp: dict = {}
    for p in pk:
        if p["source"] == "kleidiai":
            kp.setdefault((p["packer"], p["version"]), {})[p["svl"]] = p["insns_per_element"]
    for (name, v), by in sorted(kp.items()):
        out.append(f"| {name} | v{v} | " + " | ".join(f"{by[x]:.3f}" for x in SVLS) + " |")
    notes = sorted({(r["name"], r["note"]) for r in rows if r["group"] == "exported" and r["note"]})
    out += ["", "Notes:", ""]
    out += [f"- `{n.removeprefix('matmul_clamp_f32_')}`: {t}" for n, t in notes]
    for r in rows:      # a gemv name (mr = 1) served by an outer-product tile of 1vl rows
        if r["group"] == "exported" and "_1x" in r["name"] and "vlx" in r["spec"]:
            useful = r["tilegen"]["block_macs_per_insn"] / (512 // 32)
            out.append(f"- `{r['name'].removeprefix('matmul_clamp_f32_')}` is a gemv name served "
                       f"by the outer-product tile `{r['spec']}`: at m = 1 one row of its "
                       f"SVL/32 = 16 (SVL 512) is useful, so {useful:.1f} useful MACs per "
                       "instruction against the figure in the table.")
    out += ["- KleidiAI's hot loops and blocks: the labels of `tilegen.analysis.sme.KAI_RECIPES` "
            "(e.g. the f32 gemv `f32p2vlx1b_1x16vl` and `f32p16vlx1b_1x16vl`: the width-4 "
            "pass, 16 VL columns; the int8 q4 gemm `qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl`: the "
            "K-loop body on the path of every block after the first, `.ACCUMULATE`).",
            "- Corrected against the earlier excerpt-based table: KleidiAI's f32 FMOPA hot loop "
            "(`f32p2vlx1_f32p2vlx1biasf32_sme2_mopa`) is 24 instructions / 16 FMOPA (0.667, "
            "not 0.571); the f32 gemv figure 0.381 is `f32p16vlx1b_1x16vl`'s, while "
            "`f32p2vlx1b_1x16vl` (the name llama.cpp runs) scores 0.186.",
            "- What the model does not see (docs/sve-sme.md#what-the-static-model-cannot-see): "
            "latencies beyond the accumulation chains of the M4 table, per-tile and "
            "per-call work outside the block (bias and store passes, ZT0 table, "
            "smstart/smstop), bandwidth (bytes are counted, not timed).",
            f"- Legend of the terminal table: {SME_LEGEND}."]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    kleidiai_option(ap)
    ap.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    a = ap.parse_args()
    kai = trees(a.kleidiai)
    rows = collect(kai)
    pk = packers(kai)
    cmd = "python bench/sme_mix.py" + "".join(f" --kleidiai {g}" for g in a.kleidiai or []) + (
        f" --out {a.out}" if a.out else "")
    print(SME_HEADER.replace("kernel (SME static model: per 128-bit SVL granule)",
                             "kernel (per exported name: tilegen, then KleidiAI)"))
    from tilegen.analysis.sme import SmeReport  # noqa: F401 (rows are dicts; print them plainly)
    for r in rows:
        for d in [r["tilegen"]] + list(r["kleidiai"].values()):
            print(f"{d['kernel'][:62]:<62} {d['k_per_iter']:4d} {d['insns']:5d} "
                  f"{d['mac_insns']:5d} {d['mac_per_insn']:7.3f} {d['macs_per_insn_128']:8.2f} "
                  f"{d['loads']:5d} {1000 * d['loads_per_mac_128']:8.2f} {d['accumulators']:3d} "
                  f"{d['block_insns']:6d} {d['block_macs_per_insn']:8.1f} "
                  f"{d['block_stores']:4d} {d['block_load_bytes']:7d} "
                  f"{d['block_store_bytes']:6d} "
                  f"{d['block_dst_load_bytes'] + d['block_dst_store_bytes']:6d}")
    print(UNIT_HEADER)
    for r in rows:
        for d in [r["tilegen"]] + list(r["kleidiai"].values()):
            m = d["m4"]
            print(f"{d['kernel'][:62]:<62} {d['block_k']:4d} {m['sme_insns']:5d} "
                  f"{m['core_insns']:5d} {m['bound_cycles']:7.1f} {m['macs_per_cycle']:7.1f} "
                  f"{m['serial_cycles']:7.1f} "
                  f"{m['chain_cycles']:6.1f}  {m['binding']:<16} "
                  + ", ".join(f"{c} {n}" for c, n in m["classes"].items() if c != "core"))
    print(f"({UNIT_LEGEND})")
    if a.out:
        doc = {"command": cmd,
               "kleidiai": {v: Path(g).name for v, _, g in kai},
               "rows": rows, "packers": pk, "m4_units": [u.as_dict() for u in M4_UNITS.values()]}
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(markdown(rows, pk, kai, cmd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
