"""LHS "quantize and pack" routines (KleidiAI ``lhs_quant_pack_*_f32``) as generated NEON code.

Every LHS format whose layout class names a template (``packer_template``: what a format's
packer can do is an attribute of its layout), byte-identical to KleidiAI (``docs/layouts.md``,
sections ``#qai8dxp``, ``#qsi8d32p``, ``#bf16p`` and ``#f32p-lhs``):

``qai8dxp``
    per-row asymmetric int8 with an int32 offset (= -zero point) and an f32 ``1/scale`` per row;
    k padded to a multiple of 32 by repeating the last value.  C ABI::

        void f(size_t m, size_t k, size_t mr, size_t kr, size_t sr, size_t m_idx_start,
               const float* lhs, size_t lhs_stride, void* lhs_packed);

    ``lhs`` points at the first row to pack; ``lhs_packed`` at the row block holding row
    ``m_idx_start``.

``qsi8d32p``
    per-block (``bl``, a multiple of 32) symmetric int8 with an f16 scale per block.  C ABI::

        void f(size_t m, size_t k, size_t bl, size_t mr, size_t kr, size_t sr,
               size_t m_idx_start, const float* lhs, size_t lhs_stride, void* lhs_packed);

    ``lhs`` points at row 0 of the whole matrix (the routine adds ``m_idx_start`` rows).
    ``rounding="away"`` is ``kai_lhs_quant_pack_qsi8d32p_f32``; ``rounding="even"`` is the
    ties-to-even arithmetic of ``kai_lhs_quant_pack_qsi8d32p4x8sb_f32_neon`` (the generated
    code follows the spec for every ``m_idx_start`` and ``lhs_stride``; KleidiAI's 4x8sb fast
    path itself only agrees with it for ``m_idx_start % 4 == 0`` and ``lhs_stride == 4k``).
    A compile-time ``mr`` that is a multiple of 4 packs the slots 4i..4i+3 of a row block
    together (one vector ``fdiv`` for their 4 block scales, one for the reciprocals, whole
    q-register stores of 128 bytes per 32 values; at bl = 32 the next block's amax overlaps
    the divisions); the rows before the first such slot and the last < 4 rows are packed one
    at a time.  ``bench/vs_kleidiai.py --packers`` has the cycles per element.

``bf16px4``
    f32 rows rounded to bf16 (nearest even; NaN quiet), ``bf16p<mr>x4`` (kr = 4, sr = 1), the
    ABI of ``qai8dxp``; ``m_idx_start`` must be a multiple of ``mr`` (whole row blocks).

``bf16px2``
    f32 rows rounded to bf16 (as ``bf16px4``), ``bf16p<mr>x2`` (kr = 2, sr = 1): the LHS of
    the SME2 BFMOPA kernels (KleidiAI ``kai_lhs_pack_bf16p2vlx2_f32_sme``, same ABI).  K
    padding 0, padding rows of the last block written as 0.

``f32p``
    f32 rows transposed into k-major row blocks, ``f32p<mr>x1``: the LHS of the SME FMOPA
    kernels (KleidiAI ``kai_lhs_pack_f32p2vlx1_f32_sme``, same ABI).  Padding rows 0.

``mr``, ``kr`` and ``sr`` are compile-time parameters of the template.  The matching runtime
arguments are *checked*: a call whose ``mr`` differs, or whose ``kr != sr * (kr/sr of the
spec)``, returns without writing anything (as do ``m == 0``, ``k == 0`` and, for qsi8d32p,
``bl`` not a positive multiple of 32 or ``k`` not a multiple of ``bl``).

VL-scaled packers (``mr_vl=True``; every format but ``bf16px4`` (q8kp too), and the only kind of
``bf16px2`` / ``f32p``) serve the SME kernels, whose row block is ``mr`` x SVL/32 rows and so
known only at run time: ``mr`` of the spec is in VL units (``"2vl"``), and the generated code
takes the row count from its ``mr`` argument, which must be a positive multiple of
``4 * units`` (one unit at the smallest SVL, 128 bits) and at most ``64 * units`` (SVL 2048),
else nothing is written.  Rows are packed one at a time (``bf16px2`` / ``f32p``: in groups of
4, which never straddle a row block), so mr only sets strides and offsets (registers instead
of immediates); ``bf16px2`` and ``f32p`` need ``m_idx_start`` to be a
multiple of ``mr``, like ``bf16px4``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..callconv import LHS_BL, LHS_ROWS, Abi
from ..layout.base import LayoutError, RowBlocks
from ..layout.registry import LHS_LAYOUTS, layout_class
from ..records import SpecError, __version__
from .render import check_format, symbol_for, template_env

__all__ = ["PackerSpec", "PACKER_FORMATS", "PACKER_ISAS", "MR_MAX", "render", "ROUNDINGS",
           "packer_for", "streaming_packer_for"]

# What a format's packer can do (template, name, row counts, per-row quantities, rounding) is
# an attribute of its layout class (tilegen.layout.base.PackedLayout, "packer_*"): the formats
# with a generated packer are the LHS layouts that name a template.
PACKER_FORMATS = tuple(fmt for fmt, cls in LHS_LAYOUTS.items() if cls.packer_template)
ROUNDINGS = ("away", "even")
# "neon": generated NEON code; "sme" / "sme2": the streaming twin of a VL-scaled packer (its
# layout's packer_template_sme, of ISA packer_sme_isa), for the SME kernels' k-major LHS
PACKER_ISAS = ("neon", "sme", "sme2")

# Upper bound on mr.  Derivation: every KleidiAI consumer of these layouts has mr <= 64 (NEON
# kernels use 1, 4, 8; the SME "1vl" kernels use mr = SVL/32 bits, at most 2048/32 = 64), and the
# template encodes the mr-dependent constants as single immediates: the chunk stride mr*L
# (<= 64*32 = 2048, a movz), the header offsets 2*mr / 4*mr (add / str #imm12, <= 4095) and mr
# itself (cmp #imm12).  Nothing in the generated code grows with mr (rows are packed one at a
# time, or 4 at a time for the slots 4i..4i+3 of a block), so the bound is about the encodings
# and the consumers, not registers.
MR_MAX = 64

# Elements quantized per iteration of the hot loop (two ld1 of four q registers).
ELEMS_PER_ITER = 32

# VL-scaled packers: one VL unit is SVL/32 rows (the f32 lanes of one streaming vector), 4 at
# SVL 128 bits to 64 at 2048 (the architectural range, in steps of 128 bits); a spec's mr is
# 1, 2 or 4 units (the SME tiles: 1vlx4vl, 2vlx2vl, 4vlx1vl; ZA holds 4 f32 tiles).  The runtime
# mr is checked against [VL_ROWS_MIN * units, VL_ROWS_MAX * units] in steps of VL_ROWS_MIN * units
# (<= 256: cmp/tst immediates); the templates keep mr in a register, so nothing grows with it.
VL_ROWS_MIN, VL_ROWS_MAX = 4, 64
VL_UNITS = (1, 2, 4)



@lru_cache(maxsize=256)
def _packer_layout(fmt: str, mr: int, kr: int, sr: int, rounding: str, bl: int | None):
    cls = layout_class("lhs", fmt)
    if cls.has_blocks() and (bl is None or bl < 32 or bl % 32):
        raise SpecError(f"{fmt} needs bl, a positive multiple of 32, got bl={bl!r}")
    opts = {} if cls.fixed_conversion else {"rounding": rounding}
    if cls.fixed_conversion and rounding != "away":
        raise SpecError(f"{fmt} packer: {cls.fixed_conversion}; no rounding option "
                        f"(got {rounding!r})")
    try:
        return cls.for_geometry(mr, kr, sr, bl, **opts)
    except LayoutError as e:
        raise SpecError(f"{fmt} packer: {e}") from None


@dataclass(frozen=True)
class PackerSpec:
    """One LHS quantize-and-pack routine: format, ``mr`` rows per block, ``kr``/``sr``."""

    fmt: str
    mr: int
    kr: int
    sr: int
    rounding: str = "away"
    mr_vl: bool = False     # mr in VL units (SVL/32 rows each), the row count a run-time argument
    isa: str = "neon"       # "sme"/"sme2": the streaming twin (mr = units x the CPU's SVL/32 only)

    def __post_init__(self) -> None:
        if self.fmt not in PACKER_FORMATS:
            raise SpecError(f"unknown LHS packer format {self.fmt!r}; "
                            f"known: {', '.join(PACKER_FORMATS)}")
        for field in ("mr", "kr", "sr"):
            v = getattr(self, field)
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"{field} must be an int, got {v!r}")
            if v < 1:
                raise SpecError(f"{field} must be >= 1, got {field}={v}")
        if not isinstance(self.mr_vl, bool):
            raise SpecError(f"mr_vl must be a bool, got {self.mr_vl!r}")
        cls = layout_class("lhs", self.fmt)
        if self.isa not in PACKER_ISAS:
            raise SpecError(f"packer isa must be one of {', '.join(PACKER_ISAS)}, got "
                            f"{self.isa!r}")
        if self.isa != "neon" and not (self.mr_vl and cls.packer_template_sme
                                       and cls.packer_sme_isa == self.isa):
            raise SpecError(f"{self.fmt}: no streaming {self.isa} packer"
                            + ("" if cls.packer_template_sme else " for this format")
                            + (f" (its streaming packer is {cls.packer_sme_isa})"
                               if cls.packer_template_sme and cls.packer_sme_isa != self.isa
                               else "")
                            + ("" if self.mr_vl else ": it packs row blocks in VL units"))
        if self.mr_vl:
            if "vl" not in cls.packer_mr:
                raise SpecError(f"{self.fmt} packers have a compile-time mr (no VL units)")
            if self.mr not in VL_UNITS:
                raise SpecError(f"a VL-scaled packer has mr of {', '.join(map(str, VL_UNITS))} "
                                f"VL units, got mr={self.mr}vl")
        elif "fixed" not in cls.packer_mr:
            raise SpecError(f"{self.fmt} is the LHS of SME kernels: its packer's mr is in VL "
                            f"units (mr_vl=True)")
        elif self.mr > MR_MAX:
            raise SpecError(f"mr must be <= {MR_MAX} (largest mr of any consumer kernel; "
                            f"immediate encodings of the template), got mr={self.mr}")
        elif cls.packer_rows is not None and self.mr not in cls.packer_rows:
            raise SpecError(f"the {self.fmt} packer packs row blocks of "
                            f"{', '.join(map(str, cls.packer_rows))} rows, got mr={self.mr}")
        if not isinstance(self.rounding, str):
            raise SpecError(f"rounding must be a string, got {self.rounding!r}")
        self.layout(32)           # the layout's rules (interleave, kr, sr, rounding) at bl = 32
        try:
            cls.check_packer_geometry(self.kr, self.sr)
        except LayoutError as e:
            raise SpecError(str(e)) from None

    # -- derived facts -------------------------------------------------------------
    @property
    def L(self) -> int:
        """Interleave chunk: bytes of one row written contiguously (kr / sr)."""
        return self.kr // self.sr

    @property
    def mr_str(self) -> str:
        """``mr`` as names write it (``"2vl"`` in VL units)."""
        return f"{self.mr}vl" if self.mr_vl else str(self.mr)

    @property
    def vl_rows(self) -> tuple[int, ...]:
        """Every row count a VL-scaled packer accepts (one per SVL of 128..2048 bits in steps
        of 128; ``(mr,)`` for a compile-time mr)."""
        if not self.mr_vl:
            return (self.mr,)
        u = self.mr * VL_ROWS_MIN
        return tuple(range(u, self.mr * VL_ROWS_MAX + 1, u))

    def accepts_mr(self, mr) -> bool:
        """Whether a call with this ``mr`` argument packs (else it writes nothing)."""
        return not isinstance(mr, bool) and isinstance(mr, int) and mr in self.vl_rows

    @property
    def name(self) -> str:
        """KleidiAI grammar: ``<verb>_<layout label>[sb]_f32_neon``, the layout's
        ``packer_verb``: ``lhs_quant_pack`` (``lhs_pack`` for formats without quantisation,
        as KleidiAI's SME packers)."""
        cls = layout_class("lhs", self.fmt)
        label = cls.label_for(self.mr_str, self.kr, self.sr) + cls.name_suffix
        return (f"{cls.packer_verb}_{label}{'sb' if self.rounding == 'even' else ''}"
                f"_f32_{self.isa}")

    @property
    def spec_string(self) -> str:
        s = f"lhs:{self.fmt}:{self.mr_str}x{self.L}:k{self.kr}:s{self.sr}"
        return s + (":even" if self.rounding == "even" else "") + (
            "" if self.isa == "neon" else f":{self.isa}")

    @property
    def streaming(self) -> bool:
        """Whether the routine runs in streaming mode (smstart / smstop inside): it packs only
        the row blocks of the running CPU's SVL (``units`` x SVL/32 rows)."""
        return self.isa != "neon"

    @property
    def streaming_from_svl(self) -> int:
        """The smallest SVL (bits) at which the runtime packs with this streaming packer rather
        than the NEON one (the layout's ``packer_sme_from_svl``, from the SME static model)."""
        return layout_class("lhs", self.fmt).packer_sme_from_svl

    def svl_rows(self, svl_bytes: int) -> int:
        """The row count a VL-scaled packer's blocks have at SVL ``svl_bytes`` bytes."""
        return self.mr * svl_bytes // 4

    @property
    def takes_bl(self) -> bool:
        """Whether the packer takes the block length ``bl`` (formats with blocks)."""
        return layout_class("lhs", self.fmt).has_blocks()

    @property
    def lhs_at_row0(self) -> bool:
        """Whether ``lhs`` points at row 0 of the whole matrix (the packer adds m_idx_start
        rows) rather than at the first row to pack."""
        return layout_class("lhs", self.fmt).packer_lhs_at_row0

    @property
    def from_any_row(self) -> bool:
        """Whether a call may start at any row (``m_idx_start``), not only at a row block."""
        return issubclass(layout_class("lhs", self.fmt), RowBlocks)

    @property
    def abi(self) -> Abi:
        """The calling convention (:mod:`tilegen.callconv`): formats with blocks take ``bl``."""
        return LHS_BL if self.takes_bl else LHS_ROWS

    @property
    def signature(self) -> list[tuple[str, str]]:
        """C parameters (name, ctype) in order."""
        return [(p.name, p.ctype) for p in self.abi.params]

    @property
    def c_signature(self) -> str:
        return self.abi.prototype(self.name)

    def symbol(self, fmt: str = "elf") -> str:
        return symbol_for(self.name, fmt)

    # -- geometry (KleidiAI getters), from the layout object --------------------------
    def layout(self, bl: int | None = None, mr: int | None = None):
        """The packed-LHS layout object this packer writes (single source of geometry); a
        VL-scaled packer writes one per accepted ``mr`` (rows; default: the smallest, SVL 128)."""
        if mr is None:
            mr = self.vl_rows[0]
        elif not self.accepts_mr(mr):
            raise SpecError(f"{self.name} packs row blocks of "
                            f"{', '.join(map(str, self.vl_rows))} rows, not mr={mr!r}")
        return _packer_layout(self.fmt, mr, self.kr, self.sr, self.rounding, bl)

    def packed_stride(self, k: int, bl: int | None = None, mr: int | None = None) -> int:
        """Bytes per block of mr rows."""
        return self.layout(bl, mr).row_block_stride(k)

    def packed_size(self, m: int, k: int, bl: int | None = None, mr: int | None = None) -> int:
        return self.layout(bl, mr).packed_size(m, k)

    def packed_offset(self, m_idx: int, k: int, bl: int | None = None,
                      mr: int | None = None) -> int:
        return self.layout(bl, mr).packed_offset(m_idx, k)


def packer_for(spec) -> PackerSpec | None:
    """The LHS packer a kernel spec needs (None for kernels reading f32 rows as they are): q4,
    q8_0 and bf16 kernels, and the f32 SME outer products; row blocks in VL units get a
    VL-scaled packer (mr taken at run time)."""
    if not spec.packs_lhs:
        return None
    fmt = spec.lhs_stem
    if fmt not in PACKER_FORMATS:
        return None
    if spec.mr_vl:
        if "vl" not in layout_class("lhs", fmt).packer_mr:  # the q4_0_s1s0 gemm: numpy packs
            return None
        return PackerSpec(fmt, spec.mr, spec.kr, spec.sr, mr_vl=True)
    return PackerSpec(fmt, spec.lhs_mr, spec.kr, spec.sr)


def streaming_packer_for(spec) -> PackerSpec | None:
    """The streaming (SME) twin of :func:`packer_for` for an SME kernel whose LHS format has one
    (f32p, bf16px2: k-major row blocks transposed through ZA); None otherwise.  Libraries carry
    both: the runtime packs an SME kernel's LHS with the twin, ``lib.pack_lhs`` with the NEON
    packer (any mr)."""
    p = packer_for(spec)
    if (p is None or not p.mr_vl or spec.isa_info.vl_kind != "sme"
            or not layout_class("lhs", p.fmt).packer_template_sme):
        return None
    return PackerSpec(p.fmt, p.mr, p.kr, p.sr, p.rounding, mr_vl=True,
                      isa=layout_class("lhs", p.fmt).packer_sme_isa)


def _per_row(spec: PackerSpec, lay, bl: int | None) -> dict[str, int]:
    """Bytes per row of each mr-dependent layout quantity a runtime-mr template uses (from
    the layout ``lay`` at its mr), checked linear in mr over every mr the packer accepts: the
    template scales the mr register by them."""
    out = {}
    for name in lay.packer_per_row:
        v = getattr(lay, name)
        if v % lay.mr:
            raise SpecError(f"template assumption does not hold for this layout: "
                            f"{name} = {v} is not a multiple of mr = {lay.mr}")
        out[name] = v // lay.mr
    for r in spec.vl_rows:
        other = _packer_layout(spec.fmt, r, spec.kr, spec.sr, spec.rounding, bl)
        for name, per in out.items():
            if getattr(other, name) != per * r:
                raise SpecError(f"template assumption does not hold for this layout: {name} "
                                f"is not {per} bytes per row at mr = {r}")
    return out


# qsi8d32p, compile-time mr a multiple of QUAD_ROWS: groups of QUAD_ROWS rows (slots 4i..4i+3
# of a row block) are packed together, their block scales one vector fdiv; f32 registers of
# the two banks the quad path uses (v8-v15 are callee-saved), one bank per quarter block
QUAD_ROWS = 4
_QUAD_BANKS = (tuple(range(0, 8)), tuple(range(16, 24)))


def _quad_plan(lay) -> dict:
    """Instruction plan of one 32-value step of QUAD_ROWS rows in the layout ``lay``.

    The rows' packed bytes of one step are a stream: chunk c (``lay.chunk_bytes`` apart in
    memory) holds slot 0's L bytes, then slot 1's, ...; a group of QUAD_ROWS consecutive slots
    is 4L contiguous bytes of each chunk.  Each 16-byte vector of the stream is the low bytes
    of four registers of 4 int32 (two uzp1 .8h, one uzp1 .16b); a quarter step is 8 registers
    (2 stream vectors) of one bank.  Per quarter: ``loads`` (row, reg a, reg b) are ldp of
    32 consecutive source bytes of that row, ``lanes`` (reg, row) the 1/d lane of each
    register, ``narrow`` the first register of each group of four (where its stream vector
    ends up), ``stores``: ("stp", ra, rb, off) at the chunk pointer + off, ("st1", r) storing
    one chunk and stepping to the next, ("next",) stepping to the next chunk."""
    L, mr = lay.L, lay.mr
    require = _quad_require
    require(L % 4 == 0 and 32 % L == 0, "L is a multiple of 4 dividing 32")
    require(mr % QUAD_ROWS == 0, "mr is a multiple of 4")
    require(lay.chunk_bytes == mr * L, "chunk c of slot x is at c*mr*L + x*L")
    require(all(lay.element_offset(x, e) == lay.data_offset(0) + (e // L) * lay.chunk_bytes
                + x * L + e % L for x in range(min(mr, 8)) for e in range(32)),
            "the element offsets of the layout")
    gpc = L // 4                         # 4-value groups of one row in one chunk
    contiguous = lay.chunk_bytes == QUAD_ROWS * L
    quarters = []
    for q in range(4):
        bank = _QUAD_BANKS[q % 2]
        groups = []                      # (row, group of the row, register)
        for s in range(8 * q, 8 * q + 8):
            c, rem = divmod(s, QUAD_ROWS * gpc)
            r, e = divmod(rem, gpc)
            groups.append((r, c * gpc + e, bank[s - 8 * q]))
        loads = []
        for r in range(QUAD_ROWS):
            mine = sorted((g, reg) for rr, g, reg in groups if rr == r)
            require(len(mine) % 2 == 0 and all(mine[i + 1][0] == mine[i][0] + 1
                                               for i in range(len(mine) - 1)),
                    "a row's groups in a quarter are consecutive pairs")
            loads += [(r, mine[i][1], mine[i + 1][1]) for i in range(0, len(mine), 2)]
        stores = []
        off = (32 * q) % (QUAD_ROWS * L) if not contiguous else 32 * q
        if contiguous:
            stores.append(("stp", bank[0], bank[4], 32 * q))
        elif QUAD_ROWS * L == 16:        # one stream vector per chunk
            stores += [("st1", bank[0]), ("st1", bank[4])]
        else:
            stores.append(("stp", bank[0], bank[4], off))
            if off + 32 == QUAD_ROWS * L:
                stores.append(("next",))
        quarters.append(dict(loads=loads, lanes=[(reg, r) for r, _, reg in groups],
                             narrow=(bank[0], bank[4]), stores=stores))
    return dict(quarters=quarters, contiguous=contiguous, stream_bytes=32 * QUAD_ROWS)


def _quad_require(cond, what: str) -> None:
    if not cond:
        raise SpecError(f"template assumption does not hold for this layout: {what}")


def render(spec: PackerSpec, fmt: str = "elf") -> str:
    """Assembly source of ``spec`` for object format ``fmt`` (``elf`` or ``macho``)."""
    check_format(fmt)
    if not isinstance(spec, PackerSpec):
        raise SpecError(f"expected a PackerSpec, got {type(spec).__name__}")
    cls = layout_class("lhs", spec.fmt)
    stem = cls.packer_template_sme if spec.streaming else cls.packer_template
    template = template_env().get_template(f"{stem}.S.j2")
    # the layout's offsets do not depend on bl (a run-time argument of formats with blocks);
    # any valid bl
    bl = ELEMS_PER_ITER if cls.has_blocks() else None
    lay = spec.layout(bl)
    vl = dict(RT=False, QUAD=None)
    if cls.packer_quad and not spec.mr_vl and spec.mr % QUAD_ROWS == 0:
        vl["QUAD"] = _quad_plan(lay)
    if spec.mr_vl:      # mr is the run-time argument: per-row quantities, the accepted range
        rows = spec.vl_rows
        vl = dict(RT=True, QUAD=None, PER_ROW=_per_row(spec, lay, bl), MR_UNIT=rows[0], MR_LIMIT=rows[-1],
                  LAYS=[_packer_layout(spec.fmt, r, spec.kr, spec.sr, spec.rounding, bl)
                        for r in rows])
    return template.render(
        spec=spec, LAY=lay, fmt=fmt, sym=symbol_for(spec.name, fmt), lp=".L" if fmt == "elf" else "L",
        version=__version__, QR=QUAD_ROWS, QBANKS=_QUAD_BANKS, MR=None if spec.mr_vl else spec.mr, L=spec.L, KR=spec.kr,
        SR=spec.sr, even=spec.rounding == "even", EPI=ELEMS_PER_ITER, **vl,
    )
