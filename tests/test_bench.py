"""`tilegen bench` and `tune --measure`: the stopping rule and the ranking on a fake timer, the
harness under qemu (the picked kernels on the right work, outputs against numpy; every family
and every weights kind, K-quants from ggml blocks), the wall-clock fallback and the figures of
gemm and gemv rows, KleidiAI side by side, the JSON schema (strict JSON), the emulation label,
the option errors (one line, exit 2) and Ctrl-C (the partial table, exit 130)."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tilegen
from tilegen.bench import report
from tilegen.bench.clock import EMULATED_LABEL, emulation
from tilegen.bench.harness import KINDS, job_ggml, job_inputs
from tilegen.bench.stats import Reading, Rule, measure, median_ci
from tilegen.cli import main
from tilegen.generator.validate import parse_spec
from tilegen.layout import rhs_layout_for

from conftest import KLEIDIAI_TARBALL, SME_ON, guest

CPU = "neoverse-n1"
SHAPES = [(1, 36, 64), (5, 44, 96)]       # m, n not multiples of the tiles; k of 32


class FakeTimer:
    """A clock that only moves when a call "runs": each call costs the next duration."""
    counts_cycles = False
    name = "fake"

    def __init__(self, durations) -> None:
        self.t = 0
        self.calls = 0
        self._it = iter(durations)

    def now_ns(self) -> int:
        return self.t

    def call(self) -> None:
        self.calls += 1
        self.t += next(self._it)

    def time(self, fn, batch: int) -> Reading:
        t0 = self.t
        for _ in range(batch):
            fn()
        return Reading(float(self.t - t0))


def _cycle(*values):
    while True:
        yield from values


# -- the stopping rule ----------------------------------------------------------------------
def test_median_ci_is_the_order_statistic_interval():
    xs = [float(i) for i in range(100, 0, -1)]
    assert median_ci(xs) == (50.5, 40.0, 61.0)        # ranks 40 and 61 of 100 (95 %)
    assert median_ci([float(i) for i in range(1, 11)]) == (5.5, 1.0, 10.0)
    assert median_ci([3.0]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError):
        median_ci([])


def test_constant_timings_stop_on_the_ci_after_min_reps():
    t = FakeTimer(_cycle(1_000_000))
    s = measure(t.call, t, Rule(min_reps=5, warmup=2, min_sample_ns=0))
    assert (s.stop, s.reps, s.batch, t.calls) == ("ci", 5, 1, 2 + 1 + 5)
    assert s.summary()["median_ns"] == 1e6 and s.summary()["rel_ci"] == 0


def test_noisy_timings_stop_at_the_budget_then_at_max_reps():
    # 1 ms / 3 ms alternating: the CI spans both values, never within 2 %
    t = FakeTimer(_cycle(1_000_000, 3_000_000))
    s = measure(t.call, t, Rule(budget_s=0.02, warmup=2, min_sample_ns=0))
    # warm-up 1 + 3, first 1 (5 ms); samples 3, 1, 3, 1, 3, 1, 3 reach 20 ms at the 7th
    assert (s.stop, s.reps, t.now_ns()) == ("budget", 7, 20_000_000)
    t = FakeTimer(_cycle(1_000_000, 3_000_000))
    s = measure(t.call, t, Rule(budget_s=1e9, max_reps=12, warmup=0, min_sample_ns=0))
    assert (s.stop, s.reps) == ("max_reps", 12)


def test_short_calls_are_batched_and_converge_when_the_noise_is_small():
    t = FakeTimer(_cycle(10_000, 10_100, 9_900))
    s = measure(t.call, t, Rule(min_sample_ns=200_000, warmup=1))
    assert s.batch == 20 and s.stop == "ci"
    assert abs(s.summary()["median_ns"] - 10_000) < 100


# -- the measured ranking ---------------------------------------------------------------------
def test_measured_ranking_follows_the_timings_not_the_model():
    from tilegen.analysis.mca import LoopReport
    from tilegen.analysis.tune import Candidate, Ranking, Score, measured_ranking, pick_pair, tuned_entry
    specs = [parse_spec(s) for s in ("f32:neon:6x16", "f32:neon:8x8", "f32:neon:4x24",
                                     "f32:neon:1x16", "f32:neon:1x8")]
    model = {s.spec_string: v for s, v in zip(specs, (40.0, 30.0, 20.0, 10.0, 5.0))}

    def score(s):
        rep = LoopReport(s.name, "m", 1.0, 1.0, 4 * s.mr * s.nr, 8 * 4 * s.mr * s.nr / model[s.spec_string])
        return Score(Candidate(s, 8, s.mr, 0.1), rep)

    rk = {reg: Ranking("t", "m", "f32", reg, tuple(score(s) for s in specs if s.is_gemv == (reg == "gemv")))
          for reg in ("gemm", "gemv")}
    cost = {"f32:neon:6x16": 3_000_000, "f32:neon:8x8": 1_000_000, "f32:neon:4x24": 2_000_000,
            "f32:neon:1x16": 500_000, "f32:neon:1x8": 250_000}     # ns per call, fake timer
    macs = {"gemm": 64 * 64 * 64, "gemv": 64 * 64}
    thr = {}
    for reg, r in rk.items():
        thr[reg] = {}
        for s in r.scores:
            t = FakeTimer(_cycle(cost[s.spec.spec_string]))
            med = measure(t.call, t, Rule(min_sample_ns=0)).summary()["median_ns"]
            thr[reg][s.spec.spec_string] = macs[reg] / med
    got = {reg: measured_ranking(rk[reg], thr[reg]) for reg in rk}
    assert [s.spec.spec_string for s in got["gemm"].scores] == ["f32:neon:8x8", "f32:neon:4x24",
                                                               "f32:neon:6x16"]
    assert [s.spec.spec_string for s in got["gemv"].scores] == ["f32:neon:1x8", "f32:neon:1x16"]
    assert got["gemm"].scores[0].model_value == pytest.approx(30.0)
    ent = tuned_entry("f32", pick_pair(got["gemm"], got["gemv"]))
    assert ent.scores["gemm"] == round(macs["gemm"] / 1e6, 3)       # the measured throughput


@pytest.mark.parametrize("bad", [-1.0, 0.0, float("nan"), float("inf")])
def test_measured_ranking_refuses_what_is_no_throughput(bad):
    """A negative, zero or non-finite "throughput" (a wrong core clock, a broken timing) is a
    TuneError, never a row of the measured column."""
    from tilegen.analysis.mca import LoopReport
    from tilegen.analysis.tune import Candidate, Ranking, Score, TuneError, measured_ranking
    specs = [parse_spec(s) for s in ("f32:neon:6x16", "f32:neon:8x8")]
    scores = tuple(Score(Candidate(s, 8, s.mr, 0.1), LoopReport(s.name, "m", 1.0, 1.0, 96, 8.0))
                   for s in specs)
    rk = Ranking("t", "m", "f32", "gemm", scores)
    assert [s.value for s in measured_ranking(rk, {"f32:neon:6x16": 2.0, "f32:neon:8x8": 3.0})
            .scores] == [3.0, 2.0]
    with pytest.raises(TuneError, match="not a positive number"):
        measured_ranking(rk, {"f32:neon:6x16": 2.0, "f32:neon:8x8": bad})


# -- the harness under qemu -------------------------------------------------------------------
@pytest.fixture(scope="module")
def n1_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("benchlib")
    tilegen.build_library(target=CPU, out_dir=out / "lib", quiet=True)
    return out / "lib"


@pytest.fixture(scope="module")
def clock_so(tmp_path_factory):
    so = report.build_clock_routines(tmp_path_factory.mktemp("clock"))
    assert so is not None and so.is_file(), "needs clang (scripts/setup.sh)"
    return so


def _cfg(lib, clock_so, **kw):
    cfg = {"lib": str(lib), "shapes": SHAPES, "threads": [1, 2], "kinds": ["f32", "q4_0", "q8_0"],
           "rule": {"budget_s": 0.05, "min_sample_ns": 0, "warmup": 1}, "clock": "auto",
           "clock_routines": str(clock_so), "bandwidth_mib": 1, "outputs": True, "seed": 3,
           "progress": False}
    cfg.update(kw)
    return cfg


def _reference(row, seed: int = 3):
    """float64 x @ W.T for the row's job, W as the row's kernel's packed layout holds it (the
    job's ggml blocks for the formats that take only those)."""
    m, n, k = row["m"], row["n"], row["k"]
    x, w = job_inputs(seed, m, n, k)
    spec = parse_spec(row["spec"])
    lay = rhs_layout_for(spec, 32, 16 if spec.vl_scaled else None)   # any VL: same values
    raw = job_ggml(seed, lay, n, k)
    if raw is not None:
        w = lay.dequantize_rows(lay.pack_from_ggml(raw, n, k), n, k, range(n))
    elif spec.info.quantized:
        w = lay.dequantize_rows(lay.pack_from_float(w), n, k, range(n))
    return x.astype(np.float64) @ np.asarray(w, np.float64).T


