"""Static model of SME / SME2 kernels (llvm-mca has no SME model): instruction mix.

Counted over the marked hot loop (``tilegen:hot-loop-begin/end``), per hot-loop iteration and,
for the quantized families, per 32-k block (``tilegen:block-begin/end``, one scale block of
q4_0; loops inside the block are expanded by their trip count, see below).

Counting rule (per 128-bit SVL granule, so that the figures do not depend on the SVL):
every figure is taken at SVL = 128 bits.  At SVL = 128*g an outer product does g^2 times the
MACs below and a ZA-array or Z-register instruction g times; the loop's instruction count does
not change, so MACs/instruction of an outer-product loop grows with g^2, of a vector loop with g.

    outer products  FMOPA/BFMOPA/FMOPS/SMOPA/UMOPA/SUMOPA/USMOPA  za<t>.<T>, ..., z.<E>:
                    (16/|T|)^2 * |T|/|E| MACs (|T|, |E|: element bytes of tile and operands)
                    f32 FMOPA 16, BFMOPA / f16 FMOPA into .s 32, int8 SMOPA into .s 64
    ZA-array ops    FMLA/FMLS/BFMLA/SDOT/UDOT/USDOT/SUDOT/FDOT/BFDOT  za.<T>[w, off, vgxN]:
                    N * (16/|T|) * |T|/|E| MACs (N = 1 without vgx): f32 FMLA vgx4 16, int8
                    SDOT vgx4 64
    Z-register dots SDOT/UDOT/USDOT/SUDOT/BFDOT z.<T>, z.<E>: (16/|T|) * |T|/|E| MACs.
    Z-register FMLA/FMUL are not MACs: in the SME kernels they only apply scales.
    loads           every instruction whose mnemonic starts with ``ld`` (vectors: the Z
                    registers it writes; scalar loads count 0 vectors).

Loops inside a block region run the trip count written on their label line as
``// tilegen:trips <expr>`` (``svl`` = SVL in bits, e.g. ``svl/32``); the block figures are
taken at a stated SVL (``block_svl``, default 512: the block's ZA-slice loops make the
per-block cost VL-dependent).  The same counter reads KleidiAI's published kernels
(``count_kleidiai``): their ``.inst`` words carry the mnemonic in a comment.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SmeReport", "macs_of", "load_vectors", "is_load", "count", "sme_report",
           "kleidiai_lines", "count_kleidiai", "SME_HEADER"]

_ESZ = {"b": 1, "h": 2, "s": 4, "d": 8, "q": 16}
_MOPA = ("fmopa", "fmops", "bfmopa", "bfmops", "smopa", "smops", "umopa", "umops", "sumopa",
         "usmopa", "bmopa")
_ZA_OPS = ("fmla", "fmls", "bfmla", "bfmls", "sdot", "udot", "usdot", "sudot", "fdot", "bfdot",
           "svdot", "uvdot", "fvdot", "bfvdot", "smlall", "umlall", "smlal", "umlal", "fmlal",
           "bfmlal")
_Z_DOTS = ("sdot", "udot", "usdot", "sudot", "bfdot")


def _mnemonic(insn: str) -> str:
    return insn.split()[0].lower() if insn.split() else ""


def _operand_esz(insn: str) -> int | None:
    """Element bytes of the last Z operand (the multiplicands)."""
    m = re.findall(r"z\d+\.([bhsdq])", insn.lower())
    return _ESZ[m[-1]] if m else None


def macs_of(insn: str) -> int:
    """Multiply-accumulates of one instruction at SVL = 128 bits (0: not a MAC)."""
    op, low = _mnemonic(insn), insn.lower()
    if op in _MOPA:
        m = re.search(r"za\d+\.([bhsdq])", low)
        e = _operand_esz(low)
        if not m or e is None:
            return 0
        t = _ESZ[m.group(1)]
        return (16 // t) ** 2 * (t // e)
    m = re.search(r"\bza\.([bhsdq])\[[^\]]*\]", low)
    if op in _ZA_OPS and m:
        t = _ESZ[m.group(1)]
        e = _operand_esz(low[m.end():]) or t
        vg = re.search(r"vgx(\d)", m.group(0))
        grp = re.search(r"\{([^}]*)\}", low[m.end():])   # without vgx: the list's length
        n = int(vg.group(1)) if vg else (_list_len(grp.group(1)) if grp else 1)
        if op in ("smlall", "umlall"):   # 4-way widening into .s / .d
            e = t // 4
        return n * (16 // t) * max(t // e, 1)
    if op in _Z_DOTS and "za" not in low:
        m = re.match(r"\w+\s+z\d+\.([bhsdq])", low)
        e = _operand_esz(low)
        if m and e:
            t = _ESZ[m.group(1)]
            return (16 // t) * (t // e)
    return 0


def _list_len(regs: str) -> int:
    r = re.match(r"\s*z(\d+)\.\w\s*-\s*z(\d+)\.\w\s*$", regs)
    if r:
        return (int(r.group(2)) - int(r.group(1))) % 32 + 1
    return len(re.findall(r"z\d+", regs))


def is_load(insn: str) -> bool:
    return _mnemonic(insn).startswith("ld")


def load_vectors(insn: str) -> int:
    """Z registers one load writes (0 for scalar and predicate loads)."""
    if not is_load(insn):
        return 0
    low = insn.lower()
    m = re.match(r"\w+\s+\{([^}]*)\}", low)
    if m:
        return _list_len(m.group(1))
    return 1 if re.match(r"\w+\s+z\d+", low) else 0


@dataclass(frozen=True)
class Counts:
    insns: int
    mac_insns: int
    macs: int            # per 128-bit granule (SVL = 128)
    loads: int
    load_vectors: int


def count(insns: list[str]) -> Counts:
    macs = [macs_of(i) for i in insns]
    return Counts(len(insns), sum(1 for m in macs if m), sum(macs),
                  sum(1 for i in insns if is_load(i)), sum(load_vectors(i) for i in insns))


def _outer(insn: str) -> bool:
    return _mnemonic(insn) in _MOPA


def _macs_at(insns: list[str], svl: int) -> int:
    g = svl // 128
    return sum(macs_of(i) * (g * g if _outer(i) else g) for i in insns)


@dataclass(frozen=True)
class SmeReport:
    kernel: str
    k_per_iter: int
    loop: Counts
    block: Counts | None = None      # one 32-k block at block_svl, inner loops expanded
    block_macs_at_svl: int | None = None
    block_svl: int = 512
    source: str = "tilegen"

    @property
    def mac_per_insn(self) -> float:
        return self.loop.mac_insns / self.loop.insns

    @property
    def macs_per_insn(self) -> float:
        return self.loop.macs / self.loop.insns

    @property
    def loads_per_mac(self) -> float:
        return self.loop.loads / self.loop.macs if self.loop.macs else float("nan")

    @property
    def block_macs_per_insn(self) -> float | None:
        if self.block is None:
            return None
        return self.block_macs_at_svl / self.block.insns

    def as_dict(self) -> dict:
        d = {"kernel": self.kernel, "source": self.source, "model": "sme-static",
             "k_per_iter": self.k_per_iter, "insns": self.loop.insns,
             "mac_insns": self.loop.mac_insns, "mac_per_insn": round(self.mac_per_insn, 4),
             "macs_per_iter_128": self.loop.macs, "macs_per_insn_128": round(self.macs_per_insn, 3),
             "loads": self.loop.loads, "load_vectors": self.loop.load_vectors,
             "loads_per_mac_128": round(self.loads_per_mac, 5)}
        if self.block is not None:
            d.update({"block_svl": self.block_svl, "block_insns": self.block.insns,
                      "block_mac_insns": self.block.mac_insns,
                      "block_macs": self.block_macs_at_svl, "block_loads": self.block.loads,
                      "block_macs_per_insn": round(self.block_macs_per_insn, 2)})
        return d

    def row(self) -> str:
        blk = (f"{self.block.insns:6d} {self.block_macs_per_insn:8.1f}"
               if self.block is not None else f"{'-':>6} {'-':>8}")
        return (f"{self.kernel:<62} {self.k_per_iter:4d} {self.loop.insns:5d} "
                f"{self.loop.mac_insns:5d} {self.mac_per_insn:7.3f} {self.macs_per_insn:8.2f} "
                f"{self.loop.loads:5d} {1000 * self.loads_per_mac:8.2f} {blk}")


SME_HEADER = (f"{'kernel (SME static model: per 128-bit SVL granule)':<62} {'k/it':>4} "
              f"{'ins':>5} {'MACi':>5} {'MACi/i':>7} {'MAC/ins':>8} {'lds':>5} "
              f"{'ld/kMAC':>8} {'blkins':>6} {'blkMAC/i':>8}")


def _region_lines(text: str, begin: str, end: str) -> list[str] | None:
    m = re.search(rf"{begin}[^\n]*\n(.*?)\n[^\n]*{end}", text, re.S)
    return m.group(1).splitlines() if m else None


_BRANCH = re.compile(r"^(b\.\w+|b|cbnz|cbz|tbz|tbnz|b(?:gt|lt|ne|eq|le|ge|hi|lo|hs|ls|mi|pl))\s")


def _clean(line: str) -> tuple[str | None, str | None, str]:
    """(label, instruction, comment) of one assembly line."""
    code, _, comment = line.partition("//")
    code = code.strip()
    if not code:
        return None, None, comment
    if code.endswith(":"):
        return code[:-1].strip(), None, comment
    if code.startswith("."):
        return None, None, comment
    return None, code, comment


def expand(lines: list[str], svl: int, trips: dict[str, str] | None = None) -> list[str]:
    """Dynamic instruction list of a region: each loop (a label with a later branch back to
    it) runs its trip count, from ``// tilegen:trips <expr>`` on the label line or ``trips``."""
    parsed = [_clean(ln) for ln in lines]
    trips = dict(trips or {})
    for lab, _, com in parsed:
        m = re.search(r"tilegen:trips\s+(\S+)", com)
        if lab and m:
            trips[lab] = m.group(1)

    def target(insn: str) -> str:
        return insn.replace(",", " ").split()[-1]

    def run(i0: int, i1: int) -> list[str]:
        out, i = [], i0
        while i < i1:
            lab, insn, _ = parsed[i]
            if lab is not None:
                back = [j for j in range(i + 1, i1) if parsed[j][1] and _BRANCH.match(parsed[j][1])
                        and target(parsed[j][1]).rstrip("b") in (lab, lab + "b")]
                if back and lab in trips:
                    j = back[-1]
                    n = int(eval(trips[lab], {"__builtins__": {}}, {"svl": svl}))  # noqa: S307
                    out += run(i + 1, j + 1) * n
                    i = j + 1
                    continue
            if insn is not None:
                out.append(insn)
            i += 1
        return out

    return run(0, len(parsed))


