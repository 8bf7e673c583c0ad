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

Memory traffic per 32-k block (``Memory``, at ``block_svl``): every load and store (mnemonic
``ld*`` / ``st*``) with the bytes it moves at that SVL (a whole vector per Z register even where
a predicate masks lanes: an upper bound), split by role from the base register: ``dst`` (a base
register that some vector store of the region also uses: the kernel reads back what it wrote,
a dst round trip), ``stack`` (``sp``), ``scalar`` (general-register loads: arguments,
pointers) and ``packed`` (every other load: the packed LHS and RHS, their scales and biases).
Accumulators: the distinct ZA tiles / ZA-array vector groups / Z registers the hot loop's MAC
instructions write: the independent accumulation chains (one chain serialises every MAC
instruction of the loop on the MAC latency; the instruction count does not show it).

A block marker may name its k (``tilegen:block-begin k=256``: one K-quant super-block, the
int32 sub-block sums, the min term and the float epilogue of 256 k): the block figures are then
per that block (``block_k``), MACs per instruction over the whole super-block.

The SME unit and the core (``UnitMix``, ``SmeReport.unit``; at SVL 512 only): every instruction
of the block in one class of ``M4_UNITS`` — on the SME unit (it touches Z, ZA, ZT0 or a
predicate) or on the core (general registers only) — and the block's bound in cycles on Apple
M4 from that per-class table (see the section below and docs/tuning.md).

Kernels without a marked block (the f32, bf16 and q8 per-channel kernels, whose hot loop runs
over the whole k) get a derived block: the hot loop repeated 32 / k-per-iteration times.

Loops inside a block region run the trip count written on their label line as
``// tilegen:trips <expr>`` (``svl`` = SVL in bits, e.g. ``svl/32``); the block figures are
taken at a stated SVL (``block_svl``, default 512: the block's ZA-slice loops make the
per-block cost VL-dependent).  The same counter reads KleidiAI's published kernels
(``count_kleidiai``): their ``.inst`` words carry the mnemonic in a comment.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["UnitCost", "M4_UNITS", "M4_DATA", "M4_SVL", "unit_class", "UnitMix", "unit_mix",
           "unit_mix_counted", "RecordedKernel", "PR29219_GEMM",
           "UNIT_HEADER", "UNIT_LEGEND", "SmeReport", "Memory", "Traffic", "macs_of",
           "load_vectors", "is_load", "is_store",
           "mem_bytes", "memory", "accumulators", "count", "sme_report", "kleidiai_lines",
           "count_kleidiai", "SME_HEADER", "SME_LEGEND", "ROLES", "KaiRecipe", "KAI_RECIPES",
           "kleidiai_version", "kleidiai_source", "kleidiai_report", "PackerMix", "packer_mix",
           "KAI_PACKERS", "kleidiai_packer_mix", "packer_call_insns"]

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


def is_store(insn: str) -> bool:
    return _mnemonic(insn).startswith("st")


_GPR_BYTES = {"x": 8, "w": 4, "q": 16, "d": 8, "s": 4, "h": 2, "b": 1}
_NEON_BYTES = {"8b": 8, "4h": 8, "2s": 8, "1d": 8, "16b": 16, "8h": 16, "4s": 16, "2d": 16,
               "1q": 16}


def mem_bytes(insn: str, svl: int) -> int:
    """Bytes one load or store moves at SVL = ``svl`` bits (0 if it is neither); predicated
    vector accesses count whole vectors."""
    op, low = _mnemonic(insn), insn.lower()
    if not (is_load(insn) or is_store(insn)):
        return 0
    vbytes = svl // 8
    if "zt0" in low:                                        # ldr/str zt0: 512 bits
        return 64
    if re.search(r"\bza\w*\[", low) and op in ("ldr", "str"):   # one ZA array vector
        return vbytes
    m = re.match(r"(ld|st)(?:nt)?([1-4])(r?)(q|o)?(s?)([bhwd])\b", op)
    lst = re.match(r"\w+\s+\{([^}]*)\}", low)
    if m and re.search(r"\bz\d+", low):                     # SVE / SME vector accesses
        msize = {"b": 1, "h": 2, "w": 4, "d": 8}[m.group(6)]
        if m.group(3):                                      # broadcasts: ld1r<T>, ld1rq<T>, ld1ro<T>
            return {"q": 16, "o": 32}.get(m.group(4) or "", msize)
        regs = _list_len(lst.group(1)) if lst else 1
        esz = _ESZ[re.findall(r"z\d+\.([bhsdq])", low)[0]] if re.search(r"z\d+\.[bhsdq]", low) \
            else msize
        return regs * vbytes * msize // max(esz, msize)
    if lst and re.search(r"\bv\d+", lst.group(1)):          # NEON ld1/st1 ... {v0.4s, ...}
        lane = re.search(r"\}\s*\[\d+\]", low)
        arr = re.findall(r"v\d+\.(\w+)", lst.group(1))
        if lane:
            return _ESZ.get(arr[0][-1], 4) * len(arr) if arr else 4
        n = re.match(r"(?:ld|st)([1-4])r?$", op)
        if n and "r" in op[3:]:                             # ld1r: one element per register
            return _ESZ.get(arr[0][-1], 4) * len(arr)
        return sum(_NEON_BYTES.get(a, 16) for a in arr)
    if op in ("ldr", "str", "ldur", "stur") and re.match(r"\w+\s+z\d+", low):
        return vbytes
    if op in ("ldr", "str") and re.match(r"\w+\s+p\d+", low):
        return vbytes // 8
    r = re.match(r"\w+\s+([xwqdshb])\d+", low)
    if r:
        size = {"ldrb": 1, "strb": 1, "ldrh": 2, "strh": 2, "ldrsb": 1, "ldrsh": 2,
                "ldrsw": 4}.get(op, _GPR_BYTES[r.group(1)])
        return size * (2 if op in ("ldp", "stp", "ldnp", "stnp", "ldpsw") else 1)
    return 0


