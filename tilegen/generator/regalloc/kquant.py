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
from .pool import SME_X_ORDER, Z_LOW_FIRST, Frame, RegisterPool, VectorNeeds, first_fit, flatten, rows

__all__ = ["KQUANT_KR", "KQUANT_NEON_SCALARS", "KQuantNeonRegs", "allocate_kquant_neon",
           "KQUANT_SVE_SCALARS", "KQuantSveRegs", "allocate_kquant_sve", "kquant_mode", "check_neon_tile", "check_sve_tile", "check_sve_mm_rows",
           "check_sme2_interleave", "check_sme2_gemv_tile", "claim_luti4_gemv_tail",
           "KQuantLuti4GemvFrame", "KQuantSveArea", "KQuantSme2Frame",
           "KQuantSme2RowsRegs", "allocate_kquant_sme2_rows"]

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



# ---------------------------------------------------------------------------------------------
# NEON: the strategy of 8 sub-blocks of 32 k (q4_K and the families like it)
# ---------------------------------------------------------------------------------------------
KQUANT_NEON_SCALARS = ("n_rem", "rhs_ptr", "dst_tile", "dst_row", "sb_cnt", "nsb", "lhs_rbs",
                       "lhs_blk_stride", "dst_blk_stride", "tmp")
_EP = "epilogue beyond the dead registers"
_NEON_CHART = ("int32 sub-block sums", "int32 scaled sums", "LHS", "RHS", "nibble mask",
               "decode extras", "scale scratch", _EP)
_NEON_MAX_NR = 64


@dataclass(frozen=True)
class KQuantNeonRegs(Frame):
    """Registers of the K-quant NEON kernels of 8 sub-blocks of 32 k (q4_K; numbers, templates
    add the prefix; templates/kquant/neon.S.j2).

    ``t[u]`` / ``s1[u]``: unit u's cumulative sub-block sums (neon: two vectors per unit) and
    scaled sums; units are ``[g][rp][p]`` flattened (mm), ``[row][cv]`` (dot4, neon) or
    ``[p]`` (dot8).  ``ep`` names the SB epilogue's operand registers (dead hot-loop registers
    first).  ``out[row][cv]``: the registers the f32 results are loaded into for the store.
    ``extra[name]``: the vector registers a family's decode asked for by name (``extra_v`` of
    :func:`allocate_kquant_neon`, e.g. an IQ4_XS table register), live through the kernel."""

    mode: str
    mr_reg: int
    lhs_mr: int
    groups: int
    t: tuple
    s1: tuple[int, ...]
    lhs: tuple[int, ...]
    rhs: tuple[int, ...]
    mask: int
    sst: tuple[int, ...]                 # scale scratch: the scale bytes of sub-blocks j and
    #                                      j+1 (their int16 difference in the first), the int32
    #                                      differences of 4 columns, (mm, dot8) their pattern
    ep: dict = field(hash=False)
    out: tuple[tuple[int, ...], ...]
    gpr: dict[str, int] = field(hash=False)
    lo: tuple[int, ...]                  # one pointer per LHS row block
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())
    extra: dict = field(default_factory=dict, hash=False)

    #: the skeleton's sub-block shape (templates/kquant/neon.S.j2): two int8 vectors per chunk
    shape = "chunk_pairs"

    @property
    def t_flat(self) -> tuple[int, ...]:
        """Every register of ``t`` (zeroed at each SB's start)."""
        return tuple(flatten(self.t))

    @property
    def n_units(self) -> int:
        return len(self.s1)

    @property
    def n_vec(self) -> int:
        return len(self.out[0])

    @property
    def acc_offset(self) -> int:
        """sp offset of the f32 accumulators (16 bytes per unit, above the clamp values)."""
        return (self.clamp_offset + 16 + 15) // 16 * 16

    @property
    def frame_bytes(self) -> int:
        return self.acc_offset + 16 * self.n_units


