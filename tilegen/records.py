"""The facts every stage shares: the spec error, the vector-length granule, the tile bounds,
the one record per ISA (:data:`ISAS`), and the record type of an operation family
(:class:`FamilyInfo`, :class:`IsaImpl`) with the realisations K-quant families share.

The bottom of the import graph: it imports nothing from tilegen but the calling conventions,
and every stage reads these records instead of its own copy.  The family records themselves
live in their plugins (:mod:`tilegen.families`, one module per weight family), and every
client finds them through that registry (``tilegen.families.FAMILIES``).
"""
from __future__ import annotations

from dataclasses import dataclass

from .callconv import Q8, Abi

__all__ = ["__version__", "SpecError", "VL_GRANULE", "TILE_MR_MAX", "TILE_NR_MAX",
           "TILE_VL_MAX", "KR_MAX", "Isa", "ISAS", "IsaImpl", "FamilyInfo", "kquant_impls",
           "kquant_sve_impls", "kquant_sme2_impls", "kquant_record", "kquant_manifest", "kquant_default_kernels",
           "KQUANT_LLAMA_KERNELS", "KQUANT_LARGE_GEMM", "KQUANT_LARGE_PARTNER", "KQUANT_LARGE_AFTER",
           "table32_impls", "table32_default_kernels",
           "TABLE32_LLAMA_KERNELS"]

__version__ = "0.1.0"      # tilegen.__version__; generated files carry it


class SpecError(ValueError):
    """A kernel specification that cannot be generated; the message names the rule."""


# Bytes of one 128-bit granule: SVE and SME vector lengths are multiples of it.
VL_GRANULE = 16

# Upper bounds on the spec's numbers, checked before any register is counted so that a huge
# tile is refused at once.  No register-resident tile comes near them (the largest accepted:
# mr 20, nr 116, 16 VL units, kr 32); q4/q8 tiles taller than their register block run it in
# passes, so a taller mr only restates the m step (KleidiAI's consumers take m steps <= 64).
TILE_MR_MAX = 64
TILE_NR_MAX = 128
TILE_VL_MAX = 16        # mr or nr in VL units
KR_MAX = 64             # kr and sr


@dataclass(frozen=True)
class Isa:
    """Everything tilegen knows about one instruction set: the one record per ISA."""

    name: str
    features: tuple[str, ...]       # CPU features the kernels need (tilegen.runtime.cpu names)
    arch: str                       # assembler ``.arch`` line
    rank: int                       # runtime preference: lower first
    vl_kind: str | None = None      # scalable: which vector length scales tiles ("sve": cntb,
    #                                 "sme": streaming, rdsvl); None: fixed 128-bit vectors
    acc_mem: bool = False           # q4 tiles may keep f32 accumulators in memory (":am")
    mattr: str = ""                 # llvm-mca -mattr features of this ISA's instructions

    @property
    def scalable(self) -> bool:
        return self.vl_kind is not None


_SVE_ARCH = "armv9-a+sve2+i8mm+dotprod"
_SME_ARCH = "armv9-a+sme2+sve2+i8mm"
ISAS: dict[str, Isa] = {i.name: i for i in (
    Isa("sme2", ("sme", "sme2"), _SME_ARCH, 0, "sme"),
    Isa("sme", ("sme",), _SME_ARCH, 1, "sme"),
    Isa("sve2", ("sve", "sve2"), _SVE_ARCH, 2, "sve", mattr="+sve,+sve2"),
    Isa("sve", ("sve",), _SVE_ARCH, 3, "sve", mattr="+sve"),
    # int8 dot product / matrix multiply on Z registers: SVE plus the NEON feature
    Isa("sve_i8mm", ("sve", "i8mm"), _SVE_ARCH, 4, "sve", mattr="+sve,+i8mm"),
    Isa("sve_dotprod", ("sve", "dotprod"), _SVE_ARCH, 5, "sve", mattr="+sve,+dotprod"),
    # FMLAL (FEAT_FHM, in every Armv8.4+ core with FP16, so in every i8mm core): the q4_0
    # kernels' scale products; the runtime reports i8mm only with it (runtime/cpu.py)
    Isa("i8mm", ("neon", "i8mm"), "armv8.6-a+dotprod+i8mm+fp16fml", 6, acc_mem=True,
        mattr="+neon,+i8mm,+fp16fml"),
    Isa("dotprod", ("neon", "dotprod"), "armv8.2-a+dotprod", 7, acc_mem=True,
        mattr="+neon,+dotprod"),
    Isa("neon", ("neon",), "armv8-a", 8, acc_mem=True, mattr="+neon"),
    # Armv8.6 bf16 on NEON registers: BFMMLA (2x4 by 4x2 bf16 products), BFDOT
    Isa("bf16", ("neon", "bf16"), "armv8.6-a+bf16", 9, mattr="+neon,+bf16"),
)}


