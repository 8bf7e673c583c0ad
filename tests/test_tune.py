"""`tilegen tune`: tile enumeration, llvm-mca ranking, tuned files read by default_specs."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import tilegen
from tilegen.analysis.mca import AnalyzeError, LoopReport
from tilegen.build import TargetError, default_specs, get_target
from tilegen.build.tuned import TunedError, TunedFamily, read_tuned, reset_tuned, write_tuned
from tilegen.generator.spec import KernelSpec
from tilegen.generator.validate import parse_spec, validate
from tilegen.families import FAMILIES
from tilegen.records import SpecError
from tilegen.analysis.tune import (F32_MR, NR, TOLERANCE, Candidate, Ranking, Score, TuneError, candidates,
                          distinct, pick_pair, rank, rank_key, tunable_isas, tune, tuned_entry)

V2 = get_target("neoverse-v2")


def _specs(cands):
    return {c.spec.spec_string for c in cands}


def test_candidates_are_exactly_the_accepted_tiles():
    gemm = candidates(V2, "f32", "gemm")
    gemv = candidates(V2, "f32", "gemv")
    got = _specs(gemm) | _specs(gemv)
    for mr in F32_MR:
        for nr in NR:
            spec = KernelSpec("f32", "neon", mr, nr)
            try:
                validate(spec)
                accepted = True
            except SpecError:
                accepted = False
            assert (spec.spec_string in got) == accepted, spec
    assert {"f32:neon:6x16", "f32:neon:8x8", "f32:neon:4x24"} <= _specs(gemm)
    assert "f32:neon:8x16" not in _specs(gemm)          # 42 vector registers
    assert {"f32:neon:1x16", "f32:neon:1x4"} <= _specs(gemv)


def test_q4_candidates_include_known_good_and_follow_the_regime():
    gemm = candidates(V2, "q4_0", "gemm")
    gemv = candidates(V2, "q4_0", "gemv")
    for c in gemm + gemv:
        validate(c.spec)
    assert {"q4_0:i8mm:16x4", "q4_0:dotprod:16x4", "q4_0:neon:4x4", "q4_0:i8mm:4x8"} <= _specs(gemm)
    assert {"q4_0:dotprod:1x4", "q4_0:dotprod:1x4:k16:s2", "q4_0:neon:1x4"} <= _specs(gemv)
    assert all(c.spec.mr > 1 for c in gemm) and all(c.spec.mr == 1 for c in gemv)
    assert all(c.spec.sr == 2 for c in gemm + gemv)      # the q4_0 RHS layout needs sr=2
    assert max(c.spec.mr for c in candidates(V2, "q4_0", "gemm", m=8)) == 8


def test_isas_are_the_family_and_target_intersection():
    assert tunable_isas(V2, "q4_0") == ["neon", "dotprod", "i8mm", "sve_dotprod", "sve_i8mm"]
    assert tunable_isas(get_target("a64fx"), "q4_0") == ["neon"]    # SVE, no dotprod or i8mm
    assert tunable_isas(get_target("cortex-a53"), "q4_0_dx") == ["neon"]
    assert {c.spec.isa for c in candidates(get_target("neoverse-n1"), "q4_0", "gemm")} == {
        "neon", "dotprod"}
    with pytest.raises(TuneError, match="cannot run isa 'i8mm'"):
        tunable_isas(get_target("neoverse-n1"), "q4_0", "i8mm")
    with pytest.raises(TuneError, match="no template for isa 'dotprod'"):
        tunable_isas(V2, "f32", "dotprod")


def test_unknown_family_target_or_model_is_a_clear_error():
    known = ", ".join(sorted(FAMILIES))
    with pytest.raises(TuneError, match=f"unknown family 'q8'; known: {known}$"):
        candidates(V2, "q8", "gemm")
    with pytest.raises(TargetError, match="unknown target 'neoverse-v9'"):
        get_target("neoverse-v9")
    with pytest.raises(TuneError, match="no llvm-mca model"):
        tune(get_target("generic-armv8"), "f32", "gemm")
    with pytest.raises(TuneError, match="accepts no q4_0 gemm tile .* mr <= 2"):
        tune(V2, "q4_0", "gemm", m=2)


def _norm(spec: KernelSpec) -> str:
    text = tilegen.generate(spec)
    return "\n".join(ln.replace(spec.name, "KERNEL") for ln in text.splitlines()
                     if not ln.startswith("// kernel:"))


def test_same_code_groups_really_render_the_same_code():
    cands = candidates(V2, "q4_0_dx", "gemm", mrs=(4, 8, 16), nrs=(4,))
    groups = distinct(cands)
    assert sum(len(v) for v in groups.values()) == len(cands)
    rep_16x4 = next(r for r, v in groups.items() if KernelSpec("q4_0_dx", "i8mm", 16, 4) in v)
    assert rep_16x4.mr < 16                     # the allocator runs 16x4 in passes of fewer rows
    for rep, members in groups.items():
        for s in members:
            assert _norm(s) == _norm(rep), (s, rep)


def _fake(spec: str, value: float, vregs: int, bpm: float = 1.0) -> Score:
    s = parse_spec(spec)
    rows = s.mr
    cycles = 32 * rows * s.nr / value           # block cost that gives `value` MACs/cycle
    rep = LoopReport(s.name, "m", cycles / 8, cycles / 8, 4 * rows * s.nr, cycles)
    return Score(Candidate(s, vregs, rows, bpm), rep)


def test_rank_orders_by_score_then_registers_then_rhs_bytes():
    a = _fake("f32:neon:6x16", 16.0, 32, 0.67)
    b = _fake("f32:neon:3x12", 15.95, 14, 1.33)      # within 1% of a: fewer registers wins
    c = _fake("f32:neon:4x12", 15.95, 14, 1.00)      # ... and then fewer RHS bytes per MAC
    d = _fake("f32:neon:8x8", 14.0, 26, 0.5)         # clearly slower: last despite its bytes
    assert [s.spec.spec_string for s in rank([d, a, b, c])] == [
        "f32:neon:4x12", "f32:neon:3x12", "f32:neon:6x16", "f32:neon:8x8"]
    assert [s.spec.spec_string for s in rank([d, a, b, c], tol=1e-4)][0] == "f32:neon:6x16"


def test_real_ranking_is_consistent_with_its_scores():
    r = tune(V2, "f32", "gemm", mrs=(2, 4, 6, 8), nrs=(8, 12, 16))
    best = max(s.value for s in r.scores)
    keys = [rank_key(s, best) for s in r.scores]
    assert keys == sorted(keys) and len(r.scores) >= 8
    assert r.best.value >= (1 - TOLERANCE) * best
    for s in r.scores:          # the score is MACs per cycle of one 32-k block
        if not s.spec.vl_scaled:   # SVE tiles: columns at the model's VL (128 bits on v2)
            assert s.value == pytest.approx(32 * s.spec.mr * s.spec.nr / s.block_cycles)
        assert s.value == pytest.approx(s.block_macs / s.block_cycles)
        assert s.value == pytest.approx(s.report.macs_per_cycle)
    assert r.best.report.efficiency > 0.95


def _ranking(regime: str, scores: list[Score]) -> Ranking:
    return Ranking("neoverse-v2", "neoverse-v2", "q4_0", regime, tuple(rank(scores)))


def test_pick_pair_shares_the_packed_rhs():
    gemm = _ranking("gemm", [_fake("q4_0:i8mm:4x8", 43.0, 29), _fake("q4_0:i8mm:4x4", 40.0, 20),
                             _fake("q4_0:dotprod:8x4", 34.0, 29)])
    gemv = _ranking("gemv", [_fake("q4_0:dotprod:1x20", 22.0, 24),
                             _fake("q4_0:dotprod:1x4:k16:s2", 18.0, 12),
                             _fake("q4_0:dotprod:1x8:k16:s2", 19.0, 15)])
    p = pick_pair(gemm, gemv)
    assert p.shared_rhs and p.gemm.cand.rhs_key == p.gemv.cand.rhs_key
    # 4x8+1x8 keeps min(43/43, 19/22) = 86%; 4x4+1x4 only min(40/43, 18/22) = 82%
    assert (p.gemm.spec.spec_string, p.gemv.spec.spec_string) == (
        "q4_0:i8mm:4x8", "q4_0:dotprod:1x8:k16:s2")
    assert p.best_gemv.spec.spec_string == "q4_0:dotprod:1x20"
    lone = pick_pair(gemm, _ranking("gemv", [_fake("q4_0:dotprod:1x20", 22.0, 24)]))
    assert not lone.shared_rhs and lone.gemv.spec.spec_string == "q4_0:dotprod:1x20"


def test_write_is_read_first_by_default_specs(tmp_path, monkeypatch):
    gemm = tune(V2, "f32", "gemm", mrs=(4, 6), nrs=(8, 16))
    gemv = tune(V2, "f32", "gemv", nrs=(8, 16))
    pair = pick_pair(gemm, gemv)
    path = write_tuned(V2, "neoverse-v2", tuned_entry("f32", pair), tmp_path)
    assert path == tmp_path / "neoverse-v2.json"
    data = json.loads(path.read_text())
    assert data["tilegen_tuned"] == 1 and data["families"]["f32"]["shared_rhs"] is True
    specs = default_specs(V2, tuned_dir=tmp_path)
    assert specs[:2] == [pair.gemm.spec, pair.gemv.spec]
    assert len({s.name for s in specs}) == len(specs)           # deduplicated
    assert len(specs) == len(default_specs(V2, tuned_dir=tmp_path / "none")) + sum(
        s.spec_string not in tilegen.build.DEFAULT_KERNELS for s in specs[:2])
    # an alias reads the preset's file; the environment variable selects the directory
    monkeypatch.setenv("TILEGEN_TUNED_DIR", str(tmp_path))
    assert default_specs(get_target("graviton4"))[:2] == specs[:2]
    assert default_specs(get_target("neoverse-n2"))[0].spec_string == "f32:neon:6x16"
    # a second family is merged, reset removes one family, then the file
    write_tuned(V2, "neoverse-v2", TunedFamily("q4_0", parse_spec("q4_0:i8mm:4x8"),
                                               parse_spec("q4_0:dotprod:1x8:k16:s2"), True), tmp_path)
    assert set(read_tuned(V2, tmp_path).families) == {"f32", "q4_0"}
    assert reset_tuned(V2, "f32", tmp_path) == path
    assert set(read_tuned(V2, tmp_path).families) == {"q4_0"}
    assert reset_tuned(V2, None, tmp_path) == path and not path.exists()
    assert reset_tuned(V2, None, tmp_path) is None


def _entry(**kw) -> dict:
    e = {"gemm": "f32:neon:6x16", "gemv": "f32:neon:1x16", "shared_rhs": True}
    e.update(kw)
    return e


@pytest.mark.parametrize("content, message", [
    ("{not json", "is not valid JSON"),
    (json.dumps([1, 2]), "expected a JSON object"),
    (json.dumps({"tilegen_tuned": 2, "target": "neoverse-v2", "model": "x", "families": {}}),
     '"tilegen_tuned" must be 1'),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-n2", "model": "x", "families": {}}),
     "written for target 'neoverse-n2'"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"q8": _entry()}}), "unknown family 'q8'"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"f32": _entry(gemm="f32:neon:8x16")}}),
     r"families.f32.gemm: mr=8, nr=16 needs 42 vector registers"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"f32": _entry(gemv="f32:neon:4x16")}}), "needs mr == 1"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"f32": _entry(gemm="q4_0:i8mm:4x8")}}), "is a q4_0 kernel"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"f32": _entry(colour="red")}}), "unknown keys colour"),
    (json.dumps({"tilegen_tuned": 1, "target": "neoverse-v2", "model": "x",
                 "families": {"f32": _entry(gemm=None, gemv=None)}}), "neither a gemm nor a gemv"),
])
def test_bad_tuned_file_is_a_clear_error(tmp_path, content, message):
    (tmp_path / "neoverse-v2.json").write_text(content)
    with pytest.raises(TunedError, match=message) as e:
        default_specs(V2, tuned_dir=tmp_path)
    assert str(tmp_path / "neoverse-v2.json") in str(e.value)
    assert "tilegen tune --target neoverse-v2 --reset" in str(e.value)


def test_tuned_kernel_the_target_cannot_run(tmp_path):
    n1 = get_target("neoverse-n1")
    (tmp_path / "neoverse-n1.json").write_text(json.dumps({
        "tilegen_tuned": 1, "target": "neoverse-n1", "model": "neoverse-n1",
        "families": {"q4_0": {"gemm": "q4_0:i8mm:4x8", "gemv": None}}}))
    with pytest.raises(TunedError, match="needs i8mm, which target neoverse-n1 lacks"):
        default_specs(n1, tuned_dir=tmp_path)


def test_missing_llvm_mca(monkeypatch):
    monkeypatch.setattr("tilegen.analysis.mca.shutil.which", lambda name: None)
    with pytest.raises(AnalyzeError, match="apt-get install llvm-19"):
        tune(V2, "f32", "gemv", nrs=(4,))


def _cli(*args, env=None):
    import os
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "tilegen", *args], capture_output=True, text=True,
                          env=e)


def test_cli_smoke_gemv_top3():
    p = _cli("tune", "--target", "neoverse-v2", "--family", "f32", "--m", "1", "--top", "3")
    assert p.returncode == 0, p.stderr
    rows = [ln for ln in p.stdout.splitlines() if re.match(r"\s+\d+ f32:(neon|sve):1x\d+", ln)]
    assert len(rows) == 3 and "gemm" not in p.stdout
    assert "f32 gemv on neoverse-v2 (llvm-mca -mcpu=neoverse-v2)" in p.stdout


def test_cli_errors():
    p = _cli("tune", "--target", "neoverse-v9", "--family", "f32")
    assert p.returncode == 2 and "unknown target 'neoverse-v9'" in p.stderr
    p = _cli("tune", "--target", "neoverse-v2", "--family", "q8")
    assert p.returncode == 2 and "unknown family 'q8'" in p.stderr
    p = _cli("tune", "--target", "generic-armv8", "--family", "f32")
    assert p.returncode == 2 and "no llvm-mca model" in p.stderr


def test_cli_write_json_list_and_reset(tmp_path):
    env = {"TILEGEN_TUNED_DIR": str(tmp_path)}
    p = _cli("tune", "--target", "neoverse-n2", "--family", "f32", "--m", "1", "--top", "2",
             "--write", "--json", env=env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert list(out["rankings"]) == ["gemv"] and len(out["rankings"]["gemv"]) == 2
    w = out["written"]
    assert w["shared_rhs"] and w["path"] == str(tmp_path / "neoverse-n2.json")
    listed = _cli("list", "--target", "neoverse-n2", env=env).stdout.split()
    assert listed[0] == w["gemm"] and listed[2] == w["gemv"]
    (tmp_path / "neoverse-n2.json").write_text("{")
    p = _cli("build", "--target", "neoverse-n2", "-o", str(tmp_path / "lib"), env=env)
    assert p.returncode == 2 and "is not valid JSON" in p.stderr
    p = _cli("tune", "--target", "neoverse-n2", "--reset", env=env)
    assert p.returncode == 0 and not (tmp_path / "neoverse-n2.json").exists()


def test_kernels_llvm_mca_cannot_model_are_listed_not_fatal(monkeypatch):
    import tilegen.analysis.tune as tune_mod
    real = tune_mod.analyze

    def fake(spec, model):
        if spec.isa == "dotprod":
            raise AnalyzeError(f"{spec.name}: no model for this one")
        return real(spec, model)

    tune_mod.clear_cache()
    monkeypatch.setattr(tune_mod, "analyze", fake)
    r = tune(get_target("neoverse-n1"), "q4_0", "gemv", nrs=(4, 8))
    assert {s.spec.isa for s in r.scores} == {"neon"}
    assert r.not_modelled and all("no model for this one" in why for _, why in r.not_modelled)
    with pytest.raises(TuneError, match="llvm-mca models none of the .* no model for this one"):
        tune(get_target("neoverse-n1"), "q4_0", "gemv", isa="dotprod", nrs=(4,))
    tune_mod.clear_cache()


def test_tuned_pair_is_what_the_runtime_picks(tmp_path, monkeypatch):
    """`tune --write` output -> build (manifest marks the kernels preferred) -> the runtime's
    first table entry for the family on an emulated CPU."""
    from conftest import guest
    write_tuned(V2, "neoverse-v2", TunedFamily("q4_0", parse_spec("q4_0:i8mm:4x8"),
                                               parse_spec("q4_0:dotprod:1x8:k16:s2"), True), tmp_path)
    monkeypatch.setenv("TILEGEN_TUNED_DIR", str(tmp_path))
    res = tilegen.build_library(None, target="neoverse-v2", out_dir=tmp_path / "lib")
    pref = sorted(k["spec"] for k in res.manifest["kernels"] if k["preferred"])
    assert pref == ["q4_0:dotprod:1x8:k16:s2", "q4_0:i8mm:4x8"]
    picks = guest("max").call("guest_calls:picks", str(tmp_path / "lib"))
    assert picks["q4_0"] == ("matmul_clamp_f32_qsi8d32p4x8_qsi4c32p8x8_4x8_neon_i8mm",
                             "matmul_clamp_f32_qsi8d32p1x8_qsi4c32p8x8_1x8_neon_dotprod"), picks


def test_q4_grid_scores_acc_mem():
    cands = candidates(V2, "q4_0", "gemm", isa="i8mm", mrs=(8, 24), nrs=(4,))
    specs = {c.spec.spec_string for c in cands}
    assert {"q4_0:i8mm:24x4:am", "q4_0:i8mm:24x4", "q4_0:i8mm:8x4"} <= specs
    groups = distinct(cands)
    am = [r for r in groups if r.acc_mem]
    assert am and all(r.spec_string.endswith(":am") for r in am)
    assert next(c for c in cands if c.spec.spec_string == "q4_0:i8mm:24x4:am").rows == 24


def test_tuned_file_best_kernels_round_trip(tmp_path):
    """best_gemm / best_gemv: optional, validated like the pair, read back, listed after it."""
    g, v = parse_spec("q4_0:i8mm:4x8"), parse_spec("q4_0:i8mm:1x8")
    bg, bv = parse_spec("q4_0:i8mm:12x4"), parse_spec("q4_0:i8mm:1x12:k8:s2")
    write_tuned(V2, "neoverse-v2", TunedFamily("q4_0", g, v, True, {"gemm": 1.0}, bg, bv), tmp_path)
    e = read_tuned(V2, tmp_path).families["q4_0"]
    assert (e.best_gemm, e.best_gemv, e.top_gemm, e.top_gemv) == (bg, bv, bg, bv)
    assert e.specs() == [g, v, bg, bv]
    assert default_specs(V2, tuned_dir=tmp_path)[:4] == [g, v, bg, bv]
    write_tuned(V2, "neoverse-v2", TunedFamily("q4_0", g, v, True), tmp_path)
    e = read_tuned(V2, tmp_path).families["q4_0"]
    assert e.best_gemm is None and (e.top_gemm, e.top_gemv) == (g, v) and e.specs() == [g, v]
    data = json.loads((tmp_path / "neoverse-v2.json").read_text())
    data["families"]["q4_0"]["best_gemv"] = "q4_0:i8mm:12x4"
    (tmp_path / "neoverse-v2.json").write_text(json.dumps(data))
    with pytest.raises(TunedError, match="families.q4_0.best_gemv: 'q4_0:i8mm:12x4' has mr=12"):
        read_tuned(V2, tmp_path)


def test_tuned_entry_keeps_the_pair_within_tolerance():
    from tilegen.analysis.tune import best_of
    a, b = _fake("q4_0:i8mm:4x8", 60.0, 20), _fake("q4_0:i8mm:12x4", 60.5, 32)
    assert best_of(a, b) is a                 # < 1% better: no second layout for it
    c = _fake("q4_0:i8mm:12x4", 63.0, 32)
    assert best_of(a, c) is c


def test_kquant_tall_tiles_sharing_one_unpack_are_their_own_kernels():
    """q6_K tiles taller than the register block run passes over one weight unpack per
    super-block (the allocator's mr_reg is the whole tile): other code than the register
    block's tile, so tune models them on their own and counts all their rows."""
    cands = candidates(V2, "q6_K", "gemm", isa="i8mm", mrs=(8, 24), nrs=(4,))
    rows = {c.spec.mr: c.rows for c in cands}
    assert rows[8] == 8 and rows[24] == 24
    assert {s.mr for s in distinct(cands)} >= {8, 24}


def test_model_scores_name_the_block_they_are_per(tmp_path, monkeypatch, capsys):
    """tune said "MACs/cycle per 32-k block" for the K-quants too, whose score is over their
    marked block, a 256-k super-block (``block_k`` of the report): the table and the written
    pair name each family's block."""
    from dataclasses import replace
    import tilegen.analysis.tune as tune_mod
    from tilegen.cli import main

    def ranking(family, regime, specs, block_k):
        scores = []
        for spec, value in specs:
            s = _fake(spec, value, 20)
            scores.append(Score(s.cand, replace(s.report, block_k=block_k)))
        return Ranking("neoverse-n1", "neoverse-n1", family, regime, tuple(scores), len(scores))

    fams = {"q4_K": ((("q4_K:dotprod:8x4", 19.5), ("q4_K:dotprod:4x4", 15.0)),
                     (("q4_K:dotprod:1x4", 9.9),), 256, "256-k super-block"),
            "q8_0": ((("q8_0:dotprod:16x4", 30.0),), (("q8_0:dotprod:1x4", 12.0),), 32,
                     "32-k block")}
    rankings = {fam: {"gemm": ranking(fam, "gemm", g, bk), "gemv": ranking(fam, "gemv", v, bk)}
                for fam, (g, v, bk, _) in fams.items()}
    monkeypatch.setattr(tune_mod, "tune", lambda tgt, fam, reg, **kw: rankings[fam][reg])
    monkeypatch.setenv("TILEGEN_TUNED_DIR", str(tmp_path))
    for fam, (g, v, _, per) in fams.items():
        assert main(["tune", "--target", "neoverse-n1", "--family", fam, "--write"]) == 0
        out = capsys.readouterr().out
        heads = [ln for ln in out.splitlines() if ln.startswith("score = ")]
        assert len(heads) == 2 and all(f"MACs per cycle over one {per} of the tile" in h
                                       for h in heads), out
        assert (fam == "q4_K") == all("(cyc/32k: its 32-k share)" in h for h in heads), out
        for role, (spec, value) in (("gemm", g[0]), ("gemv", v[0])):
            assert re.search(rf"^{role}: {re.escape(spec)} +{value:.2f} MACs/cycle over a "
                             rf"{per}$", out, flags=re.M), out
        if fam == "q4_K":
            assert "32-k block" not in out, out


def test_measure_shape_errors_name_measure_shape(monkeypatch, capsys):
    """A bad `tune --measure-shape` was reported as bench's `--shape`."""
    import tilegen.analysis.tune as tune_mod
    from tilegen.cli import main
    monkeypatch.setattr(tune_mod, "tune", lambda *a, **kw: None)    # refused before the ranking is read
    for bad in ("0,0,0", "1,2", "a,4096,4096", "1,-1,256"):
        rc = main(["tune", "--target", "neoverse-n1", "--family", "q8_0", "--m", "1",
                   "--measure", "--measure-shape", bad])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"tilegen tune: error: --measure-shape {bad!r}: "), err
        assert err.count("\n") == 1 and "--shape" not in err.replace("--measure-shape", ""), err


