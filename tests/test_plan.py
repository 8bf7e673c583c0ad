"""Prepared matmuls (lib.plan): bit-identical to lib.matmul, argument errors, reuse, threads.

No timing here: the performance claims come from bench/call_overhead.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import tilegen
from tilegen.build.driver import source as driver_source
from tilegen.runtime import driver as D

from conftest import SME_ON, guest

# shapes: edge n (1, not a multiple of nr), k (q4: multiples of 32), m 1 (gemv) to > m_step
SHAPES = ((1, 1, 32), (1, 45, 64), (2, 7, 96), (5, 45, 64), (17, 33, 32), (1, 100, 128))
KINDS = ("f32", "q4_0", "q4_0_dx", "q8_0", "f16")


@pytest.fixture(scope="module")
def plan_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("planlib")
    tilegen.build_library(None, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu,kinds,env", [
    ("neoverse-n1", KINDS, None),                 # NEON, dotprod: no bf16
    ("max", KINDS + ("bf16",), None),             # SVE kernels (VL-scaled), i8mm, bf16
    ("max", ("f32", "q4_0", "bf16"), SME_ON),     # SME: the VL-row LHS packers (runtime mr)
])
def test_plan_bit_identical_to_matmul(plan_lib, cpu, kinds, env):
    r = guest(cpu, env=env).call("guest_plan:plan_vs_matmul", str(plan_lib), kinds, SHAPES,
                                 (1, 2, 3))
    assert r["bad"] == [], r["bad"][:10]
    fams = {kind for kind, _, _ in r["ran"]}
    assert fams == set(kinds)
    assert all(native for _, name, native in r["ran"]), [x for x in r["ran"] if not x[2]]
    if env is not None:
        assert any("sme" in name for _, name, _ in r["ran"]), r["ran"]
    if "bf16" in kinds:
        assert any("bf16p" in name for _, name, _ in r["ran"])


def test_plan_any_k_families(plan_lib):
    """Families without a block length: k not a multiple of 32 (down to 1), odd n and m."""
    shapes = ((1, 5, 7), (3, 9, 1), (4, 17, 33), (9, 2, 45))
    r = guest("max").call("guest_plan:plan_vs_matmul", str(plan_lib),
                          ("f32", "q8_0", "bf16", "f16"), shapes, (1, 2), 4)
    assert r["bad"] == [], r["bad"][:10]
    assert all(native for _, _, native in r["ran"]), r["ran"]


def test_plan_without_driver_falls_back(plan_lib):
    """A library built before the driver (or another driver ABI): plans run through ops."""
    r = guest("neoverse-n1").call("guest_plan:plan_vs_matmul", str(plan_lib), ("f32", "q4_0"),
                                  SHAPES[:4], (1, 2), 1, True)
    assert r["bad"] == []
    assert not any(native for _, _, native in r["ran"])


def test_plan_argument_errors(plan_lib):
    r = guest("neoverse-n1").call("guest_plan:plan_errors", str(plan_lib))
    expect = {
        "weights not packed": "weights must be PackedWeights",
        "m 0": "m must be a positive int", "m float": "m must be a positive int",
        "bias shape": "bias must be float32 of shape (12,)",
        "bias dtype": "bias must be float32 of shape (12,)",
        "clamp": "clamp min", "threads 0": "threads must be", "threads bool": "threads must be",
        "x float64": "x must be a float32 numpy array", "x list": "x must be a float32",
        "x 1-D": "x must have shape (m, k)", "x wrong k": "x has k=96",
        "x too many rows": "x has 5 rows (shape (5, 64)); the plan was made for at most m=4",
        "x batched too many rows": "x has 8 rows",
        "x no rows": "x has no rows",
        "out wrong shape": "out must be a writeable C-contiguous float32 array of shape (4, 12)",
        "out float64": "out must be", "out read-only": "out must be", "out strided": "out must be",
        "out list": "out must be",
        "x nan": "q4_0 activations must be finite with |x| <= 8.31901e+06",
        "x too big": "got max |x| = 1e+07",
        "x inf, shared pack": "got max |x| = inf",
    }
    for name, text in expect.items():
        assert r[name] is not None, name
        kind, msg = r[name]
        assert kind == "ArgumentError" and text in msg, (name, r[name])
    assert r["x nan"] == r["matmul x nan"]           # the message matmul gives
    assert r["x too big 1 row"] == r["matmul x too big"]
    assert not r["out after failed calls"].any()     # refused calls write nothing
    assert r["shared pack tasks"] == 2 and not r["out after failed shared call"].any()
    assert r["still right"]


@pytest.mark.parametrize("kind", ["q4_0", "f32"])
def test_plan_reused_many_times(plan_lib, kind):
    r = guest("neoverse-n1").call("guest_plan:plan_reuse", str(plan_lib), kind)
    assert r["bad"] == [] and r["native"]
    assert set(r["variants"]) <= set(range(1, 7)) and 6 in r["variants"]


def test_plan_thread_counts_and_concurrent_callers(plan_lib):
    r = guest("neoverse-n1").call("guest_plan:plan_threads", str(plan_lib))
    for m in (1, 9):
        assert r[m] == {"alternating": True, "concurrent_bad": [], "errors": []}, r[m]
    assert r["pool_workers"] == 7        # threads - 1 of the biggest plan


def test_plan_after_fork(plan_lib):
    r = guest("neoverse-n1").call("guest_plan:plan_after_fork", str(plan_lib))
    assert r["before"] and r["after"] and r["child"][0] is True and r["child"][1] >= 1, r


def test_driver_source_is_freestanding(tmp_path):
    """The driver object calls nothing outside itself (no libc, no outlined atomics), and the
    C structs are the ctypes mirror's (same fields, in order)."""
    from tilegen.build.toolchain import discover
    src = driver_source()
    for name in ("tg_plan", "tg_pool", "tg_pack", "tg_mm"):
        assert f"struct {name} {{" in src
    tc = discover("elf")
    c = tmp_path / "d.c"
    c.write_text(src)
    obj = tmp_path / "d.o"
    subprocess.run(tc.assemble_cmd(c, obj, "-O2", "-ffreestanding", "-fno-stack-protector",
                                   "-fno-builtin", "-mno-outline-atomics"), check=True)
    nm = shutil.which("llvm-nm-19") or shutil.which("llvm-nm") or shutil.which("nm")
    assert nm, "needs llvm-nm (scripts/setup.sh installs llvm-19)"
    und = subprocess.run([nm, "-u", str(obj)], capture_output=True, text=True, check=True)
    assert und.stdout.strip() == ""
    assert [f[0] for f in D.PlanStruct._fields_] == [f[0] for f in D.PLAN_FIELDS]


