"""Register allocation of the f32 kernels: NEON and SVE FMLA (accumulators [row][vec]), SME
FMOPA outer products into ZA f32 tiles (SME2: 4-k multi-vector loads) and the SME2 ZA-array
FMLA gemv.  The ZA-tile allocation also serves the bf16 BFMOPA kernels (:mod:`.bf16`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ...records import SpecError
from ..spec import KernelSpec
from .pool import SME_X_ORDER, V_ORDER, Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, rows

__all__ = ["F32FmaRegs", "SmeF32Regs", "Sme2GemvRegs", "allocate_sme_tiles",
           "ALLOCATORS"]


@dataclass(frozen=True)
class F32FmaRegs(Frame):
    """Registers of the f32 FMLA kernels (numbers; templates add the prefix): V registers on
    NEON, Z registers on SVE (one VL of columns per vector, ``pred[j]`` the store predicate of
    column vector j)."""

    acc: tuple[tuple[int, ...], ...]     # acc[row][vec] holds dst[row][4*vec : 4*vec+4] (NEON)
    lhs: tuple[int, ...]                  # one vector per row: 4 consecutive k values (SVE:
    #                                       z0-z7, the indexed FMLA operand)
    rhs: tuple[int, ...]                  # streamed RHS vectors (double-buffered)
    gpr: dict[str, int] = field(hash=False)   # named scalar registers
    lhs_ptr: tuple[int, ...]              # one LHS row pointer per tile row
    saved_x: tuple[int, ...]              # callee-saved GPRs the kernel uses
    saved_d: tuple[int, ...]              # callee-saved d-registers the kernel uses
    needs: VectorNeeds
    pred: tuple[int, ...] = ()            # SVE: store predicates

    @property
    def n_vec(self) -> int:
        return len(self.acc[0])


_F32_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_blk_stride", "dst_blk_stride")
_F32_CHART = ("accumulators", "LHS", "RHS")
_RHS_BUFFERS = 2
_SVE_MAX_VECS = 8     # st1w/ld1w immediate offsets reach vector 7 of a panel row


def _f32_fma_regs(spec: KernelSpec, v_order: list[int], lhs_within: int | None = None) -> dict:
    """The f32 FMLA kernels' registers (NEON and SVE): RHS buffers, LHS, accumulators; the
    scalars and one LHS row pointer per row; refused if they do not fit."""
    mr, nv = spec.mr, (spec.nr if spec.nr_vl else spec.nr // 4)
    pool = RegisterPool(_F32_CHART, v_order=v_order)
    if lhs_within is None:
        rhs = pool.v.take(_RHS_BUFFERS, "RHS")
        lhs = pool.v.take(mr, "LHS")
    else:     # LHS vectors (the indexed operand) in z0-z7, then the RHS buffers
        lhs = pool.v.take(mr, "LHS", within=lhs_within,
                          rule=f"mr={mr} > 8: the indexed FMLA reads its LHS vector from z0-z7, "
                               f"one per row")
        rhs = pool.v.take(_RHS_BUFFERS, "RHS")
    acc = rows(pool.v.take(mr * nv, "accumulators"), nv)
    gpr = pool.scalars(_F32_SCALARS)
    lhs_ptr = tuple(pool.x.take(mr, "LHS row pointers"))
    pool.settle(f"mr={mr}, nr={spec.nr_str}")
    return dict(acc=acc, lhs=tuple(lhs), rhs=tuple(rhs), gpr=gpr, lhs_ptr=lhs_ptr,
                **pool.frame())


def _allocate_f32_neon(spec: KernelSpec) -> F32FmaRegs:
    if spec.nr % 4:
        raise SpecError(f"nr={spec.nr} must be a multiple of 4 (one f32x4 vector per 4 columns)")
    return F32FmaRegs(**_f32_fma_regs(spec, V_ORDER))


def _store_preds(nv: int) -> tuple[int, ...]:
    """Store predicates (st1w takes p0-p7): p1.. per vector; an eighth reuses p0, which the
    template re-arms with ptrue at the next tile."""
    return tuple(range(1, min(nv, 7) + 1)) + ((0,) if nv == 8 else ())


def _allocate_f32_sve(spec: KernelSpec) -> F32FmaRegs:
    mr, nv = spec.mr, spec.nr
    if spec.mr_vl:
        raise SpecError(f"sve f32 kernels have a fixed row count: give mr as a number "
                        f"(e.g. 6x{spec.nr_str}), got mr={spec.mr_str}")
    if nv > _SVE_MAX_VECS:
        raise SpecError(f"nr={spec.nr_str} exceeds {_SVE_MAX_VECS}vl (vector offsets of one "
                        f"panel row must fit the ld1w/st1w immediate)")
    return F32FmaRegs(pred=_store_preds(nv), **_f32_fma_regs(spec, Z_LOW_FIRST, lhs_within=8))


@dataclass(frozen=True)
class SmeF32Regs(Frame):
    """Registers of the f32 SME outer-product kernel (``mu x nu`` ZA tiles of VL x VL f32).

    ``tile[i][j]`` is the ZA tile number holding rows i*VL.., columns j*VL..; the LHS column
    of a k step is ``lhs[i]``, the RHS row ``rhs[j]``.  Streaming mode clears the whole vector
    file, so every SME kernel saves d8-d15 (``saved_d``)."""

    tile: tuple[tuple[int, ...], ...]
    lhs: tuple[tuple[int, ...], ...]     # lhs[set][i]: two register sets, k steps alternate
    rhs: tuple[tuple[int, ...], ...]
    row_pred: tuple[int, ...]
    col_pred: tuple[int, ...]
    clamp: tuple[int, int]               # z registers holding clamp_min, clamp_max
    tmp: tuple[int, ...]                 # vectors for the ZA slice store path
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8                # pn8: SME2 multi-vector loads
    # SME2 f32: the 4-k hot loop's LHS / RHS vectors in 4-vector load groups (k-major: vector
    # t*mu + i of the LHS block is k step t, row block i); empty: the two-set k2 loop
    k4_lhs: tuple[tuple[int, ...], ...] = ()
    k4_rhs: tuple[tuple[int, ...], ...] = ()


_ZA_F32_TILES = 4
_SME_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "k_cnt", "lhs_ptr", "tmp",
                "lhs_blk_stride", "dst_blk_stride", "vlw", "rows")
# Z registers: two k-steps in flight (sets A and B); SME2 multi-vector loads need each LHS
# and RHS group to start at a multiple of its length, so groups start at multiples of 4.
_SME_SETS = ((0, 4), (24, 28))
_SME_F32_CHART = ("LHS", "RHS", "clamp", "store")


def _allocate_f32_sme(spec: KernelSpec) -> SmeF32Regs:
    if not (spec.mr_vl and spec.nr_vl):
        raise SpecError(f"sme f32 outer-product tiles are whole ZA tiles: give mr and nr in VL "
                        f"units (e.g. 2vlx2vl), got {spec.mr_str}x{spec.nr_str}")
    return allocate_sme_tiles(spec)


def allocate_sme_tiles(spec: KernelSpec, regs_cls=None) -> SmeF32Regs:
    """ZA f32 tiles, two LHS/RHS k-step sets, clamp and store registers of an SME outer-product
    kernel (f32 FMOPA, bf16 BFMOPA)."""
    mu, nu = spec.mr, spec.nr
    if mu * nu > _ZA_F32_TILES:
        raise SpecError(f"{spec.mr_str}x{spec.nr_str} needs {mu * nu} ZA f32 tiles, "
                        f"{_ZA_F32_TILES} exist (za0.s-za3.s)")
    if spec.isa == "sme2" and (mu == 3 or nu == 3):
        raise SpecError(f"sme2 multi-vector loads take 1, 2 or 4 vectors: {spec.mr_str}x"
                        f"{spec.nr_str} has a group of 3")
    pool = RegisterPool(_SME_F32_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    if spec.isa == "sme2":
        return _allocate_sme2_k4(spec, pool, regs_cls or SmeF32Regs)
    lhs = tuple(v.claim(range(a, a + mu), "LHS") for a, _ in _SME_SETS)
    rhs = tuple(v.claim(range(b, b + nu), "RHS") for _, b in _SME_SETS)
    clamp = v.claim((16, 17), "clamp")
    tmp = v.claim(range(20, 20 + nu), "store")
    gpr = pool.scalars(_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return (regs_cls or SmeF32Regs)(
        tile=tuple(tuple(i * nu + j for j in range(nu)) for i in range(mu)),
        lhs=lhs, rhs=rhs, row_pred=tuple(range(1, mu + 1)),
        col_pred=tuple(range(mu + 1, mu + nu + 1)), clamp=clamp, tmp=tmp, gpr=gpr,
        **pool.frame())


def _allocate_sme2_k4(spec: KernelSpec, pool: RegisterPool, regs_cls) -> SmeF32Regs:
    """SME2 outer products (f32 FMOPA: a step is one k; bf16 BFMOPA: one k-pair): 4 steps of
    LHS (4*mu vectors) and RHS (4*nu vectors) in 4-vector load groups z0..z(4(mu+nu)-1), each
    reloaded for the next 4 steps right after its last outer product; the single remainder
    steps and the bias row reuse the first vectors of the first groups."""
    mu, nu = spec.mr, spec.nr
    v = pool.v
    k4_lhs = tuple(v.claim(range(4 * c, 4 * c + 4), "LHS") for c in range(mu))
    k4_rhs = tuple(v.claim(range(4 * (mu + c), 4 * (mu + c) + 4), "RHS") for c in range(nu))
    one = (k4_lhs[0][:mu], k4_rhs[0][:nu])
    clamp = v.claim((24, 25), "clamp")
    tmp = v.claim(range(28, 28 + nu), "store")
    gpr = pool.scalars(_SME_SCALARS)
    pool.settle(f"{spec.mr_str}x{spec.nr_str}")
    return regs_cls(
        tile=tuple(tuple(i * nu + j for j in range(nu)) for i in range(mu)),
        lhs=(one[0], one[0]), rhs=(one[1], one[1]), row_pred=tuple(range(1, mu + 1)),
        col_pred=tuple(range(mu + 1, mu + nu + 1)), clamp=clamp, tmp=tmp, gpr=gpr,
        k4_lhs=k4_lhs, k4_rhs=k4_rhs, **pool.frame())


@dataclass(frozen=True)
class Sme2GemvRegs(Frame):
    """Registers of the f32 SME2 gemv (1 x nu VL): ZA-array FMLA into nu/4 vector groups of 4
    (vgx4; nu = 2: one group of 2, vgx2).  The 4-k hot loop broadcasts 4 LHS values per
    128-bit segment (ld1rqw, FMLA by lane) and streams the RHS groups through ``ring``."""

    rhs: tuple[tuple[int, ...], ...]     # rhs[g]: the vectors of ZA group g (bias, store, k tail)
    ring: tuple[tuple[int, ...], ...]    # rotating RHS load groups of the 4-k loop
    lhs: tuple[int, ...]                 # (4-value quad of the 4-k loop, one-value broadcast)
    clamp: tuple[int, int]
    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...]
    saved_d: tuple[int, ...]
    needs: VectorNeeds
    counter_pred: int = 8                # pn8: all lanes; pn9: store predicate (vlx<vg>)

    @property
    def vg(self) -> int:                 # vectors per ZA group (vgx2 / vgx4)
        return len(self.rhs[0])


_SME2_GEMV_SCALARS = ("n_rem", "rhs_ptr", "dst_ptr", "lhs_ptr", "k_cnt", "tmp", "col", "step",
                      "lhs_hi")


def _allocate_f32_sme2_gemv(spec: KernelSpec) -> Sme2GemvRegs:
    nu = spec.nr
    if nu not in (2, 4, 8, 16):
        raise SpecError(f"the sme2 gemv accumulates nr in ZA vector groups of 4 (vgx4; 2vl: one "
                        f"vgx2 group): nr must be 2vl, 4vl, 8vl or 16vl, got {spec.nr_str}")
    pool = RegisterPool(("RHS", "LHS", "clamp"), x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    vg = min(nu, 4)
    # multi-vector groups start at multiples of their length; the single-vector (by-lane)
    # operand of multi-vector FMLA must be one of z0-z15
    ring = tuple(v.claim(range(b, b + vg), "RHS") for b in (16, 20, 24, 28, 4, 8))
    rhs = ring[:nu // vg]
    lhs = v.claim((0, 1), "LHS")
    clamp = v.claim((2, 3), "clamp")
    gpr = pool.scalars(_SME2_GEMV_SCALARS)
    pool.settle(f"1x{spec.nr_str}")
    return Sme2GemvRegs(rhs=rhs, ring=ring, lhs=lhs, clamp=clamp, gpr=gpr, **pool.frame())


def _allocate_f32_sme2(spec: KernelSpec):
    if spec.is_gemv:
        return _allocate_f32_sme2_gemv(spec)
    return _allocate_f32_sme(spec)



# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"f32_neon": _allocate_f32_neon, "f32_sve": _allocate_f32_sve,
              "f32_sme": _allocate_f32_sme, "f32_sme2": _allocate_f32_sme2}