def _base(insn: str) -> str | None:
    m = re.search(r"\[\s*(%x\[\w+\]|x\d+|sp)\b", insn.lower())
    return m.group(1) if m else None


def _is_vector(insn: str) -> bool:
    """Whether a load/store moves vector registers (Z, NEON V, ZA, ZT0)."""
    parts = insn.lower().split(None, 1)
    return len(parts) > 1 and bool(re.search(r"\b(z\d+|v\d+|za\w*|zt0)\b", parts[1]))


ROLES = ("packed", "dst", "scalar", "stack")


@dataclass(frozen=True)
class Traffic:
    loads: int = 0
    load_bytes: int = 0
    stores: int = 0
    store_bytes: int = 0

    def __add__(self, o: "Traffic") -> "Traffic":
        return Traffic(self.loads + o.loads, self.load_bytes + o.load_bytes,
                       self.stores + o.stores, self.store_bytes + o.store_bytes)


@dataclass(frozen=True)
class Memory:
    """Loads and stores of an instruction list at SVL ``svl``, by role (see the module doc)."""

    svl: int
    roles: tuple[tuple[str, Traffic], ...]

    def __getitem__(self, role: str) -> Traffic:
        return dict(self.roles).get(role, Traffic())

    @property
    def total(self) -> Traffic:
        out = Traffic()
        for _, t in self.roles:
            out = out + t
        return out

    def as_dict(self) -> dict:
        d = {}
        for role, t in self.roles:
            d.update({f"{role}_loads": t.loads, f"{role}_load_bytes": t.load_bytes,
                      f"{role}_stores": t.stores, f"{role}_store_bytes": t.store_bytes})
        return d


def memory(insns: list[str], svl: int) -> Memory:
    """Memory traffic of ``insns`` at SVL ``svl`` bits, by role."""
    dst = {_base(i) for i in insns if is_store(i) and _is_vector(i)} - {None, "sp"}
    acc = {r: Traffic() for r in ROLES}
    for i in insns:
        ld, st = is_load(i), is_store(i)
        if not (ld or st):
            continue
        b = _base(i)
        role = ("stack" if b == "sp" else "dst" if b in dst
                else "scalar" if not _is_vector(i) else "packed")
        n = mem_bytes(i, svl)
        acc[role] = acc[role] + (Traffic(1, n, 0, 0) if ld else Traffic(0, 0, 1, n))
    return Memory(svl, tuple((r, acc[r]) for r in ROLES))


def accumulators(insns: list[str]) -> int:
    """Distinct accumulators the MAC instructions of ``insns`` write: ZA tiles, ZA-array vector
    groups (select register and offset), Z registers."""
    return len({_acc_key(i) for i in insns if macs_of(i)})


def _acc_key(insn: str) -> str:
    """The accumulator a MAC instruction writes: ``za<t>`` (a tile), ``za[<w>,<off>,...]`` (a
    ZA-array vector group), ``z<n>`` (a Z register)."""
    low = insn.lower()
    m = re.search(r"\bza(\d+)\.[bhsdq]", low)
    if m:
        return f"za{m.group(1)}"
    m = re.search(r"\bza\.[bhsdq](\[[^\]]*\])", low) or re.match(r"\w+\s+(z\d+)", low)
    return ("za" if m.group(1).startswith("[") else "") + re.sub(r"\s+", "", m.group(1)) if m \
        else low


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


# --- The SME unit and the core: a per-class throughput model (Apple M4) --------------------
#
# On Apple M4 the SME unit is a separate block shared by a cluster: it executes every
# instruction that touches Z, ZA, ZT0 or a predicate register, while the core runs the
# general-register instructions (loop counters, branches, address arithmetic) beside it.  Each
# instruction of a block falls in one class; each class has a row of ``M4_UNITS``: cycles per
# instruction (or per vector it moves / writes) and the latency of a dependent accumulation,
# with the public measurement it comes from (m4-sme data: github.com/tzakharko/m4-sme-exploration
# results/, kept as ../shared/thirdparty/m4-sme/) or flagged as an assumption.  A cycle is the
# issue interval of f32 FMOPA with 4 tiles (outer-products.json row 27: 2004 GFLOPS / 512 FLOP
# per FMOPA at SVL 512 = 3.91 G per second).  The bound of a block (``UnitMix.bound``) is the
# largest of: each SME-unit class on its own pipe (classes overlap), the core's instructions,
# and the longest accumulation chain (the MAC instructions into one ZA tile, ZA-array group or
# Z register, each waiting for the previous one: count x latency).  ``serial`` adds the SME
# classes instead (no overlap between pipes): the other end of the range.

M4_SVL = 512                     # Apple M4's streaming vector length: the table's figures
M4_DATA = ("outer-products.json", "za-vector-ops.json", "streaming-sve-ops.json")


