"""Static performance model: the generated kernel's 32-k block and hot loop through llvm-mca
(see shared PERF.md).

The headline figure is the cost of one 32-k block of the whole tile: for q4 the region between
``// tilegen:block-begin`` and ``// tilegen:block-end`` (scale loads, the chunk loop once at
bl = 32, conversion and scaling), branches removed; for the other families eight 4-k hot-loop
iterations.  A block marker may name its k (``tilegen:block-begin k=256``: the K-quant
kernels' super-block, 8 sub-blocks and the f32 epilogue): its cost is then reported per block
(``block_cycles``, ``block_k``) and as its 32-k share.  The hot loop is the detail: the templates mark their innermost loop with
``// tilegen:hot-loop-begin <name> (... N MACs)`` and ``// tilegen:hot-loop-end``; nothing is
guessed from the disassembly.

    block MACs/cycle = MACs of one 32-k block of the tile / its cycles (the headline)
    cycles/iter     = llvm-mca Total Cycles / Iterations for the loop body
    MAC-port bound  = llvm-mca Block RThroughput of the loop's multiply-accumulates alone
    efficiency      = bound / cycles per iteration
    MACs/cycle      = multiply-accumulates of one iteration / cycles per iteration
"""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from .sme import expand
from ..generator.render import render
from ..generator.spec import KernelSpec
from ..generator.validate import as_spec
from ..records import ISAS

__all__ = ["AnalyzeError", "LoopReport", "InstructionMix", "KReport", "hot_loop", "analyze",
           "per_k", "instruction_mix", "mca_tool", "MODELS", "MAC_MNEMONICS", "MODEL_SVE_VL"]

MODELS = ("neoverse-v2", "neoverse-n2", "neoverse-v1", "apple-m4")
# plain-NEON q4 kernels multiply with SMULL/SMULL2 (int8 -> int16) and accumulate with SADALP
MAC_MNEMONICS = ("fmla", "sdot", "udot", "smmla", "ummla", "bfmmla", "fmopa", "smopa",
                 "smull", "smull2", "smlal", "smlal2", "sadalp", "bfdot", "bfmopa")
# every modelled ISA's features (the ISA records), so that any kernel assembles for llvm-mca
_MATTR = ",".join(dict.fromkeys(f for i in ISAS.values() for f in i.mattr.split(",") if f))
# SVE vector length of each llvm-mca model's CPU (bits): scales the MAC count of VL-agnostic
# loops; models without SVE are absent.
MODEL_SVE_VL = {"neoverse-v2": 128, "neoverse-n2": 128, "neoverse-v1": 256, "a64fx": 512}


class AnalyzeError(RuntimeError):
    pass


@dataclass(frozen=True)
class LoopReport:
    kernel: str
    model: str
    cycles_per_iter: float
    mac_bound: float
    macs_per_iter: int
    block32_cycles: float | None = None    # cost of 32 k of the whole tile, scale handling included
    block32_macs: int | None = None        # MACs of those 32 k
    block_k: int = 32                      # k of the marked block (K-quants: a 256-k super-block)

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, "model": self.model,
                "block32_macs_per_cycle": self.block32_macs_per_cycle,
                "block32_cycles": self.block32_cycles, "block32_macs": self.block32_macs,
                "block_k": self.block_k, "block_cycles": self.block_cycles,
                "cycles_per_iter": self.cycles_per_iter,
                "mac_bound": self.mac_bound, "efficiency": self.efficiency,
                "macs_per_iter": self.macs_per_iter, "macs_per_cycle": self.macs_per_cycle}

    @property
    def block32_macs_per_cycle(self) -> float | None:
        """The headline: MACs per cycle over one 32-k block of the whole tile."""
        if not self.block32_cycles or not self.block32_macs:
            return None
        return self.block32_macs / self.block32_cycles

    @property
    def block_cycles(self) -> float | None:
        """Cycles of one marked block of ``block_k`` k values of the whole tile (the K-quant
        kernels: one 256-k super-block, f32 epilogue included)."""
        if self.block32_cycles is None:
            return None
        return self.block32_cycles * self.block_k / 32

    @property
    def efficiency(self) -> float:
        return self.mac_bound / self.cycles_per_iter

    @property
    def macs_per_cycle(self) -> float:
        return self.macs_per_iter / self.cycles_per_iter

    def row(self) -> str:
        bm = self.block32_macs_per_cycle
        blk = (f"{bm:9.1f} {self.block32_cycles:8.1f}" if bm is not None else
               f"{'-':>9} {'-':>8}")
        return (f"{self.kernel:<62} {self.model:<12} {blk} | {self.cycles_per_iter:7.2f} "
                f"{self.mac_bound:7.2f} {100 * self.efficiency:5.1f}% {self.macs_per_cycle:7.1f}")


