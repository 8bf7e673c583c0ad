"""The facts every stage shares: the spec error, the vector-length granule, the tile bounds,
and the one record per ISA (:data:`ISAS`) and per operation family (:data:`FAMILIES`).

The bottom of the import graph: it imports nothing from tilegen, and every stage (generator,
layout, build, runtime, export, CLI, tuner) reads these records instead of its own copy.
"""
from __future__ import annotations

from dataclasses import dataclass

from .callconv import BF16, F32, Q4, Q8, Abi

__all__ = ["__version__", "SpecError", "VL_GRANULE", "TILE_MR_MAX", "TILE_NR_MAX",
           "TILE_VL_MAX", "KR_MAX", "Isa", "ISAS", "IsaImpl", "FamilyInfo", "FAMILIES", "abi_for"]

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
    # Interleave the instructions fix (the validator refuses others, with this reason):
    # ``fixed_kr``: kr and sr are the defaults above; ``fixed_L``: kr/sr is theirs.  None:
    # the layouts and the allocator judge kr and sr.
    fixed_kr: str | None = None
    fixed_L: str | None = None


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


def _q4_family(name: str, lhs: str, rhs: str) -> FamilyInfo:
    """The int4 x int8 families share ISAs, templates, allocators and default interleave."""
    def q4(op: str, strategy: str, kr: int, allocator: str | None = None,
           fixed_L: str | None = None) -> IsaImpl:
        return IsaImpl(op, strategy, allocator or strategy, kr=kr, sr=2, fixed_L=fixed_L)
    return FamilyInfo(
        name=name, lhs=lhs, rhs=rhs, kinds=(name,), abi=Q4, quantized=True, acc_mem=True,
        impls={"neon": q4("neon", "q4_neon", 8), "dotprod": q4("neon_dotprod", "q4_neon", 8),
               "i8mm": q4("neon_i8mm", "q4_neon", 16),
               "sve_dotprod": q4("sve_dotprod", "q4_sve", 8),
               "sve_i8mm": q4("sve_i8mm", "q4_sve", 16),
               "sme": q4("sme_mopa", "q4_sme", 8, fixed_L="SMOPA reads 4-byte groups"),
               "sme2": q4("sme2_sdot", "q4_sve", 8, allocator="q4_sme2",
                          fixed_L="sme2 q4 gemv reads 4-byte groups (SDOT by lane)")},
    )


def _f32(op: str, template: str, allocator: str, **kw) -> IsaImpl:
    return IsaImpl(op, template, allocator, fixed_kr="the f32 family reads f32p panels", **kw)


def _q8(op: str, template: str, allocator: str, kr: int, fixed_kr: str | None = None) -> IsaImpl:
    return IsaImpl(op, template, allocator, kr=kr, sr=1, fixed_kr=fixed_kr)


def _kquant_impls(stem: str) -> dict[str, IsaImpl]:
    """The NEON realisations of a K-quant family (``stem``: q4k, q6k): one template and one
    allocator per family (``templates/<stem>_neon.S.j2``, ``regalloc/<stem>.py``); sr = 2
    fixed (a byte holds two k values, docs/layouts.md#q8kp), kr by the instruction: SMMLA reads
    8 k per operand row (kr = 16), SDOT by lane and SMULL 4 (kr = 8)."""
    def kq(op: str, kr: int) -> IsaImpl:
        return IsaImpl(op, f"{stem}_neon", f"{stem}_neon", kr=kr, sr=2)
    return {"neon": kq("neon", 8), "dotprod": kq("neon_dotprod", 8),
            "i8mm": kq("neon_i8mm", 16)}


def _kquant_sve_impls(stem: str) -> dict[str, IsaImpl]:
    """The SVE realisations of a K-quant family, vector-length agnostic (nr in VL units;
    ``templates/<stem>_sve.S.j2``, allocator ``<stem>_sve``): SMMLA per 128-bit segment
    (sve_i8mm, kr = 16; its gemv SDOT on 8-k groups of the same layout), SDOT by lane
    (sve_dotprod, kr = 8)."""
    def kq(op: str, kr: int) -> IsaImpl:
        return IsaImpl(op, f"{stem}_sve", f"{stem}_sve", kr=kr, sr=2)
    return {"sve_dotprod": kq("sve_dotprod", 8), "sve_i8mm": kq("sve_i8mm", 16)}