@dataclass(frozen=True)
class UnitCost:
    """One class of the M4 table: ``cycles`` per instruction (``per="insn"``) or per vector it
    writes or moves (``per="vector"``), ``latency`` of one accumulation into the same
    accumulator (MAC classes), the unit that runs it, and the source: ``data`` = (file of the
    m4-sme data, row of the throughput figure, row of the latency figure or None, FLOP per
    instruction or per vector at SVL 512), or None for an assumption (``note`` says what is
    assumed)."""

    cls: str
    unit: str                   # "sme" or "core"
    cycles: float
    per: str = "insn"
    latency: float | None = None
    data: tuple[str, int, int | None, int] | None = None
    note: str = ""

    @property
    def assumed(self) -> bool:
        return self.data is None

    @property
    def source(self) -> str:
        if self.data is None:
            return f"assumption: {self.note}"
        f, tput, lat, _ = self.data
        return (f"m4-sme {f} row {tput}" + (f", latency row {lat}" if lat is not None else "")
                + (f" ({self.note})" if self.note else ""))

    def table_row(self) -> str:
        """The row of the table in docs/tuning.md and bench/results/sme_mix.md."""
        lat = "–" if self.latency is None else format(self.latency, "g")
        return (f"| `{self.cls}` | {self.unit} | {self.cycles:g} | {self.per} | {lat} | "
                f"{self.source} |")

    def as_dict(self) -> dict:
        return {"class": self.cls, "unit": self.unit, "cycles": self.cycles, "per": self.per,
                "latency": self.latency, "source": self.source, "assumed": self.assumed}


#: Apple M4's SME unit and core, per instruction class (cycles at SVL 512; see above).
M4_UNITS: dict[str, UnitCost] = {u.cls: u for u in (
    UnitCost("mopa.f32", "sme", 1, latency=4, data=("outer-products.json", 27, 0, 512),
             note="FMOPA f32: 2004 GFLOPS with 4 tiles, 498 with 1"),
    UnitCost("mopa.f16", "sme", 2, latency=8, data=("outer-products.json", 135, 108, 1024),
             note="FMOPA f16 into f32: 2000 GFLOPS with 4 tiles, 500 with 1; BFMOPA the same "
                  "(rows 171, 144)"),
    UnitCost("mopa.i8", "sme", 2, latency=4, data=("outer-products.json", 225, 216, 2048),
             note="SMOPA int8 into int32: 3997 GOPS with 2 tiles, 1998 with 1"),
    UnitCost("mopa.i16", "sme", 2, latency=4, data=("outer-products.json", 189, 180, 1024),
             note="SMOPA int16 into int32: 1998 GOPS with 2 tiles, 1000 with 1"),
    UnitCost("mopa.other", "sme", 2, latency=8,
             note="other outer products (64-bit tiles, 2-way f16 into f16): 2 cycles, latency 8"),
    UnitCost("za.f32", "sme", 0.5, "vector", 4, ("za-vector-ops.json", 279, 0, 32),
             note="FMLA f32 into ZA vgx2: 250 GFLOPS over 64 slices, 62.6 on one group; vgx4 "
                  "the same per vector (rows 423, 288)"),
    UnitCost("za.f16", "sme", 0.5, "vector", 8, ("za-vector-ops.json", 1575, 1296, 64),
             note="FDOT f16 into f32 ZA vgx2: 500 GFLOPS over 64 slices, 62.5 on one group"),
    UnitCost("za.int", "sme", 0.5, "vector", 8,
             note="integer ZA-array ops (SDOT/UDOT/SMLALL into ZA, not measured): the "
                  "widening FDOT's 0.5 cycles per vector, latency 8"),
    UnitCost("z.fp", "sme", 4, latency=8, data=("streaming-sve-ops.json", 279, 0, 32),
             note="streaming FMLA f32 on Z registers: 31.3 GFLOPS with 32 chains, 15.7 with 1"),
    UnitCost("z.int", "sme", 4, latency=8,
             note="integer and permute Z-register ops (not measured): the streaming FMLA's 4 "
                  "cycles, latency 8"),
    UnitCost("luti", "sme", 4, note="LUTI2/LUTI4 (not measured): a Z-register op, 4 cycles"),
    UnitCost("za.move", "sme", 1, "vector",
             note="ZA tile/slice moves (MOVA, ZERO; not measured): 1 cycle per vector"),
    UnitCost("load", "sme", 1, "vector",
             note="streaming vector loads (not in the data files): 1 vector of 64 bytes per "
                  "cycle, 250 GB/s at 3.91 GHz, the low end of the 230-450 GB/s reported by "
                  "m4-sme-exploration and arXiv 2409.18779"),
    UnitCost("store", "sme", 1, "vector",
             note="streaming vector stores (not measured): 1 vector per cycle"),
    UnitCost("pred", "sme", 1,
             note="predicate-only instructions (WHILELT, PTRUE, CNTP; not measured): 1 cycle"),
    UnitCost("core", "core", 0.25,
             note="general-register instructions on the core beside the SME unit (not "
                  "measured): 4 per cycle"),
)}

_FP_ZA = ("fmla", "fmls", "fadd", "fsub", "bfmla", "bfmls", "bfadd", "bfsub")
_FP_WIDEN = ("fdot", "bfdot", "fvdot", "bfvdot", "fmlal", "fmlsl", "bfmlal", "bfmlsl")


def _touches_sme(low: str) -> bool:
    return bool(re.search(r"\bz\d+\b|\bza|\bzt0\b|\bpn?\d+\b", low.split(None, 1)[1])) \
        if len(low.split(None, 1)) > 1 else False


def _list_or_one(low: str) -> int:
    m = re.search(r"\{([^}]*)\}", low)
    return _list_len(m.group(1)) if m and re.search(r"z\d+", m.group(1)) else 1


