"""Every SME/SME2 kernel tilegen ships or llama.cpp calls through the export, judged on the
Apple M4 SME-unit model (issue #34 item 4): the bound per 32 k, the binding class, MACs per
cycle, and the ratio to KleidiAI's kernel of the same name and (K-quants) to Arm's Q4_K SME2
gemm proposed for llama.cpp in PR #29219.

    python bench/sme_bound.py [--kleidiai TREE_OR_TARBALL ...] [--pr29219 ASM_FILE]
                              [--out bench/results/sme_bound]

The kernels (:func:`kernels`): every sme/sme2 spec of the preset default list
(``tilegen.families.DEFAULT_KERNELS``) and of every tuned preset (``tilegen/build/tuned``), every
exported KleidiAI name with ``_sme`` in it (``tilegen.export.kleidiai.KERNELS``, and the names a
tuned export replaces), and the SME2 entries of the llama patch's table of tilegen families
(the K-quants, IQ4_NL, MXFP4; default and tuned).
Each goes through ``tilegen.analysis.sme``: its block at SVL 512 on the per-class M4 table
(``M4_UNITS``, docs/tuning.md), and its static MACs per instruction at SVL 128.  KleidiAI's
kernels are read from real source trees (``--kleidiai``, default: the v1.24.0 and v1.30.0
release tarballs in ../shared/thirdparty/kleidiai, as ``bench/sme_mix.py``).  PR #29219's gemm
is in neither tree: its block's counts are recorded in ``tilegen.analysis.sme.PR29219_GEMM``
(where they were counted from is there); ``--pr29219`` re-counts a copy of its assembly and
stops if it differs from the record.

A figure whose binding class is an assumption of the M4 table (no public measurement) is
marked; so is a ratio with such a figure on either side.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilegen.analysis.sme import (M4_UNITS, PR29219_GEMM, UnitMix, kleidiai_report,  # noqa: E402
                                  sme_report)
from tilegen.build.targets import TARGETS  # noqa: E402
from tilegen.build.tuned import tuned_specs, tuned_targets  # noqa: E402
from tilegen.export.kleidiai import KERNELS, kquant_entries, tuned_overrides  # noqa: E402
from tilegen.families import DEFAULT_KERNELS, KQUANT_FAMILIES  # noqa: E402
from tilegen.generator import parse_spec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sme_mix import header, kleidiai_option, trees  # noqa: E402

SME_ISAS = ("sme", "sme2")
KQUANT = KQUANT_FAMILIES
MARK = "†"


def _sme(spec: str) -> bool:
    return parse_spec(spec).isa in SME_ISAS


def kernels() -> list[dict]:
    """One row per (tilegen kernel, exported KleidiAI name or None): the spec, what ships it
    (``default``, ``tuned <target>``) and how the export serves it."""
    ships: dict[str, list[str]] = {}
    served: dict[str, list[str]] = {}          # spec -> KleidiAI names (exported)
    kq: dict[str, list[str]] = {}              # spec -> roles in the tilegen-family table

    def add(d: dict, spec: str, what: str) -> None:
        d.setdefault(spec, [])
        if what not in d[spec]:
            d[spec].append(what)

    for s in DEFAULT_KERNELS:
        if _sme(s):
            add(ships, s, "default")
    for t in tuned_targets():
        for s in tuned_specs(TARGETS[t]):
            if s.isa in SME_ISAS:
                add(ships, s.spec_string, f"tuned {t}")
    for k in KERNELS:
        if "_sme" in k.name:
            add(served, k.spec, k.name)
    for t in tuned_targets():
        for name, s in tuned_overrides(t).items():
            if "_sme" in name:
                add(served, s, name)
    for t in [None] + [t for t in tuned_targets() if "sme2" in TARGETS[t].features]:
        for e in kquant_entries(t, tuned=t is not None):
            if e.isa in SME_ISAS:
                label = "" if t is None else f" (--tuned {t})"
                add(kq, e.gemm.spec, f"tilegen-family {e.family} gemm{label}")
                add(kq, e.gemv.spec, f"tilegen-family {e.family} gemv{label}")
    specs = list(dict.fromkeys([*ships, *served, *kq]))
    rows = []
    for s in specs:
        for name in served.get(s) or [None]:
            rows.append({"spec": s, "ships": ships.get(s, []), "kleidiai_name": name,
                         "kquant": kq.get(s, [])})
    return rows


def judge(unit: UnitMix, macs: int, block_k: int) -> dict:
    """The M4 figures of one block: bound per 32 k, binding class (and whether the M4 table
    assumes it), MACs per cycle, and the same with the measured classes only."""
    cls = unit.chain_class if unit.binding.startswith("chain ") else unit.binding
    measured = [c for k, c in unit.cycles if not M4_UNITS[k].assumed]
    if unit.chain_class in M4_UNITS and not M4_UNITS[unit.chain_class].assumed:
        measured.append(unit.chain)
    mb = max(measured, default=0.0)
    per = 32 / block_k
    return {"block_k": block_k, "sme_insns_per_32k": round(unit.sme_insns * per, 2),
            "core_insns_per_32k": round(unit.core_insns * per, 2),
            "bound_per_32k": round(unit.bound * per, 2), "binding": unit.binding,
            "binding_class": cls, "assumed": M4_UNITS[cls].assumed,
            "macs_per_cycle": round(macs / unit.bound, 2),
            "measured_bound_per_32k": round(mb * per, 2),
            "measured_macs_per_cycle": round(macs / mb, 2) if mb else None}


def _tilegen(spec: str) -> dict:
    r, r128 = sme_report(spec), sme_report(spec, block_svl=128)
    return {"kernel": r.kernel, **judge(r.unit, r.block_macs_at_svl, r.block_k),
            "static_macs_per_insn_128": round(r128.block_macs_per_insn, 2)}


def _kleidiai(tree: Path, name: str) -> dict:
    r, r128 = kleidiai_report(tree, name), kleidiai_report(tree, name, 128)
    return {"kernel": r.kernel, **judge(r.unit, r.block_macs_at_svl, r.block_k),
            "static_macs_per_insn_128": round(r128.block_macs_per_insn, 2)}


def pr29219() -> dict:
    p = PR29219_GEMM
    return {"kernel": p.name, "where": p.where, **judge(p.unit, p.block_macs(), 32),
            "static_macs_per_insn_128": round(p.block_macs(128) / p.block_insns, 2),
            "classes": dict(p.classes)}


def _ratio(a: dict, b: dict) -> dict:
    return {"ratio": round(a["macs_per_cycle"] / b["macs_per_cycle"], 3),
            "assumed": a["assumed"] or b["assumed"]}


def collect(kai: list[tuple[str, Path, str]]) -> tuple[list[dict], dict]:
    pr = pr29219()
    rows = []
    for row in kernels():
        spec = parse_spec(row["spec"])
        t = _tilegen(row["spec"])
        row.update({"isa": spec.isa, "gemv": spec.is_gemv, "tilegen": t, "kleidiai": {},
                    "vs_kleidiai": {}, "vs_pr29219": None})
        if row["kleidiai_name"]:
            for v, tree, _ in kai:
                k = _kleidiai(tree, row["kleidiai_name"])
                row["kleidiai"][v] = k
                row["vs_kleidiai"][v] = _ratio(t, k)
        if spec.family in KQUANT and spec.isa == "sme2" and not spec.is_gemv:
            row["vs_pr29219"] = _ratio(t, pr)
        rows.append(row)
    return rows, pr


def _m(d: dict, key: str, fmt: str) -> str:
    """A figure, marked when the binding class is an assumption."""
    return format(d[key], fmt) + (f" {MARK}" if d["assumed"] else "")


def markdown(rows: list[dict], pr: dict, kai: list[tuple[str, Path, str]], cmd: str) -> str:
    vers = [v for v, _, _ in kai]
    out = header("Every SME/SME2 kernel on the Apple M4 SME-unit model", kai, cmd) + [
           "Per kernel, one block (32 k; the K-quants: one 256-k super-block, normalised here "
           "per 32 k) at SVL 512 on the per-class table `tilegen.analysis.sme.M4_UNITS` "
           "(docs/tuning.md#the-sme-unit-and-the-core-apple-m4): `bound`: cycles per 32 k "
           "(each SME class on its own pipe, the core beside it, the longest accumulation "
           "chain); `binding`: the class that sets it; `MAC/cyc`: the block's MACs / bound; "
           "`measured MAC/cyc`: the same with the assumed classes left out (what the public "
           "measurements alone bound; – where no measured class is in the block); `@128`: "
           "MACs per instruction of the block at SVL 128 (the static count, no M4 table: "
           "M4 is SVL 512); `/ KleidiAI`: tilegen's MAC/cyc over that of KleidiAI's kernel of "
           "the same name (above 1: tilegen's is faster by the table); `/ PR #29219`: over Arm's "
           f"Q4_K SME2 gemm proposed for llama.cpp. `{MARK}`: the binding class (of either side, "
           "for a ratio) is an assumption of the M4 table, not a measurement: that figure is "
           "assumption-based; unmarked figures rest on measured classes.", "",
           "| tilegen kernel | ISA | ships | llama.cpp calls it as | bound / 32 k | binding | "
           "MAC/cyc | measured MAC/cyc | @128 | "
           + " | ".join(f"KleidiAI v{v} MAC/cyc (binding)" for v in vers) + " | "
           + " | ".join(f"/ KleidiAI v{v}" for v in vers) + " | / PR #29219 |",
           "|---|---|---|---|---|---|---|---|---|" + "---|" * (2 * len(vers)) + "---|"]
    for r in rows:
        t = r["tilegen"]
        calls = ([f"`{r['kleidiai_name'].removeprefix('matmul_clamp_f32_')}`"]
                 if r["kleidiai_name"] else []) + r["kquant"]
        meas = _meas(t)
        kcols = [f"{_m(k, 'macs_per_cycle', '.1f')} ({k['binding']})"
                 for k in (r["kleidiai"].get(v) for v in vers) if k] or ["–"] * len(vers)
        rcols = [_m(r["vs_kleidiai"][v], "ratio", ".2f") if v in r["vs_kleidiai"] else "–"
                 for v in vers]
        prc = (_m(r["vs_pr29219"], "ratio", ".2f") if r["vs_pr29219"]
               else "– (gemv)" if r["gemv"] and r["spec"].split(":")[0] in KQUANT else "–")
        out.append(f"| `{r['spec']}` | {r['isa']} | {', '.join(r['ships']) or '–'} | "
                   f"{'; '.join(calls) or '–'} | {_m(t, 'bound_per_32k', '.0f')} | "
                   f"{t['binding']} | {_m(t, 'macs_per_cycle', '.1f')} | {meas} | "
                   f"{t['static_macs_per_insn_128']:.1f} | " + " | ".join(kcols) + " | "
                   + " | ".join(rcols) + f" | {prc} |")
    out += ["", "## The kernels compared against", "",
            "| kernel | source | SME / core insns per 32 k | bound / 32 k | binding | MAC/cyc | "
            "measured MAC/cyc | @128 |", "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in rows:
        for v, k in r["kleidiai"].items():
            if (k["kernel"], v) in seen:
                continue
            seen.add((k["kernel"], v))
            out.append(_ref_row(k, f"KleidiAI v{v}"))
    out.append(_ref_row(pr, "PR #29219 (recorded counts)"))
    cls = ", ".join(f"{c} {n}" for c, n in pr["classes"].items())
    q6 = [r for r in rows if r["vs_pr29219"] and r["spec"].startswith("q6_K")]
    q8 = next((r for r in rows if r["kleidiai_name"] ==
               "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa"), None)
    out += ["", "Notes:", "",
            f"- PR #29219's gemm (`{pr['kernel']}`) is in no KleidiAI release tree here; its "
            f"source was reached through the search tool at {pr['where']}. Its block's counts "
            f"are recorded in `tilegen.analysis.sme.PR29219_GEMM` and run through the same "
            f"model: {cls} per 32 k (tile 4 VL x 16 VL in 128-bit granules: 16 x 64 at SVL "
            "512; the weight conversion LUTI4 + MOV + FMLA is 18 of the hot loop's 34 "
            "instructions per 4 k). `--pr29219 FILE` re-counts a copy of the assembly and "
            "stops if it differs.",
            "- The K-quant ratios divide tilegen's MAC/cyc for a 256-k super-block (its "
            "int16 SMOPA and the Z-register decode of the scales and mins) by that kernel's "
            "per 32-k block (f16 FMOPA on weights converted to f16 per 4 k): both MAC/cyc at "
            "the same SVL, so the tiles compare. Only the gemms are compared: the PR's gemv "
            "(`qsi8d32p1x4_qai4c32p16vsx4s1s0sf16_1x16vs_sme2_dot`) is not counted here.",
            ]
    if q6 and q8:
        k = q8["kleidiai"][vers[-1]]
        out.append("- PR #29219 serves Q6_K through the Q8_0 path (`qai8dxp1vlx4_qsi8cxp4vlx4_"
                   f"1vlx4vl_sme2_mopa`, KleidiAI v{vers[-1]}: {_m(k, 'macs_per_cycle', '.1f')} "
                   "MAC/cyc); tilegen's q6_K gemms against it: "
                   + ", ".join(f"`{r['spec']}` "
                               f"{r['tilegen']['macs_per_cycle'] / k['macs_per_cycle']:.2f}"
                               + (f" {MARK}" if r["tilegen"]["assumed"] or k["assumed"] else "")
                               for r in q6) + ".")
    tuned = tuned_targets()
    out += [f"- Tuned presets read: {', '.join(tuned) or 'none'}; "
            + ("none of them has an SME/SME2 kernel (their targets have no SME), so the "
               "default list and the default export are the whole set."
               if not any(s for r in rows for s in r["ships"] if s.startswith("tuned"))
               else "their SME kernels are in the table."),
            _gemv_note(rows, vers[-1]),
            "- What the model does not see: docs/sve-sme.md#what-the-static-model-cannot-see; "
            "the assumed classes and their values: the table in docs/tuning.md."]
    return "\n".join(out) + "\n"


def _gemv_note(rows: list[dict], last: str) -> str:
    """The note on gemv names served by an outer-product tile: useful MACs at m = 1."""
    out = ("- A gemv name served by an outer-product tile (mr = 1 VL) does 1 useful row of "
           "SVL/32 = 16 at m = 1: its MAC/cyc is for a full tile")
    for r in rows:
        if r["kleidiai_name"] and "_1x" in r["kleidiai_name"] and "vlx" in r["spec"]:
            useful = r["tilegen"]["macs_per_cycle"] / 16
            k = r["kleidiai"][last]["macs_per_cycle"]
            mark = f" {MARK}" if r["vs_kleidiai"][last]["assumed"] else ""
            out += (f"; `{r['spec']}` as `{r['kleidiai_name'].removeprefix('matmul_clamp_f32_')}`"
                    f": {useful:.1f} useful MAC/cyc at m = 1, {useful / k:.2f} x KleidiAI "
                    f"v{last}'s{mark}")
    return out + "."


def _meas(d: dict) -> str:
    return "–" if d["measured_macs_per_cycle"] is None else f"{d['measured_macs_per_cycle']:.1f}"


def _ref_row(k: dict, src: str) -> str:
    meas = _meas(k)
    return (f"| `{k['kernel'].removeprefix('kai_matmul_clamp_f32_')}` | {src} | "
            f"{k['sme_insns_per_32k']:g} / {k['core_insns_per_32k']:g} | "
            f"{_m(k, 'bound_per_32k', '.0f')} | {k['binding']} | "
            f"{_m(k, 'macs_per_cycle', '.1f')} | {meas} | {k['static_macs_per_insn_128']:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    kleidiai_option(ap)
    ap.add_argument("--pr29219", type=Path, metavar="ASM_FILE",
                    help="a copy of PR #29219's gemm assembly: re-count it against the record")
    ap.add_argument("--out", type=Path, help="write <out>.json and <out>.md")
    a = ap.parse_args()
    if a.pr29219:
        try:
            PR29219_GEMM.recount(a.pr29219.read_text())
        except (OSError, ValueError, StopIteration) as e:
            print(f"sme_bound: --pr29219: {e}", file=sys.stderr)
            return 1
        print(f"{a.pr29219}: the same counts as the record")
    kai = trees(a.kleidiai)
    rows, pr = collect(kai)
    cmd = "python bench/sme_bound.py" + "".join(f" --kleidiai {g}" for g in a.kleidiai or []) + (
        f" --out {a.out}" if a.out else "")
    md = markdown(rows, pr, kai, cmd)
    print(md)
    if a.out:
        doc = {"command": cmd, "kleidiai": {v: Path(g).name for v, _, g in kai},
               "rows": rows, "pr29219": pr,
               "m4_units": [u.as_dict() for u in M4_UNITS.values()]}
        a.out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
