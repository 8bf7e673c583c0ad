"""Register allocation of the K-quant kernels of family ``q4_K`` (LHS ``q8kp``, RHS ``q4kp``;
the arithmetic of docs/specs.md#q4_k and tilegen.reference.kquant) on NEON V registers.

One super-block (SB, 256 k) is one iteration of the kernel's k loop, its 8 sub-blocks of 32 k
unrolled.  Per accumulator unit (a register of int32 sums):

    T   the sub-block dot products, cumulative over the SB (zeroed once per SB);
    S1  the scaled sums: after sub-block j, S1 += (sc_j - sc_{j+1}) * T  (sc_8 = 0), so that
        S1 = sum_j sc_j * (sum over sub-block j) at the SB's end without zeroing T per
        sub-block (the "telescoping" form; MUL at j = 0, MLA after);
    the f32 accumulators live in the stack frame (one 16-byte slot per unit, loaded and stored
    once per SB by the float epilogue: x = f32(S1)*d; x -= dmin*f32(S2); acc += da*x).

Strategies (``Q4KRegs.mode``), by ISA and interleave (the NEON allocation is the shared
:func:`tilegen.generator.regalloc.kquant.allocate_kquant_neon`, ``Q4KRegs`` its record):

``mm``    i8mm, kr = 16, mr a multiple of 4: SMMLA of (2 rows x 8 k) by (2 columns x 8 k); a
          unit is (row block g, row pair rp, column pair p) in SMMLA's 2x2 order; the
          sub-block scale differences and the SB's d / dmin / da are arranged to match.  The
          min term: two SMMLA of the hi/lo bsums by the mins of a column pair.
``dot4``  dotprod, kr = 8: SDOT by lane; a unit is (row, 4 columns) (gemv: mr = 1, the
          row's 32 k of a sub-block in two vectors).  The min term: SDOT by lane of the
          bsums against UZP1/UZP2 of the mins of 4 columns.
``dot8``  i8mm gemv (mr = 1) on the kr = 16 layout: SDOT of the row's 8 k (both halves)
          against 2 columns x 8 k; a unit is a column pair (lanes c0 c0 c1 c1), folded by ADDP
          to 4 columns at the SB end, then the dot4 epilogue.
``neon``  plain NEON, kr = 8: SMULL/SMULL2 (int16 products) + SADALP into two int32 vectors
          per unit (columns 0-1 and 2-3 of the unit), ADDP per sub-block; then as dot4.

The SVE kernels (``sve_i8mm``, ``sve_dotprod``; :class:`Q4KSveRegs`, templates/q4k_sve.S.j2)
are vector-length agnostic: nr = nv VL units of VL/32 columns, every 128-bit segment of a Z
register laid out as the NEON register of the same strategy (mm: SMMLA per segment, a unit is
(row block g, row pair rp, half h of column vector h // 2); dot4: SDOT by lane, a unit is
(row, column vector); dot8: the sve_i8mm gemv, a unit is a half h).  Indexed operands (the
SDOT LHS and the bsums of its min term) are z0-z7.  The f32 accumulators live in a VL-sized
stack area (``addvl sp``), one vector per unit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...generator.spec import KernelSpec
from ...generator.tile_layouts import check_packing
from ...generator.regalloc.kquant import (KQUANT_NEON_SCALARS, KQuantNeonRegs, KQuantSveArea,
                                          allocate_kquant_neon, check_sve_mm_rows,
                                          check_sve_tile, kquant_mode)
from ...generator.regalloc.pool import (Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, first_fit,
                                        rows)

__all__ = ["Q4KRegs", "Q4KSveRegs", "allocate_sve", "Q4K_SCALARS", "Q4K_SVE_SCALARS", "ALLOCATORS"]

Q4K_SCALARS = KQUANT_NEON_SCALARS
#: the NEON register record of q4_K (the shared 32-k sub-block one)
Q4KRegs = KQuantNeonRegs


def _allocate_q4k_neon(spec: KernelSpec) -> Q4KRegs:
    return allocate_kquant_neon(spec, "q4_K")


# ---------------------------------------------------------------------------------------------
# SVE (vector-length agnostic; templates/q4k_sve.S.j2)
# ---------------------------------------------------------------------------------------------
Q4K_SVE_SCALARS = Q4K_SCALARS + ("sc_ptr", "nb_ptr")
_SVE_MAX_NV = 4         # dmin at [rhs, #(nv + cv), mul vl] (ld1h immediates reach 7)
_SVE_EP = "epilogue beyond the dead registers"
Q4K_SVE_CHART = ("int32 sub-block sums", "int32 scaled sums", "LHS", "RHS", "scale scratch",
                 _SVE_EP)


@dataclass(frozen=True)
class Q4KSveRegs(KQuantSveArea, Frame):
    """Registers of the q4_K SVE kernels (numbers; templates add the prefix).

    ``t[u]`` / ``s1[u]``: unit u's cumulative sub-block sums and scaled sums; units are
    ``[g][rp][h]`` flattened (mm: h = half of column vector h // 2, VL/64 column pairs),
    ``[row][cv]`` (dot4) or ``[h]`` (dot8).  ``slot[u]``: the unit's f32 accumulator in the
    VL-sized stack area (``acc_vls`` vectors below the fixed frame).  ``lhs``: mm, 4 per row
    block (both 8-k halves of a 16-k chunk, both row pairs); dot4, two sets of (low, high)
    4-k chunks in z0-z7 (gemv: the row's 32 k in two); dot8, the two 8-k broadcasts.  ``ep``
    names the SB epilogue's operands; ``bs`` (bsums) are z0-z7 for the by-lane SDOT.
    ``out[row][cv]`` receive the f32 results at the tile's end."""

    mode: str
    mr_reg: int
    lhs_mr: int
    groups: int
    t: tuple[int, ...]
    s1: tuple[int, ...]
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    sst: tuple[int, ...]                 # sc_j, sc_{j+1} (then their difference), pattern
    ep: dict = field(hash=False)
    out: tuple[tuple[int, ...], ...]
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...]
    pred: tuple[int, ...] = ()
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())
    xv: dict = field(default_factory=dict, hash=False)   # a family's extra registers (name -> reg)

    # what the SVE skeleton (templates/kquant/sve.S.j2) reads under its shared names
    @property
    def c(self) -> tuple[int, ...]:
        """The units' cumulative sub-block sums (``t``)."""
        return self.t

    @property
    def w(self) -> tuple[tuple[int, ...], ...]:
        """Per weight vector (mm / dot8: half h; dot4: column vector cv) the two int8 vectors
        one nibble vector unpacks into (low, high nibbles)."""
        if self.mode == "dot4":
            return tuple(self.rhs[i:i + 2] for i in range(0, len(self.rhs), 2))
        return (self.rhs[:2],) * (2 * len(self.pred))

    @property
    def pass_rows(self) -> int:
        return self.mr_reg

    stream_w = False        # every column vector's weights of a chunk held at once (dot4)


