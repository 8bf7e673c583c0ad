"""Per-32-k-block cost of tilegen's q4 kernels next to KleidiAI's (llvm-mca static model).

    python bench/vs_kleidiai.py                       # KleidiAI side from bench/results/kleidiai_reference.json
    python bench/vs_kleidiai.py --kleidiai DIR        # ... measured now, from a KleidiAI source tree
    python bench/vs_kleidiai.py --kleidiai DIR --record   # and write those numbers as the new reference
    python bench/vs_kleidiai.py --packers [--kleidiai DIR [--record]]   # the qsi8d32p LHS packers

DIR may be a KleidiAI release tarball tilegen knows (``../shared/thirdparty/kleidiai/
kleidiai-v1.30.0.tar.gz``): it is unpacked once into tilegen's cache
(``provision.ensure_kleidiai_source``) and recorded with its version and digest.

The figure is the one `tilegen analyze` / `tilegen tune` rank by: MACs per cycle over one
32-k block of the whole tile, scale loads and conversion included (llvm-mca-19
``-iterations=200`` over the block loop's body with its branches removed; at bl = 32 every
inner k loop runs once).  tilegen: the region between the ``tilegen:block-begin/end`` markers.
KleidiAI: its kernels are built from the given tree only (never vendored, never committed):
``<kernel>_asm.S`` is assembled, else ``<kernel>.c`` compiled (clang-19 -O2, the tree as include
path), the object disassembled; the hot loop is the innermost backward-branch loop with the most
multiply-accumulates, the block loop the smallest loop that converts (``scvtf``) among it and
the loops around it, and its body is measured like tilegen's.  Where the C wrapper picks its
kernel by block length (``if (bl == 32)``, e.g. the 16x4x32 i8mm gemm's ``opt32`` kernel), only
the function it calls at bl = 32 is read.  MACs per block = m_step x n_step x 32 (from the name).

``--packers``: cycles per element of one 32-value block of the qsi8d32p LHS quantize-and-pack
routines (tilegen's 4-row and one-row paths, KleidiAI's 4x8sb 4-row block; see
``measure_packers`` and ``measure_kleidiai_packer``), written to OUTDIR/vs_kleidiai_packers.*;
the KleidiAI side from ``kleidiai_packer_reference.json`` (``--record``), else issue #15's
neoverse-v2 figure.

Without ``--kleidiai`` the KleidiAI side is the recorded reference (with the command that
produced it).  Writes OUTDIR/vs_kleidiai.json and .md (default bench/results).
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's tilegen
from tilegen.analysis.mca import MAC_MNEMONICS, AnalyzeError, _MATTR, analyze  # noqa: E402
from tilegen.emulate.provision import ensure_cross_sysroot, ensure_kleidiai_source  # noqa: E402

MODELS = ("neoverse-v2", "neoverse-n2", "neoverse-v1", "apple-m4")
RESULTS = Path(__file__).resolve().parent / "results"
REFERENCE = RESULTS / "kleidiai_reference.json"

# (family, regime) -> KleidiAI NEON kernels of that family (matmul_clamp_f32_<name>)
KLEIDIAI = {
    ("q4_0", "gemm"): ("qsi8d32p4x8_qsi4c32p4x8_8x4x32_neon_i8mm", "qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm",
                       "qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod"),
    ("q4_0", "gemv"): ("qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", "qsi8d32p1x8_qsi4c32p4x8_1x4x32_neon_dotprod"),
    ("q4_0_dx", "gemm"): ("qai8dxp4x8_qsi4c32p4x8_16x4x32_neon_i8mm", "qai8dxp4x8_qsi4c32p4x8_8x4x32_neon_i8mm",
                          "qai8dxp4x8_qsi4c32p8x8_4x8x32_neon_i8mm",
                          "qai8dxp4x8_qsi4c32p8x8_4x8_neon_i8mm", "qai8dxp4x4_qsi4c32p4x4_16x4_neon_dotprod",
                          "qai8dxp4x4_qsi4c32p8x4_4x8_neon_dotprod"),
    ("q4_0_dx", "gemv"): ("qai8dxp1x4_qsi4c32p4x4_1x4_neon_dotprod", "qai8dxp1x4_qsi4c32p8x4_1x8_neon_dotprod",
                          "qai8dxp1x8_qsi4c32p4x8_1x4x32_neon_dotprod",
                          "qai8dxp1x8_qsi4c32p8x8_1x8x32_neon_dotprod", "qai8dxp1x8_qsi4c32p8x8_1x8_neon_dotprod"),
}
_DIRS = {"q4_0": "matmul_clamp_f32_qsi8d32p_qsi4c32p", "q4_0_dx": "matmul_clamp_f32_qai8dxp_qsi4c32p"}
# tilegen tiles compared (the tuner's leaders; `tilegen tune` ranks every accepted tile)
TILEGEN = {
    "gemm": ("i8mm:8x4", "i8mm:16x4", "i8mm:4x8", "i8mm:12x4", "i8mm:24x4", "i8mm:24x4:am",
             "i8mm:4x12:am", "i8mm:8x8:am", "dotprod:16x4"),
    "gemv": ("dotprod:1x4", "dotprod:1x8", "dotprod:1x12", "dotprod:1x16", "dotprod:1x20",
             "dotprod:1x24", "dotprod:1x8:k16:s2", "dotprod:1x12:k16:s2", "i8mm:1x4",
             "i8mm:1x8", "i8mm:1x12", "i8mm:1x8:k8:s2", "i8mm:1x16:k8:s2", "i8mm:1x20:k8:s2",
             "i8mm:1x24:k8:s2"),
}
# a wrapper's ``if (bl == 32) { kai_kernel_...(`` : the kernel it runs at this script's block size
_BL32_CALL = re.compile(r"if\s*\(\s*bl\s*==\s*32\s*\)\s*\{?\s*(kai_kernel_\w+)\s*\(")
BRANCH = re.compile(r"^(b\.\w+|b|cbz|cbnz|tbz|tbnz)$")


def tool(*names: str) -> str:
    for n in names:
        if shutil.which(n):
            return n
    raise SystemExit(f"none of {', '.join(names)} found (apt-get install clang-19 llvm-19)")


def mca_block(lines: list[str], model: str) -> float:
    src = ".Lmca_top:\n" + "\n".join(lines) + "\n"
    p = subprocess.run([tool("llvm-mca-19", "llvm-mca"), "-mtriple=aarch64", f"-mcpu={model}",
                        f"-mattr={_MATTR}", "-iterations=200"], input=src, capture_output=True, text=True)
    if p.returncode:
        raise AnalyzeError(p.stderr[:400])
    total = int(re.search(r"Total Cycles:\s+(\d+)", p.stdout).group(1))
    iters = int(re.search(r"Iterations:\s+(\d+)", p.stdout).group(1))
    return total / iters


def _tile(name: str) -> tuple[int, int]:
    m = re.search(r"_(\d+)x(\d+)(?:x\d+)?_neon", name)
    return int(m.group(1)), int(m.group(2))


def _cc(*flags: str) -> list[str]:
    """clang-19 for aarch64 Linux against tilegen's arm64 cross sysroot (its C headers: the
    host needs none; ``provision.ensure_cross_sysroot`` fetches it once)."""
    return [tool("clang-19", "clang"), "--target=aarch64-linux-gnu",
            f"--sysroot={ensure_cross_sysroot(quiet=True)}", *flags]


def _build(src_root: Path, family: str, name: str, tmp: Path) -> Path | None:
    d = src_root / "kai" / "ukernels" / "matmul" / _DIRS[family]
    stem = f"kai_matmul_clamp_f32_{name}"
    obj = tmp / f"{stem}.o"
    flags = ["-O2", "-c", "-march=armv8.6-a+dotprod+i8mm+fp16", f"-I{src_root}", f"-I{d}"]
    if (d / f"{stem}_asm.S").exists():
        src = d / f"{stem}_asm.S"
    elif (d / f"{stem}.c").exists():
        src = d / f"{stem}.c"
    else:
        return None
    (tmp / "src").mkdir(exist_ok=True)      # which file was built (path in the tree)
    (tmp / "src" / f"{stem}.txt").write_text(str(src.relative_to(src_root)) + "\n")
    p = subprocess.run(_cc(*flags, str(src), "-o", str(obj)), capture_output=True, text=True)
    if p.returncode:
        print(f"  {name}: build failed: {p.stderr.strip()[:300]}", file=sys.stderr)
        return None
    return obj


def _bl32_kernel(src_root: Path, family: str, name: str) -> str | None:
    """The assembly kernel the C wrapper of ``name`` calls at bl = 32 when it picks one by block
    length (e.g. the 16x4x32 i8mm gemm's ``..._opt32_...``), else None (one kernel for all)."""
    c = src_root / "kai" / "ukernels" / "matmul" / _DIRS[family] / f"kai_matmul_clamp_f32_{name}.c"
    m = _BL32_CALL.search(c.read_text()) if c.exists() else None
    return m.group(1) if m else None


def _function_range(obj: Path, symbol: str) -> tuple[int, int]:
    """[start, end) of the function ``symbol`` in the object (llvm-nm --print-size)."""
    out = subprocess.run([tool("llvm-nm-19", "llvm-nm"), "--print-size", "--defined-only", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) == 4 and f[3] == symbol:
            return int(f[0], 16), int(f[0], 16) + int(f[1], 16)
    raise ValueError(f"{symbol} is not defined in {obj.name}")


def disasm(obj: Path, symbol: str | None = None) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of the object's code, in address order (local labels of
    the kernel's loops split the listing into symbols: they are read as one stream); with
    ``symbol``, only that function's code."""
    out = subprocess.run([tool("llvm-objdump-19", "llvm-objdump"), "-d", "--no-show-raw-insn",
                          "--mattr=+sve2,+i8mm,+dotprod,+bf16,+fullfp16", str(obj)],
                         capture_output=True, text=True, check=True).stdout
    ins = []
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m:
            ops = re.sub(r"\s*//.*$", "", m.group(3)).strip()
            ins.append((int(m.group(1), 16), m.group(2), ops))
    if symbol is not None:
        lo, hi = _function_range(obj, symbol)
        ins = [i for i in ins if lo <= i[0] < hi]
    return sorted(ins)


def _block_region(ins: list[tuple[int, str, str]]) -> list[str]:
    loops = []
    for addr, mn, ops in ins:
        if BRANCH.match(mn):
            m = re.search(r"(?:^|,\s*)(?:0x)?([0-9a-f]+)(?:\s*<[^>]*>)?$", ops)
            if m and int(m.group(1), 16) < addr:
                loops.append((int(m.group(1), 16), addr))

    def body(lo, hi):
        return [(a, mn, ops) for a, mn, ops in ins if lo <= a <= hi]

    def macs(lo, hi):
        return sum(1 for _, mn, _ in body(lo, hi) if mn in MAC_MNEMONICS)

    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    hot = max(inner, key=lambda lp: macs(*lp))
    around = [lp for lp in loops if lp[0] <= hot[0] and hot[1] <= lp[1]      # hot itself too
              and any(mn == "scvtf" for _, mn, _ in body(*lp))]
    blk = min(around, key=lambda lp: lp[1] - lp[0]) if around else hot
    return [f"{mn} {ops}".strip() for _, mn, ops in body(*blk) if not BRANCH.match(mn)]


def measure_kleidiai(src_root: Path) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for (family, regime), names in KLEIDIAI.items():
            for name in names:
                obj = _build(src_root, family, name, Path(tmp))
                if obj is None:
                    print(f"  KleidiAI {name}: not in the tree, skipped", file=sys.stderr)
                    continue
                entry = _bl32_kernel(src_root, family, name)
                try:
                    region = _block_region(disasm(obj, entry))
                except ValueError:      # e.g. a wrapper .c whose _asm.S is not in the tree
                    print(f"  KleidiAI {name}: no multiply-accumulate loop in {obj.name}, skipped",
                          file=sys.stderr)
                    continue
                mr, nr = _tile(name)
                src = next(f for f in (Path(tmp) / "src").iterdir() if f.name.startswith(obj.stem))
                for model in MODELS:
                    cyc = mca_block(region, model)
                    rows.append({"family": family, "regime": regime, "kernel": name, "model": model,
                                 "source": src.read_text().split("\n", 1)[0],
                                 **({"bl32_kernel": entry} if entry else {}),
                                 "block_insns": len(region),
                                 "block_macs": 32 * mr * nr, "block_cycles": round(cyc, 2),
                                 "block_macs_per_cycle": round(32 * mr * nr / cyc, 2)})
    return {"rows": rows}


def measure_tilegen() -> list[dict]:
    rows = []
    for family in ("q4_0", "q4_0_dx"):
        for regime, tiles in TILEGEN.items():
            for t in tiles:
                spec = f"{family}:{t}"
                for model in MODELS:
                    try:
                        r = analyze(spec, model)
                    except Exception as e:      # a tile the allocator refuses
                        print(f"  {spec}: {e}", file=sys.stderr)
                        break
                    nr = int(re.match(r"\w+:(\d+)x(\d+)", t).group(2))
                    rows_ = r.macs_per_iter // (32 * nr)
                    macs = 32 * rows_ * nr
                    rows.append({"family": family, "regime": regime, "spec": spec, "kernel": r.kernel,
                                 "model": model, "block_macs": macs,
                                 "block_cycles": round(r.block32_cycles, 2),
                                 "block_macs_per_cycle": round(macs / r.block32_cycles, 2),
                                 "hot_loop_efficiency": round(r.efficiency, 3)})
    return rows


def _best(rows, family, regime, model):
    c = [r for r in rows if r["family"] == family and r["regime"] == regime and r["model"] == model]
    return max(c, key=lambda r: r["block_macs_per_cycle"]) if c else None


def compare(tg: list[dict], kai: list[dict]) -> list[dict]:
    out = []
    for family, regime in KLEIDIAI:
        for model in MODELS:
            t, k = _best(tg, family, regime, model), _best(kai, family, regime, model)
            if t is None:
                continue
            ratio = t["block_macs_per_cycle"] / k["block_macs_per_cycle"] if k else None
            out.append({"family": family, "regime": regime, "model": model,
                        "tilegen": t["spec"], "tilegen_macs_per_cycle": t["block_macs_per_cycle"],
                        "kleidiai": k["kernel"] if k else None,
                        "kleidiai_macs_per_cycle": k["block_macs_per_cycle"] if k else None,
                        "ratio": round(ratio, 3) if ratio else None})
    return out


def markdown(res: dict) -> str:
    src = res["kleidiai_source"]
    lines = ["# tilegen vs KleidiAI: MACs per cycle over one 32-k block (llvm-mca-19)", "",
             f"`{res['command']}`. KleidiAI side: {src}. Best tile of each side per (family, "
             "regime, model); ratio = tilegen / KleidiAI. Per block = the whole tile's 32 k incl. "
             "scale loads, conversion and the f32 accumulation (bl = 32).", "",
             "| family | regime | model | tilegen (best) | MAC/cyc | KleidiAI (best) | MAC/cyc | ratio |",
             "|---|---|---|---|---:|---|---:|---:|"]
    for c in res["compare"]:
        lines.append(f"| {c['family']} | {c['regime']} | {c['model']} | `{c['tilegen']}` | "
                     f"{c['tilegen_macs_per_cycle']:.1f} | "
                     f"{('`' + c['kleidiai'] + '`') if c['kleidiai'] else 'not measured'} | "
                     f"{c['kleidiai_macs_per_cycle'] or '-'} | {c['ratio'] or '-'} |")
    missing = sorted({f"{c['family']} {c['regime']}" for c in res["compare"] if not c["kleidiai"]})
    if missing:
        names = sorted(n for (f, r), ns in KLEIDIAI.items() if f"{f} {r}" in missing for n in ns)
        lines += ["", f"Not measured on the KleidiAI side ({', '.join(missing)}): none of its "
                  f"kernels of that kind ({', '.join(names)}) could be built from the tree."]
    lines += ["", "## every measured kernel", "", "| side | kernel | model | cycles / block | MAC/cyc |",
              "|---|---|---|---:|---:|"]
    for side, rows in (("KleidiAI", res["kleidiai"]), ("tilegen", res["tilegen"])):
        for r in rows:
            lines.append(f"| {side} | `{r.get('spec', r['kernel'])}` | {r['model']} | "
                         f"{r['block_cycles']} | {r['block_macs_per_cycle']} |")
    return "\n".join(lines) + "\n"


# --packers: the LHS quantize-and-pack routine of the q4_0 kernels (issue #15 item 4)
PACKER_SPECS = (("qsi8d32p", 4, 16, 2, "even"), ("qsi8d32p", 4, 16, 2, "away"),
                ("qsi8d32p", 4, 8, 2, "away"), ("qsi8d32p", 8, 4, 1, "away"))
# KleidiAI kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon: cycles per element of its 4-row block
# of 32 values.  Recorded by `--packers --kleidiai DIR --record` (PACKER_REFERENCE); without
# that file, the issue #15 table's neoverse-v2 figure
PACKER_REFERENCE = RESULTS / "kleidiai_packer_reference.json"
PACKER_KAI = "lhs_quant_pack_qsi8d32p4x8sb_f32_neon"
PACKER_KLEIDIAI = {"kernel": PACKER_KAI, "cycles_per_element": {"neoverse-v2": 0.548},
                   "provenance": "issue #15 table"}


def measure_kleidiai_packer(src_root: Path) -> dict:
    """KleidiAI's 4x8sb packer built from the tree (clang-19 -O2 against the cross sysroot, the
    tree as include path):
    the loop around its amax and quantize loops (4 rows), those two inner loops expanded to
    their trip counts at bl = 32 (32 / the fabs, resp. fcvtns, per iteration: each is 4 values
    of one of the 4 rows), branches removed."""
    src = src_root / "kai" / "ukernels" / "matmul" / "pack" / f"kai_{PACKER_KAI}.c"
    with tempfile.TemporaryDirectory() as tmp:
        obj = Path(tmp) / "p.o"
        subprocess.run(_cc("-O2", "-c", "-march=armv8.2-a+fp16", "-ffreestanding", f"-I{src_root}",
                           f"-I{src.parent}", str(src), "-o", str(obj)), check=True)
        ins = disasm(obj)
    loops = []
    for addr, mn, ops in ins:
        if BRANCH.match(mn):
            m = re.search(r"(?:^|,\s*)(?:0x)?([0-9a-f]+)(?:\s*<[^>]*>)?$", ops)
            if m and int(m.group(1), 16) < addr:
                loops.append((int(m.group(1), 16), addr))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]

    def body(lo, hi):
        return [(a, mn, ops) for a, mn, ops in ins if lo <= a <= hi]

    def has(lp, mn_prefix):
        return any(mn.startswith(mn_prefix) for _, mn, _ in body(*lp))

    scan = next(lp for lp in inner if has(lp, "fabs"))
    quant = next(lp for lp in inner if has(lp, "fcvtns"))
    blk = min((lp for lp in loops if lp[0] <= min(scan[0], quant[0])
               and max(scan[1], quant[1]) <= lp[1] and lp not in (scan, quant)),
              key=lambda lp: lp[1] - lp[0])
    region = []
    a = blk[0]
    for lo, hi in sorted((scan, quant)):
        region += body(a, lo - 1)
        kind = "fabs" if (lo, hi) == scan else "fcvtns"
        nq = sum(1 for _, mn, _ in body(lo, hi) if mn == kind)
        region += body(lo, hi) * (32 // nq)
        a = hi + 1
    region += body(a, blk[1])
    lines = [f"{mn} {ops}".strip() for _, mn, ops in region if not BRANCH.match(mn)]
    return {"kernel": PACKER_KAI, "source": str(src.relative_to(src_root)),
            "block_insns": len(lines),
            "cycles_per_element": {m: round(mca_block(lines, m) / 128, 3) for m in MODELS}}


def _label_block(text: str, label: str) -> list[str]:
    """Instructions from ``label:`` to the backward branch to it, branches dropped."""
    body = text.split(f"{label}:\n", 1)[1].split(f"b.ne {label}\n", 1)[0]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if line and not line.endswith(":") and not line.startswith("."):
            out.append(line)
    return [i for i in out if not BRANCH.match(i.split()[0])]


def measure_packers() -> list[dict]:
    """Cycles per element of one 32-value block (bl = 32) of tilegen's qsi8d32p packers: the
    4-row path (``tilegen:quad-block-begin/end``, 4 x 32 elements) and the one-row path (its
    ``.Lblock`` loop body, 32 elements; the routine's only path before issue #15 item 4)."""
    from tilegen.analysis.mca import _branchless, _region
    from tilegen.generator.packers import PackerSpec, render
    rows = []
    for fmt, mr, kr, sr, rnd in PACKER_SPECS:
        spec = PackerSpec(fmt, mr, kr, sr, rounding=rnd)
        text = render(spec)
        paths = {"one row": (_label_block(text, ".Lblock"), 32)}
        quad = _region(text, "tilegen:quad-block-begin", "tilegen:quad-block-end")
        if quad is not None:
            paths["4 rows"] = (_branchless(quad), 128)
        for path, (insns, elems) in paths.items():
            for model in MODELS:
                cyc = mca_block(insns, model)
                rows.append({"packer": spec.name, "path": path, "model": model,
                             "insns": len(insns), "elements": elems,
                             "block_cycles": round(cyc, 2),
                             "cycles_per_element": round(cyc / elems, 3)})
    return rows


def packers_markdown(rows: list[dict], cmd: str, k: dict) -> str:
    models = ", ".join(k["cycles_per_element"])
    lines = ["# qsi8d32p LHS quantize-and-pack: cycles per element (llvm-mca-19)", "",
             f"`{cmd}`. One 32-value block (bl = 32), branches removed, `-iterations=200`; "
             f"tilegen's 4-row path: its bl = 32 loop (block b quantized while block b+1's amax "
             f"is taken). KleidiAI `{k['kernel']}` (4-row block): {k['provenance']} "
             f"({models}).", "",
             "| packer | path | model | insns | cycles / block | cycles / element | "
             "vs KleidiAI |", "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        ref = k["cycles_per_element"].get(r["model"])
        if r is rows[0]:
            lines += [f"| KleidiAI `{k['kernel']}` | 4 rows | {m} | "
                            f"{k.get('block_insns', '-')} | - | {v} | 1.0 |"
                            for m, v in k["cycles_per_element"].items()]
        lines.append(f"| `{r['packer']}` | {r['path']} | {r['model']} | {r['insns']} | "
                     f"{r['block_cycles']} | {r['cycles_per_element']} | "
                     f"{round(r['cycles_per_element'] / ref, 3) if ref else '-'} |")
    return "\n".join(lines) + "\n"


def _tree(given: Path) -> tuple[Path, str]:
    """(source tree, where it came from) of ``--kleidiai``: a directory as it is, a release
    tarball unpacked by ``provision.ensure_kleidiai_source`` (version and digest in its name)."""
    if given.is_file():
        tree = ensure_kleidiai_source(given, quiet=True)
        return tree, (f"ARM-software/kleidiai from `{given.name}` (unmodified release tarball; "
                      f"unpacked by tilegen.emulate.provision.ensure_kleidiai_source into "
                      f"`{tree.name}`)")
    return given, f"the source tree `{given}`"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kleidiai", type=Path, help="a KleidiAI source tree or release tarball (its "
                                                 "kernels are built from it)")
    p.add_argument("--record", action="store_true",
                   help=f"with --kleidiai: write the KleidiAI numbers to {REFERENCE.name}")
    p.add_argument("--provenance", default="",
                   help="with --record: where the tree's files came from (stored in the reference)")
    p.add_argument("-o", "--outdir", type=Path, default=RESULTS)
    p.add_argument("--packers", action="store_true",
                   help="only the qsi8d32p LHS packers (cycles per element; writes "
                        "OUTDIR/vs_kleidiai_packers.json and .md)")
    a = p.parse_args(argv)
    if a.packers:
        cmd = "python bench/vs_kleidiai.py --packers" + (
            f" --kleidiai {a.kleidiai}" if a.kleidiai else "") + (" --record" if a.record else "")
        if a.kleidiai:
            tree, origin = _tree(a.kleidiai)
            kai = measure_kleidiai_packer(tree)
            kai["command"] = cmd
            kai["provenance"] = (a.provenance or f"built from {origin}") + f" by `{cmd}`"
            if a.record:
                PACKER_REFERENCE.write_text(json.dumps(kai, indent=1) + "\n")
        elif PACKER_REFERENCE.exists():
            kai = json.loads(PACKER_REFERENCE.read_text())
            kai["provenance"] = f"recorded in `bench/results/{PACKER_REFERENCE.name}`: " + \
                kai["provenance"]
        else:
            kai = PACKER_KLEIDIAI
        rows = measure_packers()
        a.outdir.mkdir(parents=True, exist_ok=True)
        (a.outdir / "vs_kleidiai_packers.json").write_text(json.dumps(
            {"command": cmd, "models": MODELS, "kleidiai": kai,
             "kleidiai_issue15_v2": PACKER_KLEIDIAI["cycles_per_element"]["neoverse-v2"],
             "rows": rows}, indent=1) + "\n")
        md = packers_markdown(rows, cmd, kai)
        (a.outdir / "vs_kleidiai_packers.md").write_text(md)
        print(md)
        return 0
    cmd = "python bench/vs_kleidiai.py" + (f" --kleidiai {a.kleidiai}" if a.kleidiai else "") + \
        (" --record" if a.record else "")
    if a.kleidiai:
        tree, origin = _tree(a.kleidiai)
        kai = measure_kleidiai(tree)
        kai["command"] = cmd
        kai["provenance"] = a.provenance or origin
        source = f"built from {origin} by this run"
        if a.record:
            REFERENCE.write_text(json.dumps(kai, indent=1) + "\n")
    else:
        if not REFERENCE.exists():
            raise SystemExit(f"no {REFERENCE}: give --kleidiai DIR")
        kai = json.loads(REFERENCE.read_text())
        source = (f"recorded in `bench/results/{REFERENCE.name}` by `{kai['command']}`"
                  + (f" ({kai['provenance']})" if kai.get("provenance") else ""))
    tg = measure_tilegen()
    res = {"command": cmd, "kleidiai_source": source, "models": MODELS,
           "compare": compare(tg, kai["rows"]), "kleidiai": kai["rows"], "tilegen": tg}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "vs_kleidiai.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.outdir / "vs_kleidiai.md").write_text(markdown(res))
    print(markdown(res).split("\n## every")[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
