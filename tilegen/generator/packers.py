"""LHS "quantize and pack" routines (KleidiAI ``lhs_quant_pack_*_f32``) as generated NEON code.

Three formats, byte-identical to KleidiAI (``docs/layouts.md``, sections ``#qai8dxp``,
``#qsi8d32p`` and ``#bf16p``):

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

``bf16px4``
    f32 rows rounded to bf16 (nearest even; NaN quiet), ``bf16p<mr>x4`` (kr = 4, sr = 1), the
    ABI of ``qai8dxp``; ``m_idx_start`` must be a multiple of ``mr`` (whole row blocks).

``mr``, ``kr`` and ``sr`` are compile-time parameters of the template.  The matching runtime
arguments are *checked*: a call whose ``mr`` differs, or whose ``kr != sr * (kr/sr of the
spec)``, returns without writing anything (as do ``m == 0``, ``k == 0`` and, for qsi8d32p,
``bl`` not a positive multiple of 32 or ``k`` not a multiple of ``bl``).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import __version__
from .render import _check_format, _env, symbol_for
from .spec import SpecError

__all__ = ["PackerSpec", "PACKER_FORMATS", "MR_MAX", "render", "ROUNDINGS"]

PACKER_FORMATS = ("qai8dxp", "qsi8d32p", "bf16px4")
# formats whose values are converted by one fixed rule (no rounding option)
_FIXED_ROUNDING = ("bf16px4",)
ROUNDINGS = ("away", "even")

# Upper bound on mr.  Derivation: every KleidiAI consumer of these layouts has mr <= 64 (NEON
# kernels use 1, 4, 8; the SME "1vl" kernels use mr = SVL/32 bits, at most 2048/32 = 64), and the
# template encodes the mr-dependent constants as single immediates: the chunk stride mr*L
# (<= 64*32 = 2048, a movz), the header offsets 2*mr / 4*mr (add / str #imm12, <= 4095) and mr
# itself (cmp #imm12).  Nothing in the generated code grows with mr (rows are packed one at a
# time), so the bound is about the encodings and the consumers, not registers.
MR_MAX = 64

# Elements quantized per iteration of the hot loop (two ld1 of four q registers).
ELEMS_PER_ITER = 32


@lru_cache(maxsize=256)
def _packer_layout(fmt: str, mr: int, kr: int, sr: int, rounding: str, bl: int | None):
    from ..layout.base import LayoutError
    from ..layout.registry import layout_class
    if fmt == "qsi8d32p" and (bl is None or bl < 32 or bl % 32):
        raise SpecError(f"qsi8d32p needs bl, a positive multiple of 32, got bl={bl!r}")
    opts = {} if fmt in _FIXED_ROUNDING else {"rounding": rounding}
    if fmt in _FIXED_ROUNDING and rounding != "away":
        raise SpecError(f"{fmt} packer: f32 -> bf16 is round-to-nearest-even; no rounding option "
                        f"(got {rounding!r})")
    try:
        return layout_class("lhs", fmt).for_geometry(mr, kr, sr, bl, **opts)
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
        if self.mr > MR_MAX:
            raise SpecError(f"mr must be <= {MR_MAX} (largest mr of any consumer kernel; "
                            f"immediate encodings of the template), got mr={self.mr}")
        if not isinstance(self.rounding, str):
            raise SpecError(f"rounding must be a string, got {self.rounding!r}")
        self.layout(32)           # the layout's rules (interleave, rounding) at bl = 32
        L = self.kr // self.sr
        if self.fmt == "qsi8d32p" and (L % 4 or 32 % L):
            # one routine serves every bl: L must divide 32 (not only the bl of one call)
            raise SpecError(f"qsi8d32p needs L = kr/sr to be a multiple of 4 dividing 32 "
                            f"(4, 8, 16 or 32), got L={L} (kr={self.kr}, sr={self.sr})")

    # -- derived facts -------------------------------------------------------------
    @property
    def L(self) -> int:
        """Interleave chunk: bytes of one row written contiguously (kr / sr)."""
        return self.kr // self.sr

    @property
    def isa(self) -> str:
        return "neon"

    @property
    def name(self) -> str:
        """KleidiAI grammar: ``lhs_quant_pack_<layout label>[sb]_f32_neon``."""
        from ..layout.registry import layout_class
        label = layout_class("lhs", self.fmt).label_for(self.mr, self.kr, self.sr)
        return f"lhs_quant_pack_{label}{'sb' if self.rounding == 'even' else ''}_f32_neon"

    @property
    def spec_string(self) -> str:
        s = f"lhs:{self.fmt}:{self.mr}x{self.L}:k{self.kr}:s{self.sr}"
        return s + (":even" if self.rounding == "even" else "")

    @property
    def signature(self) -> list[tuple[str, str]]:
        """C parameters (name, ctype) in order."""
        sz = "size_t"
        head = [("m", sz), ("k", sz)]
        if self.fmt == "qsi8d32p":
            head.append(("bl", sz))
        return head + [("mr", sz), ("kr", sz), ("sr", sz), ("m_idx_start", sz),
                       ("lhs", "const void*"), ("lhs_stride", sz), ("lhs_packed", "void*")]

    @property
    def c_signature(self) -> str:
        args = ", ".join(f"{t} {n}" for n, t in self.signature)
        return f"void {self.name}({args})"

    def symbol(self, fmt: str = "elf") -> str:
        return symbol_for(self.name, fmt)

    # -- geometry (KleidiAI getters), from the layout object --------------------------
    def layout(self, bl: int | None = None):
        """The packed-LHS layout object this packer writes (single source of geometry)."""
        return _packer_layout(self.fmt, self.mr, self.kr, self.sr, self.rounding, bl)

    def packed_stride(self, k: int, bl: int | None = None) -> int:
        """Bytes per block of mr rows."""
        return self.layout(bl).row_block_stride(k)

    def packed_size(self, m: int, k: int, bl: int | None = None) -> int:
        return self.layout(bl).packed_size(m, k)

    def packed_offset(self, m_idx: int, k: int, bl: int | None = None) -> int:
        return self.layout(bl).packed_offset(m_idx, k)


def packer_for(spec) -> PackerSpec | None:
    """The LHS packer a q4, q8_0 or bf16 kernel spec needs (None for unpacked-LHS families)."""
    if not (spec.info.quantized or spec.info.packs_lhs) or spec.mr_vl:   # VL-row blocks: numpy
        return None
    if spec.info.lhs not in PACKER_FORMATS:     # KleidiAI's SME2 q4 layouts: numpy packs only
        return None
    return PackerSpec(spec.info.lhs, spec.lhs_mr, spec.kr, spec.sr)


def render(spec: PackerSpec, fmt: str = "elf") -> str:
    """Assembly source of ``spec`` for object format ``fmt`` (``elf`` or ``macho``)."""
    _check_format(fmt)
    if not isinstance(spec, PackerSpec):
        raise SpecError(f"expected a PackerSpec, got {type(spec).__name__}")
    template = _env().get_template(f"lhs_pack_{spec.fmt}_neon.S.j2")
    # the layout's offsets do not depend on bl (a run-time argument of qsi8d32p); any valid bl
    lay = spec.layout(ELEMS_PER_ITER if spec.fmt == "qsi8d32p" else None)
    return template.render(
        spec=spec, LAY=lay, fmt=fmt, sym=symbol_for(spec.name, fmt), lp=".L" if fmt == "elf" else "L",
        version=__version__, MR=spec.mr, L=spec.L, KR=spec.kr, SR=spec.sr,
        even=spec.rounding == "even", EPI=ELEMS_PER_ITER,
    )