def unit_class(insn: str) -> tuple[str, int]:
    """(class, vectors) of one instruction: the class is a key of :data:`M4_UNITS`, for loads
    and stores followed by ``:<width>.x<vectors>`` (``ld1b {z0.b-z3.b}``: ``load:b.x4``);
    vectors: the Z vectors / ZA vectors it writes or moves (1 for single-vector forms)."""
    op, low = _mnemonic(insn), insn.lower()
    if not _touches_sme(low):
        return "core", 1
    if op in _MOPA:
        t = re.search(r"za\d+\.([bhsdq])", low)
        e = _operand_esz(low)
        if t and e:
            ts = _ESZ[t.group(1)]
            fp = op.startswith(("f", "bf"))
            if ts == 4 and fp:
                return ("mopa.f32" if e == 4 else "mopa.f16" if e == 2 else "mopa.other"), 1
            if ts == 4 and not fp:
                return ("mopa.i8" if e == 1 else "mopa.i16" if e == 2 else "mopa.other"), 1
        return "mopa.other", 1
    arr = re.search(r"\bza\.([bhsdq])\[[^\]]*\]", low)
    if arr and not (is_load(insn) or is_store(insn)) and op not in ("mova", "mov", "movaz"):
        vg = re.search(r"vgx(\d)", arr.group(0))
        n = int(vg.group(1)) if vg else _list_or_one(low[arr.end():])
        if op in _FP_ZA:
            return "za.f32", n
        if op in _FP_WIDEN:
            return "za.f16", n
        return "za.int", n
    if is_load(insn) or is_store(insn):
        kind = "load" if is_load(insn) else "store"
        if "zt0" in low:
            return f"{kind}:zt0.x1", 1
        if re.search(r"\bza", low):
            return f"{kind}:za.x1", 1
        n = _list_or_one(low) if re.search(r"\bz\d+", low) else 0
        m = re.match(r"(?:ld|st)(?:nt)?[1-4]r?(q|o)?s?([bhwd])\b", op)
        width = ("r" + (m.group(1) or "") if "r" in op[3:4] else "") + m.group(2) if m else \
            ("z" if n else "p")
        return f"{kind}:{width}.x{max(n, 1)}", max(n, 1)
    if op.startswith("luti"):
        return "luti", _list_or_one(low)
    if op in ("mova", "mov", "movaz", "zero", "movt") and re.search(r"\bza|\bzt0", low):
        return "za.move", _list_or_one(low)
    if not re.search(r"\bz\d+", low):
        return "pred", 1
    if op.startswith(("f", "bf")) or op in ("scvtf", "ucvtf"):
        return "z.fp", 1
    return "z.int", 1


@dataclass(frozen=True)
class UnitMix:
    """A block's instructions by class (SME unit / core) and its M4 bound in cycles."""

    classes: tuple[tuple[str, int], ...]     # class (loads/stores: with width.xN) -> count
    cycles: tuple[tuple[str, float], ...]    # M4_UNITS class -> cycles on its pipe
    chain: float                             # longest accumulation chain, cycles
    chain_class: str
    chain_acc: str

    @property
    def sme_insns(self) -> int:
        return sum(n for c, n in self.classes if M4_UNITS[c.split(":")[0]].unit == "sme")

    @property
    def core_insns(self) -> int:
        return sum(n for c, n in self.classes if M4_UNITS[c.split(":")[0]].unit == "core")

    @property
    def bound(self) -> float:
        return max([self.chain] + [c for _, c in self.cycles])

    @property
    def binding(self) -> str:
        """The class that sets the bound (``chain <class> on <accumulator>`` for a chain)."""
        cls, cyc = max(self.cycles, key=lambda t: t[1], default=("core", 0.0))
        return f"chain {self.chain_class} on {self.chain_acc}" if self.chain > cyc else cls

    @property
    def serial(self) -> float:
        """The SME unit's classes one after another (no overlap), or the core or the chain."""
        sme = sum(c for k, c in self.cycles if M4_UNITS[k].unit == "sme")
        return max([sme, self.chain] + [c for k, c in self.cycles if M4_UNITS[k].unit == "core"])

    def as_dict(self) -> dict:
        return {"sme_insns": self.sme_insns, "core_insns": self.core_insns,
                "classes": dict(self.classes),
                "class_cycles": {k: round(v, 2) for k, v in self.cycles},
                "chain_cycles": self.chain, "bound_cycles": round(self.bound, 2),
                "serial_cycles": round(self.serial, 2), "binding": self.binding}


def unit_mix(insns: list[str]) -> UnitMix:
    """The classes of ``insns`` (a block, loops expanded) and their cycles on Apple M4 by
    :data:`M4_UNITS`; chains: the MAC instructions into one accumulator."""
    items, chains = [], {}
    for i in insns:
        key, vec = unit_class(i)
        items.append((key, vec, 1))
        if macs_of(i) and M4_UNITS[key.split(":")[0]].latency is not None:
            acc, cls = _acc_key(i), key.split(":")[0]
            chains[acc] = (cls, chains.get(acc, (cls, 0))[1] + 1)
    return _mix(items, chains)


def unit_mix_counted(classes: dict[str, int], chains: dict[str, tuple[str, int]]) -> UnitMix:
    """The same from recorded counts (a kernel whose source is not at hand, e.g.
    :data:`PR29219_GEMM`): ``classes`` maps a class key of :func:`unit_class` to its count
    (a per-vector class with ``.x<N>``: N vectors per instruction; the others one), ``chains``
    an accumulator to (MAC class, MAC instructions into it)."""
    items = []
    for key, n in classes.items():
        u = M4_UNITS[key.split(":")[0]]
        m = re.search(r"\.x(\d+)$", key)
        if u.per == "vector" and not m:
            raise ValueError(f"{key}: a per-vector class needs .x<vectors> in its key")
        items.append((key, int(m.group(1)) if m else 1, n))
    return _mix(items, chains)