def _rel_err(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_harness_runs_the_picked_kernels_on_the_right_work(n1_lib, clock_so):
    res = guest(CPU).call("tilegen.bench.harness:run", _cfg(n1_lib, clock_so))
    rows = res["rows"]
    assert res["machine"]["emulated"] and res["machine"]["label"] == EMULATED_LABEL
    for kind in ("f32", "q4_0", "q8_0"):
        for m, n, k in SHAPES:
            job = [r for r in rows if (r["kind"], r["m"], r["n"], r["k"]) == (kind, m, n, k)]
            assert [(r["what"], r["threads"]) for r in job] == [("kernel", 1), ("plan", 1),
                                                                ("plan", 2)], job
            spec = parse_spec(job[0]["spec"])
            assert spec.family == kind and spec.is_gemv == (m == 1)
            assert {r["kernel"] for r in job} == {spec.name}     # the plan runs the same kernel
            want = _reference(job[0])
            for r in job:
                assert r["out"].shape == (m, n) and r["weights_bytes"] > 0
                assert r["timing"]["reps"] >= 1 and r["timing"]["median_ns"] > 0
                # f32: rounding only; int8 activations: their quantisation
                assert _rel_err(r["out"], want) < (1e-5 if kind == "f32" else 2e-2), r["kernel"]
            assert np.array_equal(job[0]["out"], job[1]["out"])   # same packers, same kernel
            assert np.array_equal(job[1]["out"], job[2]["out"])   # any threads: bit-identical


def test_named_kernels_run_at_every_shape(n1_lib, clock_so):
    names = ["q8_0:dotprod:1x4", "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"]
    res = guest(CPU).call("tilegen.bench.harness:run", _cfg(n1_lib, clock_so, kernels=names))
    rows = res["rows"]
    assert [(r["what"], r["spec"], r["m"]) for r in rows] == [
        ("kernel", s, m) for m, _, _ in SHAPES for s in ("q8_0:dotprod:1x4", "f32:neon:6x16")]
    for r in rows:      # a gemv kernel at m = 5 too: it runs m row by row
        assert _rel_err(r["out"], _reference(r)) < (1e-5 if r["kind"] == "f32" else 2e-2)


def test_wall_clock_fallback_and_the_core_frequency(n1_lib, clock_so):
    g = guest(CPU)
    # a gemv and a gemm job (m > 1, m != n, nothing square): the figures count m*n*k MACs
    small = dict(shapes=[(1, 32, 64), (3, 20, 96)], kinds=["f32"], plan=False)
    auto = g.call("tilegen.bench.harness:run", _cfg(n1_lib, clock_so, **small))
    forced = g.call("tilegen.bench.harness:run", _cfg(n1_lib, clock_so, clock="wall",
                                                      freq_ghz=2.0, **small))
    # qemu-user has no perf_event_open: auto falls back and says why
    assert auto["machine"]["counter"] == "wall"
    assert "PERF_COUNT_HW_CPU_CYCLES" in auto["machine"]["counter_why"]
    assert auto["machine"]["core_ghz_source"].startswith("measured")
    assert auto["machine"]["core_ghz"] > 0 and auto["machine"]["cntfrq_hz"] > 0
    assert forced["machine"]["counter_why"] == "wall clock requested (--clock wall)"
    assert (forced["machine"]["core_ghz"], forced["machine"]["core_ghz_source"]) == (2.0, "--freq-ghz")
    doc = report.join(forced, str(n1_lib), CPU, "neoverse-n1")
    assert [(r["m"], r["n"], r["k"]) for r in doc["rows"]] == [(1, 32, 64), (3, 20, 96)]
    assert parse_spec(doc["rows"][1]["spec"]).mr > 1          # the gemm row runs a gemm kernel
    for r in doc["rows"]:
        macs, ns = r["m"] * r["n"] * r["k"], r["timing"]["median_ns"]
        assert not r["cycles_counted"] and r["cycles_source"].startswith("wall time x 2.000 GHz")
        assert r["macs_per_cycle"] == pytest.approx(macs / (ns * 2.0))
        assert r["macs_per_cycle_per_thread"] == pytest.approx(macs / (ns * 2.0))
        assert r["gflops"] == pytest.approx(2 * macs / ns)          # FLOP per ns = GFLOP/s
        assert r["model_macs_per_cycle"] > 0
        assert r["ratio_to_model"] == pytest.approx(r["macs_per_cycle"] / r["model_macs_per_cycle"])
    with pytest.raises(Exception, match="perf_event_open"):
        g.call("tilegen.bench.harness:run", _cfg(n1_lib, clock_so, clock="perf", **small))


def test_kleidiai_kernels_of_the_same_jobs(n1_lib, clock_so):
    kai = report.kleidiai_config(KLEIDIAI_TARBALL, quiet=True)
    cfg = _cfg(n1_lib, clock_so, kinds=["q8_0"], plan=False, kleidiai=kai)
    rows = guest(CPU).call("tilegen.bench.harness:run", cfg)["rows"]
    for m, n, k in SHAPES:
        mine = [r for r in rows if r["m"] == m and r["what"] == "kernel"]
        theirs = [r for r in rows if r["m"] == m and r["what"] == "kleidiai"]
        assert len(mine) == 1 and theirs, rows
        names = {r["kernel"] for r in theirs}
        # n1 has dotprod, not i8mm: KleidiAI's dotprod kernels of the regime, nothing else
        want = ({"kai_run_matmul_clamp_f32_qai8dxp1x8_qsi8cxp4x8_1x4_neon_dotprod",
                 "kai_run_matmul_clamp_f32_qai8dxp1x4_qsi8cxp4x4_1x4_neon_dotprod"} if m == 1 else
                {"kai_run_matmul_clamp_f32_qai8dxp4x4_qsi8cxp4x4_16x4_neon_dotprod"})
        assert names == want
        for r in theirs:
            assert r["kleidiai_version"] == "1.24.0"
            assert _rel_err(r["out"], _reference(r)) < 2e-2, r["kernel"]


# -- the command line -------------------------------------------------------------------------
def test_bench_json_follows_the_schema_and_every_figure_is_labelled(n1_lib, capsys):
    assert main(["bench", str(n1_lib), "--kind", "q8_0", "--shape", "1,32,64", "--shape",
                 "3,20,64", "--threads", "2", "--budget", "0.05", "--bandwidth-mib", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out, parse_constant=_refuse)
    assert report.check_schema(doc) == [] and doc["interrupted"] is False
    assert doc["label"] == EMULATED_LABEL and doc["machine"]["emulated"] is True
    assert {r["label"] for r in doc["rows"]} == {EMULATED_LABEL}
    assert [(r["what"], r["m"], r["threads"]) for r in doc["rows"]] == [
        ("kernel", 1, 1), ("plan", 1, 1), ("plan", 1, 2), ("kernel", 3, 1), ("plan", 3, 1),
        ("plan", 3, 2)]
    assert doc["model"] == "neoverse-n1" and all(r["model_macs_per_cycle"] for r in doc["rows"])
    text = report.table(doc)
    assert text.count(EMULATED_LABEL) == 2
    bad = json.loads(json.dumps(doc))
    del bad["rows"][0]["gflops"]
    bad["rows"][1]["m"] = "1"
    bad["machine"]["emulated"] = 1
    assert report.check_schema(bad) == ["$.machine.emulated: expected bool, got int",
                                        "$.rows[0].gflops: missing",
                                        "$.rows[1].m: expected int, got str"]


def test_bench_refuses_a_macho_library_under_the_emulator(tmp_path, monkeypatch, capsys):
    from test_cli import _fake_lib
    monkeypatch.setattr(report, "run_harness", _no_emulator)
    assert main(["bench", str(_fake_lib(tmp_path / "m", "macho"))]) == 2
    assert "Mach-O needs macOS" in capsys.readouterr().err


def _no_emulator(*a, **k):
    raise AssertionError("the harness must not start")


def _digest_fails(lib, out):
    """A copy of ``lib`` whose manifest lacks one kernel: the library's kernel-table digest
    no longer matches it (a LoadError when the harness loads it)."""
    import shutil
    shutil.copytree(lib, out)
    m = json.loads((out / "manifest.json").read_text())
    m["kernels"] = m["kernels"][:-1]
    (out / "manifest.json").write_text(json.dumps(m))
    return out


TUNE = ["tune", "--target", CPU, "--family", "q8_0", "--measure"]


# (argv after "bench LIB" or a tune command, the message's words, the harness starts)
@pytest.mark.parametrize("argv,needle,starts", [
    (["--shape", "1,2"], "give m,n,k", False), (["--shape", "0,4,4"], "give m,n,k", False),
    (["--shape", "1,1099511627776,256"], "the bound is 2 GiB per job", False),
    (["--threads", "0"], "--threads '0'", False), (["--threads", "x"], "--threads 'x'", False),
    (["--threads", "4097,1"], "at most 4096 threads", False),
    (["--threads", "5000"], "at most 4096 threads", False),
    (["--budget", "0"], "--budget must be a finite number above 0", False),
    (["--budget", "nan"], "--budget must be a finite number above 0", False),
    (["--rel-ci", "nan"], "--rel-ci must be a finite number above 0", False),
    (["--rel-ci", "-0.1"], "--rel-ci must be a finite number above 0", False),
    (["--freq-ghz", "-1"], "--freq-ghz must be a finite number above 0", False),
    (["--freq-ghz", "nan"], "--freq-ghz must be a finite number above 0", False),
    (["--freq-ghz", "inf"], "--freq-ghz must be a finite number above 0", False),
    (["--bandwidth-mib", "0"], "--bandwidth-mib must be a finite number from 1", False),
    (["--bandwidth-mib", "-5"], "--bandwidth-mib must be a finite number from 1", False),
    (["--cpu", "nosuch"], "unknown cpu model 'nosuch'", False),
    (["--sve-vl", "100"], "SVE vector length 100 is invalid", False),
    (["--kind", "nosuch"], "--kind 'nosuch': unknown weights kind", False),
    (["--kind", "bf16"], "the library has no kernel of bf16", False),    # n1: no bf16
    (["--kernel", "f32:neon:7x12"], "has no such kernel", False),
    (["--kernel", "nope"], "no such kernel", False),
    ([TUNE, "--freq-ghz", "-1"], "--freq-ghz must be a finite number above 0", False),
    ([TUNE, "--budget", "nan"], "--budget must be a finite number above 0", False),
    ([TUNE, "--bandwidth-mib", "0"], "--bandwidth-mib must be a finite number from 1", False),
    ([TUNE, "--cpu", "nosuch"], "unknown cpu model 'nosuch'", False),
    ([TUNE, "--measure-shape", "0,0,0"], "--measure-shape '0,0,0': give m,n,k", False),
    ([TUNE, "--measure-shape", "2,1099511627776,256"], "--measure-shape", False),
    (["--digest"], "kernel table is not the one libtilegen.so was built with", True),
    (["--kind", "q4_K", "--shape", "1,8,64"], "nothing to time: q4_K: shape 1,8,64: k=64: k "
                                              "must be a multiple of 256", True),
])
def test_bench_and_tune_option_errors(n1_lib, tmp_path, argv, needle, starts, monkeypatch,
                                      capsys):
    """Each bad option: one line `tilegen <cmd>: error: ...` on stderr, exit 2, no traceback;
    checked before the harness starts (except the library's digest and a shape its kernels'
    layouts refuse, which the harness finds: its one-line error comes back)."""
    import tilegen.analysis.tune as T
    if not starts:
        monkeypatch.setattr(report, "run_harness", _no_emulator)
        monkeypatch.setattr(T, "tune", _no_emulator)
    lib = _digest_fails(n1_lib, tmp_path / "lib") if argv == ["--digest"] else n1_lib
    small = ["--budget", "0.05", "--bandwidth-mib", "1", "--no-plan"]
    if argv and argv[0] == TUNE:
        cmd, full = "tune", [*TUNE, *argv[1:]]
    else:
        cmd, full = "bench", ["bench", str(lib), *[a for a in argv if a != "--digest"],
                              *(small if starts else [])]
    assert main(full) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"tilegen {cmd}: error: ") and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and out == ""


def test_json_output_is_strict():
    """--json never writes NaN or Infinity (not JSON): they become null."""
    doc = {"a": float("nan"), "b": [1.5, float("inf"), -float("inf")], "c": {"d": 2, "e": None}}
    text = report.to_json(doc)
    assert json.loads(text, parse_constant=_refuse) == {"a": None, "b": [1.5, None, None],
                                                       "c": {"d": 2, "e": None}}


def _refuse(name):
    raise AssertionError(f"non-standard JSON constant {name}")


def test_perf_event_plumbing_on_a_software_event():
    """The counter path (syscall, attribute block, reset/enable/disable ioctls, read) on the
    task clock, which any Linux kernel counts (this VM has no hardware cycle counter, and
    qemu-user no perf_event_open): the count is the CPU time of the timed calls, in ns."""
    from tilegen.bench.clock import PERF_SW_TASK_CLOCK, PerfCycles
    t = PerfCycles(PERF_SW_TASK_CLOCK)
    try:
        r = t.time(lambda: sum(range(200_000)), 3)
        again = t.time(lambda: None, 1)          # reset between intervals
    finally:
        t.close()
    # CPU time within the wall time (less when this shared machine is busy), and reset
    assert r.cycles is not None and 1e5 < r.cycles <= 1.05 * r.ns
    assert again.cycles < r.cycles / 20


def test_thread_lists_and_emulation_checks(monkeypatch):
    assert report.parse_threads("4") == [1, 2, 3, 4]
    assert report.parse_threads("2..3") == [2, 3] and report.parse_threads("1,8") == [1, 8]
    assert report.guest_cpu("neoverse-v1") == "neoverse-v1" and report.guest_cpu("apple-m4") == "max"
    monkeypatch.setenv("TILEGEN_EMULATED_CPU", "cortex-a53")
    assert emulation()[0] is True
    monkeypatch.setenv("TILEGEN_EMULATED_CPU", "host")
    assert emulation()[0] is False      # this x86-64 host runs its own code natively


def test_tune_measure_refuses_emulated_timings_unless_forced(tmp_path, capsys, monkeypatch):
    import tilegen.analysis.tune as T
    real = T.tune
    # the real model and search, over a small grid (mr 1 and 4, nr 4 and 8): fast
    monkeypatch.setattr(T, "tune", lambda *a, **k: real(*a, **k, mrs=(1, 4), nrs=(4, 8)))
    argv = ["tune", "--target", CPU, "--family", "q8_0", "--isa", "dotprod", "--measure",
            "--top", "2", "--measure-shape", "4,32,64", "--budget", "0.05", "--bandwidth-mib",
            "1", "--write", "--tuned-dir", str(tmp_path)]
    assert main(argv) == 2      # x86-64 host: refused before anything is timed
    assert "not written from emulated timings" in capsys.readouterr().err
    assert not (tmp_path / f"{CPU}.json").exists()
    # the harness's own check (a tilegen inside the guest passes the host's): the measured
    # rankings are shown, labelled, then refused
    real_run = report.run_harness
    monkeypatch.setattr(report, "will_emulate", lambda: False)
    monkeypatch.setattr(report, "run_harness", lambda cfg, **kw: real_run(cfg, emulate=True, **kw))
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert "not writing a tuned file" in err and EMULATED_LABEL in out
    assert not (tmp_path / f"{CPU}.json").exists()
    assert main(argv + ["--force"]) == 0
    capsys.readouterr()
    data = json.loads((tmp_path / f"{CPU}.json").read_text())["families"]["q8_0"]
    meas = data["measured"]
    assert meas["method"]["emulated"] is True and meas["method"]["label"] == EMULATED_LABEL
    assert meas["method"]["shapes"] == {"gemm": "4,32,64", "gemv": "1,32,64"}
    for reg in ("gemm", "gemv"):
        ranking = meas["ranking"][reg]
        assert len(ranking) == 2
        assert [r["measured"] for r in ranking] == sorted((r["measured"] for r in ranking),
                                                          reverse=True) or \
            abs(ranking[0]["measured"] - ranking[1]["measured"]) <= 0.01 * ranking[0]["measured"]
        assert data["scores"][reg] == pytest.approx(
            next(r["measured"] for r in ranking if r["spec"] == data[reg]), abs=1e-3)
    from tilegen.build import get_target
    from tilegen.build.tuned import read_tuned
    assert read_tuned(get_target(CPU), tmp_path).families["q8_0"].measured == meas


def test_ctrl_c_prints_the_rows_measured_and_one_line(n1_lib):
    """SIGINT to `tilegen bench` (as a terminal's Ctrl-C: the whole process group) once the
    first row is measured: the table of the rows measured so far on stdout, then one line,
    exit 130; no traceback from the host or the emulated guest."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-m", "tilegen", "bench", str(n1_lib), "--kind", "f32", "--kind",
            "q8_0", "--shape", "1,64,256", "--shape", "2,64,256", "--threads", "2", "--budget",
            "1", "--rel-ci", "1e-9", "--bandwidth-mib", "1"]
    # a CI no run reaches: every measurement runs to its 1 s budget, so the rows after the
    # first take seconds and the signal lands while they run (with 0.2 s and the default CI an
    # idle machine finished all 12 before the signal reached the guest)
    # SIGINT delivered and at its default action in the child, as a terminal's shell starts a
    # command: an ignored or blocked SIGINT is inherited (a run started in the background
    # without job control ignores it, and Python installs no KeyboardInterrupt handler then)
    def _sigint_default():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    p = subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=_sigint_default)
    err = b""
    try:
        while b"tilegen bench: [2/" not in err:         # until the first row is measured
            chunk = os.read(p.stderr.fileno(), 65536)       # unbuffered: communicate reads on
            assert chunk, err.decode()
            err += chunk
        os.killpg(p.pid, signal.SIGINT)
        out, rest = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    err, out = (err + rest).decode(), out.decode()
    assert p.returncode == 130, err
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out
    lines = [x for x in err.splitlines() if not x.startswith("tilegen bench: [")]
    assert len(lines) == 1, (err, out)
    done, total = (int(v) for v in re.fullmatch(
        r"tilegen bench: interrupted: (\d+) of (\d+) measurements done \(printed above\)",
        lines[0]).groups())
    assert total == 12 and 1 <= done < total
    rows = [x for x in out.splitlines()
            if x.split()[:1] in (["kernel"], ["plan"]) and x.split()[1] in ("f32", "q8_0")]
    assert len(rows) == done and rows[0].split()[:2] == ["kernel", "f32"]
    assert "interrupted (Ctrl-C)" in out and out.count(EMULATED_LABEL) == 2


# -- every family and every weights kind ------------------------------------------------------
def _family_kernels() -> dict:
    """One kernel per family of the records (a gemm where the family has one, NEON before
    VL-scaled): from linux-aarch64-all's defaults, which hold every family."""
    from tilegen.build import default_specs, get_target
    from tilegen.families import FAMILIES
    specs = default_specs(get_target("linux-aarch64-all"))
    return {fam: min((s for s in specs if s.family == fam),
                     key=lambda s: (s.vl_scaled, s.is_gemv)) for fam in FAMILIES}


def _tune_target(fam):
    """(target, isa) to `tune --measure` a family on: a preset whose features run one of the
    family's ISAs, one with an llvm-mca model (not SME) first."""
    from tilegen.build.targets import TARGETS
    from tilegen.records import ISAS
    for modelled in (True, False):
        for tgt in TARGETS.values():
            for isa in fam.isas:
                if (set(ISAS[isa].features) <= tgt.features and tgt.llvm_cpu
                        and (ISAS[isa].vl_kind != "sme") == modelled):
                    return tgt.name, isa
    raise AssertionError(f"no preset runs a {fam.name} ISA")


@pytest.fixture(scope="module")
def every_family_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("every") / "lib"
    tilegen.build_library(list(_family_kernels().values()), target="linux-aarch64-all",
                          out_dir=out, quiet=True)
    return out


def test_every_family_and_kind_is_timed_on_valid_operands(every_family_lib, clock_so):
    """The harness times one kernel of every family of the records (K-quants on seeded ggml
    blocks, the SME2 q4_0 layouts, bf16) and the library's picks and plans for every runtime
    weights kind (f16 weights too), on cpu max with SME: each output against float64 numpy
    over the weights its packed layout holds."""
    kernels = _family_kernels()
    rule = {"budget_s": 0.02, "min_sample_ns": 0, "warmup": 1, "min_reps": 3}
    shapes = [(1, 20, 512), (3, 20, 512)]
    g = guest("max", env=SME_ON)
    res = g.call("tilegen.bench.harness:run", _cfg(
        every_family_lib, clock_so, shapes=[(3, 20, 512)], rule=rule,
        kernels=[s.spec_string for s in kernels.values()]))
    assert res["skipped"] == [] and not res["interrupted"]
    assert [r["spec"] for r in res["rows"]] == [s.spec_string for s in kernels.values()]
    by_kind = g.call("tilegen.bench.harness:run", _cfg(
        every_family_lib, clock_so, shapes=shapes, rule=rule, kinds=list(KINDS), threads=[1]))
    assert by_kind["skipped"] == []
    assert sorted({(r["kind"], r["m"], r["what"]) for r in by_kind["rows"]}) == sorted(
        (kind, m, what) for kind in KINDS for m, _, _ in shapes for what in ("kernel", "plan"))
    for r in res["rows"] + by_kind["rows"]:
        assert r["timing"]["median_ns"] > 0 and r["weights_bytes"] > 0
        tol = 1e-5 if parse_spec(r["spec"]).family == "f32" else 2e-2
        assert _rel_err(r["out"], _reference(r)) < tol, (r["kind"], r["spec"])


def test_every_family_is_tuned_by_timings(monkeypatch, capsys):
    """`tune --measure` ranks one kernel of each op of every family of the records by its
    timing (a small grid, tiny shapes; SME-only families by timings alone, llvm-mca has no
    SME model): positive measured throughputs in strict JSON.  The harness runs in one
    persistent guest on cpu max with SME opted in (the subprocess path: the tests above)."""
    import tilegen.analysis.tune as T
    from tilegen.families import FAMILIES
    real = T.tune
    monkeypatch.setattr(T, "tune", lambda *a, **k: real(*a, **k, mrs=(1, 4), nrs=(4, 8)))
    monkeypatch.setattr(report, "run_harness", lambda cfg, cpu, sve_vl=None, sme_vl=None: guest(
        cpu, sve_vl, sme_vl, env=SME_ON).call("tilegen.bench.harness:run", cfg))
    for fam in FAMILIES.values():
        target, isa = _tune_target(fam)
        argv = ["tune", "--target", target, "--family", fam.name, "--isa", isa, "--measure",
                "--top", "1", "--measure-shape", "2,8,256", "--budget", "0.02",
                "--bandwidth-mib", "1", "--cpu", "max", "--json"]
        assert main(argv) == 0, (fam.name, capsys.readouterr().err)
        doc = json.loads(capsys.readouterr().out, parse_constant=_refuse)
        ranking = doc["measured"]["ranking"]
        # a family whose gemv is another family's (q4_0_f16) ranks its gemm kernels only
        assert set(ranking) == ({"gemm"} if fam.gemv_family else {"gemm", "gemv"}), fam.name
        for reg, rows in ranking.items():
            assert len(rows) == 1 and rows[0]["measured"] > 0, (fam.name, reg, rows)
            assert parse_spec(rows[0]["spec"]).family == fam.name
