"""What mixture-of-experts adds around the kernels: instructions per MUL_MAT_ID outside the
matmul kernels (grouping, gathering, activation quantise/pack, scatter) against the kernels'
own, counted under qemu, for tilegen's path (the llama patch's grouped MUL_MAT_ID, compiled from
``kleidiai_moe.cpp.j2`` into tests/data/templates/mmid_harness.cpp.j2 over the exported
kernels) and ggml's repack path (``bench/moe_overhead_ggml.cpp``: one MUL_MAT_ID node on
weights in ggml's CPU_REPACK buffer, linked against the llama check's OFF build), on the
synthetic MoE model's shapes (``tilegen.gguf.synth.MOE_CONFIG``: k = n = 256, 4 experts, 2
used), decode (1 token) and a prompt batch (64 tokens), one thread.

The count: qemu-user ``-one-insn-per-tb -d exec,nochain`` logs every guest instruction; the
programs call ``mmid_mark`` around the measured call and print where each object is loaded, and
each instruction between the marks is attributed to its function (``llvm-nm``): the kernels
(tilegen: ``*matmul_clamp*``; ggml: ``ggml_gemm_*``/``ggml_gemv_*``), the activation packers
(tilegen: ``*lhs*pack*``; ggml: ``quantize_*q8*``), everything else (grouping, gathers, scatters,
``memcpy``).  For ggml the one-node graph compute of a tiny ``ggml_add`` (the CPU backend's
cost of computing any graph) is counted too and subtracted from "other".  Both programs run on
qemu's ``neoverse-n1`` (the OFF build is ``armv8.2-a+dotprod``: ggml's DOTPROD repack kernels;
tilegen's DOTPROD table entries).

Needs the llama check's OFF build (``scripts/llama_cpp_check.sh`` makes it; its static ggml
libraries are linked here), clang-19 and the cross sysroot.

    python bench/moe_overhead.py [--types q4_0,q4_K] [--tokens 1,64] [--work DIR]
"""
from __future__ import annotations

import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))          # this checkout's tilegen
CPU = "neoverse-n1"
#: llama.cpp's kernels.cpp DOTPROD entries of the KleidiAI types (gemm, its LHS packer, gemv,
#: its LHS packer) and the block arguments kleidiai.cpp passes (lhs_bl, rhs_bl, pack_bl)
KAI_ENTRIES = {
    "q4_0": ("qsi8d32p4x4_qsi4c32p4x4_16x4_neon_dotprod", "lhs_quant_pack_qsi8d32p_f32",
             "qsi8d32p1x4_qsi4c32p4x4_1x4_neon_dotprod", "lhs_quant_pack_qsi8d32p_f32", (32, 32, 32)),
    "q8_0": ("qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod", "lhs_quant_pack_qai8dxp_f32",
             "qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod", "lhs_quant_pack_qai8dxp_f32", (0, 0, 32)),
}
#: the programs' marker function (the counted window lies between two of its calls)
MARK = "mmid_mark"


