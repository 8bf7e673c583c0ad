"""What the K-quant register allocators share (each K-quant plugin's ``regalloc`` and
``regalloc_sme2`` submodules, e.g. :mod:`tilegen.families.q4_k.regalloc`; a new K-quant
family's allocator takes the same): the strategy of a NEON or SVE tile by ISA,
interleave and row count, the tile rules every strategy has, the records' common frames (the
SVE accumulator area, the SME2 register frame) and the SME2 interleave and gemv rules.

Strategies (``mode`` of the register records), by ISA: ``i8mm`` / ``sve_i8mm`` (kr = 16)
SMMLA (``mm``; its gemv, mr = 1, SDOT on 8-k groups of the same layout: ``dot8``),
``dotprod`` / ``sve_dotprod`` (kr = 8) SDOT by lane (``dot4``), ``neon`` (kr = 8) SMULL/SADALP
(``neon``).  Every K-quant layout holds two k values per byte (sr = 2).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from ..tile_layouts import check_packing
from .pool import Frame, VectorNeeds

__all__ = ["KQUANT_KR", "kquant_mode", "check_neon_tile", "check_sve_tile", "check_sve_mm_rows",
           "check_sme2_interleave", "check_sme2_gemv_tile", "KQuantSveArea", "KQuantSme2Frame"]

#: the interleave (kr) of each NEON / SVE strategy's layout
KQUANT_KR = {"i8mm": 16, "dotprod": 8, "neon": 8, "sve_i8mm": 16, "sve_dotprod": 8}


def kquant_mode(spec: KernelSpec, family: str, where: str) -> str:
    """The strategy of a ``family`` tile on NEON or SVE (``where`` names which in the message):
    sr = 2 and the ISA's kr checked first."""
    if spec.sr != 2:
        raise SpecError(f"{family} layouts hold two k values per byte: sr must be 2, "
                        f"got sr={spec.sr}")
    want = KQUANT_KR.get(spec.isa)
    if want is None:
        raise SpecError(f"{family} has no {where} strategy for isa {spec.isa!r}")
    if spec.kr != want:
        raise SpecError(f"{family} {spec.isa} kernels need kr={want} (kr/sr = {want // 2} k "
                        f"values per operand row), got kr={spec.kr}")
    if spec.isa in ("i8mm", "sve_i8mm"):
        return "dot8" if spec.mr == 1 else "mm"
    return "neon" if spec.isa == "neon" else "dot4"


def check_neon_tile(spec: KernelSpec, family: str, max_nr: int) -> None:
    """NEON tiles: fixed sizes, nr a multiple of 4 up to ``max_nr``."""
    if spec.mr_vl or spec.nr_vl:
        raise SpecError(f"{family} NEON tiles have fixed sizes, got {spec.mr_str}x{spec.nr_str}")
    if spec.nr % 4 or spec.nr > max_nr:
        raise SpecError(f"{family} NEON tiles need nr a multiple of 4 (one int32x4 vector per 4 "
                        f"columns) and at most {max_nr}, got nr={spec.nr}")


def check_sve_tile(spec: KernelSpec, family: str, max_nv: int, reach: str) -> None:
    """SVE tiles: a fixed row count, nr in VL units up to ``max_nv`` (``reach``: the load
    immediates that bound it)."""
    if spec.mr_vl or not spec.nr_vl:
        raise SpecError(f"{family} SVE tiles have a fixed row count and nr in VL units (nv x "
                        f"VL/32 columns), e.g. 8x1vl; got {spec.mr_str}x{spec.nr_str}")
    if spec.nr > max_nv:
        raise SpecError(f"{family} SVE tiles reach nr={max_nv}vl ({reach}), "
                        f"got nr={spec.nr_str}")


def check_sve_mm_rows(spec: KernelSpec, family: str, mode: str) -> None:
    """sve_i8mm SMMLA reads 2 rows per operand: mr = 1 (its gemv) or a multiple of 4."""
    if mode == "mm" and spec.mr % 4:
        raise SpecError(f"{family} sve_i8mm (SMMLA, 2 rows per operand) needs mr=1 (gemv) or a "
                        f"multiple of 4, got mr={spec.mr}")


def check_sme2_interleave(spec: KernelSpec, family: str) -> None:
    """The SME2 kernels read k pairs of 4-k chunks: the packing, then kr = 4, sr = 2."""
    check_packing(spec)
    if spec.kr != 4 or spec.sr != 2:
        raise SpecError(f"{family} sme2 kernels read k pairs of 4-k chunks: kr=4, sr=2, got "
                        f"kr={spec.kr}, sr={spec.sr}")


def check_sme2_gemv_tile(spec: KernelSpec, family: str) -> None:
    """SME2 gemv tiles: 1 x 2vl or 1 x 4vl (one ZA-array SDOT vgx2 / vgx4 per 4-k chunk)."""
    if spec.nr not in (2, 4):
        raise SpecError(f"{family} sme2 gemv tiles are 1x2vl or 1x4vl (one ZA-array SDOT vgx2 / "
                        f"vgx4 per 4-k chunk), got 1x{spec.nr_str}")


class KQuantSveArea:
    """The f32 accumulators of the K-quant SVE kernels: one vector per register unit (``s1``)
    in a VL-sized stack area below the fixed frame."""

    @property
    def n_units(self) -> int:
        return len(self.s1)

    @property
    def acc_vls(self) -> int:
        """Vectors of the f32 accumulator area (one per unit)."""
        return self.n_units

    # One pass over the tile's rows unless the record says otherwise (q6_K's row passes, its
    # ``pass_rows`` a field): what the SVE skeleton (templates/kquant/sve.S.j2) reads.
    @property
    def passes(self) -> int:
        return 1

    @property
    def pass_groups(self) -> int:
        return self.groups

    @property
    def w_vls(self) -> int:
        """Vectors of staged weights above the accumulators (passes > 1)."""
        return 0

    @property
    def area_vls(self) -> int:
        """Vectors of the whole stack area (the accumulators, then what a record stages)."""
        return self.acc_vls


@dataclass(frozen=True, kw_only=True)
class KQuantSme2Frame(Frame):
    """What the K-quant SME2 register records share: the GPRs by name, the frame, the
    all-true counter predicate (pn8) of the multi-vector loads."""

    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())
    counter_pred: int = 8