# headline: one 32-k block of the whole tile; after the bar, the hot loop alone
HEADER = (f"{'kernel':<62} {'model':<12} {'blkMAC/c':>9} {'cyc/32k':>8} | {'cyc/it':>7} "
          f"{'MACbnd':>7} {'eff':>6} {'MAC/cyc':>7}")


def hot_loop(text: str) -> tuple[list[str], int]:
    """Instructions of the marked hot loop and its MAC count (from the marker)."""
    m = re.search(r"tilegen:hot-loop-begin[^\n]*?(\d+) MACs", text)
    insns = _region(text, "tilegen:hot-loop-begin", "tilegen:hot-loop-end")
    if not m or insns is None:
        raise AnalyzeError("no marked hot loop in the generated code")
    return insns, int(m.group(1))


def _region(text: str, begin: str, end: str) -> list[str] | None:
    m = re.search(rf"{begin}[^\n]*\n(.*?)\n[^\n]*{end}", text, re.S)
    if not m:
        return None
    out = []
    for line in m.group(1).splitlines():
        line = line.split("//")[0].strip()
        if line and not line.endswith(":") and not line.startswith("."):
            out.append(line)
    return out


def _branchless(insns: list[str]) -> list[str]:
    return [i for i in insns if not re.match(r"(b\.\w+|b|cbnz|cbz|tbz|tbnz)\s", i)]


def mca_tool() -> str:
    """Path of llvm-mca, or AnalyzeError saying how to install it."""
    tool = shutil.which("llvm-mca-19") or shutil.which("llvm-mca")
    if tool is None:
        raise AnalyzeError("llvm-mca not found: apt-get install llvm-19")
    return tool


def _mca(lines: list[str], model: str) -> str:
    tool = mca_tool()
    src = ".Lmca_top:\n" + "\n".join(lines) + "\n"
    p = subprocess.run([tool, "-mtriple=aarch64", f"-mcpu={model}", f"-mattr={_MATTR}",
                        "-iterations=200"], input=src, capture_output=True, text=True)
    if p.returncode != 0:
        raise AnalyzeError(f"llvm-mca -mcpu={model} failed: {p.stderr.strip()[:500]}")
    return p.stdout


@dataclass(frozen=True)
class InstructionMix:
    """SME kernels (llvm-mca has no SME model): MAC instructions per hot-loop instruction."""

    kernel: str
    mac_insns: int
    insns: int

    @property
    def ratio(self) -> float:
        return self.mac_insns / self.insns

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, "mac_insns": self.mac_insns, "insns": self.insns,
                "mac_per_insn": self.ratio}

    def row(self) -> str:
        return f"{self.kernel:<62} {self.mac_insns:6d} {self.insns:6d} {self.ratio:8.3f}"


MIX_HEADER = f"{'kernel (SME: no llvm-mca model)':<62} {'MACins':>6} {'insns':>6} {'MAC/ins':>8}"


def instruction_mix(spec: KernelSpec | str) -> InstructionMix:
    spec = as_spec(spec)
    insns, _ = hot_loop(render(spec).text)
    macs = sum(1 for i in insns if i.split()[0] in MAC_MNEMONICS)
    return InstructionMix(spec.name, macs, len(insns))


@dataclass(frozen=True)
class KReport:
    """Cost of ``k`` values of the whole tile (:func:`per_k`)."""

    kernel: str
    model: str
    k: int
    macs: int           # k x the tile's MACs per k value
    cycles: float
    insns: int          # instructions modelled per ``unit_k`` values (branches removed)
    unit_k: int         # k-values of the region measured (the block, or one hot-loop pass)

    @property
    def macs_per_cycle(self) -> float:
        return self.macs / self.cycles

    def as_dict(self) -> dict:
        return {"kernel": self.kernel, "model": self.model, "k": self.k, "macs": self.macs,
                "cycles": self.cycles, "macs_per_cycle": self.macs_per_cycle,
                "insns": self.insns, "unit_k": self.unit_k}


def _check_model(spec: KernelSpec, model: str) -> None:
    if spec.isa_info.vl_kind == "sme":
        raise AnalyzeError(f"{spec.name}: llvm-mca has no useful SME model; SME kernels are "
                           f"measured by instruction_mix (MAC instructions per loop instruction)")
    if spec.isa_info.vl_kind == "sve" and model not in MODEL_SVE_VL:
        raise AnalyzeError(f"{spec.name}: model {model} has no SVE (models with SVE: "
                           f"{', '.join(MODEL_SVE_VL)})")


