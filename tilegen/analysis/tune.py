"""Tile search: every tile the register allocator accepts, ranked by the llvm-mca model.

    candidates(target, family, regime)  -> tiles the allocator accepts (ISAs: family ∩ target)
    distinct(cands)                     -> one representative per kernel code
    score(cands, model)                 -> llvm-mca reports (thread pool, cached per process)
    rank(scores)                        -> best first
    pick_pair(gemm, gemv)               -> gemm + gemv kernels that read one packed RHS

Score of a tile: MACs per cycle over a whole 32-k block (q4: scale loads and conversion
included; f32: eight 4-k hot-loop iterations), compared at ``tol`` (1%) of the best; ties go
to fewer vector registers, then fewer packed-RHS bytes per MAC, then the smaller tile.
"""
from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Iterable, Sequence

from .mca import MODEL_SVE_VL, AnalyzeError, LoopReport, analyze, mca_tool
from ..build.defaults import default_specs
from ..build.targets import TARGETS, Target
from ..build.tuned import TunedFamily, read_tuned
from ..generator.regalloc import allocate
from ..generator.spec import KernelSpec
from ..generator.validate import validate
from ..layout.base import rhs_identity
from ..layout.base import rhs_layout_for
from ..families import FAMILIES
from ..records import ISAS, SpecError

__all__ = ["TuneError", "Candidate", "Score", "Ranking", "Pair", "REGIMES", "tunable_isas",
           "tunable_families",
           "candidates", "distinct", "score", "rank", "rank_key", "tune", "pick_pair", "best_of", "tuned_entry", "clear_cache",
           "Measured", "measured_ranking", "Versus", "versus"]

REGIMES = ("gemm", "gemv")
# The grid the allocator is asked about (it decides; nothing here is a list of valid tiles).
F32_MR = tuple(range(1, 17))
Q4_MR = tuple(range(1, 33))
NR = tuple(range(4, 33, 4))
VL_UNITS = tuple(range(1, 9))      # nr (and SME mr) in vector-length units for scalable ISAs
Q4_KR_SR = tuple((kr, sr) for kr in (4, 8, 16, 32) for sr in (1, 2, 4))
Q4_ACC_MEM = (False, True)      # q4: f32 accumulators in registers / in the frame (":am")
_K_FOR_BYTES = 4096         # k at which packed-RHS bytes per MAC are measured (bias amortised)
TOLERANCE = 0.01


class TuneError(ValueError):
    """A tune request that cannot be served (unknown family, no model, no tile...)."""


@dataclass(frozen=True)
class Candidate:
    spec: KernelSpec
    vregs: int              # vector registers the allocator uses
    rows: int               # rows the hot loop computes at once (q4: the allocator's mr_reg)
    rhs_bytes_per_mac: float

    @property
    def rhs_key(self) -> tuple:
        """The packed RHS this kernel reads (the runtime pairs gemm and gemv by it)."""
        return rhs_identity(self.spec)


@dataclass(frozen=True)
class Score:
    cand: Candidate
    report: LoopReport

    @property
    def spec(self) -> KernelSpec:
        return self.cand.spec

    @property
    def block_macs(self) -> int:
        s = self.spec
        if s.vl_scaled:     # at the VL of the model's CPU
            vl = MODEL_SVE_VL[self.report.model] // 8
            return 32 * (s.mr_at(vl) if s.mr_vl else self.cand.rows) * s.nr_at(vl)
        return 32 * self.cand.rows * s.nr

    @property
    def block_cycles(self) -> float:
        blk = self.report.block32_cycles
        return blk if blk is not None else 8 * self.report.cycles_per_iter

    @property
    def value(self) -> float:
        """MACs per cycle over one 32-k block of the tile (the primary score)."""
        return self.block_macs / self.block_cycles

    def as_dict(self) -> dict:
        return {"spec": self.spec.spec_string, "kernel": self.spec.name,
                "isa": self.spec.isa, "mr": self.spec.mr, "nr": self.spec.nr,
                "kr": self.spec.kr, "sr": self.spec.sr, "acc_mem": self.spec.acc_mem,
                "rows": self.cand.rows,
                "cycles_per_iter": self.report.cycles_per_iter,
                "efficiency": self.report.efficiency,
                "macs_per_cycle": self.report.macs_per_cycle,
                "block32_cycles": self.block_cycles, "block32_macs_per_cycle": self.value,
                "vregs": self.cand.vregs, "rhs_bytes_per_mac": self.cand.rhs_bytes_per_mac}