def _sve_ep_counts(mode: str, P: int, nv: int) -> dict[str, int]:
    """SB-epilogue operands besides the bsums: mm, the row-pair da patterns and per half the d /
    dmin patterns and mins; dot4/dot8, per column vector d, dmin and the two UZP'd mins."""
    if mode == "mm":
        return {"dap": 2, "d": 2 * nv, "dm": 2 * nv, "mins": 2 * nv, "f16": 1, "s2": 1, "fa": 1}
    return {"da": 1, "d": nv, "dm": nv, "mins": 2 * nv, "f16": 2, "s2": 1, "fa": 1}


def _sve_block(spec: KernelSpec, mode: str, mr_reg: int, extra: tuple = (),
               extra_x: tuple = ()):
    nv, P = spec.nr, spec.lhs_mr
    G = mr_reg // P
    U = {"mm": mr_reg * nv, "dot4": mr_reg * nv, "dot8": 2 * nv}[mode]
    pool = RegisterPool(Q4K_SVE_CHART + tuple(role for _, role in extra), v_order=Z_LOW_FIRST)
    v = pool.v
    if mode == "dot4":
        lhs = v.take(4 if P == 4 else 2, "LHS", within=8,
                     rule="indexed SDOT operands (the LHS registers) must be z0-z7")
    else:
        lhs = v.take(4 * G if mode == "mm" else 2, "LHS")
    rhs = v.take(2 * nv if mode == "dot4" else 2, "RHS")
    sst = v.take(3, "scale scratch")
    t = v.take(U, "int32 sub-block sums")
    s1 = v.take(U, "int32 scaled sums")
    xv = {name: v.take(1, role)[0] for name, role in extra}
    # the bsums: mm, (hi, lo) x row pair; dot4/dot8 P = 4: hi rows 0-1, 2-3, lo rows 0-1, 2-3
    # (by-lane SDOT operands: the z0-z7 LHS registers); gemv: hi and lo of the row in one
    nbs = 4 if P == 4 else 1
    if mode == "mm":
        bs = lhs[:4]
    else:
        bs = lhs[:nbs] + v.take(max(0, nbs - len(lhs)), _SVE_EP)
    dead = [r for r in list(lhs) + list(rhs) + list(sst) + list(t) if r not in bs]
    ep, i = {"bs": tuple(bs)}, 0
    for name, n in _sve_ep_counts(mode, P, nv).items():
        ep[name] = tuple(v.reuse(dead[i:], n, _SVE_EP))
        i += n
    ep["fold"] = ep["s2"]       # dot8's fold of the column halves (the skeleton's name)
    out_flat = v.reuse(list(lhs) + list(rhs) + list(sst) + list(t), mr_reg * nv + 4, _SVE_EP)
    out = rows(out_flat[:mr_reg * nv], nv)
    ep["tmp"] = tuple(out_flat[mr_reg * nv:])
    gpr = pool.scalars(Q4K_SVE_SCALARS + tuple(extra_x))
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    fields = dict(mode=mode, t=tuple(t), s1=tuple(s1), lhs=tuple(lhs), rhs=tuple(rhs),
                  sst=tuple(sst), ep=ep, out=out, gpr=gpr, lo=lo, pred=tuple(range(1, nv + 1)))
    return pool, (dict(fields, xv=xv) if extra else fields)


def allocate_sve(spec: KernelSpec, family: str = "q4_K", extra: tuple = (),
                 extra_x: tuple = ()) -> Q4KSveRegs:
    """The SVE registers of a q4_K-shaped kernel of ``family``: ``extra`` ((name, role), ...)
    one more Z register each, taken after the scaled sums (``xv[name]``), ``extra_x`` more
    named GPRs (``gpr``)."""
    check_sve_tile(spec, family, _SVE_MAX_NV, "the dmin vectors at [rhs, #(nv + cv), mul vl]")
    mode = kquant_mode(spec, family, "SVE")
    check_sve_mm_rows(spec, family, mode)
    check_packing(spec)
    return Q4KSveRegs(**first_fit(spec, lambda mr_reg: _sve_block(spec, mode, mr_reg, extra, extra_x),
                                  " (indexed SDOT operands in z0-z7)" if mode == "dot4" else ""))


# allocator name (``IsaImpl.allocator`` of the family records) -> function
ALLOCATORS = {"q4k_neon": _allocate_q4k_neon, "q4k_sve": allocate_sve}