def test_runtime_import_does_not_load_jinja2():
    """The runtime never renders templates: jinja2 is imported when one is rendered."""
    import sys
    code = ("import sys, tilegen, tilegen.runtime; assert 'jinja2' not in sys.modules; "
            "tilegen.generate('f32:neon:1x4'); assert 'jinja2' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


# -- hardening (issue 21): fork, thread lifetime, table snapshot, allocation, environment ------
def test_fork_while_a_thread_prepares_row_counts(plan_lib):
    """200 forks while another thread of the parent prepares row counts of the same plan: a
    child that calls the plan with an unprepared row count never blocks on a lock the other
    thread held at the fork (reset in the child), and computes the same bits."""
    r = guest("neoverse-n1", env={"TILEGEN_TEST_FRESH": "fork"}).call(
        "guest_plan:fork_while_preparing", str(plan_lib), 200)
    assert r["hangs"] == [] and r["bad"] == [] and r["errors"] == [], r
    assert r["prepared_during"] > 0, r


def test_threads_end_with_their_library(plan_lib):
    """30 x (load, plan(threads=4), call, matmul(threads=4), del, gc) returns the thread count
    to its baseline; a plan keeps the pool alive on its own; close() and ``with`` end every
    thread at once and make the plans and matmul refuse."""
    r = guest("neoverse-n1", env={"TILEGEN_TEST_FRESH": "threads"}).call(
        "guest_plan:threads_after_cycles", str(plan_lib), 30)
    assert r["peak"][0] > r["base"][0], r          # the threads did start
    assert r["after_cycles"] == r["base"], r
    assert r["plan_alone_ok"] and r["plan_alone_threads"] >= 1, r
    assert r["after_plan_dropped"] == r["base"], r
    assert r["open_threads"] >= 1 and r["closed_threads"] == 0, r
    assert r["refused"] == [("plan call", True), ("plan call, other rows", True),
                            ("matmul", True), ("plan", True)], r
    assert r["rows_after_close"] == (2, 64), r
    assert r["with_open"] >= 1 and r["with_closed"] == 0, r
    assert r["end"] == r["base"], r


def test_plan_made_while_the_library_closes(plan_lib):
    """lib.plan racing lib.close() (found by tests/test_state.py's state machine): the plan
    used to escape the close (callable afterwards) and start pool threads on the closed
    library when it made the library's plan driver.  Now lib.plan raises ArgumentError and
    starts nothing, whether the driver existed or not."""
    r = guest("neoverse-n1", env={"TILEGEN_TEST_FRESH": "close-race"}).call(
        "guest_plan:plan_made_while_closing", str(plan_lib))
    for case in ("first plan", "driver exists"):
        c = r[case]
        assert not c["plan"] and c["error"] is not None, (case, c)
        assert c["error"][0] == "ArgumentError" and "closed" in c["error"][1], (case, c)
        assert c["threads"] == 0, (case, c)


def test_fork_while_the_lifetime_lock_is_held(plan_lib):
    """The lock that orders close() and plan registration is reset in a forked child."""
    r = guest("neoverse-n1", env={"TILEGEN_TEST_FRESH": "close-race"}).call(
        "guest_plan:fork_while_closing_lock_held", str(plan_lib))
    assert not r["hung"] and r["child"] == ("ok", True, True), r


def test_plan_keeps_its_kernel_table(plan_lib):
    """set_table and gemv_threshold after the plan do not change the plan's kernels, for row
    counts it prepares later (README: a plan keeps its kernel table)."""
    r = guest("max").call("guest_plan:plan_keeps_its_table", str(plan_lib))
    assert r["got"] == {3: True, 2: True, 1: True, 8: True}, r
    assert r["first"] == r["later"], r
    assert r["new_table_kernel"] == r["other"] != r["cur"] and r["new_plan_ok"], r


def test_plan_allocates_for_the_rows_given(plan_lib):
    """An m no address space holds is refused when the plan is made; a 1-row call of a plan
    for 2**20 rows (4 GiB of output) allocates its one row, not the planned m."""
    r = guest("neoverse-n1").call("guest_plan:plan_allocations", str(plan_lib))
    for m in (2**40, 2**62):
        assert "TiB" in r[m] and f"m={m}" in r[m], r
    assert r["one_row_same"], r
    assert r["one_row_peak_bytes"] < 1 << 20, r


def test_bad_thread_environment(plan_lib):
    """TILEGEN_PLAN_SPIN and TILEGEN_THREADS outside their ranges (or not integers) are an
    ArgumentError naming the variable; in-range values work."""
    r = guest("neoverse-n1").call("guest_plan:bad_env", str(plan_lib))
    for var, good in (("TILEGEN_PLAN_SPIN", ("0", "500")), ("TILEGEN_THREADS", ("3",))):
        for (v_, val), got in r.items():
            if v_ != var:
                continue
            assert got == ("ok" if val in good else ("ArgumentError", True)), (var, val, got)


def test_spin_count_parsing(monkeypatch):
    from tilegen.runtime.errors import ArgumentError
    from tilegen.runtime.driver import DEFAULT_SPIN, MAX_SPIN, spin_count
    monkeypatch.delenv("TILEGEN_PLAN_SPIN", raising=False)
    assert spin_count() == DEFAULT_SPIN
    for v, want in (("0", 0), (" 7 ", 7), (str(MAX_SPIN), MAX_SPIN), ("", DEFAULT_SPIN)):
        monkeypatch.setenv("TILEGEN_PLAN_SPIN", v)
        assert spin_count() == want
    for v in ("-1", "abc", "1e3", "2.5", str(MAX_SPIN + 1), str(2**64 - 1)):
        monkeypatch.setenv("TILEGEN_PLAN_SPIN", v)
        with pytest.raises(ArgumentError, match="TILEGEN_PLAN_SPIN"):
            spin_count()


@pytest.mark.parametrize("cpu,kinds,env", [
    ("neoverse-n1", KINDS + ("q4_K", "q6_K"), None),
    ("max", ("f32", "bf16", "q4_K", "q8_0"), SME_ON),     # SME: VL-row LHS packers
])
def test_plan_for_a_huge_m_allocates_nothing_for_it(plan_lib, cpu, kinds, env):
    """lib.plan(w, m=2**30) used to allocate the packed-LHS workspace of all m rows when the
    plan was made (numpy's MemoryError "Unable to allocate ... GiB" for k = 4096): the
    workspace of a row count is allocated by the first call with that many rows.  Making the
    plan allocates under 1 MiB, its 1- and 3-row calls equal lib.matmul, and a plan for m = 5
    still takes the native fast path, which allocates no array once its first call is done."""
    r = guest(cpu, env=env).call("guest_plan:plan_lazy_workspace", str(plan_lib), kinds)
    assert set(r) == set(kinds)
    for kind, got in r.items():
        assert got["huge"] == "ok", (kind, got)
        assert got["huge_peak_bytes"] < 1 << 20, (kind, got)
        assert got["huge_rows_1_same"] and got["huge_rows_3_same"], (kind, got)
        assert got["native"] and got["calls_same"] == [True] * 3, (kind, got)
        # no array: a workspace or output of 5 rows of k = 4096 is >= 20 KiB (ctypes' and the
        # interpreter's small objects are a few hundred bytes)
        assert got["fast_call_peak_bytes"] < 1024, (kind, got)
    if env is not None:
        assert any("sme" in got["kernel"] for got in r.values()), r