@dataclass(frozen=True)
class Measured(Score):
    """A score whose value is a timing (``tune --measure``): measured MACs per cycle (or per
    ns, the unit the method records) of the kernel, next to its model report (None: a kernel
    llvm-mca does not model, e.g. SME, ranked by its timing alone)."""
    measured: float = 0.0

    @property
    def value(self) -> float:
        return self.measured

    @property
    def model_value(self) -> float | None:
        return None if self.report is None else Score.value.fget(self)

    def as_dict(self) -> dict:
        if self.report is None:
            s = self.spec
            base = {"spec": s.spec_string, "kernel": s.name, "isa": s.isa, "mr": s.mr,
                    "nr": s.nr, "kr": s.kr, "sr": s.sr, "acc_mem": s.acc_mem,
                    "rows": self.cand.rows, "vregs": self.cand.vregs,
                    "rhs_bytes_per_mac": self.cand.rhs_bytes_per_mac}
        else:
            base = super().as_dict()
        return dict(base, measured=self.measured, model_block32_macs_per_cycle=self.model_value)


@dataclass(frozen=True)
class Ranking:
    target: str
    model: str
    family: str
    regime: str
    scores: tuple[Score, ...]      # distinct kernels, best first
    n_tiles: int = 0               # accepted tiles (several may render one kernel)
    same_code: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)
    # representative spec -> the other accepted tiles that render its code
    not_modelled: tuple[tuple[str, str], ...] = ()     # (spec, why) analyze could not model
    # the candidates of not_modelled (tune(..., unmodelled=True): timed by tune --measure)
    unmodelled: tuple[Candidate, ...] = field(default=(), compare=False)

    @property
    def best(self) -> Score:
        return self.scores[0]


@dataclass(frozen=True)
class Pair:
    gemm: Score
    gemv: Score
    shared_rhs: bool        # gemv reads the gemm's packed RHS
    best_gemm: Score        # unconstrained winners, for the report
    best_gemv: Score


def tunable_isas(target: Target, family: str, isa: str | None = None) -> list[str]:
    """The family's ISAs the target can run (only ``isa`` if given)."""
    fam = FAMILIES.get(family)
    if fam is None:
        raise TuneError(f"unknown family {family!r}; known: {', '.join(sorted(FAMILIES))}")
    isas = [i for i in fam.isas if set(ISAS[i].features) <= target.features]
    if isa is not None:
        if isa not in fam.isas:
            raise TuneError(f"family {family!r} has no template for isa {isa!r}; "
                            f"available: {', '.join(fam.isas)}")
        if isa not in isas:
            raise TuneError(f"target {target.name} cannot run isa {isa!r} (features "
                            f"{', '.join(sorted(target.features))})")
        isas = [isa]
    if not isas:
        raise TuneError(f"target {target.name} runs none of {family}'s ISAs ({', '.join(fam.isas)})")
    return isas


def tunable_families(target: Target) -> list[str]:
    """The families ``tune`` ranks and ``tune --write`` pairs on ``target`` (registry order): those
    with an ISA the target runs that llvm-mca models, i.e. not SME (the SME-only families,
    ``q4_0_s1s0`` and ``q4_0_f16``, are ranked by ``tune --measure`` timings alone).  The
    shipped presets carry a tuned pair for each (``scripts/tune_presets.sh``)."""
    return [name for name, fam in FAMILIES.items()
            if any(ISAS[i].vl_kind != "sme" and set(ISAS[i].features) <= target.features
                   for i in fam.isas)]