def _units(mode: str, mr_reg: int, nr: int) -> int:
    return {"mm": mr_reg * nr // 4, "dot4": mr_reg * nr // 4, "neon": mr_reg * nr // 4,
            "dot8": nr // 2}[mode]


def _ep_counts(mode: str, P: int, nr: int) -> dict[str, int]:
    """SB-epilogue operands: bsums (hi, lo) of one row block, its d (and the row-pair
    patterns), per column pair / vector d, dmin and the mins, scratch."""
    nv = nr // 4
    if mode == "mm":
        return {"bh": 2, "bl": 2, "da": 1, "dap": 2, "d": nr // 2, "dm": nr // 2,
                "mins": nr // 2, "f16": 1, "s2": 1, "fa": 1}
    bs = 4 if P == 4 else 1                  # bsum_hi, bsum_lo of the row block
    if mode == "neon":      # SMULL/SMLAL2 of int16 bsums by each column's 8 mins, ADDP
        return {"bs": bs, "da": 1, "d": nv, "dm": nv, "mins": 4 * nv, "f16": 2, "s2": 1,
                "fa": 1, "b16": 1, "v": 4}
    # dot4 / dot8: by-lane SDOT of the mins (UZP1/UZP2: j 0-3, 4-7 of 4 columns)
    return {"bs": bs, "da": 1, "d": nv, "dm": nv, "mins": 2 * nv, "f16": 2, "s2": 1, "fa": 1}


def _neon_block(spec: KernelSpec, mode: str, mr_reg: int, extra_v):
    nr, P = spec.nr, spec.lhs_mr
    G, U, nv = mr_reg // P, _units(mode, mr_reg, nr), nr // 4
    pool = RegisterPool(_NEON_CHART)
    v = pool.v
    t_flat = v.take(U * (2 if mode == "neon" else 1), "int32 sub-block sums")
    t = tuple(rows(t_flat, 2)) if mode == "neon" else tuple(t_flat)
    s1 = tuple(v.take(U, "int32 scaled sums"))
    n_lhs = {"mm": mr_reg // 2, "dot4": 2, "dot8": 4, "neon": 3}[mode]
    lhs = tuple(v.take(n_lhs, "LHS"))
    # mm: the unpacked (low, high) nibbles of every column pair; dot4: of every column vector;
    # dot8: one column pair's; neon: one column vector's and two int16 product vectors
    n_rhs = {"mm": nr, "dot4": 2 * nv, "dot8": 2, "neon": 4}[mode]
    rhs = tuple(v.take(n_rhs, "RHS"))
    mask = v.take(1, "nibble mask")[0]
    extra = {name: tuple(v.take(n, "decode extras")) for name, n in extra_v}
    sst = tuple(v.take(4 if mode in ("mm", "dot8") else 3, "scale scratch"))
    dead = list(t_flat) + list(lhs) + list(rhs) + list(sst)
    ep, i = {}, 0
    for name, n in _ep_counts(mode, P, nr).items():
        got = v.reuse(dead[i:], n, _EP)
        i += n
        ep[name] = tuple(got)
    out_flat = v.reuse(dead, mr_reg * nv + 4, _EP)     # + two loads, clamp min and max
    out = rows(out_flat[:mr_reg * nv], nv)
    ep["tmp"] = tuple(out_flat[mr_reg * nv:])
    gpr = pool.scalars(KQUANT_NEON_SCALARS)
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    return pool, dict(mode=mode, t=t, s1=s1, lhs=lhs, rhs=rhs, mask=mask, sst=sst,
                      ep=ep, out=out, gpr=gpr, lo=lo, extra=extra)


def allocate_kquant_neon(spec: KernelSpec, family: str,
                         extra_v: tuple[tuple[str, int], ...] = ()) -> KQuantNeonRegs:
    """The registers of a ``family`` NEON tile on the shared 32-k sub-block strategy
    (templates/kquant/neon.S.j2).  ``extra_v``: (name, count) of the vector registers the
    family's decode needs beyond the nibble mask (taken after it, live through the kernel, in
    ``R.extra[name]``; e.g. ``(("table", 1),)`` for a TBL decode's 16-byte table); they count in
    the tile's register budget, so a family with extras may accept smaller tiles."""
    check_neon_tile(spec, family, _NEON_MAX_NR)
    mode = kquant_mode(spec, family, "NEON")
    check_packing(spec)
    return KQuantNeonRegs(**first_fit(spec, lambda mr_reg: _neon_block(spec, mode, mr_reg,
                                                                       tuple(extra_v))))

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


def check_sme2_gemv_tile(spec: KernelSpec, family: str, one_vl: bool = False) -> None:
    """SME2 gemv tiles: 1 x 2vl or 1 x 4vl (one ZA-array SDOT vgx2 / vgx4 per 4-k chunk); with
    ``one_vl`` (a family whose template has the 1vl hook of kquant/sme2_gemv_luti4.S.j2) also
    1 x 1vl (the multi-vector SDOT vgx4 over four k-chunks of the one column vector, four ZA
    slices summed once per sub-block)."""
    if spec.nr in (2, 4) or (one_vl and spec.nr == 1):
        return
    tiles = "1x1vl, 1x2vl or 1x4vl" if one_vl else "1x2vl or 1x4vl"
    raise SpecError(f"{family} sme2 gemv tiles are {tiles} (one ZA-array SDOT vgx2 / vgx4 per "
                    f"4-k chunk), got 1x{spec.nr_str}")


def claim_luti4_gemv_tail(v, nu: int, raw: tuple[tuple[int, ...], ...]):
    """The LUTI4 K-quant SME2 gemvs' (kquant/sme2_gemv_luti4.S.j2) upper registers, after the
    nibble groups ``raw`` (z4-z7, z8-z11) are claimed from the vector pool ``v``: (unp, bc, s1,
    acc).  nu = 2, 4: ``unp`` two nu-vector groups at z16 and z20, ``s1`` / ``acc`` nu vectors
    at z24 / z28, no ``bc``.  nu = 1: ``unp`` two 4-vector groups (four chunks each), ``bc``
    the broadcast LHS quads (the second nibble group, free with one load per sub-block, and
    z24-z27), ``s1`` z28, ``acc`` z29."""
    if nu == 1:
        unp = (v.claim(range(16, 20), "RHS"), v.claim(range(20, 24), "RHS"))
        bc = (raw[1], v.claim(range(24, 28), "LHS"))
        return unp, bc, v.claim((28,), "f32 epilogue"), v.claim((29,), "f32 epilogue")
    unp = (v.claim(range(16, 16 + nu), "RHS"), v.claim(range(20, 20 + nu), "RHS"))
    return (unp, (), v.claim(range(24, 24 + nu), "f32 epilogue"),
            v.claim(range(28, 28 + nu), "f32 epilogue"))


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


# ---------------------------------------------------------------------------------------------
# SVE: the vector-length agnostic strategy of 8 sub-blocks of 32 k (templates/kquant/sve.S.j2)
# ---------------------------------------------------------------------------------------------
KQUANT_SVE_SCALARS = KQUANT_NEON_SCALARS + ("sc_ptr", "nb_ptr")
_SVE_MAX_NV = 4         # dmin at [rhs, #(nv + cv), mul vl] (ld1h immediates reach 7)
_SVE_EP = "epilogue beyond the dead registers"
_SVE_CHART = ("int32 sub-block sums", "int32 scaled sums", "LHS", "RHS", "scale scratch",
                 _SVE_EP)


@dataclass(frozen=True)
class KQuantSveRegs(KQuantSveArea, Frame):
    """Registers of the K-quant SVE kernels of 8 sub-blocks of 32 k (q4_K and the families
    built on it: q5_K, iq4_xs; numbers, templates add the prefix; templates/kquant/sve.S.j2).

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
    pool = RegisterPool(_SVE_CHART + tuple(role for _, role in extra), v_order=Z_LOW_FIRST)
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
    gpr = pool.scalars(KQUANT_SVE_SCALARS + tuple(extra_x))
    lo = tuple(pool.x.take(G, "LHS row pointers"))
    fields = dict(mode=mode, t=tuple(t), s1=tuple(s1), lhs=tuple(lhs), rhs=tuple(rhs),
                  sst=tuple(sst), ep=ep, out=out, gpr=gpr, lo=lo, pred=tuple(range(1, nv + 1)))
    return pool, (dict(fields, xv=xv) if extra else fields)


def allocate_kquant_sve(spec: KernelSpec, family: str, extra: tuple = (),
                        extra_x: tuple = ()) -> KQuantSveRegs:
    """The SVE registers of a q4_K-shaped kernel of ``family``: ``extra`` ((name, role), ...)
    one more Z register each, taken after the scaled sums (``xv[name]``), ``extra_x`` more
    named GPRs (``gpr``)."""
    check_sve_tile(spec, family, _SVE_MAX_NV, "the dmin vectors at [rhs, #(nv + cv), mul vl]")
    mode = kquant_mode(spec, family, "SVE")
    check_sve_mm_rows(spec, family, mode)
    check_packing(spec)
    return KQuantSveRegs(**first_fit(spec, lambda mr_reg: _sve_block(spec, mode, mr_reg, extra, extra_x),
                                  " (indexed SDOT operands in z0-z7)" if mode == "dot4" else ""))



@dataclass(frozen=True, kw_only=True)
class KQuantSme2Frame(Frame):
    """What the K-quant SME2 register records share: the GPRs by name, the frame, the
    all-true counter predicate (pn8) of the multi-vector loads."""

    gpr: dict[str, int] = field(hash=False)
    saved_x: tuple[int, ...] = ()
    saved_d: tuple[int, ...] = ()
    needs: VectorNeeds = VectorNeeds(())
    counter_pred: int = 8


@dataclass(frozen=True, kw_only=True)
class KQuantLuti4GemvFrame(KQuantSme2Frame):
    """The frame of the LUTI4 K-quant SME2 gemvs (kquant/sme2_gemv_luti4.S.j2): ``bc`` (the
    1 x 1vl tile's two 4-vector groups of broadcast LHS quads, () otherwise) and, with them, 32
    bytes of stack for one sub-block's permuted quads (stored by two 16-byte ST1W, read back
    by LD1RW)."""

    bc: tuple[tuple[int, ...], ...] = ()

    @property
    def quads_offset(self) -> int:
        """sp offset of the 32 bytes of permuted LHS quads (above the clamp values)."""
        return (self.clamp_offset + 16 + 15) // 16 * 16

    @property
    def frame_bytes(self) -> int:
        return self.quads_offset + 32 if self.bc else super().frame_bytes


@dataclass(frozen=True, kw_only=True)
class KQuantSme2RowsRegs(KQuantSme2Frame):
    """The mu vl x 1vl int16-SMOPA gemm of the 4-bit K-quant layouts (q4_K, iq4_xs; mu = 4: the
    four int32 ZA tiles hold S1 of four groups of SVL/32 rows, all multiplied by the same
    decoded weights; templates/kquant/sme2_gemm_rows.S.j2).  Hot loop: ``lhs`` (two sets
    of 2*mu: per 4-k chunk the low and the high k pair of each row group, widened by LD1SB .h),
    ``rhs_b`` (one vector of nibbles: two chunks), ``w`` (LUTI4's four int16 vectors), ``p``
    (two pairs: per chunk the low and the high k pairs of the columns after UZP, then scaled;
    a family with its own decode: ``extra``, its named vectors),
    ``sc`` (the sub-block scale of each column, twice), ``sc_raw``, ``table`` (the LUTI4
    table's source at entry).  SB end: ``mins`` (the mins' k pairs), per row group ``bsb`` / ``lob``
    (bsum bytes), ``wide`` / ``wlo`` (widened), ``bs`` (the group's bsum k pairs); per batch of
    4 rows of a tile: ``zero`` (4 zero vectors), ``s1`` / ``s2`` (S1 and S2 of the 4 rows),
    ``d``, ``dm``, ``da``, ``acc``, ``clamp``; predicates ``p_lo`` / ``p_hi`` / ``p_rows``
    (the batch's rows)."""

    mu: int
    nu: int
    lhs: tuple[tuple[int, ...], ...]
    rhs_b: int
    w: tuple[int, ...]
    p: tuple[tuple[int, int], tuple[int, int]]
    sc: tuple[int]
    sc_raw: int
    table: int
    mins_b: tuple[int, int]
    mins: tuple[int, ...]
    bsb: tuple[int, int]
    lob: tuple[int, int]
    wide: tuple[int, ...]
    wlo: tuple[int, ...]
    bs: tuple[int, ...]
    zero: tuple[int, ...]
    s1: tuple[int, ...]
    s2: tuple[int, ...]
    d: tuple[int]
    dm: tuple[int]
    da: int
    acc: tuple[int]
    clamp: tuple[int, int]
    extra: dict[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    p_lo: int = 2
    p_hi: int = 3
    p_rows: int = 4
    # the :i16 variant (LHS q8ki16p, int16 values): each set of ``lhs`` is ordered so that the
    # low pairs of the four row groups (lhs[2g]) and the high pairs (lhs[2g + 1]) are four
    # consecutive registers from a multiple of 4, the targets of one LD1H {4 vectors}
    lhs16: bool = False


_ROWS_SCALARS = ("n_rem", "rec", "rp", "scp", "lp", "lhs_rb", "lhs_rbs", "dst_tile", "dst_row",
                 "dap", "sb_cnt", "nsb", "sub_cnt", "rows", "tmp", "left", "rpt", "pt")
_ROWS_CHART = ("LHS", "RHS", "column scales", "SB-end operands", "f32 epilogue", "clamp")


def allocate_kquant_sme2_rows(spec: KernelSpec, family: str,
                              extra: tuple[tuple[str, int], ...] = (),
                              extra_x: tuple[tuple[str, str], ...] = ()) -> KQuantSme2RowsRegs:
    """The 4vl x 1vl SME2 gemm of a K-quant layout: one decode of the weights for the four ZA
    tiles.  Without ``extra``, the 4-bit layouts' LUTI4 decode (``w``, ``p``, ``rhs_b``,
    ``table``); a family with a decode of its own names its hot-loop vectors in ``extra``
    ((name, count): ``R.extra[name]``, each group at a multiple of its count from z16 on,
    then ``sc``, ``sc_raw``).  GPR ``pt`` (the fold's predicate bounds) is free in the hot
    loop: a family may give it a second name there.  ``extra_x``: second names of GPRs for a family's
    own pointers ((name, scalar): ``R.gpr[name]`` is that scalar's register; free in the hot
    loop: ``dap``, ``left``, ``rpt``, ``pt``; ``pt`` and ``tmp`` across the fold too, where the
    family's fold blocks do not use them)."""
    mu = spec.mr
    check_sme2_interleave(spec, family)
    pool = RegisterPool(_ROWS_CHART, x_order=SME_X_ORDER, streaming=True)
    v = pool.v
    lhs = (v.claim(range(0, 2 * mu), "LHS"), v.claim(range(2 * mu, 4 * mu), "LHS"))
    if spec.lhs_i16:        # lhs[2g + h] = base + mu*h + g (mu = 4: z0-z3 low, z4-z7 high pairs)
        lhs = tuple(tuple(s[mu * h + g] for g in range(mu) for h in range(2)) for s in lhs)
    ex: dict[str, tuple[int, ...]] = {}
    if not extra:
        w = v.claim(range(16, 20), "RHS")
        p = (v.claim((20, 21), "RHS"), v.claim((22, 23), "RHS"))
        rhs_b, sc, sc_raw, table = v.claim(range(24, 28), "column scales")
        bs = v.claim(range(28, 32), "SB-end operands")
    else:
        w, p, rhs_b, table, at = (), (), -1, -1, 16
        for name, n in extra:
            at = -(-at // n) * n
            ex[name] = v.claim(range(at, at + n), "RHS")
            at += n
        sc, sc_raw = v.claim((at, at + 1), "column scales")
        bs = tuple(range(28, 32))
    # SB end (multi-vector groups start at a multiple of their length): the hot loop's
    # registers are dead; mins live over the fold, the rest per row group / batch
    mins = tuple(range(24, 28))
    clamp = (22, 23)
    gpr = pool.scalars(_ROWS_SCALARS)
    gpr.update({name: gpr[of] for name, of in extra_x})
    pool.settle(f"{family} sme2 gemm {spec.mr_str}x{spec.nr_str}")
    return KQuantSme2RowsRegs(mu=mu, nu=1, lhs=lhs, rhs_b=rhs_b, w=w, p=p, sc=(sc,),
                           sc_raw=sc_raw, table=table,
                           mins_b=(0, 1), mins=mins, bsb=(0, 1), lob=(2, 3),
                           wide=tuple(range(4, 8)), wlo=tuple(range(8, 12)), bs=bs,
                           zero=tuple(range(12, 16)), s1=tuple(range(4, 8)),
                           s2=tuple(range(8, 12)), d=(16,), dm=(17,), da=18, acc=(19,),
                           clamp=clamp, extra=ex, gpr=gpr, lhs16=spec.lhs_i16, **pool.frame())