def _kquant_sme2(stem: str) -> dict[str, IsaImpl]:
    """The SME2 realisation of a K-quant family: the gemm (``templates/<stem>_sme2.S.j2``,
    int16 SMOPA of the scaled weights into ZA) and the gemv (``<stem>_sme2_gemv.S.j2``,
    ZA-array SDOT) on one RHS layout, allocator ``regalloc/<stem>_sme2.py``.  kr = 4 (L = 2):
    a column's two bytes of a 4-k chunk are the k pairs the 2-way int16 SMOPA reads."""
    return {"sme2": IsaImpl("sme2_mopa", f"{stem}_sme2", f"{stem}_sme2", kr=4, sr=2,
                            gemv_op="sme2_sdot", gemv_template=f"{stem}_sme2_gemv",
                            fixed_kr=f"the {stem} sme2 kernels read k pairs of 4-k chunks "
                                     f"(kr = 4, sr = 2)")}


FAMILIES: dict[str, FamilyInfo] = {
    # f32 GEMM: NEON/SVE FMLA, SME FMOPA outer products (SME2: multi-vector loads and the
    # ZA-array FMLA gemv).
    "f32": FamilyInfo(
        name="f32", lhs="f32p", rhs="f32p", kinds=("f32", "f16"), abi=F32,
        impls={"neon": _f32("neon_mla", "f32_neon", "f32_neon"),
               "sve": _f32("sve_mla", "f32_sve", "f32_sve"),
               "sme": _f32("sme_mopa", "f32_sme", "f32_sme"),
               "sme2": _f32("sme2_mopa", "f32_sme", "f32_sme2", gemv_op="sme2_mla",
                            gemv_template="f32_sme2_gemv")},
    ),
    # llama.cpp's q4_0 path: LHS per-32-block symmetric int8 (f16 scale), RHS int4 from
    # ggml block_q4_0 with f16 scales (KleidiAI matmul_clamp_f32_qsi8d32p_qsi4c32p).
    "q4_0": _q4_family("q4_0", "qsi8d32p", "qsi4c32pscalef16"),
    # q4_0 on KleidiAI's SME2 layouts (llama.cpp's SME2 gemv operands): LHS qsi8d32p with
    # the scales behind the values, RHS qsi4c32ps1s0scalef16 (k-adjacent nibble pairs, zero
    # point 8: the LUTI4 unpack); no runtime weight kind of its own.
    "q4_0_s1s0": FamilyInfo(
        name="q4_0_s1s0", lhs="qsi8d32pscaletail", rhs="qsi4c32ps1s0scalef16", kinds=(),
        abi=Q4, quantized=True,
        impls={"sme2": IsaImpl("sme2_mopa", "q4_sme2_luti4_mopa", "q4_sme2_luti4", kr=4, sr=1,
                               gemv_op="sme2_luti4", gemv_template="q4_sme2_luti4",
                               fixed_kr="the LUTI4 q4 kernels read 4-byte groups")}),
    # llama.cpp's SME2 Q4_0 gemm (KleidiAI matmul_clamp_f32_f16p_qsi4c32p): f32 activations
    # rounded to f16 (LHS f16p<mr>x2), the q4_0_s1s0 RHS; the LUTI4 unpack gives (u - 8) as
    # f16, each product with the block scale is rounded to f16 (FMUL) and FMOPA (f16 pairs
    # into f32) accumulates in ZA over all of k.  kr = 4, sr = 2 are KleidiAI's getters (the
    # RHS packer's arguments); the layouts read pairs (L = 2).
    # Its gemm pairs with the q4_0_s1s0 gemv on one packing (llama.cpp's SME2 Q4_0 entry); the
    # runtime's q4_0 weights use the pair where the CPU runs it (tilegen.runtime.select).
    "q4_0_f16": FamilyInfo(
        name="q4_0_f16", lhs="f16px2", rhs="qsi4c32ps1s0scalef16", kinds=(), abi=Q4,
        quantized=True, gemv_family="q4_0_s1s0",
        impls={"sme2": IsaImpl("sme2_mopa", "q4_sme2_f16_mopa", "q4_sme2_f16", kr=4, sr=2,
                               fixed_kr="the f16 x q4 SME2 kernel reads k-pairs of 4-nibble "
                                        "chunks (KleidiAI's kr = 4, sr = 2)")}),
    # LHS per-row asymmetric int8, RHS int4 per 32-block with bf16 scales, row sums and bias
    # (KleidiAI matmul_clamp_f32_qai8dxp_qsi4c32p).
    "q4_0_dx": _q4_family("q4_0_dx", "qai8dxp", "qsi4c32p"),
    # ggml Q8_0 weights requantised per channel: LHS per-row asymmetric int8, RHS int8 with an
    # f32 scale, row sum and bias per column (KleidiAI matmul_clamp_f32_qai8dxp_qsi8cxp).
    "q8_0": FamilyInfo(
        name="q8_0", lhs="qai8dxp", rhs="qsi8cxp", kinds=("q8_0",), abi=Q8, quantized=True,
        impls={"neon": _q8("neon", "q8_neon", "q8_neon", 8),
               "dotprod": _q8("neon_dotprod", "q8_neon", "q8_neon", 4),
               "i8mm": _q8("neon_i8mm", "q8_neon", "q8_neon", 8),
               "sve_dotprod": _q8("sve_dotprod", "q8_sve", "q8_sve", 4),
               "sve_i8mm": _q8("sve_i8mm", "q8_sve", "q8_sve", 8),
               "sme": _q8("sme_mopa", "q8_sme", "q8_sme", 4,
                          "q8_0 sme kernels read 4-byte k groups (SMOPA)"),
               # the SMOPA gemm with multi-vector loads; its gemv ZA-array SDOT (q8_sve.S.j2)
               "sme2": IsaImpl("sme2_mopa", "q8_sme", "q8_sme2", kr=4, sr=1,
                               gemv_op="sme2_sdot", gemv_template="q8_sve",
                               fixed_kr="q8_0 sme2 kernels read 4-byte k groups (SMOPA, "
                                        "SDOT by lane)")},
    ),
    # ggml's K-quants (issue #24): Q8_K-style activations (q8kp: int8 per row per 256-k
    # super-block, f32 d, sub-block sums) against lossless repacks of ggml block_q4_K / block_q6_K
    # (docs/layouts.md#q8kp, #q4kp, #q6kp; arithmetic: tilegen.reference.kquant).  The ISAs
    # are added with their kernels.
    "q4_K": FamilyInfo(name="q4_K", lhs="q8kp", rhs="q4kp",
                       impls={**_kquant_impls("q4k"), **_kquant_sve_impls("q4k"),
                              **_kquant_sme2("q4k")},
                       kinds=("q4_K",), abi=Q8, quantized=True),
    "q6_K": FamilyInfo(name="q6_K", lhs="q8kp", rhs="q6kp",
                       impls={**_kquant_impls("q6k"), **_kquant_sve_impls("q6k"),
                              **_kquant_sme2("q6k")},
                       kinds=("q6_K",), abi=Q8, quantized=True),
    # f32 activations and weights rounded to bf16, f32 accumulation (KleidiAI
    # matmul_clamp_f32_bf16p<mr>x4_bf16p<nr>x4b): BFMMLA gemm, BFDOT gemv on the same RHS.
    "bf16": FamilyInfo(
        name="bf16", lhs="bf16px4", rhs="bf16px4b", kinds=("bf16",), abi=BF16, packs_lhs=True,
        impls={"bf16": IsaImpl("neon_mmla", "bf16_neon", "bf16_neon", kr=4, sr=1,
                               gemv_op="neon_dot", fixed_kr="the bf16 NEON layouts "
                               "(bf16p<mr>x4 / bf16p<nr>x4b) read k-chunks of 4"),
               # BFMOPA into ZA f32 tiles on KleidiAI's bf16p<vl>x2 / bf16p<vl>x2b layouts
               "sme2": IsaImpl("sme2_mopa", "bf16_sme", "bf16_sme2", kr=2, sr=1,
                               lhs="bf16px2", rhs="bf16px2b",
                               fixed_kr="BFMOPA reads bf16 pairs")},
    ),
}


def abi_for(family: str) -> Abi:
    """The calling convention of ``family``'s kernels (its record's ``abi``)."""
    return FAMILIES[family].abi