def test_tunable_families_are_every_modelled_family_the_target_runs():
    """tune --write (scripts/tune_presets.sh) pairs every family with a NEON or SVE kernel the
    target runs: the new formats of issue #32 (q5_K, iq4_xs, iq4_nl, mxfp4) and q8_0 / bf16
    (missing from the presets only because they came after them), not the SME-only ones."""
    from tilegen.analysis.tune import tunable_families
    v2 = tunable_families(V2)
    assert {"f32", "q4_0", "q4_0_dx", "q8_0", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq4_nl", "mxfp4",
            "bf16"} == set(v2)
    assert [f for f in FAMILIES if f in v2] == v2          # registry order
    assert "bf16" not in tunable_families(get_target("neoverse-n1"))     # no BF16 on n1
    assert "q4_0_s1s0" not in tunable_families(get_target("apple-m4"))   # SME only: not modelled


@pytest.mark.parametrize("family", ["q5_K", "iq4_xs", "iq4_nl", "mxfp4"])
def test_new_formats_are_ranked_and_paired(family):
    """The formats of issue #32: candidates on every NEON/SVE ISA the target has, both regimes
    ranked by the model (narrowed to one ISA and nr 4 here) and a gemm / gemv pair on one
    packed RHS."""
    isas = set(tunable_isas(V2, family))
    assert isas == {i for i in FAMILIES[family].isas if i != "sme2"}, isas
    assert {c.spec.isa for c in candidates(V2, family, "gemm", mrs=(4, 8), nrs=(4,))} == isas
    isa = "i8mm" if "i8mm" in isas else "dotprod"
    gemm = tune(V2, family, "gemm", isa=isa, mrs=(4,), nrs=(4,), jobs=2)
    gemv = tune(V2, family, "gemv", isa=isa, mrs=(1,), nrs=(4,), jobs=2)
    assert gemm.scores and gemv.scores and not gemm.not_modelled and not gemv.not_modelled
    assert all(s.value > 0 for s in gemm.scores + gemv.scores)
    pair = pick_pair(gemm, gemv)
    assert pair.shared_rhs and pair.gemv.spec.mr == 1 and pair.gemm.spec.mr > 1