def _hot(text: str) -> tuple[list[str], int]:
    lines = _region_lines(text, "tilegen:hot-loop-begin", "tilegen:hot-loop-end")
    m = re.search(r"tilegen:hot-loop-begin\s+\S+\s+\((\d+) k", text)
    if lines is None:
        raise ValueError("no marked hot loop in the generated code")
    return [i for _, i, _ in map(_clean, lines) if i], int(m.group(1)) if m else 0


def sme_report(spec, block_svl: int = 512) -> SmeReport:
    """Instruction mix of one SME kernel's hot loop (and 32-k block, quantized families)."""
    from .generator.render import render
    from .generator.validate import as_spec
    spec = as_spec(spec)
    text = render(spec).text
    insns, k = _hot(text)
    block = _region_lines(text, "tilegen:block-begin", "tilegen:block-end")
    if block is None:
        return SmeReport(spec.name, k, count(insns))
    dyn = expand(block, block_svl)
    return SmeReport(spec.name, k, count(insns), count(dyn), _macs_at(dyn, block_svl), block_svl)


# --- KleidiAI's published kernels (read, never copied into this repository) ---------------

def kleidiai_lines(text: str) -> list[str]:
    """Assembly lines of a KleidiAI kernel (.c inline asm or .S): ``.inst`` words replaced by
    the mnemonic in their comment, labels kept (``7:`` / ``label_7:``)."""
    out = []
    for raw in text.splitlines():
        s = raw.strip()
        m = re.match(r'^"(.*?)(?:\\n)?"\s*(//.*)?$', s)
        if m:
            s = (m.group(1).strip() + ("  " + m.group(2) if m.group(2) else "")).strip()
        m = re.match(r"KAI_ASM_LABEL\((\w+)\)(.*)", s)
        if m:
            s = m.group(1) + ":" + m.group(2)
        m = re.match(r"(?:\.inst\s+0x[0-9a-fA-F]+|KAI_ASM_INST\(0x[0-9a-fA-F]+\))\s*//\s*(.*)", s)
        if m:
            s = m.group(1)
        if not s or s.startswith("#"):
            continue
        out.append(s)
    return out