class BenchError(RuntimeError):
    pass


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if p.returncode:
        raise BenchError(f"{' '.join(map(str, cmd))[:300]}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def _tool(*names: str) -> str:
    for n in names:
        if shutil.which(n):
            return n
    raise BenchError(f"needs {' or '.join(names)} (scripts/setup.sh installs llvm-19)")


# --- the programs ---------------------------------------------------------------------------

def off_ggml_libs() -> list[Path]:
    """libggml, libggml-cpu, libggml-base of the llama check's OFF build (the newest)."""
    from tilegen.emulate import provision
    found = sorted((provision.cache_dir() / "llama").glob("*-off-*/build/ggml/src/libggml-cpu.a"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise BenchError("no OFF build of the llama check in the cache: run "
                         "scripts/llama_cpp_check.sh once (it builds ggml for aarch64)")
    d = found[-1].parent
    return [d / "libggml.a", d / "libggml-cpu.a", d / "libggml-base.a"]


def build_programs(work: Path) -> dict:
    """The exported KleidiAI tree as a shared object, the MUL_MAT_ID harness (the patch's
    default chunk size) and the ggml driver."""
    import jinja2
    from tilegen.build.toolchain import discover
    from tilegen.emulate import provision
    from tilegen.export import kleidiai as K
    from tilegen.generator.render import template_env
    tc = discover("elf")
    if tc.kind != "clang":
        raise BenchError(f"needs clang (scripts/setup.sh installs clang-19), found {tc.kind}")
    sysroot = provision.ensure_cross_sysroot(quiet=True)
    llama = provision.ensure_llama_cpp_source(quiet=True)
    ggml = llama / "ggml"
    so = work / "libkai_export.so"
    if not so.is_file():
        root = work / "kleidiai"
        shutil.rmtree(root, ignore_errors=True)
        K.write_tree(root, target="linux-aarch64-all")
        (work / "aarch64.cmake").write_text(K.cmake_toolchain(cc=tc.driver[0]))
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        _run(["cmake", "-S", root, "-B", work / "build", *gen, "-DCMAKE_BUILD_TYPE=Release",
              f"-DCMAKE_TOOLCHAIN_FILE={work / 'aarch64.cmake'}"])
        _run(["cmake", "--build", work / "build", "-j", "2"])
        _run(tc.link_cmd(["-Wl,-Bsymbolic", "-Wl,--whole-archive", work / "build" / "libkleidiai.a",
                          "-Wl,--no-whole-archive"], so))
    env = template_env().overlay(loader=jinja2.ChoiceLoader([
        jinja2.FileSystemLoader(str(ROOT / "tests" / "data" / "templates")), template_env().loader]))
    src = work / "mmid_harness.cpp"
    src.write_text(env.get_template("mmid_harness.cpp.j2").render(chunk_rows=None))
    lld = next(f for f in tc.link_flags if f.startswith("-fuse-ld="))
    harness = work / "mmid_harness"
    # -O3, as llama.cpp's Release build compiles kleidiai.cpp
    _run([*tc.driver, "--driver-mode=g++", *tc.target_flags, "-std=c++17", "-O3", f"--sysroot={sysroot}",
          f"-I{ggml / 'include'}", f"-I{ggml / 'src' / 'ggml-cpu' / 'kleidiai'}", src, "-o", harness, lld,
          "-static-libstdc++", "-static-libgcc", "-ldl"])
    driver = work / "moe_overhead_ggml"
    _run([*tc.driver, "--driver-mode=g++", *tc.target_flags, "-std=c++17", "-O3", f"--sysroot={sysroot}",
          f"-I{ggml / 'include'}", ROOT / "bench" / "moe_overhead_ggml.cpp", "-o", driver, lld,
          *off_ggml_libs(), "-static-libstdc++", "-static-libgcc", "-lpthread", "-lm", "-ldl"])
    return {"so": so, "harness": harness, "driver": driver}


# --- inputs ---------------------------------------------------------------------------------

def entry(kind: str) -> tuple:
    """(gemm, gemm LHS packer, gemv, gemv LHS packer, block args, gemm spec) of the DOTPROD
    table entry of ``kind`` the patch uses."""
    from tilegen.export import kleidiai as K
    from tilegen.export.llama import LLAMA_FAMILIES
    if kind in KAI_ENTRIES:
        gemm, gl, gemv, vl, bl = KAI_ENTRIES[kind]
        spec = next(kk.kernel_spec for kk in K.KERNELS if kk.name == "matmul_clamp_f32_" + gemm)
        return "matmul_clamp_f32_" + gemm, gl, "matmul_clamp_f32_" + gemv, vl, bl, spec
    for e in K.KQUANT_DEFAULT:
        if e.family == kind and e.isa == "dotprod":
            fam = LLAMA_FAMILIES[kind]
            bl = (fam.block_len,) * 3 if fam.kernel_bl else (0, 0, 0)
            lhs = K.llama_entry(e).lhs_packer
            return e.gemm.name, lhs, e.gemv.name, lhs, bl, e.gemm.kernel_spec
    raise BenchError(f"no DOTPROD table entry for {kind}")


def weights(kind: str, E: int, n: int, k: int, rng) -> np.ndarray:
    """E experts' ggml blocks (E, n, row bytes): ggml's quantisation of normal floats for Q4_0 /
    Q8_0, random valid blocks for the other families."""
    from tilegen.families import KIND_FAMILY, rhs_layout_class
    from tilegen.layout.ggml import quantize_q4_0, quantize_q8_0
    if kind in ("q4_0", "q8_0"):
        q = quantize_q4_0 if kind == "q4_0" else quantize_q8_0
        return np.stack([q(rng.normal(size=(n, k)).astype(np.float32)) for _ in range(E)])
    lay = rhs_layout_class(KIND_FAMILY[kind])
    return np.stack([lay.random_ggml(n, k, int(rng.integers(1 << 30))).reshape(n, -1)
                     for _ in range(E)])


def packed_rhs(spec, raw: np.ndarray, n: int, k: int) -> bytes:
    """One expert packed as the patch's repack packs it (the gemm's RHS layout)."""
    from tilegen.layout import rhs_layout_for
    return rhs_layout_for(spec).pack_from_ggml(raw, n, k).tobytes()


# --- the count ------------------------------------------------------------------------------

def symbols(path: Path, base: int) -> list[tuple[int, int, str]]:
    """(start, end, name) of the defined functions of ``path`` loaded at ``base``."""
    nm = _tool("llvm-nm-19", "llvm-nm")
    out = _run([nm, "--defined-only", "-S", "-C", "--numeric-sort", path]).stdout
    syms = []
    for line in out.splitlines():
        m = re.match(r"([0-9a-f]+) ([0-9a-f]+) [tTwW] (.+)$", line)
        if m and int(m.group(2), 16):
            a = int(m.group(1), 16) + base
            syms.append((a, a + int(m.group(2), 16), m.group(3)))
    return sorted(syms)


def run_traced(argv: list[str], exe: Path) -> tuple[list[collections.Counter], list]:
    """Run ``argv`` under qemu (neoverse-n1) logging every instruction. The program prints
    where each object is loaded and waits; the symbols are read, then it runs on. Returns per
    window between successive ``mmid_mark`` calls a Counter PC -> instructions, and the
    symbol table [(start, end, name, object)]."""
    from tilegen.emulate.runner import guest_command
    cmd, env = guest_command([str(a) for a in argv], CPU)
    env = dict(env, MMID_MAPS="1")
    sysroot = Path(cmd[cmd.index("-L") + 1]) if "-L" in cmd else Path("/")
    with tempfile.TemporaryDirectory() as d:
        fifo = Path(d) / "exec.log"
        os.mkfifo(fifo)
        qemu = [cmd[0], "-one-insn-per-tb", "-d", "exec,nochain", "-D", str(fifo), *cmd[1:]]
        proc = subprocess.Popen(qemu, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        mark: list[int] = []            # the marker's PC, set before the program may call it
        phases: list[collections.Counter] = []

        def parse() -> None:
            pat = re.compile(r"\[[0-9a-f]+/([0-9a-f]+)/")
            cur = None
            with open(fifo) as f:
                for line in f:
                    m = pat.search(line)
                    if not m:
                        continue
                    pc = int(m.group(1), 16)
                    if mark and pc == mark[0]:
                        cur = collections.Counter()
                        phases.append(cur)
                    elif cur is not None:
                        cur[pc] += 1

        t = threading.Thread(target=parse)
        t.start()
        maps, err = [], []
        for line in proc.stderr:
            if line.startswith("maps end"):
                break
            err.append(line)
            m = re.match(r"map (\S*) 0x([0-9a-f]+)$", line.strip())
            if m:
                maps.append((m.group(1), int(m.group(2), 16)))
        table = []
        for name, addr in maps:         # an object's functions not in its symbol table: "?"
            if addr:
                table.append((addr, addr, "?", Path(name).name if name else exe.name))
            host = exe if not name else Path(name) if Path(name).is_file() else \
                sysroot / name.lstrip("/")
            if host.is_file():
                table += [(a, b, s, host.name) for a, b, s in symbols(host, addr)]
        table.sort()
        pcs = [a for a, _, s, o in table if s == MARK and o == exe.name]
        if len(pcs) == 1:
            mark.append(pcs[0])
        proc.stdin.write("\n")
        proc.stdin.close()
        err.append(proc.stderr.read())
        rc = proc.wait()
        t.join()
        if rc or len(pcs) != 1:
            raise BenchError(f"traced {exe.name}: exit {rc}, {len(pcs)} {MARK} symbols: "
                             f"{''.join(err)[-1500:]}")
    return phases[:-1], table


def attribute(counts: collections.Counter, table: list, classify) -> tuple[dict, dict]:
    """Instructions per category (``classify(function name, object)``), and per (category,
    function) the instructions of each function."""
    starts = [a for a, _, _, _ in table]
    bases = [(a, o) for a, b, _, o in table if a == b]     # the objects' load addresses
    out: dict[str, int] = collections.Counter()
    funcs: dict[tuple, int] = collections.Counter()
    for pc, c in counts.items():
        i = bisect.bisect_right(starts, pc) - 1
        while i >= 0 and table[i][0] == table[i][1]:        # skip the object markers
            i -= 1
        if i >= 0 and table[i][0] <= pc < table[i][1]:
            name, obj = table[i][2], table[i][3]
        else:       # the last object loaded below pc (libc's memcpy variants, say)
            j = bisect.bisect_right([a for a, _ in bases], pc) - 1
            name, obj = "", bases[j][1] if j >= 0 else "?"
        cat = classify(name, obj)
        out[cat] += c
        funcs[(cat, f"{name or '?'} ({obj})")] += c
    return dict(out), dict(funcs)


def tilegen_class(name: str, obj: str) -> str:
    if "matmul_clamp" in name:
        return "kernels"
    if "lhs" in name and "pack" in name:
        return "pack"
    return "other"


def ggml_class(name: str, obj: str) -> str:
    if "ggml_gemm_" in name or "ggml_gemv_" in name:
        return "kernels"
    if "quantize" in name and "q8" in name:
        return "pack"
    return "other"


def measure(kind: str, shape: str, tokens: int, progs: dict, work: Path, seed: int = 0) -> list[dict]:
    """Both paths' counts for one MUL_MAT_ID: ``shape`` "up" (k = n_embd, n = n_ff, the
    activations shared by the slots, as gate/up) or "down" (k = n_ff, n = n_embd, one
    activation row per slot)."""
    import gguf
    from tilegen.gguf import synth
    cfg = synth.MOE_CONFIG
    E, U = cfg.n_expert, cfg.n_expert_used
    k, n, src1_rows = (cfg.n_embd, cfg.n_ff, 1) if shape == "up" else (cfg.n_ff, cfg.n_embd, U)
    rng = np.random.default_rng(seed)
    raw = weights(kind, E, n, k, rng)
    x = rng.normal(size=(tokens, src1_rows, k)).astype(np.float32)
    ids = np.stack([rng.permutation(E)[:U] for _ in range(tokens)]).astype(np.int32)
    gemm, gl, gemv, vl, bl, spec = entry(kind)
    rhs = [packed_rhs(spec, raw[e], n, k) for e in range(E)]
    blob = np.array([k, n, E, U, tokens, src1_rows, *bl], np.int64).tobytes() + ids.tobytes() \
        + x.tobytes() + b"".join(np.int64(len(r)).tobytes() + r for r in rhs)
    tin = work / f"tg-{kind}-{shape}-{tokens}.bin"
    tin.write_bytes(blob)
    phases, table = run_traced([progs["harness"], progs["so"], "1" if _kernel_bl(kind) else "0",
                                gemm, gl, gemv, vl, tin, work / "out.bin", "1"], progs["harness"])
    tg, tg_funcs = attribute(phases[0], table, tilegen_class)
    ty = gguf.GGMLQuantizationType[kind.upper()].value
    gin = work / f"ggml-{kind}-{shape}-{tokens}.bin"
    gin.write_bytes(np.array([ty, k, n, E, U, tokens, src1_rows], np.int64).tobytes()
                    + raw.tobytes() + x.tobytes() + ids.tobytes())
    phases, table = run_traced([progs["driver"], gin], progs["driver"])
    frame = sum(phases[0].values())
    gg, gg_funcs = attribute(phases[2], table, ggml_class)
    rows = []
    for path, c, extra, funcs in (("tilegen", tg, 0, tg_funcs), ("ggml repack", gg, frame, gg_funcs)):
        kern = c.get("kernels", 0)
        other = max(0, c.get("other", 0) - extra)
        rows.append({"type": kind, "shape": shape, "tokens": tokens, "rows": tokens * U,
                     "path": path, "kernels": kern, "pack": c.get("pack", 0), "other": other,
                     "framework": extra, "functions": funcs,
                     "overhead": (c.get("pack", 0) + other) / kern if kern else float("nan")})
    return rows


def _kernel_bl(kind: str) -> bool:
    from tilegen.export.llama import LLAMA_FAMILIES
    fam = LLAMA_FAMILIES.get(kind)
    return kind == "q4_0" or (fam is not None and fam.kernel_bl)


def table_md(rows: list[dict]) -> str:
    head = ("| type | shape | tokens | routed rows | path | kernel instr. | LHS quantise/pack | "
            "group, gather, scatter, other | outside / kernels |\n|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['type']} | {r['shape']} | {r['tokens']} | {r['rows']} | {r['path']} | {r['kernels']:,} | "
        f"{r['pack']:,} | {r['other']:,} | {100 * r['overhead']:.1f} % |\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--types", default="q4_0,q4_K", help="comma-separated (default q4_0,q4_K)")
    p.add_argument("--shapes", default="up,down")
    p.add_argument("--tokens", default="1,64")
    p.add_argument("--work", type=Path, help="build directory (default: a temporary one)")
    p.add_argument("--detail", type=int, default=0, metavar="N",
                   help="also list the N functions with the most instructions of each run")
    a = p.parse_args(argv)
    work = a.work or Path(tempfile.mkdtemp(prefix="moe-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        progs = build_programs(work)
        rows = []
        for kind in a.types.split(","):
            for shape in a.shapes.split(","):
                for tokens in map(int, a.tokens.split(",")):
                    rows += measure(kind, shape, tokens, progs, work)
                    print(f"moe_overhead: {kind} {shape} {tokens} done", file=sys.stderr)
    except BenchError as e:
        print(f"moe_overhead: error: {e}", file=sys.stderr)
        return 2
    print(table_md(rows), end="")
    if a.detail:
        for r in rows:
            frame = r["framework"]
            note = f" (the framework's {frame:,} subtracted from other)" if frame else ""
            print(f"\n{r['type']} {r['shape']} {r['tokens']} tokens, {r['path']}{note}:")
            for (cat, name), c in sorted(r["functions"].items(), key=lambda kv: -kv[1])[:a.detail]:
                print(f"  {cat:8} {c:>10,}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