def _block_macs_per_cycle(spec_string: str, model: str) -> float:
    """MACs per cycle over one 32-k block of a NEON kernel, straight from llvm-mca's report."""
    from tilegen.analysis.mca import analyze
    from tilegen.generator.regalloc import allocate
    spec = validate(parse_spec(spec_string))
    rows = getattr(allocate(spec), "mr_reg", spec.mr)
    return 32 * rows * spec.nr / analyze(spec, model).block32_cycles


def test_versus_compares_the_runtime_picks_the_best_tiles_and_the_same_tile(tmp_path):
    """`tune --family iq4_xs --versus q4_K`: the picks are the tuned file's pairs (not the
    rankings' winners), the best tiles the rankings' winners, the same tile q4_K on iq4_xs's
    pick tile; every ratio is the quotient of the two kernels' own llvm-mca scores."""
    from tilegen.analysis.tune import versus
    n1 = get_target("neoverse-n1")
    write_tuned(n1, "neoverse-n1", TunedFamily("iq4_xs", parse_spec("iq4_xs:dotprod:8x4"),
                                               parse_spec("iq4_xs:dotprod:1x8"), False), tmp_path)
    write_tuned(n1, "neoverse-n1", TunedFamily("q4_K", parse_spec("q4_K:dotprod:4x8"),
                                               parse_spec("q4_K:dotprod:1x4"), False), tmp_path)
    v = versus(n1, "iq4_xs", "q4_K", "gemv", tuned_dir=tmp_path)
    assert [s.spec.spec_string for s in v.pick] == ["iq4_xs:dotprod:1x8", "q4_K:dotprod:1x4"]
    assert [s.spec.spec_string for s in v.same] == ["iq4_xs:dotprod:1x8", "q4_K:dotprod:1x8"]
    mine, theirs = (_block_macs_per_cycle(s, "neoverse-n1")
                    for s in ("iq4_xs:dotprod:1x8", "q4_K:dotprod:1x4"))
    assert v.pick_ratio == pytest.approx(mine / theirs, rel=1e-9)
    assert v.same_ratio == pytest.approx(mine / _block_macs_per_cycle("q4_K:dotprod:1x8", "neoverse-n1"),
                                         rel=1e-9)
    bests = [tune(n1, f, "gemv").best for f in ("iq4_xs", "q4_K")]
    assert [s.spec for s in v.best] == [s.spec for s in bests]
    assert v.best_ratio == pytest.approx(bests[0].value / bests[1].value, rel=1e-9)
    assert v.pick_ratio != v.best_ratio     # the tuned file, not the ranking, gave the picks
    # no tuned entry: no pick, no pick ratio; the same tile then is the best tile's
    empty = versus(n1, "iq4_xs", "q4_K", "gemv", tuned_dir=tmp_path / "none")
    assert empty.pick == (None, None) and empty.pick_ratio is None
    assert empty.same[0].spec == bests[0].spec
    p = _cli("tune", "--target", "neoverse-n1", "--family", "iq4_xs", "--versus", "q4_K",
             "--m", "1", env={"TILEGEN_TUNED_DIR": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("gemv   runtime"))
    assert "iq4_xs:dotprod:1x8" in line and line.endswith(f"{mine / theirs:.3f}")
    p = _cli("tune", "--target", "neoverse-n1", "--family", "iq4_xs", "--versus", "q9")
    assert p.returncode == 2 and "--versus: unknown family 'q9'" in p.stderr