def _mix(items: list[tuple[str, int, int]], chains: dict[str, tuple[str, int]]) -> UnitMix:
    """The UnitMix of (class key, vectors per instruction, instructions) items and the
    accumulation chains (accumulator -> (MAC class, MAC instructions into it))."""
    counts: dict[str, int] = {}
    cycles: dict[str, float] = {}
    for key, vec, n in items:
        counts[key] = counts.get(key, 0) + n
        cls = key.split(":")[0]
        u = M4_UNITS[cls]
        cycles[cls] = cycles.get(cls, 0.0) + n * u.cycles * (vec if u.per == "vector" else 1)
    lat = {acc: (float(n * M4_UNITS[cls].latency), cls) for acc, (cls, n) in chains.items()}
    acc, (chain, ccls) = max(lat.items(), key=lambda t: t[1][0], default=("-", (0.0, "-")))
    order = list(M4_UNITS)
    by_class = sorted(counts.items(), key=lambda t: (order.index(t[0].split(":")[0]), t[0]))
    return UnitMix(tuple(by_class), tuple(sorted(cycles.items(), key=lambda t: order.index(t[0]))),
                   chain, ccls, acc)


BLOCK_K = 32


@dataclass(frozen=True)
class SmeReport:
    kernel: str
    k_per_iter: int
    loop: Counts
    block: Counts | None = None      # one 32-k block at block_svl, inner loops expanded
    block_macs_at_svl: int | None = None
    block_svl: int = 512
    source: str = "tilegen"
    block_mem: Memory | None = None  # loads and stores of that block, by role
    accumulators: int = 0            # distinct accumulators of the hot loop's MAC instructions
    block_derived: bool = False      # block = the hot loop x 32 / k_per_iter (no marked block)
    block_k: int = BLOCK_K           # k of the block (a marker's ``k=``: 256 for K-quants)
    unit: UnitMix | None = None      # that block on the SME unit and the core (Apple M4)

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
             "loads_per_mac_128": round(self.loads_per_mac, 5),
             "accumulators": self.accumulators}
        if self.block is not None:
            d.update({"block_svl": self.block_svl, "block_insns": self.block.insns,
                      "block_mac_insns": self.block.mac_insns,
                      "block_macs": self.block_macs_at_svl, "block_loads": self.block.loads,
                      "block_macs_per_insn": round(self.block_macs_per_insn, 2),
                      "block_derived": self.block_derived, "block_k": self.block_k})
        if self.block_mem is not None:
            t = self.block_mem.total
            d.update({"block_stores": t.stores, "block_load_bytes": t.load_bytes,
                      "block_store_bytes": t.store_bytes,
                      **{f"block_{k}": v for k, v in self.block_mem.as_dict().items()}})
        if self.unit is not None:
            d["m4"] = {**self.unit.as_dict(), "macs_per_cycle":
                       round(self.block_macs_at_svl / self.unit.bound, 2)}
        return d

    def unit_row(self) -> str:
        """The block on Apple M4's SME unit and core (``UNIT_HEADER``)."""
        u = self.unit
        classes = ", ".join(f"{c} {n}" for c, n in u.classes if c != "core")
        return (f"{self.kernel:<62} {self.block_k:4d} {u.sme_insns:5d} {u.core_insns:5d} "
                f"{u.bound:7.1f} {self.block_macs_at_svl / u.bound:7.1f} {u.serial:7.1f} "
                f"{u.chain:6.1f}  {u.binding:<16} {classes}")

    def row(self) -> str:
        blk = (f"{self.block.insns:6d} {self.block_macs_per_insn:8.1f}"
               if self.block is not None else f"{'-':>6} {'-':>8}")
        if self.block_mem is not None:
            t, dst = self.block_mem.total, self.block_mem["dst"]
            mem = (f"{t.stores:4d} {t.load_bytes:7d} {t.store_bytes:6d} "
                   f"{dst.load_bytes + dst.store_bytes:6d}")
        else:
            mem = f"{'-':>4} {'-':>7} {'-':>6} {'-':>6}"
        return (f"{self.kernel:<62} {self.k_per_iter:4d} {self.loop.insns:5d} "
                f"{self.loop.mac_insns:5d} {self.mac_per_insn:7.3f} {self.macs_per_insn:8.2f} "
                f"{self.loop.loads:5d} {1000 * self.loads_per_mac:8.2f} {self.accumulators:3d} "
                f"{blk} {mem}")


SME_HEADER = (f"{'kernel (SME static model: per 128-bit SVL granule)':<62} {'k/it':>4} "
              f"{'ins':>5} {'MACi':>5} {'MACi/i':>7} {'MAC/ins':>8} {'lds':>5} "
              f"{'ld/kMAC':>8} {'acc':>3} {'blkins':>6} {'blkMAC/i':>8} {'blst':>4} "
              f"{'blldB':>7} {'blstB':>6} {'dstB':>6}")
UNIT_HEADER = (f"{'kernel (SME unit vs core, Apple M4 table, SVL 512)':<62} {'blk k':>4} "
               f"{'SMEi':>5} {'core':>5} {'bound':>7} {'MAC/cyc':>7} {'serial':>7} {'chain':>6}  "
               f"{'binding':<16} SME-unit instructions by class")
UNIT_LEGEND = ("per block (32 k, or the marker's k) at SVL 512: SMEi / core: instructions on the "
               "SME unit (Z, ZA, ZT0, predicates) / on the core (general registers only); bound: "
               "cycles, each SME class on its own pipe, the core, and the longest chain of MACs "
               "into one accumulator x latency (chain); MAC/cyc: the block's MACs / bound; "
               "serial: the SME classes added; cycles "
               "and sources per class: tilegen.analysis.sme.M4_UNITS, docs/tuning.md")
