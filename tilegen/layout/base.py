"""Shared helpers for layout objects."""
from __future__ import annotations

import dataclasses
import re
from functools import lru_cache
from typing import ClassVar


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


def roundup(a: int, b: int) -> int:
    return -(-a // b) * b


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