@lru_cache(maxsize=None)     # specs are immutable; every target's grid asks for the same tiles
def _candidate(spec: KernelSpec) -> Candidate | None:
    try:
        regs = allocate(validate(spec))
    except SpecError:
        return None
    # VL-scaled tiles: bytes per MAC do not depend on the VL; measure them at 128 bits
    vl = 16 if spec.vl_scaled else None
    rows = getattr(regs, "mr_reg", spec.mr)       # VL-scaled: in VL units
    nr = spec.nr_at(vl)
    rhs = rhs_layout_for(spec, 32, vl).packed_size(nr, _K_FOR_BYTES)
    return Candidate(spec, regs.needs.total, rows, rhs / (rows * nr * _K_FOR_BYTES))


def candidates(target: Target, family: str, regime: str, isa: str | None = None,
               m: int | None = None, mrs: Sequence[int] | None = None,
               nrs: Sequence[int] | None = None) -> list[Candidate]:
    """Every tile of the grid the allocator accepts, for ``regime`` ("gemv": mr == 1;
    "gemm": mr > 1, and mr <= m if ``m`` is given).  ``mrs``/``nrs`` narrow the grid."""
    if regime not in REGIMES:
        raise TuneError(f"unknown regime {regime!r}; known: {', '.join(REGIMES)}")
    out: list[Candidate] = []
    for i in tunable_isas(target, family, isa):
        out += _isa_candidates(family, regime, i, m, None if mrs is None else tuple(mrs),
                               None if nrs is None else tuple(nrs))
    return out


@lru_cache(maxsize=None)     # the grid of one ISA is the same on every target that runs it
def _isa_candidates(family: str, regime: str, i: str, m: int | None,
                    mrs: tuple[int, ...] | None, nrs: tuple[int, ...] | None
                    ) -> tuple[Candidate, ...]:
    """:func:`candidates` of one of the family's ISAs."""
    quant = FAMILIES[family].quantized
    grid_mr = mrs if mrs is not None else (Q4_MR if quant else F32_MR)
    grid_nr = nrs if nrs is not None else NR
    krsr: Iterable[tuple[int | None, int | None]] = Q4_KR_SR if quant else ((None, None),)
    out: list[Candidate] = []
    seen: set[KernelSpec] = set()
    scalable = ISAS[i].scalable
    rows = [(mr, False) for mr in grid_mr]
    if ISAS[i].vl_kind == "sme" and regime == "gemm":     # ZA tiles: rows in VL units too
        rows += [(mu, True) for mu in (1, 2, 4)]
    for mr, mr_vl in rows:
        if not mr_vl and ((regime == "gemv") != (mr == 1)
                          or (m is not None and regime == "gemm" and mr > m)):
            continue
        for nr in (VL_UNITS if scalable else grid_nr):    # nrs narrows fixed widths
            for (kr, sr), am in ((ks, a) for ks in krsr
                                 for a in (Q4_ACC_MEM if quant else (False,))):
                try:
                    spec = KernelSpec(family, i, mr, nr, kr=kr, sr=sr, nr_vl=scalable,
                                      mr_vl=mr_vl, acc_mem=am)
                except SpecError:
                    continue
                c = _candidate(spec) if spec not in seen else None
                seen.add(spec)
                if c is not None:
                    out.append(c)
    return tuple(out)


def _canonical_key(spec: KernelSpec) -> tuple:
    info = spec.info
    return (spec.sr != info.impls[spec.isa].sr, spec.kr != info.impls[spec.isa].kr,
            spec.spec_string)