def per_k(spec: KernelSpec | str, model: str, k: int = 256) -> KReport:
    """llvm-mca cost of ``k`` values of the whole tile, every per-block step included (the
    K-quants: one 256-k super-block, ``bench/vs_ggml.py``).

    The unit measured: the marked block region (``tilegen:block-begin`` ..
    ``tilegen:block-end``) if the kernel has one, covering the K values its marker states
    (``tilegen:block-begin k=<K>``, a K-quant super-block) or 32 (q4's bl = 32 block); a
    loop inside it runs the trip count on its label line (``// tilegen:trips <n>``, as for
    the SME static model, at the model's SVE vector length; an unmarked loop runs once).
    Without a block region, one hot-loop pass, covering the k its marker states (``(<n> k x``
    / ``(<n> k-steps``).  Branches removed; the unit's cycles are scaled by k / its k-values.
    MACs = k x the hot loop's MACs per k value."""
    spec = as_spec(spec)
    _check_model(spec, model)
    text = render(spec).text
    insns, macs = hot_loop(text)
    if spec.vl_scaled:      # the marker counts MACs per 128 bits of vector length
        macs = macs * MODEL_SVE_VL[model] // 128
    m = re.search(r"tilegen:hot-loop-begin[^\n]*?\((?:[^()\n]*: )?(\d+) k[ -]", text)
    if not m:
        raise AnalyzeError(f"{spec.name}: the hot-loop marker does not say how many k-values "
                           f"one iteration covers ('(<n> k x ...')")
    hot_k = int(m.group(1))
    block = re.search(r"tilegen:block-begin( k=(\d+))?[^\n]*\n(.*?)\n[^\n]*tilegen:block-end",
                      text, re.S)
    if block is not None:
        unit = int(block.group(2)) if block.group(1) else 32
        lines = _branchless(expand(block.group(3).splitlines(), MODEL_SVE_VL.get(model, 128)))
    else:
        unit, lines = hot_k, _branchless(insns)
    if k % unit or k % hot_k:
        raise AnalyzeError(f"{spec.name}: k={k} is not a multiple of {unit} (one measured "
                           f"region) and {hot_k} (one hot-loop iteration)")
    out = _mca(lines, model)
    cyc = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / int(
        re.search(r"Iterations:\s+(\d+)", out).group(1))
    return KReport(spec.name, model, k, k * macs // hot_k, cyc * k / unit, len(lines), unit)


def analyze(spec: KernelSpec | str, model: str) -> LoopReport:
    spec = as_spec(spec)
    _check_model(spec, model)
    text = render(spec).text
    insns, macs = hot_loop(text)
    if spec.vl_scaled:      # the marker counts MACs per 128 bits of vector length
        macs = macs * MODEL_SVE_VL[model] // 128
    body = [re.sub(r"(b\.\w+|b|cbnz|cbz)\s+(\S+,\s*)?\S+$",
                   lambda mm: f"{mm.group(1)} {mm.group(2) or ''}.Lmca_top", i) for i in insns]
    out = _mca(body, model)
    total = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1))
    iters = int(re.search(r"Iterations:\s+(\d+)", out).group(1))
    mac_lines = [i for i in insns if i.split()[0] in MAC_MNEMONICS]
    if not mac_lines:
        raise AnalyzeError(f"{spec.name}: no multiply-accumulate ({', '.join(MAC_MNEMONICS)}) "
                           f"in the marked hot loop")
    bound = float(re.search(r"Block RThroughput:\s+([\d.]+)", _mca(mac_lines, model)).group(1))
    cpi = total / iters
    block = _region(text, "tilegen:block-begin", "tilegen:block-end")
    block_k = 32
    if block is not None:       # q4: one 32-k block = scale loads + one chunk + conversion
        out = _mca(_branchless(block), model)
        blk = int(re.search(r"Total Cycles:\s+(\d+)", out).group(1)) / int(
            re.search(r"Iterations:\s+(\d+)", out).group(1))
        blk_macs = macs         # the chunk loop (32 k) runs once per block at bl = 32
        # a block of another k (``tilegen:block-begin k=256``: one K-quant super-block whose
        # hot loop is the block): the 32-k figures are its share
        mk = re.search(r"tilegen:block-begin k=(\d+)", text)
        if mk:
            block_k = int(mk.group(1))
            blk, blk_macs = blk * 32 / block_k, macs * 32 // block_k
    else:                       # f32: the hot loop covers 4 k
        blk, blk_macs = 8 * cpi, 8 * macs
    return LoopReport(spec.name, model, cpi, bound, macs, blk, blk_macs, block_k)