def _loop_body(lines: list[str], label: str) -> list[str]:
    parsed = [_clean(ln) for ln in lines]
    start = next(i for i, (lab, _, _) in enumerate(parsed) if lab == label)
    for j in range(start + 1, len(parsed)):
        insn = parsed[j][1]
        back = insn and _BRANCH.match(insn) and insn.replace(",", " ").split()[-1]
        if back in (label, label + "b"):
            return lines[start + 1:j + 1]
    raise ValueError(f"no backward branch to {label}")


def count_kleidiai(name: str, text: str, hot_label: str, k_per_iter: int,
                   block_label: str | None = None, block_trips: dict[str, str] | None = None,
                   block_svl: int = 512) -> SmeReport:
    """The same figures for a KleidiAI kernel: its hot loop is the loop at ``hot_label``; the
    32-k block the loop at ``block_label`` (one iteration), inner loops by ``block_trips``."""
    lines = kleidiai_lines(text)
    hot = [i for _, i, _ in map(_clean, _loop_body(lines, hot_label)) if i]
    if block_label is None:
        return SmeReport(name, k_per_iter, count(hot), source="kleidiai")
    dyn = expand(_loop_body(lines, block_label), block_svl, block_trips)
    return SmeReport(name, k_per_iter, count(hot), count(dyn), _macs_at(dyn, block_svl),
                     block_svl, source="kleidiai")