def distinct(cands: Sequence[Candidate]) -> dict[KernelSpec, list[KernelSpec]]:
    """Group tiles that render one kernel's code: representative -> the tiles it stands for.

    A q4 tile the allocator computes in passes of ``rows`` < mr rows is the ``rows``-row
    tile's code under another name; kr/sr variants with one kr/sr ratio share name, code and
    packed bytes.  The representative has mr == rows and the family's default sr, then kr."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in cands:
        s = c.spec
        groups.setdefault((s.isa, c.rows, s.nr, s.L, s.mr_vl, s.nr_vl, s.acc_mem), []).append(c)
    out: dict[KernelSpec, list[KernelSpec]] = {}
    for (isa, rows, nr, _, mr_vl, nr_vl, am), cs in groups.items():
        variants = {c.spec for c in cs if c.spec.mr == rows}
        if not variants:        # the grid left the rows-row tile out: the same kr/sr variants
            variants = {KernelSpec(c.spec.family, isa, rows, nr, c.spec.kr, c.spec.sr,
                                   mr_vl=mr_vl, nr_vl=nr_vl, acc_mem=am) for c in cs}
        rep = min(variants, key=_canonical_key)
        out[rep] = [c.spec for c in cs]
    return out


_cache: dict[tuple[KernelSpec, str], LoopReport] = {}
_lock = threading.Lock()


def clear_cache() -> None:
    with _lock:
        _cache.clear()


def _analyze(spec: KernelSpec, model: str) -> LoopReport:
    key = (spec, model)
    with _lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    r = analyze(spec, model)
    with _lock:
        _cache[key] = r
    return r


def score(cands: Sequence[Candidate], model: str,
          jobs: int | None = None) -> tuple[list[Score], list[tuple[KernelSpec, str]]]:
    """llvm-mca reports of ``cands`` on ``model`` (same order), and the kernels analyze
    cannot model with the reason (AnalyzeError; a missing llvm-mca is raised at once)."""
    mca_tool()          # fail fast, with the install hint, when llvm-mca is missing

    def one(c: Candidate) -> LoopReport | AnalyzeError:
        try:
            return _analyze(c.spec, model)
        except AnalyzeError as e:
            return e

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as ex:
        reports = list(ex.map(one, cands))
    scores = [Score(c, r) for c, r in zip(cands, reports) if isinstance(r, LoopReport)]
    failed = [(c.spec, str(r)) for c, r in zip(cands, reports) if isinstance(r, AnalyzeError)]
    return scores, failed


def rank_key(s: Score, best: float, tol: float = TOLERANCE) -> tuple:
    """Sort key: score at ``tol`` of ``best``, then vregs, RHS bytes/MAC, tile size."""
    return (-round(s.value / best / tol), s.cand.vregs, s.cand.rhs_bytes_per_mac,
            s.spec.mr, s.spec.nr, s.spec.spec_string)


def rank(scores: Iterable[Score], tol: float = TOLERANCE) -> list[Score]:
    ss = list(scores)
    if not ss:
        return []
    best = max(s.value for s in ss)
    return sorted(ss, key=lambda s: rank_key(s, best, tol))


def tune(target: Target, family: str, regime: str, isa: str | None = None, m: int | None = None,
         model: str | None = None, jobs: int | None = None, mrs: Sequence[int] | None = None,
         nrs: Sequence[int] | None = None, unmodelled: bool = False) -> Ranking:
    """Rank the distinct kernels of every accepted ``family``/``regime`` tile on ``model``
    (default: the target's llvm-mca model).  ``unmodelled``: the kernels llvm-mca does not
    model (SME) are kept as candidates (``Ranking.unmodelled``, for timings) and a ranking
    without a modelled kernel is no error."""
    model = model or target.llvm_cpu
    if not model:
        raise TuneError(f"target {target.name} has no llvm-mca model (llvm_cpu); tune a CPU "
                        f"preset instead (see `tilegen targets`)")
    cands = candidates(target, family, regime, isa, m, mrs, nrs)
    if not cands:
        raise TuneError(f"the register allocator accepts no {family} {regime} tile for "
                        f"{target.name}" + (f" with mr <= {m}" if m is not None else ""))
    groups = distinct(cands)
    reps = [c for c in (_candidate(r) for r in groups) if c is not None]
    scores, failed = score(reps, model, jobs)
    if not scores and not (unmodelled and failed):
        raise TuneError(f"llvm-mca models none of the {len(reps)} {family} {regime} kernels on "
                        f"{model}: {failed[0][1]}")
    return Ranking(target.name, model, family, regime, tuple(rank(scores)), len(cands),
                   {r.spec_string: tuple(s.spec_string for s in v if s != r)
                    for r, v in groups.items()},
                   tuple((sp.spec_string, why) for sp, why in failed),
                   tuple(c for c in reps if c.spec in {sp for sp, _ in failed}) if unmodelled
                   else ())


def measured_ranking(ranking: Ranking, measured: dict[str, float],
                     tol: float = TOLERANCE) -> Ranking:
    """``ranking``'s kernels that were timed (spec string -> measured throughput, higher is
    better), ranked by the measurement (ties within ``tol`` as :func:`rank`).  A throughput
    that is not a finite positive number is a TuneError (a timing gone wrong, never ranked)."""
    scores = [Measured(s.cand, s.report, float(measured[s.spec.spec_string]))
              for s in ranking.scores if s.spec.spec_string in measured]
    scores += [Measured(c, None, float(measured[c.spec.spec_string]))
               for c in ranking.unmodelled if c.spec.spec_string in measured]
    bad = [s for s in scores if not (math.isfinite(s.measured) and s.measured > 0)]
    if bad:
        raise TuneError(f"{bad[0].spec.spec_string}: measured throughput {bad[0].measured} is "
                        f"not a positive number (the timing or the core clock is wrong)")
    if not scores:
        raise TuneError(f"no {ranking.family} {ranking.regime} kernel was timed")
    return replace(ranking, scores=tuple(rank(scores, tol)))


def pick_pair(gemm: Ranking, gemv: Ranking) -> Pair:
    """The gemm and gemv kernels to ship together.

    The unconstrained winners if they read the same packed RHS (nr, kr, sr); else, over the
    RHS layouts both rankings have, the pair whose worse kernel loses least against its
    winner (max of min(gemm/best gemm, gemv/best gemv)).  No common layout: the winners,
    ``shared_rhs=False``."""
    bg, bv = gemm.best, gemv.best
    if bg.cand.rhs_key == bv.cand.rhs_key:
        return Pair(bg, bv, True, bg, bv)
    first_g: dict[tuple, Score] = {}
    first_v: dict[tuple, Score] = {}
    for s in gemm.scores:
        first_g.setdefault(s.cand.rhs_key, s)
    for s in gemv.scores:
        first_v.setdefault(s.cand.rhs_key, s)
    common = [k for k in first_g if k in first_v]
    if not common:
        return Pair(bg, bv, False, bg, bv)

    def merit(k: tuple) -> tuple[float, float]:
        rg, rv = first_g[k].value / bg.value, first_v[k].value / bv.value
        return (min(rg, rv), rg)

    k = max(common, key=merit)
    return Pair(first_g[k], first_v[k], True, bg, bv)


def best_of(chosen: Score, best: Score, tol: float = TOLERANCE) -> Score:
    """``best`` if it beats ``chosen`` by more than ``tol``, else ``chosen`` (a second packed
    layout is worth its memory only for a real gain)."""
    return chosen if chosen.value >= best.value * (1 - tol) else best


def tuned_entry(family: str, pair: Pair) -> TunedFamily:
    """The tuned-file entry: the pair (the default selection, one packed layout) and the best
    gemm and best gemv of any layout (served to weights packed for both, ``for_ops``); a
    pair kernel within ``TOLERANCE`` of the winner stands as the best."""
    bg, bv = best_of(pair.gemm, pair.best_gemm), best_of(pair.gemv, pair.best_gemv)
    return TunedFamily(family, pair.gemm.spec, pair.gemv.spec, pair.shared_rhs,
                       {"gemm": round(pair.gemm.value, 3), "gemv": round(pair.gemv.value, 3),
                        "best_gemm": round(bg.value, 3), "best_gemv": round(bv.value, 3)},
                       bg.spec, bv.spec)


def grid_specs(families: Sequence[str] | None = None) -> dict[str, KernelSpec]:
    """Spec string -> spec of every kernel any preset can build: each target's default
    kernels and every tile of the tuning grid the allocator accepts for it (gemm and gemv);
    ``families``: only those families' kernels (in the same order as in the whole grid).  A
    new dict per call over one computation per process (the grid is fixed by the registries)."""
    return {s: spec for s, spec in _grid_specs(None if families is None else tuple(families))}


@lru_cache(maxsize=16)
def _grid_specs(families: tuple[str, ...] | None) -> tuple[tuple[str, KernelSpec], ...]:
    out: dict[str, KernelSpec] = {}
    for tgt in dict.fromkeys(TARGETS.values()):
        for s in default_specs(tgt):
            if families is None or s.family in families:
                out.setdefault(s.spec_string, s)
        for fam in (FAMILIES if families is None else [f for f in FAMILIES if f in families]):
            for regime in REGIMES:
                try:
                    cands = candidates(tgt, fam, regime)
                except TuneError:
                    continue
                for c in cands:
                    out.setdefault(c.spec.spec_string, c.spec)
    return tuple(out.items())


@dataclass(frozen=True)
class Versus:
    """``family`` against ``other`` on one target and regime, the way a user meets them:
    ``pick`` is the kernel the runtime runs by default (the tuned file's pair; None when the
    family has no tuned entry), ``best`` the best accepted tile of any ISA the target has
    (the model's ranking), ``same`` the other family's kernel of ``family``'s pick tile (the
    same-tile comparison; None when the allocator refuses that tile)."""
    target: str
    model: str
    regime: str
    family: str
    other: str
    pick: tuple[Score | None, Score | None]     # (family, other)
    best: tuple[Score, Score]
    same: tuple[Score | None, Score | None]

    @staticmethod
    def _ratio(pair: tuple[Score | None, Score | None]) -> float | None:
        a, b = pair
        return None if a is None or b is None else a.value / b.value

    @property
    def pick_ratio(self) -> float | None:
        return self._ratio(self.pick)

    @property
    def best_ratio(self) -> float:
        return self.best[0].value / self.best[1].value

    @property
    def same_ratio(self) -> float | None:
        return self._ratio(self.same)

    def as_dict(self) -> dict:
        def one(s: Score | None) -> dict | None:
            return None if s is None else {"spec": s.spec.spec_string, "score": s.value}
        return {"target": self.target, "model": self.model, "regime": self.regime,
                "family": self.family, "other": self.other,
                "pick": [one(s) for s in self.pick], "pick_ratio": self.pick_ratio,
                "best": [one(s) for s in self.best], "best_ratio": self.best_ratio,
                "same_tile": [one(s) for s in self.same], "same_ratio": self.same_ratio}


def _score_of(spec: KernelSpec | None, model: str) -> Score | None:
    c = None if spec is None else _candidate(spec)
    return None if c is None else Score(c, _analyze(spec, model))


def versus(target: Target, family: str, other: str, regime: str, jobs: int | None = None,
           tuned_dir: str | None = None) -> Versus:
    """``family`` against ``other`` on ``target``'s llvm-mca model in ``regime`` (gemm or
    gemv): the runtime's default picks (the tuned pairs), the best tiles of any ISA the
    target has, and the same tile (see :class:`Versus`).  Scores are MACs per cycle over the
    family's block (the ratio is one of cycles for the same MACs)."""
    if regime not in REGIMES:
        raise TuneError(f"regime {regime!r}: one of {', '.join(REGIMES)}")
    rk = [tune(target, f, regime, jobs=jobs) for f in (family, other)]
    model = rk[0].model
    tuned = read_tuned(target, tuned_dir)
    picks = []
    for f in (family, other):
        ent = tuned.families.get(f) if tuned is not None else None
        picks.append(_score_of(getattr(ent, regime) if ent is not None else None, model))
    mine = picks[0].spec if picks[0] is not None else rk[0].best.spec
    try:
        twin = validate(replace(mine, family=other))
    except SpecError:
        twin = None
    same = (_score_of(mine, model), _score_of(twin, model))
    return Versus(target.name, model, regime, family, other, tuple(picks),
                  (rk[0].best, rk[1].best), same)
