"""Per-256-k-super-block cost of ggml's repack kernels (or vec_dot) next to tilegen's (llvm-mca).

    python bench/vs_ggml.py                          # ggml built now; tilegen's K-quant defaults
    python bench/vs_ggml.py --tilegen q4_K:i8mm:8x4 --tilegen q6_K:dotprod:1x8   # these specs
    python bench/vs_ggml.py --no-tilegen             # ggml's side only
    python bench/vs_ggml.py --models neoverse-v2 --kernels ggml_gemm_q4_K_8x8_q8_K -o /tmp/x

The figure (issue #24's): MACs per cycle over one 256-k super-block of the whole tile =
mr x nr x 256 / llvm-mca-19 cycles (``-iterations=200``, branches removed; the method and
helpers of bench/vs_kleidiai.py) of every instruction the kernel runs for that super-block.

ggml: ``ggml/src/ggml-cpu/arch/arm/repack.cpp`` of the llama.cpp sources in the
llama-cpp-python sdist (``tilegen.emulate.provision.ensure_llama_cpp_source``; never vendored)
is compiled with clang-19 -O3 for each model's ``-mcpu`` (the aarch64 headers from
``ensure_cross_sysroot``) and linked statically with ``bench/vs_ggml_driver.c``, which calls one
kernel on one tile (gemm: 4 rows x 8 columns, gemv: 1 x 8) of nb super-blocks.  qemu-user
(``tilegen.emulate``; the model's SVE vector length, which picks ggml's SVE-256 or NEON path)
traces the instructions the kernel runs (``-one-insn-per-tb -d exec,nochain -dfilter``) at
nb = 2 and nb = 3: the extra instructions of nb = 3 are the kernel's whole path through one super-block,
unrolled loops, inner loops and data-independent branches included, nothing guessed from the
loop structure.  Its int8 dot-product MACs (SDOT/UDOT 4 per lane, SMMLA 32 per 128 bits) must
equal mr x nr x 256, else the run fails.  ``ISSUE_BUILD`` (the issue's one build for all four
models: ``-march=armv8.6-a+dotprod+i8mm+fp16``, no SVE) is measured too, against the figures
issue #24 quotes (``ISSUE_FIGURES``).

ggml's vec_dot, for a type its repack lacks (a plugin's ``GGML_VEC_DOT``; IQ4_XS:
``ggml_vec_dot_iq4_xs_q8_K`` of ``arch/arm/quants.c``, one output per call): quants.c is
compiled with the same flags and linked into the same driver, which calls it as ggml's
mul_mat does (n = 256 nb, nrc x nrc outputs); the same two traces cut one super-block of those
outputs (MACs checked: nrc x nrc x 256).  ggml's mul_mat calls it per output for every m, so
the one figure stands for its gemm and its gemv.

tilegen: ``tilegen.analysis.mca.per_k(spec, model, 256)`` (the kernel's marked block region,
``tilegen:block-begin k=256``, inner loops expanded by their ``tilegen:trips``; or a hot loop
that covers the super-block), cross-checked for the K-quant kernels (Q8 calling convention)
by the same qemu cut of the generated kernel linked with the driver (``-DTILEGEN_KERNEL``):
the two must agree within 2%.  Specs: the
``--tilegen`` ones, else every default kernel (tilegen.build) of the K-quant families of the
registry (``q4_K``, ``q5_K``, ``q6_K``) that the model's target runs and llvm-mca models (no SME), and the ``GRID`` tiles
(i8mm / dotprod gemm 4..32 x 4, 8 and gemv 1 x 4..16; sve_i8mm / sve_dotprod gemm
4..16 x 1vl, 2vl and gemv 1 x 1..4vl) the register allocator accepts.

Writes OUTDIR/vs_ggml.json and .md (default bench/results).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # this checkout's tilegen
sys.path.insert(0, str(Path(__file__).resolve().parent))          # vs_kleidiai's helpers
from vs_kleidiai import BRANCH, disasm, mca_block, tool  # noqa: E402

MODELS = ("neoverse-v2", "neoverse-n2", "neoverse-v1", "apple-m4")
RESULTS = Path(__file__).resolve().parent / "results"
DRIVER = Path(__file__).resolve().parent / "vs_ggml_driver.c"
SB = 256                                    # QK_K: k-values of one super-block
NR = 8                                      # ggml's repacked column groups (block_q4_Kx8 ...)
ROWS = {"gemm": 4, "gemv": 1}               # block_q8_Kx4 rows per gemm tile; gemv one row

def _ggml_kernels(plugins=None) -> tuple[tuple, ...]:
    """(family, regime, ggml function, instruction it multiplies with, columns of its group) of
    every ggml kernel tilegen's families are measured against: a plugin's own
    ``GGML_REPACK`` ((regime, function, instruction, columns), ...: e.g. iq4_nl's 4x4 kernels
    on q8_0 blocks), else, for a K-quant family, ggml's naming of its K-quant kernels
    ggml_<regime>_<type>_8x8_q8_K (SMMLA) and _8x4_q8_K (SDOT), 8 columns; and a plugin's
    ``GGML_VEC_DOT`` ((regime, function, instruction, nrc), ...: the vec_dot of
    ``arch/arm/quants.c`` ggml's mul_mat calls for a type its repack lacks, e.g. iq4_xs's
    ggml_vec_dot_iq4_xs_q8_K, nrc x nrc outputs per call; :func:`vec_dots`).  ``plugins``:
    the registry's (``tilegen.families.PLUGINS``) by default.  The driver is built with this
    list (KERNELS, VEC_DOTS), and a name the sources lack fails the build, saying so."""
    from tilegen.families import KQUANT_FAMILIES, PLUGINS
    out = []
    for regime in ("gemm", "gemv"):
        for p in PLUGINS if plugins is None else plugins:
            fam = p.RECORDS[0].name
            own = getattr(p, "GGML_REPACK", None)
            if own is None and fam in KQUANT_FAMILIES:
                own = tuple((regime, f"ggml_{regime}_{fam}_8x{w}_q8_K", mac, NR)
                            for w, mac in (("8", "smmla"), ("4", "sdot")))
            out += [(fam, r, f, mac, cols) for r, f, mac, cols in own or () if r == regime]
            out += [(fam, r, f, mac, nrc) for r, f, mac, nrc in getattr(p, "GGML_VEC_DOT", ())
                    if r == regime]
    return tuple(out)


def vec_dots(plugins=None) -> dict[str, int]:
    """ggml vec_dot function -> nrc (one call computes nrc rows x nrc columns) of the plugins'
    ``GGML_VEC_DOT``s (``plugins``: the registry's by default)."""
    from tilegen.families import PLUGINS
    return {f: nrc for p in (PLUGINS if plugins is None else plugins)
            for _, f, _, nrc in getattr(p, "GGML_VEC_DOT", ())}


GGML = _ggml_kernels()
VEC_DOT = vec_dots()
COLS = {g[2]: g[4] for g in GGML}
#: tilegen's families measured: those with a ggml kernel (repack or vec_dot)
TILEGEN_FAMILIES = tuple(dict.fromkeys(g[0] for g in GGML))


def rows_of(func: str, regime: str) -> int:
    """Rows of the tile one call of ``func`` computes: nrc for a vec_dot, else ROWS[regime]."""
    return VEC_DOT.get(func, ROWS[regime])
# qemu-user CPU of each model for the trace: what matters is the ISA and the SVE vector length
# (ggml's q4_K 8x8 gemm has an SVE path for 256-bit vectors only); qemu has no v2 / m4 model
QEMU_CPU = {"neoverse-v2": "max,sve-default-vector-length=16", "neoverse-n2": "neoverse-n2",
            "neoverse-v1": "neoverse-v1", "apple-m4": "max,sve=off"}
SVE_VL = {"neoverse-v2": 128, "neoverse-n2": 128, "neoverse-v1": 256}
# the issue's build: one -march for the four models (no SVE: the NEON paths everywhere)
ISSUE_BUILD = "-march=armv8.6-a+dotprod+i8mm+fp16"
ISSUE_FIGURES = {   # issues #24 / #32, "Performance": MAC/cycle per super-block, v2 / n2 / v1 / m4
    "ggml_gemm_q4_K_8x8_q8_K": (36.2, 16.6, 34.7, 26.8),
    "ggml_gemm_q4_K_8x4_q8_K": (30.6, 14.3, 29.5, 23.7),
    "ggml_gemm_q6_K_8x8_q8_K": (24.9, 11.3, 23.5, 18.4),
    "ggml_gemm_q6_K_8x4_q8_K": (23.1, 10.5, 21.7, 16.9),
    "ggml_gemm_q5_K_8x8_q8_K": (27.0, 12.7, 26.9, None),
    "ggml_gemm_q5_K_8x4_q8_K": (21.7, 10.3, 21.6, None),
    "ggml_gemv_q5_K_8x4_q8_K": (9.6, 4.7, 9.9, None),
    "ggml_gemm_iq4_nl_4x4_q8_0": (29.8, 14.2, 25.4, None),
    "ggml_gemv_iq4_nl_4x4_q8_0": (15.2, 7.4, 11.9, None),
}
TARGETS = {"gemm": 1.5, "gemv": 1.0}        # tilegen / ggml's best, per super-block (issue #24)


def target(family: str, regime: str) -> float:
    """The ratio tilegen / ggml's best a family's kernels are held to: its plugin's
    ``VS_GGML_TARGETS`` (issue #32's formats: gemm 1.8, gemv 1.3), else TARGETS."""
    from tilegen.families import plugin
    return getattr(plugin(family), "VS_GGML_TARGETS", TARGETS)[regime]


class GgmlError(RuntimeError):
    pass


# --- ggml: build, trace, cut one super-block -------------------------------------------------

@dataclass(frozen=True)
class Build:
    """ggml's repack.cpp and the driver, linked statically for one set of target flags."""

    flags: str
    exe: Path
    ins: dict[int, tuple[str, str]]         # address -> (mnemonic, operands)
    funcs: dict[str, tuple[int, int]]       # symbol -> [start, end)


def ggml_tree() -> Path:
    from tilegen.emulate.provision import ensure_llama_cpp_source
    return ensure_llama_cpp_source(quiet=True)


def build(flags: str, tmp: Path, tree: Path | None = None) -> Build:
    """clang-19 -O3 ``flags`` of repack.cpp (the tree's ggml include dirs, the cross sysroot's
    C/C++ headers) + the driver, linked statically (lld, unused sections dropped)."""
    from tilegen.emulate.provision import ensure_cross_sysroot
    tree = tree or ggml_tree()
    sysroot = ensure_cross_sysroot(quiet=True)
    src = tree / "ggml" / "src" / "ggml-cpu" / "arch" / "arm" / "repack.cpp"
    if not src.is_file():
        raise GgmlError(f"{src} is missing: is {tree} a llama.cpp tree with ggml's Arm repack?")
    tag = re.sub(r"[^\w.-]+", "_", flags)
    target = ["--target=aarch64-linux-gnu", f"--sysroot={sysroot}", *flags.split()]
    inc = [f"-I{tree / 'ggml' / d}" for d in ("include", "src", "src/ggml-cpu")]
    obj = tmp / f"repack{tag}.o"
    _run([tool("clang++-19", "clang++"), *target, "-O3", "-std=c++17", "-ffunction-sections",
          *inc, "-c", str(src), "-o", str(obj)])
    objs = [obj]
    if VEC_DOT:             # the vec_dot functions: ggml's Arm quants.c, the same flags
        qsrc = src.parent / "quants.c"
        if not qsrc.is_file():
            raise GgmlError(f"{qsrc} is missing: is {tree} a llama.cpp tree with ggml's Arm "
                            "vec_dot functions?")
        objs.append(tmp / f"quants{tag}.o")
        _run([tool("clang-19", "clang"), *target, "-O3", "-std=c11", "-ffunction-sections",
              *inc, "-c", str(qsrc), "-o", str(objs[-1])])
    return _link(flags, target, objs, tmp / f"driver{tag}", "ggml_")


def _run(cmd: list[str]) -> None:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise GgmlError(f"{' '.join(cmd[:3])} ... failed:\n{p.stderr.strip()[:800]}")


def _link(flags: str, target: list[str], objs: list[Path], exe: Path, prefix: str,
          defines: tuple[str, ...] = ()) -> Build:
    """The driver linked statically (lld, unused sections dropped) with ``objs``; the
    functions whose symbol starts with ``prefix`` and their address ranges."""
    kernels = "KERNELS(X)=" + " ".join(f"X({f},{ROWS[r]},{c})" for _, r, f, _, c in GGML
                                       if f not in VEC_DOT)
    dots = "VEC_DOTS(X)=" + " ".join(f"X({f},{n})" for f, n in VEC_DOT.items())
    _run([tool("clang-19", "clang"), *target, f"-D{kernels}", f"-D{dots}", *defines, "-O2",
          "-fuse-ld=lld", "-static", str(DRIVER), *map(str, objs), "-Wl,--gc-sections", "-o", str(exe)])
    nm = subprocess.run([tool("llvm-nm-19", "llvm-nm"), "-S", str(exe)], capture_output=True,
                        text=True, check=True).stdout
    funcs = {}
    for line in nm.splitlines():
        f = line.split()
        if len(f) == 4 and f[2] in "Tt" and f[3].startswith(prefix):
            funcs[f[3]] = (int(f[0], 16), int(f[0], 16) + int(f[1], 16))
    return Build(flags, exe, {a: (mn, ops) for a, mn, ops in disasm(exe)}, funcs)


def tilegen_trace_lines(spec, tmp: Path, qemu_cpu: str, vl: int = 128) -> list[str]:
    """The instructions a generated tilegen kernel (Q8 calling convention) runs for one
    super-block of one tile (its rows and columns at SVE vector length ``vl`` bits, the one
    ``qemu_cpu`` has), cut the way ggml's are (the driver built with -DTILEGEN_KERNEL),
    branches removed: the cross-check of ``tilegen.analysis.mca.per_k``."""
    mr, nr = spec.mr_at(vl // 8), spec.nr_at(vl // 8)
    from tilegen.emulate.provision import ensure_cross_sysroot
    from tilegen.generator.render import render
    asm = tmp / f"{spec.name}.S"
    asm.write_text(render(spec).text)
    target = ["--target=aarch64-linux-gnu", f"--sysroot={ensure_cross_sysroot(quiet=True)}"]
    b = _link("tilegen", target, [asm], tmp / f"tilegen-{spec.name}-{vl}", spec.name,
              (f"-DTILEGEN_KERNEL={spec.name}", f"-DTILE_MR={mr}", f"-DTILE_NR={nr}"))
    pcs = one_super_block(trace(b, spec.name, 2, qemu_cpu, tmp),
                          trace(b, spec.name, 3, qemu_cpu, tmp))
    return [f"{b.ins[a][0]} {b.ins[a][1]}".strip() for a in pcs if not BRANCH.match(b.ins[a][0])]


def _qemu() -> str:
    from tilegen.emulate.provision import ensure
    tb = ensure(quiet=True)
    if tb.qemu is None:
        raise GgmlError("the trace needs qemu-user (this host runs aarch64 natively)")
    return str(tb.qemu)


def trace(b: Build, func: str, nb: int, qemu_cpu: str, tmp: Path) -> list[int]:
    """Addresses of the instructions ``func`` runs on one tile of ``nb`` super-blocks."""
    lo, hi = b.funcs[func]
    log = tmp / f"trace-{func}-{nb}.log"
    p = subprocess.run([_qemu(), "-cpu", qemu_cpu, "-one-insn-per-tb", "-d", "exec,nochain",
                        "-dfilter", f"{lo:#x}..{hi - 1:#x}", "-D", str(log), str(b.exe), func,
                        str(nb)], capture_output=True, text=True)
    if p.returncode:
        raise GgmlError(f"qemu -cpu {qemu_cpu} {b.exe.name} {func} {nb}: {p.stderr.strip()[:400]}")
    pcs = []
    with log.open() as f:
        for line in f:
            m = re.search(r"\[[0-9a-f]+/([0-9a-f]+)/", line)
            if m and lo <= int(m.group(1), 16) < hi:
                pcs.append(int(m.group(1), 16))
    log.unlink()
    return pcs


WINDOW = 256        # instructions that must agree after an inserted stretch


def one_super_block(t2: list[int], t3: list[int]) -> list[int]:
    """The instructions ``t3`` (nb = 3) runs beyond ``t2`` (nb = 2), in order: t2 with one
    more iteration of the super-block loop inserted in each pass over k (one pass for ggml's
    tiles; a tilegen tile taller or wider than its register block runs several).  Walking
    both, each stretch starts where the traces part (the loop's back branch: the stretch is
    the loop path from its head) and ends at the shortest length after which the traces agree
    again for ``WINDOW`` instructions (or to both ends)."""
    extra = len(t3) - len(t2)
    if extra <= 0:
        raise GgmlError("the kernel runs no more instructions for one more super-block")
    out, i, j = [], 0, 0
    while i < len(t2):
        if t2[i] == t3[j]:
            i, j = i + 1, j + 1
            continue
        w = min(WINDOW, len(t2) - i)
        ell = next((n for n in range(1, len(t3) - j - w + 1)
                    if t3[j + n:j + n + w] == t2[i:i + w]), None)
        if ell is None:
            raise GgmlError("the nb = 3 trace is not the nb = 2 trace with stretches added")
        out += t3[j:j + ell]
        j += ell
    out += t3[j:]
    if len(out) != extra:
        raise GgmlError("the nb = 3 trace is not the nb = 2 trace with stretches added")
    return out


def dot_macs(mn: str, ops: str, vl: int) -> int:
    """int8 multiply-accumulates of one SDOT/UDOT/USDOT/SMMLA/UMMLA/USMMLA (0 for others)."""
    z = ops.startswith("z")
    if mn in ("smmla", "ummla", "usmmla"):
        return 32 * (vl // 128 if z else 1)
    if mn in ("sdot", "udot", "usdot", "sudot"):
        if z:
            return (vl // 8) if ".s" in ops.split(",")[0] else 0
        return 8 if ops.split(",")[0].endswith(".2s") else 16
    return 0


def ggml_path(b: Build, func: str, rows: int, model: str, qemu_cpu: str, tmp: Path) -> dict:
    """The instructions of one super-block of ``func`` on the model (checked by its MACs)."""
    if func not in b.funcs:
        raise GgmlError(f"{func} is not in repack.cpp / quants.c built with {b.flags}")
    pcs = one_super_block(trace(b, func, 2, qemu_cpu, tmp), trace(b, func, 3, qemu_cpu, tmp))
    vl = SVE_VL.get(model, 128)
    insns = [b.ins[a] for a in pcs]
    macs = sum(dot_macs(mn, ops, vl) for mn, ops in insns)
    cols = COLS.get(func, NR)
    if macs != rows * cols * SB:
        raise GgmlError(f"{func} ({b.flags}, {model}): the super-block path has {macs} int8 "
                        f"dot-product MACs, {rows}x{cols}x{SB} = {rows * cols * SB} expected")
    return {"lines": [f"{mn} {ops}".strip() for mn, ops in insns if not BRANCH.match(mn)],
            "sve": any(re.search(r"\bz\d+\.", ops) for _, ops in insns),
            "stack_ldst": sum(1 for mn, ops in insns
                              if mn.startswith(("ld", "st")) and "[sp" in ops),
            "insns": len(insns), "macs": macs}


def measure_ggml(models=MODELS, kernels=None, issue_build: bool = True,
                 tmp: Path | None = None) -> list[dict]:
    """One row per (build, kernel, model): the per-model -mcpu build, and the issue's build."""
    with tempfile.TemporaryDirectory() as d:
        tmp = tmp or Path(d)
        tree = ggml_tree()
        builds = [(f"-mcpu={m}", (m,)) for m in models]
        if issue_build:
            builds.append((ISSUE_BUILD, tuple(models)))
        rows = []
        for flags, on in builds:
            b = build(flags, tmp, tree)
            seen = {}       # a vec_dot serves both regimes: measured once per model
            for family, regime, func, mac, _ in GGML:
                if kernels and func not in kernels:
                    continue
                for model in on:
                    cpu = "max,sve=off" if flags == ISSUE_BUILD else QEMU_CPU[model]
                    again = (func, model) in seen
                    if not again:
                        path = ggml_path(b, func, rows_of(func, regime), model, cpu, tmp)
                        seen[func, model] = path, mca_block(path["lines"], model)
                    path, cyc = seen[func, model]
                    ref = ISSUE_FIGURES.get(func)
                    rows.append({"family": family, "regime": regime, "kernel": func,
                                 "mac_insn": mac, "build": flags, "model": model,
                                 "qemu_cpu": cpu, "path": "sve" if path["sve"] else "neon",
                                 "insns": path["insns"], "stack_ldst": path["stack_ldst"],
                                 "macs": path["macs"], "cycles": round(cyc, 2),
                                 "macs_per_cycle": round(path["macs"] / cyc, 2),
                                 "issue_figure": ref[MODELS.index(model)] if ref and
                                 flags == ISSUE_BUILD else None})
                    if not again:
                        print(f"  ggml {func:<26} {flags:<36} {model:<12} "
                              f"{rows[-1]['macs_per_cycle']:6.1f} MAC/cyc", file=sys.stderr)
        return rows


# --- tilegen ----------------------------------------------------------------------------------

# tiles tried besides the defaults (the tuner's usual leaders): gemm mr x nr, gemv 1 x nr
# (SVE: nr in vector lengths)
GRID = {"gemm": [(mr, nr) for mr in (4, 8, 12, 16, 20, 24, 28, 32) for nr in (4, 8)],
        "gemv": [(1, nr) for nr in (4, 8, 12, 16)]}
GRID_SVE = {"gemm": [(mr, f"{v}vl") for mr in (4, 8, 12, 16) for v in (1, 2)],
            "gemv": [(1, f"{v}vl") for v in (1, 2, 3, 4)]}
GRID_ISAS = ("i8mm", "dotprod", "sve_i8mm", "sve_dotprod")


def tilegen_specs(model: str, families=TILEGEN_FAMILIES) -> list[str]:
    """Default kernels (tuned first) of ``families`` that the model's target runs, no SME,
    then the ``GRID`` tiles on ``GRID_ISAS`` that the allocator accepts (spec strings)."""
    from tilegen.build.defaults import default_specs
    from tilegen.build.targets import get_target
    from tilegen.generator.validate import as_spec
    from tilegen.families import FAMILIES
    target = get_target(model)
    defaults = [s for s in default_specs(target)
                if s.family in families and s.isa_info.vl_kind != "sme"]
    out, names = [s.spec_string for s in defaults], {s.name for s in defaults}
    for fam in families:
        for isa in (i for i in GRID_ISAS if i in FAMILIES[fam].isas if fam in FAMILIES):
            grid = GRID_SVE if isa.startswith("sve") else GRID
            for mr, nr in grid["gemm"] + grid["gemv"]:
                try:
                    spec = as_spec(f"{fam}:{isa}:{mr}x{nr}")
                except Exception:       # a tile the allocator refuses
                    continue
                if target.supports(spec) and spec.name not in names:
                    names.add(spec.name)
                    out.append(f"{fam}:{isa}:{mr}x{nr}")
    return out


def measure_tilegen(specs_by_model: dict[str, list[str]], traced: bool = True) -> list[dict]:
    """``per_k`` per 256 k of each spec on each model; with ``traced``, for the Q8 calling
    convention's kernels (the K-quants) also the cycles of the instructions the kernel runs
    for one super-block under qemu (cut like ggml's): they must agree with per_k's."""
    from tilegen.analysis.mca import per_k
    from tilegen.callconv import Q8
    from tilegen.generator.validate import as_spec
    rows, lines = [], {}
    with tempfile.TemporaryDirectory() as d:
        for model, specs in specs_by_model.items():
            for s in specs:
                spec = as_spec(s)
                try:
                    r = per_k(spec, model, SB)
                except Exception as e:      # e.g. an SVE kernel on a model without SVE
                    print(f"  tilegen {s} on {model}: {e}", file=sys.stderr)
                    continue
                tr = None
                if traced and spec.info.abi is Q8 and SB % r.unit_k == 0:
                    vl = SVE_VL.get(model, 128) if spec.vl_scaled else 128
                    if (spec.name, vl) not in lines:
                        lines[spec.name, vl] = tilegen_trace_lines(spec, Path(d),
                                                                   QEMU_CPU[model], vl)
                    # the whole mr x nr tile: per_k's region is one pass of the register
                    # block (a taller / wider tile runs several over k)
                    tile = spec.mr_at(vl // 8) * spec.nr_at(vl // 8) * SB
                    tr = mca_block(lines[spec.name, vl], model) * r.macs / tile
                    if abs(tr - r.cycles) > 0.02 * r.cycles:
                        raise GgmlError(f"{s} on {model}: per_k models {r.cycles:.1f} cycles per "
                                        f"super-block, the traced path {tr:.1f}")
                rows.append({"family": spec.family, "regime": "gemv" if spec.mr == 1 else "gemm",
                             "spec": s, "kernel": r.kernel, "model": model, "macs": r.macs,
                             "cycles": round(r.cycles, 2), "insns_per_block": r.insns,
                             "block_k": r.unit_k, "macs_per_cycle": round(r.macs_per_cycle, 2),
                             "traced_cycles": None if tr is None else round(tr, 2)})
                print(f"  tilegen {s:<30} {model:<12} {rows[-1]['macs_per_cycle']:6.1f} MAC/cyc",
                      file=sys.stderr)
    return rows


# --- tables -----------------------------------------------------------------------------------

def _best(rows, family, regime, model, key="macs_per_cycle"):
    c = [r for r in rows if r["family"] == family and r["regime"] == regime and r["model"] == model]
    return max(c, key=lambda r: r[key]) if c else None


def compare(ggml: list[dict], tg: list[dict], models=MODELS) -> list[dict]:
    """Per (family, regime, model): ggml's best (any kernel, either build), tilegen's best,
    ratio."""
    out = []
    for family, regime in dict.fromkeys((f, r) for f, r, *_ in GGML):
        for model in models:
            g, t = _best(ggml, family, regime, model), _best(tg, family, regime, model)
            if g is None:
                continue
            ratio = round(t["macs_per_cycle"] / g["macs_per_cycle"], 3) if t else None
            out.append({"family": family, "regime": regime, "model": model,
                        "ggml": g["kernel"], "ggml_path": g["path"], "ggml_build": g["build"],
                        "ggml_macs_per_cycle": g["macs_per_cycle"],
                        "tilegen": t["spec"] if t else None,
                        "tilegen_macs_per_cycle": t["macs_per_cycle"] if t else None,
                        "ratio": ratio, "target": target(family, regime),
                        "meets_target": None if ratio is None else ratio >= target(family, regime)})
    return out


def markdown(res: dict) -> str:
    L = ["# tilegen vs ggml's repack kernels (vec_dot where ggml has no repack): MACs per cycle "
         "over one 256-k super-block (llvm-mca-19)", "",
         f"`{res['command']}`. ggml: `{res['ggml_source']}` built now with clang-19 -O3, "
         f"`-mcpu=<model>` and `{ISSUE_BUILD}` (its best of both is the anchor), its whole "
         "path through 256 k of the tile (gemm 4x8, gemv 1x8; iq4_nl 4x4, 1x4; a vec_dot: its "
         "nrc x nrc outputs, one call per output of mul_mat for both regimes) traced by qemu "
         "(nb = 3 minus nb = 2), branches removed. "
         "tilegen: `tilegen.analysis.mca.per_k(spec, model, 256)`. Ratio = tilegen / ggml's best; "
         "targets: gemm >= 1.5, gemv >= 1.0 (issue #32's formats q5_K, iq4_nl: 1.8 and 1.3).", "",
         "| family | regime | model | ggml (best) | MAC/cyc | tilegen (best) | MAC/cyc | ratio | "
         "target |", "|---|---|---|---|---:|---|---:|---:|---|"]
    for c in res["compare"]:
        ok = "-" if c["ratio"] is None else ("met" if c["meets_target"] else "**missed**")
        L.append(f"| {c['family']} | {c['regime']} | {c['model']} | `{c['ggml']}` "
                 f"(`{c['ggml_build']}`, {c['ggml_path']}) | {c['ggml_macs_per_cycle']:.1f} | "
                 f"{('`' + c['tilegen'] + '`') if c['tilegen'] else 'no kernel'} | "
                 f"{c['tilegen_macs_per_cycle'] if c['tilegen'] else '-'} | "
                 f"{c['ratio'] or '-'} | >= {c['target']} ({ok}) |")
    L += ["", "## ggml, every kernel and build", "",
          f"`-mcpu=<model>`: the build for that CPU (ggml's SVE path where the model's vector "
          f"length is the one it is written for). `{ISSUE_BUILD}`: issue #24's one build "
          f"(NEON paths), beside the figure the issue quotes. stack ld/st: loads and stores "
          f"with an `[sp` address in the super-block path.", "",
          "| kernel | build | model | path | insns | stack ld/st | cycles | MAC/cyc | issue |",
          "|---|---|---|---|---:|---:|---:|---:|---:|"]
    listed = set()      # a vec_dot's gemm and gemv rows are one measurement
    for r in res["ggml"]:
        if (r["kernel"], r["build"], r["model"]) in listed:
            continue
        listed.add((r["kernel"], r["build"], r["model"]))
        L.append(f"| `{r['kernel']}` | `{r['build']}` | {r['model']} | {r['path']} | "
                 f"{r['insns']} | {r['stack_ldst']} | {r['cycles']} | {r['macs_per_cycle']} | "
                 f"{r['issue_figure'] or ''} |")
    if res["tilegen"]:
        L += ["", "## tilegen, every kernel", "",
              "cycles / 256 k: `per_k` (the marked region: one pass of the register block); "
              "traced: the instructions the kernel runs for one super-block of the whole tile "
              "under qemu, cut like ggml's (K-quant kernels), per pass.",
              "", "| spec | model | insns / block | block k | cycles / 256 k | traced | MAC/cyc |",
              "|---|---|---:|---:|---:|---:|---:|"]
        for r in res["tilegen"]:
            L.append(f"| `{r['spec']}` | {r['model']} | {r['insns_per_block']} | "
                     f"{r['block_k']} | {r['cycles']} | {r['traced_cycles'] or '-'} | "
                     f"{r['macs_per_cycle']} |")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tilegen", action="append", metavar="SPEC",
                   help="tilegen kernel spec to compare (repeatable; default: the K-quant "
                        "family defaults of each model's target)")
    p.add_argument("--no-tilegen", action="store_true", help="ggml's side only")
    p.add_argument("--no-trace-tilegen", action="store_true",
                   help="skip the qemu-traced cross-check of tilegen's K-quant figures")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--kernels", nargs="+", choices=[g[2] for g in GGML],
                   help="only these ggml kernels")
    p.add_argument("--no-issue-build", action="store_true",
                   help=f"skip the issue's {ISSUE_BUILD} build")
    p.add_argument("-o", "--outdir", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    cmd = "python bench/vs_ggml.py" + "".join(f" --tilegen {s}" for s in a.tilegen or ()) + \
        (" --no-tilegen" if a.no_tilegen else "") + \
        (f" --models {' '.join(a.models)}" if a.models != list(MODELS) else "") + \
        (f" --kernels {' '.join(a.kernels)}" if a.kernels else "") + \
        (" --no-issue-build" if a.no_issue_build else "") + \
        (" --no-trace-tilegen" if a.no_trace_tilegen else "")
    ggml = measure_ggml(tuple(a.models), a.kernels, not a.no_issue_build)
    if a.no_tilegen:
        specs = {}
    elif a.tilegen:
        specs = {m: list(a.tilegen) for m in a.models}
    else:
        specs = {m: tilegen_specs(m) for m in a.models}
        if not any(specs.values()):
            print("  tilegen: no default kernel of the K-quant families (give --tilegen)",
                  file=sys.stderr)
    tg = measure_tilegen(specs, not a.no_trace_tilegen)
    src = ggml_tree()
    res = {"command": cmd, "models": a.models,
           "ggml_source": f"{src.parent.parent.name}/vendor/llama.cpp/ggml/src/ggml-cpu/arch/arm/"
                          "repack.cpp" + (" and quants.c" if VEC_DOT else ""),
           "compare": compare(ggml, tg, a.models), "ggml": ggml, "tilegen": tg}
    a.outdir.mkdir(parents=True, exist_ok=True)
    (a.outdir / "vs_ggml.json").write_text(json.dumps(res, indent=1) + "\n")
    (a.outdir / "vs_ggml.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