@dataclass(frozen=True)
class IsaImpl:
    """How one family is realised on one ISA: name suffix, default interleave, template and
    register allocator (``templates/<template>.S.j2``; ``allocator`` names an entry of
    ``tilegen.generator.regalloc.ALLOCATORS``)."""

    op: str                          # ISA/instruction suffix of the kernel name
    template: str
    allocator: str
    kr: int = 1                      # kr / sr when the spec gives none
    sr: int = 1
    gemv_op: str | None = None       # gemv tiles (mr == 1) with a strategy of their own
    gemv_template: str | None = None
    lhs: str | None = None           # layout formats of this ISA when not the family's
    rhs: str | None = None
    # the ``:i16`` variant (KernelSpec.lhs_i16): the LHS format its kernels read instead (the
    # values widened to int16 at pack time) and the tiles that have it; none: no such variant
    lhs_i16: str | None = None
    lhs_i16_tiles: tuple[str, ...] = ()
    # RHS formats of single tiles of this ISA when not the ISA's: ((tile "<mr>x<nr>", format),
    # ...), e.g. q5_K's sme2 4vl x 1vl gemm on its own variant (KernelSpec.rhs_layout_class)
    rhs_tiles: tuple[tuple[str, str], ...] = ()
    # Interleave the instructions fix (the validator refuses others, with this reason):
    # ``fixed_kr``: kr and sr are the defaults above; ``fixed_L``: kr/sr is theirs.  None:
    # the layouts and the allocator judge kr and sr.
    fixed_kr: str | None = None
    fixed_L: str | None = None
    # The large-m gemm of this ISA's table entries (issue #34): a gemm tile of more rows that
    # reads the same packed RHS as an entry's gemm (and gemv), run instead of the entry's gemm
    # once m exceeds ``large_after`` tiles of the entry's gemm (rows at the CPU's vector length:
    # tilegen.runtime.select.KernelPair.large_from).  The one place the rule's threshold lives.
    large_gemm: str | None = None
    large_after: int = 1


@dataclass(frozen=True)
class FamilyInfo:
    """The one record per operation family."""

    name: str
    lhs: str                        # packed-LHS layout format (tilegen.layout.registry stem),
    #                                 for kernels that pack their LHS (KernelSpec.packs_lhs)
    rhs: str                        # packed-RHS layout format (registry stem)
    impls: dict[str, IsaImpl]       # isa -> realisation
    kinds: tuple[str, ...]          # runtime weight kinds the family consumes
    abi: Abi                        # the kernels' calling convention (tilegen.callconv)
    quantized: bool = False
    packs_lhs: bool = False         # unquantized LHS packed by the kernel's own layout (mr rows
    #                                 per row block; bf16: f32 rows rounded to bf16)
    acc_mem: bool = False           # tiles may keep f32 accumulators in memory (":am", on the
    #                                 ISAs whose record allows it)
    gemv_family: str | None = None  # a family whose gemv kernels read this family's packed
    #                                 weights and pair with its gemm (another LHS format)

    @property
    def isas(self) -> tuple[str, ...]:
        return tuple(self.impls)


def kquant_impls(stem: str) -> dict[str, IsaImpl]:
    """The NEON realisations of a K-quant family (``stem``: q4k, q6k): one template and one
    allocator per family (``templates/<stem>_neon.S.j2``; allocator ``<stem>_neon``, in the
    plugin's ``regalloc`` submodule); sr = 2
    fixed (a byte holds two k values, docs/layouts.md#q8kp), kr by the instruction: SMMLA reads
    8 k per operand row (kr = 16), SDOT by lane and SMULL 4 (kr = 8)."""
    def kq(op: str, kr: int) -> IsaImpl:
        return IsaImpl(op, f"{stem}_neon", f"{stem}_neon", kr=kr, sr=2)
    return {"neon": kq("neon", 8), "dotprod": kq("neon_dotprod", 8),
            "i8mm": kq("neon_i8mm", 16)}