SME_LEGEND = ("per hot-loop iteration at SVL 128: ins, MACi (MAC instructions), MACi/i, MAC/ins, "
              "lds (loads), ld/kMAC, acc (independent accumulators); per 32-k block (K-quants: "
              "per 256-k super-block, block_k) at SVL 512 (derived from the hot loop where no "
              "block is marked): blkins, blkMAC/i, blst (stores), blldB / blstB (bytes loaded / stored), dstB (dst bytes loaded + "
              "stored)")


def _block_report(name: str, k: int, insns: list[str], dyn: list[str] | None, svl: int,
                  source: str, block_k: int = BLOCK_K) -> SmeReport:
    """The report of a hot loop ``insns`` and a 32-k block ``dyn`` (expanded; None: derived
    from the hot loop)."""
    derived = dyn is None
    if derived:
        if not k or BLOCK_K % k:
            raise ValueError(f"{name}: {k} k per hot-loop iteration does not divide a "
                             f"{BLOCK_K}-k block")
        dyn = insns * (BLOCK_K // k)
    return SmeReport(name, k, count(insns), count(dyn), _macs_at(dyn, svl), svl, source,
                     memory(dyn, svl), accumulators(insns), derived, block_k,
                     unit_mix(dyn) if svl == M4_SVL else None)


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


def expand(lines: list[str], svl: int, trips: dict[str, str] | None = None,
           taken: tuple[str, ...] = ()) -> list[str]:
    """Dynamic instruction list of a region: each loop (a label with a later branch back to
    it) runs its trip count, from ``// tilegen:trips <expr>`` on the label line or ``trips``;
    a forward branch to a label in ``taken`` is taken (the instructions up to the label are
    left out), every other forward branch falls through."""
    parsed = [_clean(ln) for ln in lines]
    where = {lab: i for i, (lab, _, _) in enumerate(parsed) if lab}
    given = dict(trips or {})        # the caller's trips win over the label comments
    trips = {}
    for lab, _, com in parsed:
        m = re.search(r"tilegen:trips\s+(\S+)", com)
        if lab and m:
            trips[lab] = m.group(1)
    trips.update(given)

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
                if _BRANCH.match(insn):
                    t = target(insn)
                    t = t[:-1] if t.endswith("f") and t[:-1].isdigit() else t
                    if t in taken and i < where.get(t, -1) < i1:
                        i = where[t]
                        continue
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
    from ..generator.render import render
    from ..generator.validate import as_spec
    spec = as_spec(spec)
    text = render(spec).text
    insns, k = _hot(text)
    block = _region_lines(text, "tilegen:block-begin", "tilegen:block-end")
    dyn = None if block is None else expand(block, block_svl)
    mk = re.search(r"tilegen:block-begin k=(\d+)", text)
    return _block_report(spec.name, k, insns, dyn, block_svl, "tilegen",
                         int(mk.group(1)) if mk else BLOCK_K)


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
                   block_svl: int = 512, taken: tuple[str, ...] = ()) -> SmeReport:
    """The same figures for a KleidiAI kernel: its hot loop is the loop at ``hot_label``; the
    32-k block the loop at ``block_label`` (one iteration), inner loops by ``block_trips``."""
    lines = kleidiai_lines(text)
    hot = [i for _, i, _ in map(_clean, _loop_body(lines, hot_label)) if i]
    dyn = (None if block_label is None
           else expand(_loop_body(lines, block_label), block_svl, block_trips, taken))
    return _block_report(name, k_per_iter, hot, dyn, block_svl, "kleidiai")


# --- KleidiAI source trees: where each kernel's hot loop is (facts about their sources) ----

@dataclass(frozen=True)
class KaiRecipe:
    """How to count one KleidiAI kernel: the label of its hot loop, k per iteration, and for
    kernels with a per-32-k scale block the label of the block loop and the trip counts of the
    loops inside it (``svl`` in bits).  The same labels hold in v1.24.0 and v1.30.0."""

    hot: str
    k: int
    block: str | None = None
    trips: tuple[tuple[str, str], ...] = ()
    note: str = ""
    taken: tuple[str, ...] = ()       # forward branches of the block taken (see expand)


#: KleidiAI kernels (names without the ``kai_`` prefix) the static model counts.
KAI_RECIPES: dict[str, KaiRecipe] = {
    "matmul_clamp_f32_qsi8d32p1x4_qsi4c32p4vlx4_1x4vl_sme2_sdot":
        KaiRecipe("3", 16, "2", (("3", "32//16"),), "block loop: LOOP_K_START"),
    "matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa":
        KaiRecipe("label_4", 4, "label_3", (("label_4", "32//4"),), "block: the K loop at bl = 32"),
    "matmul_clamp_f32_qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa":
        KaiRecipe("4", 4, "3", (("4", "32//4"), ("5", "svl//32")),
                  "block: LOOP_K_START on the path of every block after the first (ACCUMULATE)",
                  ("6",)),
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa": KaiRecipe("label_3", 4),
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme2_dot": KaiRecipe("label_3", 16),
    "matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme_mopa": KaiRecipe("label_3", 4),
    "matmul_clamp_f32_qai8dxp1x4_qsi8cxp4vlx4_1x4vl_sme_dot": KaiRecipe("label_3", 16),
    "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa": KaiRecipe("label_4", 8),
    "matmul_clamp_f32_f32p2vlx1_f32p2vlx1biasf32_sme2_mopa": KaiRecipe("label_4", 4),
    "matmul_clamp_f32_f32p2vlx1_f32p2vlx1b_2vlx2vl_sme_mopa": KaiRecipe("label_4", 4),
    "matmul_clamp_f32_f32_f32p2vlx1b_1x16vl_sme2_mla":
        KaiRecipe("label_23", 4, note="hot loop: width 4 (16 VL columns per pass)"),
    "matmul_clamp_f32_f32_f32p16vlx1b_1x16vl_sme2_mla":
        KaiRecipe("label_23", 4, note="hot loop: width 4 (16 VL columns per pass)"),
}


