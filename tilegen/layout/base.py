"""What every layout module shares: :class:`PackedLayout` (names, ``for_geometry``, what the
format's generated packer can do), the geometry mixins (:class:`Interleaved`, :class:`RowBlocks`
(packed LHS), :class:`ColumnGroups` / :class:`RhsGroups` (packed RHS), :class:`ScaleBlocks`,
:class:`PaddedSlots`), argument checks, C's float -> int rounding, and the layout a kernel spec
reads (:func:`rhs_layout_for`, :func:`lhs_layout_for`, :func:`same_rhs`).

A layout family is one module (``lhs_int8``, ``rhs_int4``, ``rhs_int8``, ``bf16``, ``f16``,
``f32``; ggml's block formats in ``ggml``) importing only this one, ``ggml`` and ``bf16``; the
registry (:mod:`tilegen.layout.registry`) lists the classes the dispatchers know."""
from __future__ import annotations

import dataclasses
import itertools
import re
from functools import lru_cache
from typing import ClassVar

import numpy as np


class LayoutError(ValueError):
    """Input that does not fit a packed layout (shape, dtype, alignment)."""


@lru_cache(maxsize=512)
def _compiled(expr: str):
    return compile(expr, "<layout>", "eval")


def eval_expr(expr: str, **env: int) -> int:
    """Evaluate a layout's stride expression (integers, + * //, names k and bl)."""
    return int(eval(_compiled(expr), {"__builtins__": {}}, env))  # noqa: S307 - own strings


def c_expr(expr: str) -> str:
    """The same expression in C over size_t (floor division is C's unsigned division)."""
    return expr.replace("//", "/")


def checked_c_expr(expr: str, layout_value, points) -> str:
    """``expr`` (Python syntax, ``//`` floor division) as C, after checking that it gives
    ``layout_value(**point)`` for every point of ``points`` (dicts of the expression's names):
    the export's C packers take their offsets this way, so the layout object stays the one
    source of truth."""
    for point in points:
        want = layout_value(**point)
        got = eval_expr(expr, **point)
        if got != want:
            raise AssertionError(f"packer expression {expr!r} gives {got} at {point}, "
                                 f"the layout object {want}")
    return c_expr(expr)


def grid(**axes):
    """Every combination of the axes' values, as dicts (the points expressions are checked at)."""
    keys = list(axes)
    for vals in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, vals))