def kquant_sve_impls(stem: str) -> dict[str, IsaImpl]:
    """The SVE realisations of a K-quant family, vector-length agnostic (nr in VL units;
    ``templates/<stem>_sve.S.j2``, allocator ``<stem>_sve``): SMMLA per 128-bit segment
    (sve_i8mm, kr = 16; its gemv SDOT on 8-k groups of the same layout), SDOT by lane
    (sve_dotprod, kr = 8)."""
    def kq(op: str, kr: int) -> IsaImpl:
        return IsaImpl(op, f"{stem}_sve", f"{stem}_sve", kr=kr, sr=2)
    return {"sve_dotprod": kq("sve_dotprod", 8), "sve_i8mm": kq("sve_i8mm", 16)}


def kquant_record(name: str, rhs: str, stem: str, isas: tuple[str, ...] | None = None,
                  i16_tiles: tuple[str, ...] = (), large: bool = False,
                  rhs_tiles: tuple[tuple[str, str], ...] = ()) -> FamilyInfo:
    """The record of a K-quant family: Q8_K-style activations (``q8kp``: int8 per row per
    256-k super-block, f32 d, sub-block sums) against the family's lossless repack ``rhs`` of
    its ggml blocks, on the NEON, SVE and SME2 K-quant templates and allocators of ``stem``
    (docs/layouts.md#q8kp; arithmetic: tilegen.reference.kquant); weight kind ``name``, the Q8
    calling convention.  ``isas``: the ISAs the family realises (default: all of them);
    ``i16_tiles``: its SME2 gemm tiles with an ``:i16`` variant (:func:`kquant_sme2_impls`);
    ``large``: the family has the SME2 large-m gemm :data:`KQUANT_LARGE_GEMM`;
    ``rhs_tiles``: SME2 tiles on an RHS format of their own (``IsaImpl.rhs_tiles``)."""
    impls = {**kquant_impls(stem), **kquant_sve_impls(stem),
             **kquant_sme2_impls(stem, i16_tiles, large, rhs_tiles)}
    if isas is not None:
        unknown = set(isas) - set(impls)
        if unknown:
            raise SpecError(f"{name}: no K-quant realisation for {sorted(unknown)}")
        impls = {isa: impl for isa, impl in impls.items() if isa in isas}
    return FamilyInfo(name=name, lhs="q8kp", rhs=rhs, impls=impls, kinds=(name,), abi=Q8,
                      quantized=True)


def kquant_manifest(name: str, rhs: str, stem: str, package: str,
                    isas: tuple[str, ...] | None = None,
                    i16_tiles: tuple[str, ...] = (), large: bool = False,
                    rhs_tiles: tuple[tuple[str, str], ...] = ()) -> tuple:
    """What a K-quant family plugin declares about itself, from its kind ``name``, its RHS
    format ``rhs``, its template/allocator stem, its plugin package ``package`` and the ISAs it
    realises ``isas`` (default: every K-quant ISA): (RECORDS, ALLOCATOR_MODULES, GGML_TYPES,
    DEFAULT_KERNELS, LLAMA_KERNELS) — the plugin's own allocator submodules
    ``<package>.regalloc`` (NEON, SVE) and ``<package>.regalloc_sme2`` (when it realises
    sme2), the GGUF type of the same name in capitals, :func:`kquant_default_kernels` and the
    llama.cpp patch's tiles :data:`KQUANT_LLAMA_KERNELS`, each restricted to those ISAs;
    ``i16_tiles``: the SME2 gemm tiles with an ``:i16`` variant (LHS ``q8ki16p``);
    ``large``: the family has the SME2 large-m gemm (:data:`KQUANT_LARGE_GEMM`: in its record
    and, with the gemm on the same RHS, in its default kernels); ``rhs_tiles``: SME2 tiles on
    an RHS format of their own ((tile, format), ``IsaImpl.rhs_tiles``)."""
    record = kquant_record(name, rhs, stem, isas, i16_tiles, large, rhs_tiles)
    have = record.impls
    modules = (f"{package}.regalloc",) + ((f"{package}.regalloc_sme2",) if "sme2" in have else ())
    sme2 = have.get("sme2")
    defaults = tuple(s for s in kquant_default_kernels(name, sme2.large_gemm if sme2 else None)
                     if s.split(":")[1] in have)
    llama = tuple(e for e in KQUANT_LLAMA_KERNELS if e[0] in have)
    return (record,), modules, {name.upper(): name}, defaults, llama