@dataclass(frozen=True)
class RecordedKernel:
    """A kernel whose source is not among the inputs the suite has (no release tree holds it):
    the counts of its block, taken once from its source with this module's counter
    (:func:`count_kleidiai` with ``recipe``), kept as figures, and run through the same M4
    model by :func:`unit_mix_counted`.  ``recount`` checks them against a copy of the source."""

    name: str
    where: str                  # repository, commit and path of the counted source
    recipe: KaiRecipe
    mr_vl: int                  # the tile in SVL/32 units (mr x nr f32 results per VL)
    nr_vl: int
    block_insns: int            # one 32-k block, inner loops run their trips
    classes: tuple[tuple[str, int], ...]          # unit_class key -> count in that block
    chains: tuple[tuple[str, str, int], ...]      # (accumulator, MAC class, MAC instructions)

    def block_macs(self, svl: int = M4_SVL) -> int:
        r = svl // 32
        return self.mr_vl * r * self.nr_vl * r * BLOCK_K

    @property
    def unit(self) -> UnitMix:
        return unit_mix_counted(dict(self.classes), {a: (c, n) for a, c, n in self.chains})

    def recount(self, text: str) -> SmeReport:
        """Count a copy of the source (the asm file's text) by ``recipe``; ValueError if its
        block differs from the recorded figures."""
        r = self.recipe
        rep = count_kleidiai(self.name, text, r.hot, r.k, r.block, dict(r.trips) or None)
        got = (rep.block.insns, tuple(rep.unit.classes), rep.block_macs_at_svl)
        want = (self.block_insns, self.classes, self.block_macs())
        if got != want:
            raise ValueError(f"{self.name}: the source counts {got}, the record says {want}")
        return rep


#: Arm's Q4_K SME2 gemm proposed for llama.cpp in ggml-org/llama.cpp PR #29219 ("kleidiai: add
#: SME2 Q4_K and Q6_K matmul support"): in no KleidiAI release tree here (v1.30.0 has no
#: ``matmul_clamp_f32_f16p_qai4c32p``), its assembly reached through a public mirror of
#: ARM-software/kleidiai.  f16 LHS (4 VL rows x 2 k), Q4_K as asymmetric int4 with one f16
#: scale and offset per 32 k and column: per 4 k, LUTI4 to f16, MOV of the offsets, FMLA
#: (value x scale + offset), then FMOPA f16 into f32 on four tiles.  Block: its K loop
#: (label_3) at bl = 32, the inner loop (label_4, 4 k) run 8 times.
PR29219_GEMM = RecordedKernel(
    "kai_matmul_clamp_f32_f16p4vsx2_qai4c32p16vsx4s1s0sf16_4vsx16vs_sme2_mopa",
    "github.com/qualcomm/kleidiai@56445b18d559c165e021a48ecfc578d0f3055d52 (a mirror of "
    "ARM-software/kleidiai), kai/ukernels/matmul/matmul_clamp_f32_f16p_qai4c32p/"
    "kai_matmul_clamp_f32_f16p4vsx2_qai4c32p16vsx4s1s0sf16_4vsx16vs_sme2_mopa_asm.S",
    KaiRecipe("label_4", 4, "label_3", (("label_4", "32//4"),), "block: the K loop at bl = 32"),
    1, 4, 293,
    (("mopa.f16", 64), ("z.fp", 64), ("z.int", 76), ("luti", 16), ("load:b.x2", 8),
     ("load:h.x2", 2), ("load:w.x1", 16), ("core", 47)),
    (("za0", "mopa.f16", 16), ("za1", "mopa.f16", 16), ("za2", "mopa.f16", 16),
     ("za3", "mopa.f16", 16)))


def kleidiai_version(tree) -> str:
    """The release of a KleidiAI source tree (``project(... VERSION x.y.z)`` of its CMake)."""
    from pathlib import Path
    cm = Path(tree) / "CMakeLists.txt"
    m = re.search(r"project\s*\([^)]*?VERSION\s+([\d.]+)", cm.read_text()) if cm.is_file() else None
    if m is None:
        raise ValueError(f"{tree}: no KleidiAI CMakeLists.txt with project(... VERSION ...)")
    return m.group(1)


def kleidiai_source(tree, name: str):
    """The file holding kernel ``name``'s assembly in a KleidiAI tree: ``kai_<name>_asm.S``
    where it exists (v1.24.0+ moved most kernels there), else the inline asm of ``kai_<name>.c``."""
    from pathlib import Path
    base = Path(tree) / "kai" / "ukernels" / "matmul"
    for fname in (f"kai_{name}_asm.S", f"kai_{name}.c"):
        found = sorted(base.rglob(fname))
        if found:
            return found[0]
    raise FileNotFoundError(f"{name}: neither kai_{name}_asm.S nor kai_{name}.c under {base}")


def kleidiai_report(tree, name: str, block_svl: int = 512) -> SmeReport:
    """The static model of KleidiAI kernel ``name`` (a :data:`KAI_RECIPES` key) read from the
    source tree ``tree``."""
    r = KAI_RECIPES[name]
    text = kleidiai_source(tree, name).read_text()
    return count_kleidiai("kai_" + name, text, r.hot, r.k, r.block, dict(r.trips) or None,
                          block_svl, r.taken)


