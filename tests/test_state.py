"""The runtime as a state machine (issue 21, item 13: find the next defects by machine).

tests/guest_state.py holds a hypothesis ``RuleBasedStateMachine`` over the runtime (load,
close, pack every kind, adopt, set_table, save/load, plans, matmul from several threads,
fork, drop in any order), checked against numpy and against itself (see its docstring for
the invariants).  It runs whole inside one fresh emulated guest per CPU configuration; the
host only seeds it, bounds it in time and reads the summary.

The suite runs a bounded, seeded run.  A soak raises it (README, "Testing"):
``TILEGEN_SOAK_EXAMPLES=N`` examples per configuration (and the soak's extra CPU models),
``TILEGEN_SOAK_STEPS=S`` steps per example (default 50), ``TILEGEN_SOAK_SEED=s`` (an
integer, or ``random``: printed, so a failure can be replayed)."""
from __future__ import annotations

import json
import os
import random

import pytest

import tilegen
from tilegen.emulate.remote import GuestCrashed

from conftest import SME_ON, guest

SOAK = os.environ.get("TILEGEN_SOAK_EXAMPLES", "").strip()
STEPS = int(os.environ.get("TILEGEN_SOAK_STEPS", "50" if SOAK else "40"))
_seed = os.environ.get("TILEGEN_SOAK_SEED", "2113").strip()
SEED = random.SystemRandom().randrange(2**32) if _seed == "random" else int(_seed)

# (cpu, sve_vl, sme_vl, env, examples in the suite)
CONFIGS = [
    pytest.param("neoverse-n1", None, None, {}, 16, id="neoverse-n1"),      # NEON, dotprod
    pytest.param("max", None, 512, SME_ON, 8, id="max-sme512"),           # SVE, i8mm, bf16, SME
]
if SOAK:
    CONFIGS += [
        pytest.param("neoverse-v1", None, None, {}, 0, id="neoverse-v1"),   # i8mm, bf16, SVE 256
        pytest.param("max", 128, None, {}, 0, id="max-sve128"),           # SVE kernels at VL 128
        pytest.param("cortex-a53", None, None, {}, 0, id="cortex-a53"),    # plain NEON
        # idle plan workers sleep at once (futex wake-ups on every call)
        pytest.param("neoverse-n1", None, None, {"TILEGEN_PLAN_SPIN": "0"}, 0,
                     id="neoverse-n1-spin0"),
    ]

# every kind of check the machine makes, which a run is expected to have made
CHECKS = ("float64 reference checks", "get_rows checks", "matmul calls", "plan calls",
          "calls from concurrent threads", "calls racing close()", "calls in forked children",
          "save/load (new)", "refusals (ArgumentError)")


@pytest.fixture(scope="module")
def state_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("statelib")
    tilegen.build_library(None, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu,sve_vl,sme_vl,env,examples", CONFIGS)
def test_runtime_state_machine(state_lib, tmp_path, cpu, sve_vl, sme_vl, env, examples):
    examples = int(SOAK) if SOAK else examples
    # a fresh guest (no library of another test in it: the leak checks count threads and
    # fds); OpenBLAS without threads (it stops them at fork and starts them later)
    g = guest(cpu, sve_vl, sme_vl,
              env={**env, "OPENBLAS_NUM_THREADS": "1", "TILEGEN_TEST_FRESH": "state"})
    log = tmp_path / "steps.log"
    timeout = 300 + 2.0 * examples * STEPS
    try:
        r = g.call_with_timeout(timeout, "guest_state:run_state_machine", str(state_lib), SEED,
                                examples, STEPS, log_path=str(log))
    except GuestCrashed as e:
        steps = log.read_text()[-8000:] if log.exists() else "(no step log)"
        pytest.fail(f"seed {SEED}: the guest died or hung: {e}\n-- steps of the example --\n"
                    f"{steps}", pytrace=False)
    failure = r.pop("failure")
    print(f"\nstate machine on {cpu} (seed {SEED}, {examples} examples x {STEPS} steps): "
          + json.dumps(r, sort_keys=True))
    assert failure is None, (f"seed {SEED}: {failure['error']}\n{failure['steps']}\n"
                             f"{failure['traceback']}")
    assert r["examples"] >= examples and r["steps"] >= examples * STEPS // 2, r
    missing = [c for c in CHECKS if not any(n for what, n in r["checks"].items()
                                            if what.startswith(c))]
    assert not missing, (missing, r["checks"])