def kquant_default_kernels(name: str, large: str | None = None) -> tuple[str, ...]:
    """A K-quant family's default kernels: per ISA a gemm and the gemv on its packed RHS, i8mm
    (SMMLA gemm, kr16) first, then dotprod (SDOT by lane, kr8), plain NEON (SMULL) last (the
    tiles are `tilegen tune`'s best on neoverse-v2 / -n1, llvm-mca); SME2: the int16 SMOPA gemm
    and the ZA-array SDOT gemv on one 2vlx2 packing; with ``large``, also the SME2 entry on the
    1vl packing: :data:`KQUANT_LARGE_PARTNER` with the large-m gemm ``large`` (the record's
    ``IsaImpl.large_gemm``: :data:`KQUANT_LARGE_GEMM`, its ``:i16`` variant where the family has
    one; the entry comes after the 2vl pair, docs/tuning.md#the-large-m-gemm; the gemv on that
    packing, ``1x1vl`` for q4_K and iq4_xs, pairs with it when a library lists it)."""
    extra = (f"sme2:{KQUANT_LARGE_PARTNER}", f"sme2:{large}") if large else ()
    return tuple(f"{name}:{t}" for t in ("i8mm:8x4", "i8mm:1x4", "dotprod:8x4", "dotprod:1x4",
                                          "neon:4x4", "neon:1x4", "sme2:1vlx2vl", "sme2:1x2vl")
                 + extra)


#: the K-quant SME2 large-m gemm (four ZA tiles of LHS rows sharing decoded weights, issue #34)
#: and the gemm on its packing (nr = 1vl) it takes over from; it runs once m exceeds
#: ``KQUANT_LARGE_AFTER`` tiles of that gemm (SVL/32 rows each): the M4 model's crossover at
#: SVL 512 (docs/tuning.md#the-large-m-gemm)
KQUANT_LARGE_GEMM = "4vlx1vl"
KQUANT_LARGE_PARTNER = "1vlx1vl"
KQUANT_LARGE_AFTER = 1


#: the (gemm, gemv) pairs the llama.cpp patch wires for a K-quant family, per ISA: (isa, gemm
#: tile, gemv tile, how the gemm and the gemv multiply), in the patch's order
KQUANT_LLAMA_KERNELS = (("sme2", "1vlx2vl", "1x2vl", "int16 SMOPA", "ZA-array SDOT"),
                        ("i8mm", "8x4", "1x4", "SMMLA", "SMMLA"),
                        ("dotprod", "8x4", "1x4", "SDOT by lane", "SDOT by lane"))


def kquant_sme2_impls(stem: str, i16_tiles: tuple[str, ...] = (), large: bool = False,
                      rhs_tiles: tuple[tuple[str, str], ...] = ()) -> dict[str, IsaImpl]:
    """The SME2 realisation of a K-quant family: the gemm (``templates/<stem>_sme2.S.j2``,
    int16 SMOPA of the scaled weights into ZA) and the gemv (``<stem>_sme2_gemv.S.j2``,
    ZA-array SDOT) on one RHS layout, allocator ``<stem>_sme2`` (the plugin's ``regalloc_sme2``).  kr = 4 (L = 2):
    a column's two bytes of a 4-k chunk are the k pairs the 2-way int16 SMOPA reads.  The gemm
    tiles ``i16_tiles`` have an ``:i16`` variant reading the activations widened to int16 at
    pack time (``q8ki16p``, docs/layouts.md#q8ki16p).  ``large``: the family has the large-m
    gemm :data:`KQUANT_LARGE_GEMM` (its entries switch to it past ``KQUANT_LARGE_AFTER`` tiles
    of rows).  ``rhs_tiles``: tiles on an RHS format of their own (``IsaImpl.rhs_tiles``)."""
    return {"sme2": IsaImpl("sme2_mopa", f"{stem}_sme2", f"{stem}_sme2", kr=4, sr=2,
                            gemv_op="sme2_sdot", gemv_template=f"{stem}_sme2_gemv",
                            lhs_i16="q8ki16p" if i16_tiles else None,
                            lhs_i16_tiles=tuple(i16_tiles), rhs_tiles=tuple(rhs_tiles),
                            fixed_kr=f"the {stem} sme2 kernels read k pairs of 4-k chunks "
                                     f"(kr = 4, sr = 2)",
                            large_gemm=(None if not large else
                                        f"{KQUANT_LARGE_GEMM}:i16" if KQUANT_LARGE_GEMM in i16_tiles
                                        else KQUANT_LARGE_GEMM),
                            large_after=KQUANT_LARGE_AFTER)}