# --- LHS packers: instructions per packed element --------------------------------------------

@dataclass(frozen=True)
class PackerMix:
    """Instructions per packed f32 element of an LHS packer's steady state at SVL ``svl``."""

    name: str
    source: str
    svl: int
    insns: int              # instructions of the counted region (hot loop or expanded pass)
    elements: int           # f32 source elements it packs
    memory: Memory

    @property
    def per_element(self) -> float:
        return self.insns / self.elements

    def as_dict(self) -> dict:
        t = self.memory.total
        return {"packer": self.name, "source": self.source, "svl": self.svl, "insns": self.insns,
                "elements": self.elements, "insns_per_element": round(self.per_element, 4),
                "loads": t.loads, "stores": t.stores, "load_bytes": t.load_bytes,
                "store_bytes": t.store_bytes}


def packer_mix(spec, svl: int) -> PackerMix:
    """A generated VL-scaled LHS packer at SVL ``svl`` bits: the NEON packer's hot loop (4 rows
    x 8 values, the same at every SVL), or the streaming twin's pass over a whole row block
    (its marked block: units x SVL/32 rows x 4/units chunks of SVL/32 granules of kr values,
    every inner loop run its trips)."""
    from ..generator.packers import render
    text = render(spec)
    if spec.streaming:
        dyn = expand(_region_lines(text, "tilegen:block-begin", "tilegen:block-end"), svl)
        rows = svl // 32      # a pass: units x R rows, 4/units chunks of R kr-value granules
        return PackerMix(spec.name, "tilegen", svl, len(dyn), 4 * rows * rows * spec.kr,
                         memory(dyn, svl))
    insns, _ = _hot(text)
    return PackerMix(spec.name, "tilegen", svl, len(insns), 32, memory(insns, svl))


#: KleidiAI's SME LHS packers: per source file kind ("asm": ``kai_<name>_asm.S``, "c": the
#: inline asm of ``kai_<name>.c``, which v1.24.0 has for the bf16 packer), the hot loop's label
#: and the f32 elements one iteration packs (an expression of svl in bits): the main loop of
#: each, the steady state of a whole row block
KAI_PACKERS: dict[str, dict[str, tuple[str, str]]] = {
    "lhs_pack_f32p2vlx1_f32_sme": {"asm": ("label_4", "4 * svl // 32")},    # 4 slices in, 4 out
    "lhs_pack_bf16p2vlx2_f32_sme": {"asm": ("label_4", "8 * svl // 32"),    # 8 f32 vectors in
                                    "c": ("3", "4 * svl // 32")},           # 2 x 2 f32 vectors in
    "lhs_pack_bf16p2vlx2_f32_sme2": {"asm": ("label_3", "4 * svl // 32")},  # 2 x 2 f32 vectors in
}


def kleidiai_packer_mix(tree, name: str, svl: int) -> PackerMix:
    """The same figure for KleidiAI's packer ``name`` (a :data:`KAI_PACKERS` key) in the source
    tree ``tree``."""
    from pathlib import Path
    base = Path(tree) / "kai" / "ukernels" / "matmul" / "pack"
    for kind, fname in (("asm", f"kai_{name}_asm.S"), ("c", f"kai_{name}.c")):
        if (base / fname).is_file() and kind in KAI_PACKERS[name]:
            label, elems = KAI_PACKERS[name][kind]
            text = (base / fname).read_text()
            break
    else:
        raise FileNotFoundError(f"{name}: no counted source under {base}")
    hot = [i for _, i, _ in map(_clean, _loop_body(kleidiai_lines(text), label)) if i]
    n = int(eval(elems, {"__builtins__": {}}, {"svl": svl}))  # noqa: S307
    return PackerMix("kai_" + name, "kleidiai", svl, len(hot), n, memory(hot, svl))


def packer_call_insns(spec, svl: int, m: int, k: int) -> int:
    """Instructions of one call of a generated VL-scaled packer packing ``m`` rows (1 or the
    row block, mr = units x SVL/32) of ``k`` values (a multiple of 8 and of 4 x SVL/32), at SVL
    ``svl``: its steady-state loops only (argument checks and per-block set-up left out).  NEON:
    the 4-row loop (m = mr) or the one-row loop plus the padding-row loop of the other mr - 1
    rows (m = 1); streaming: the pass over the row block (4/units chunks of SVL/32 granules of
    kr values), once per pass (m = 1: one row loaded per pass; the skipped row groups' set-up counted, an
    upper bound)."""
    from ..generator.packers import render
    text = render(spec)
    rows = svl // 32
    mr = spec.mr * rows
    if m not in (1, mr):
        raise ValueError(f"m must be 1 or mr = {mr}")
    if spec.streaming:
        block = _region_lines(text, "tilegen:block-begin", "tilegen:block-end")
        lp = ".L"
        trips = {}
        if m == 1:
            for i in range(spec.mr):
                trips[f"{lp}rows4_{i}"] = "0"
                trips[f"{lp}rows1_{i}"] = "1" if i == 0 else "0"
        return len(expand(block, svl, trips)) * (k // (4 // spec.mr * rows * spec.kr))
    lines = text.splitlines()
    if m == mr:
        hot, _ = _hot(text)
        return len(hot) * (mr // 4) * (k // 8)
    one = [i for _, i, _ in map(_clean, _loop_body(lines, ".Lloop")) if i]
    pad = [i for _, i, _ in map(_clean, _loop_body(lines, ".Lpad_loop")) if i]
    return len(one) * (k // 8) + len(pad) * (mr - 1) * (k // spec.kr)