def roundup(a: int, b: int) -> int:
    return -(-a // b) * b


# ----------------------------------------------------------------------------------------
# argument checks and C arithmetic the packers share
# ----------------------------------------------------------------------------------------
def check_pos(**kw) -> None:
    """LayoutError unless every value is a positive integer (bools refused)."""
    for name, v in kw.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise LayoutError(f"{name} must be a positive integer, got {v!r}")


def check_m_idx_start(m_idx_start) -> int:
    if not isinstance(m_idx_start, (int, np.integer)) or m_idx_start < 0:
        raise LayoutError(f"m_idx_start must be a non-negative integer, got {m_idx_start!r}")
    return int(m_idx_start)


def rows_f32(x, what: str = "lhs") -> np.ndarray:
    """``x`` as a 2-D float32 array of rows (LayoutError otherwise)."""
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise LayoutError(f"{what} must be float32, got {x.dtype}")
    if x.ndim != 2:
        raise LayoutError(f"{what} must be 2-D (rows, k), got shape {x.shape}")
    return x


def flat_u8(buf) -> np.ndarray:
    """A packed buffer as flat uint8 (other dtypes viewed as their bytes)."""
    b = np.asarray(buf)
    if b.dtype != np.uint8:
        b = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    return b.reshape(-1)


def rows_index(rows, n: int) -> np.ndarray:
    """Row indices ``rows`` as a flat int64 array, each in [0, n)."""
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise LayoutError(f"row indices must be in [0, {n}), got {idx.min()}..{idx.max()}")
    return idx


def round_half_away(v: np.ndarray) -> np.ndarray:
    """C roundf on float32 values (exact: v - trunc(v) is exact in f32)."""
    t = np.trunc(v)
    f = v - t
    return t + np.where(np.abs(f) >= np.float32(0.5), np.sign(v), np.float32(0)).astype(v.dtype)


def f32_to_i32_sat(v: np.ndarray) -> np.ndarray:
    """AArch64 float -> int32 conversion of already-integral values (saturating, NaN -> 0)."""
    v = np.where(np.isnan(v), 0.0, np.clip(v.astype(np.float64), -2.0 ** 31, 2.0 ** 31 - 1))
    return v.astype(np.int64)


class PackedLayout:
    """What every packed layout class says about its own name (docs/layouts.md#names).

    * ``format`` (class attribute): the format's stem, unique among the layouts of one role
      (``role``: ``"rhs"`` or ``"lhs"``); the key of :data:`tilegen.layout.registry.RHS_LAYOUTS`
      / ``LHS_LAYOUTS`` and what :class:`~tilegen.runtime.PackedWeights` records.
    * ``label``: the token KleidiAI kernel names use for the layout,
      ``<prefix><rows>x<kr/sr><tail>`` (:meth:`label_for`; ``rows`` may be ``"2vl"``).  Labels of
      two formats may coincide (KleidiAI calls both int4 RHS formats ``qsi4c32p<nr>x<L>``).
    * ``name``: ``label`` followed by ``name_suffix``, the part of the format the label leaves
      out (``"scalef16"``): unique across the formats of a role.  It names the tile rows and
      L = kr/sr, not every geometry field (kr, sr and bl are the object's fields).

    ``for_geometry`` is the one constructor path of both dispatchers (by kernel spec and by
    format); attributes that are class constants rather than fields (``sr = 1`` of the f32p
    and bf16 formats, qai8dxp's ``rounding``) are the only values those formats accept.
    """

    format: ClassVar[str]
    role: ClassVar[str]                 # "rhs" (tile rows = nr) or "lhs" (tile rows = mr)
    label_prefix: ClassVar[str]
    label_tail: ClassVar[str] = ""
    name_suffix: ClassVar[str] = ""
    #: the ggml block type ``pack_from_ggml`` reads, and its k values per block
    #: (e.g. ``("Q4_K", 256)``); None: the format takes no ggml blocks
    ggml_block: ClassVar[tuple[str, int] | None] = None
    #: RHS formats that take their weights only as ggml blocks (``pack_from_ggml``; float
    #: weights refused): the ggml block type (e.g. ``"q4_K"``), whose seeded random valid
    #: rows the class gives by ``random_ggml(n, k, seed)``; None: float weights are packed
    ggml_only: ClassVar[str | None] = None

    # -- what tilegen's generated NEON packer of this format can do (LHS formats;
    #    tilegen.generator.packers reads these, never a table of its own) -------------------
    #: stem of the packer's template (``templates/<stem>.S.j2``); None: no generated packer
    #: (numpy packs only)
    packer_template: ClassVar[str | None] = None
    #: stem of the streaming (SME) twin of the packer's template, for the LHS of SME kernels
    #: (``isa="sme"`` packers); None: NEON only
    packer_template_sme: ClassVar[str | None] = None
    #: the ISA of that streaming packer ("sme", or "sme2" where it uses SME2 instructions)
    packer_sme_isa: ClassVar[str] = "sme"
    #: the smallest SVL (bits) from which the streaming packer takes fewer instructions per
    #: packed element than the NEON one (SME static model, tilegen.analysis.sme.packer_mix; a
    #: test recomputes it): the runtime packs with the streaming twin from there on
    packer_sme_from_svl: ClassVar[int] = 128
    #: KleidiAI's verb in the packer's name: ``<verb>_<label>..._f32_neon``
    packer_verb: ClassVar[str] = "lhs_quant_pack"
    #: row counts the packer takes: "fixed" (a compile-time mr) and/or "vl" (mr in VL units,
    #: the row count a run-time argument)
    packer_mr: ClassVar[tuple[str, ...]] = ("fixed", "vl")
    #: the compile-time mr values the packer's template serves (None: any up to its bound)
    packer_rows: ClassVar[tuple[int, ...] | None] = None
    #: mr-dependent quantities (attribute names) a runtime-mr template scales by the mr register
    packer_per_row: ClassVar[tuple[str, ...]] = ()
    #: a compile-time mr that is a multiple of 4 packs the slots 4i..4i+3 together
    packer_quad: ClassVar[bool] = False
    #: the packer's ``lhs`` argument points at row 0 of the whole matrix (it adds m_idx_start
    #: rows itself; KleidiAI's qsi8d32p convention), not at the first row to pack
    packer_lhs_at_row0: ClassVar[bool] = False
    #: formats without a rounding option: how f32 values become the format's (None: the
    #: format quantises, with the ``rounding`` the layout takes or fixes)
    fixed_conversion: ClassVar[str | None] = None

    @classmethod
    def check_packer_geometry(cls, kr: int, sr: int) -> None:
        """LayoutError when one generated packer cannot serve this ``kr``/``sr`` (beyond the
        layout's own rules, which hold at every block length)."""

    @classmethod
    def has_blocks(cls) -> bool:
        """Whether the format's values come in blocks of ``bl`` (a geometry field; their
        packers take ``bl`` as an argument)."""
        return any(f.name == "bl" for f in dataclasses.fields(cls))

    @classmethod
    def label_for(cls, rows: int | str, kr: int, sr: int) -> str:
        """The KleidiAI name token of this format for a tile of ``rows`` (an int, or e.g.
        ``"2vl"`` for VL-scaled tiles) with interleave ``kr``/``sr``."""
        return f"{cls.label_prefix}{rows}x{kr // sr}{cls.label_tail}"

    @classmethod
    def parse_name(cls, text: str) -> tuple[int, int] | None:
        """(tile rows, L) of a :attr:`name` of this format, or None."""
        m = re.fullmatch(rf"{re.escape(cls.label_prefix)}(\d+)x(\d+)"
                         rf"{re.escape(cls.label_tail + cls.name_suffix)}", text)
        return (int(m[1]), int(m[2])) if m else None

    @property
    def rows(self) -> int:
        """Tile rows of the layout: ``nr`` (RHS) or ``mr`` (LHS)."""
        return self.nr if self.role == "rhs" else self.mr

    @property
    def label(self) -> str:
        return self.label_for(self.rows, self.kr, self.sr)

    @property
    def name(self) -> str:
        return self.label + self.name_suffix

    @classmethod
    def for_geometry(cls, rows: int, kr: int | None = None, sr: int | None = None,
                     bl: int | None = None, **options):
        """The layout of this format for ``rows`` tile rows; ``None``: the format's default
        (an error if it has none).  ``bl`` is ignored by formats without blocks."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        rows_field = "nr" if cls.role == "rhs" else "mr"
        args = {rows_field: rows}
        for key, v in (("kr", kr), ("sr", sr), ("bl", bl), *options.items()):
            if v is None:
                continue
            if key in fields:
                args[key] = v
            elif key in ("kr", "sr", "bl", "rounding") and hasattr(cls, key):
                if v != getattr(cls, key):
                    raise LayoutError(f"{cls.format} has fixed {key}: {key} must be "
                                      f"{getattr(cls, key)!r}, got {v!r}")
            elif key != "bl":
                raise LayoutError(f"unexpected geometry for {cls.format}: {key}")
        for f in fields.values():
            if f.name not in args and f.default is dataclasses.MISSING:
                raise LayoutError(f"layout {cls.format} needs {f.name}=")
        return cls(**args)


# ----------------------------------------------------------------------------------------
# geometry mixins of the interleaved formats
# ----------------------------------------------------------------------------------------
class Interleaved(PackedLayout):
    """Interleave chunk L = kr/sr and (formats with blocks) blocks of bl elements."""

    def check_interleave(self, **positive) -> int:
        """The rules every interleaved layout shares: positive geometry, a whole chunk
        L = kr/sr and (layouts with blocks, ``bl`` among ``positive``) ggml's block multiple
        of 32; returns L."""
        check_pos(kr=self.kr, sr=self.sr, **positive)
        if self.kr % self.sr:
            raise LayoutError(f"kr={self.kr} must be a multiple of sr={self.sr}")
        if "bl" in positive and self.bl % 32:
            raise LayoutError(f"bl={self.bl} must be a multiple of 32")
        return self.kr // self.sr

    @property
    def L(self) -> int:
        """Bytes of one row written contiguously (interleave chunk): kr / sr."""
        return self.kr // self.sr

    def num_blocks(self, k: int) -> int:
        if k % self.bl:
            raise LayoutError(f"k={k} is not a multiple of bl={self.bl}")
        return k // self.bl


def region_blocks(m: int, mr: int, m_idx_start: int) -> int:
    """Row blocks a pack call for m rows starting at m_idx_start touches."""
    return -(-((m_idx_start % mr) + m) // mr) if m else 0


class RowBlocks:
    """Sizes and offsets of a packed-LHS layout made of ceil(m / mr) row blocks of
    ``row_block_stride(k)`` bytes, and where a pack call puts its rows."""

    role = "lhs"

    def packed_size(self, m: int, k: int) -> int:
        return -(-m // self.mr) * self.row_block_stride(k)

    def packed_offset(self, m_idx: int, k: int) -> int:
        return (m_idx // self.mr) * self.row_block_stride(k)

    def region_size(self, m: int, k: int, m_idx_start: int = 0) -> int:
        """Bytes a pack call for m rows starting at m_idx_start can touch."""
        return region_blocks(m, self.mr, m_idx_start) * self.row_block_stride(k)

    def placement(self, m: int, m_idx_start: int):
        """(row blocks of the region, block of each row, slot of each row) of a pack call for
        m rows starting at global row m_idx_start."""
        g = m_idx_start % self.mr + np.arange(m)
        return region_blocks(m, self.mr, m_idx_start), g // self.mr, g % self.mr


class ColumnGroups:
    """Sizes and offsets of a packed-RHS layout made of ceil(n / nr) groups of
    ``group_stride(k)`` bytes."""

    role = "rhs"

    def packed_size(self, n: int, k: int) -> int:
        return -(-n // self.nr) * self.group_stride(k)

    def packed_offset(self, n_idx: int, k: int) -> int:
        if n_idx % self.nr:
            raise LayoutError(f"n_idx={n_idx} is not a multiple of nr={self.nr}")
        return (n_idx // self.nr) * self.group_stride(k)

    def column_groups(self, packed, n: int, k: int) -> np.ndarray:
        """The packed bytes of n columns as (ceil(n / nr), group_stride(k)) uint8; LayoutError
        when the buffer is shorter than ``packed_size(n, k)``."""
        b = flat_u8(packed)
        size = self.packed_size(n, k)
        if b.size < size:
            raise LayoutError(f"packed buffer holds {b.size} bytes, {size} needed for n={n}, k={k}")
        return b[:size].reshape(-(-n // self.nr), self.group_stride(k))


class RhsGroups(ColumnGroups, Interleaved):
    """The interleaved packed-RHS layouts (groups of nr columns, :class:`ColumnGroups`)."""


class ScaleBlocks:
    """k in blocks of ``bl`` values (a multiple of 32, ggml's block) with a scale each, for
    formats whose strides are expressions in k and bl (``stride_expr``) and need a positive k."""

    def check_blocks(self, **positive) -> None:
        """Positive geometry (``positive`` first, then kr, sr, bl) and bl a multiple of 32."""
        check_pos(**positive, kr=self.kr, sr=self.sr, bl=self.bl)
        if self.bl % 32:
            raise LayoutError(f"bl={self.bl} must be a multiple of 32")

    def num_blocks(self, k: int) -> int:
        if k < 1 or k % self.bl:
            raise LayoutError(f"k={k} must be a positive multiple of bl={self.bl}")
        return k // self.bl

    def blocks_stride(self, k: int) -> int:
        """``stride_expr`` at k (a positive multiple of bl)."""
        self.num_blocks(k)
        return eval_expr(self.stride_expr, k=k, bl=self.bl)


class PaddedSlots:
    """Blocks of ``slots`` rows (LHS) or columns (RHS) whose k values are padded to
    ``k_multiple`` and interleaved in chunks of L, then ``slot_tail_bytes`` per slot."""

    k_multiple = 32

    def k_padded(self, k: int) -> int:
        return roundup(k, self.k_multiple)

    @property
    def stride_expr(self) -> str:
        """Bytes per block as an expression in k (one source for Python and C getters)."""
        km = self.k_multiple
        return f"{self.slots} * ((k + {km - 1}) // {km} * {km} + {self.slot_tail_bytes})"

    def slots_stride(self, k: int) -> int:
        return eval_expr(self.stride_expr, k=k)

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one interleave chunk (the block's slots x L values)."""
        return self.slots * self.L


def _dims(spec, vl: int | None) -> tuple[int, int]:
    """Concrete (mr, nr) of a spec; VL-scaled tiles need the CPU's vector length in bytes."""
    from ..records import SpecError
    try:
        return spec.mr_at(vl), spec.nr_at(vl)
    except SpecError as e:
        raise LayoutError(str(e)) from None


@lru_cache(maxsize=1024)   # layout objects are immutable; the runtime asks on every call
def rhs_layout_for(spec, bl: int = 32, vl: int | None = None):
    """The packed-RHS layout object a kernel spec reads (``bl``: block length of q4 formats;
    ``vl``: vector length in bytes, for tiles given in VL units): the family's RHS format
    (``FamilyInfo.rhs``) at the spec's geometry."""
    _, nr = _dims(spec, vl)
    return spec.rhs_layout_class.for_geometry(nr, spec.kr, spec.sr, bl)


_ALL_VLS = tuple(range(16, 257, 16))


def rhs_identity(spec) -> tuple:
    """What a kernel's packed RHS is, as a hashable key: its layout objects at every vector
    length the tile can meet (one layout for fixed-width tiles) and which VL scales them.
    Two kernels read the same packed weights exactly when their keys are equal."""
    vls = _ALL_VLS if spec.vl_scaled else (None,)
    return (spec.vl_kind, tuple(rhs_layout_for(spec, 32, v) for v in vls))


def same_rhs(a, b, vl: int | None = None) -> bool:
    """Whether kernel specs ``a`` and ``b`` read the same packed RHS (equal layout objects):
    at vector length ``vl`` (bytes) if given, else at every vector length."""
    if vl is None:
        return rhs_identity(a) == rhs_identity(b)
    return rhs_layout_for(a, 32, vl) == rhs_layout_for(b, 32, vl)


def _lhs_mr(spec, vl: int | None) -> int:
    from ..records import SpecError
    try:
        return spec.lhs_mr_at(vl)
    except SpecError as e:
        raise LayoutError(str(e)) from None


@lru_cache(maxsize=1024)
def lhs_layout_for(spec, bl: int = 32, vl: int | None = None):
    """The packed-LHS layout object a kernel spec reads (None: unpacked f32 rows)."""
    cls = spec.lhs_layout_class
    if cls is None:
        return None
    return cls.for_geometry(_lhs_mr(spec, vl), spec.kr, spec.sr, bl)