def table32_impls() -> dict[str, IsaImpl]:
    """The realisations of a block-32 table-decoded family (iq4_nl, mxfp4: 4-bit indices into
    the layout's int8 table, q4_0's packing): q4_0's NEON / SVE allocators (kr by the
    instruction, sr 2) with iq4_nl's table-decode templates (``iq4nl_neon``, ``iq4nl_sve``: the
    table and the scale widening come from the layout), and SME2: the SMOPA gemm
    (``iq4nl_sme2``, on q4_0's SME skeleton) and the ZA-array SDOT gemv (``iq4nl_sme2_gemv``,
    on q4_0's za4 strategy) under one record and one packing (kr 8, sr 2), the indices decoded
    by LUTI4 through the layout's table in ZT0 (allocator ``q4_sme2_pair``)."""
    def impl(op: str, kr: int, sve: bool = False) -> IsaImpl:
        return IsaImpl(op, "iq4nl_sve" if sve else "iq4nl_neon", "q4_sve" if sve else "q4_neon",
                       kr=kr, sr=2)
    return {"neon": impl("neon", 8), "dotprod": impl("neon_dotprod", 8),
            "i8mm": impl("neon_i8mm", 16), "sve_dotprod": impl("sve_dotprod", 8, True),
            "sve_i8mm": impl("sve_i8mm", 16, True),
            "sme2": IsaImpl("sme2_mopa", "iq4nl_sme2", "q4_sme2_pair", kr=8, sr=2,
                            gemv_op="sme2_sdot", gemv_template="iq4nl_sme2_gemv",
                            fixed_L="SMOPA and SDOT by lane read 4-byte groups")}


def table32_default_kernels(name: str) -> tuple[str, ...]:
    """A block-32 table family's default kernels, gemm + the gemv on its packing, as q4_0's
    pairs: SVE (VL units) first, SMMLA 16x1vl kr16 with the SDOT gemv kr16, SDOT by lane 8x1vl
    with 1x1vl; the SME2 pair (SMOPA gemm 1vlx2vl + ZA-array SDOT gemv 1x2vl, one packing;
    opt-in at run time with TILEGEN_SME, as q4_0's SME pair); then i8mm SMMLA 12x4 kr16 (12-row
    register blocks: llvm-mca's best on neoverse-v2/-n2/-v1) with the SDOT gemv 1x4 kr16;
    dotprod SDOT by lane 16x4 kr8 with 1x4; plain NEON (SMULL) 4x4 / 1x4 last."""
    return tuple(f"{name}:{t}" for t in (
        "sve_i8mm:16x1vl", "sve_dotprod:1x1vl:k16:s2", "sve_dotprod:8x1vl", "sve_dotprod:1x1vl",
        "sme2:1vlx2vl", "sme2:1x2vl", "i8mm:12x4", "dotprod:1x4:k16:s2", "dotprod:16x4",
        "dotprod:1x4", "neon:4x4", "neon:1x4"))


#: the (gemm, gemv) pairs the llama.cpp patch wires for a block-32 table family, per ISA slot
#: (isa, gemm tile, gemv tile, how each multiplies), each gemv on its gemm's packing: the SME2
#: SMOPA 1vlx2vl with the ZA-array SDOT 1x2vl, the I8MM SMMLA 12x4 with the SDOT-on-pairs 1x4,
#: the DOTPROD 16x4 with its 1x4
TABLE32_LLAMA_KERNELS = (("sme2", "1vlx2vl", "1x2vl", "SMOPA", "SDOT"),
                         ("i8mm", "12x4", "1x4", "SMMLA", "SMMLA"),
                         ("dotprod", "16x4", "1x4", "SDOT by lane", "SDOT by lane"))
