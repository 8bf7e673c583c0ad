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

# (cpu, sve_vl, sme_vl, env, examples in the suite); the i-th configuration runs seed SEED + i
CONFIGS = [
    ("neoverse-n1", None, None, {}, 16),          # NEON, dotprod
    ("max", None, 512, SME_ON, 8),                # SVE, i8mm, bf16, SME (VL 512)
]
if SOAK:
    CONFIGS += [
        ("neoverse-v1", None, None, {}, 0),           # i8mm, SVE 256
        ("max", 128, None, {}, 0),                    # SVE kernels at VL 128, bf16, no SME
        ("cortex-a53", None, None, {}, 0),            # plain NEON
        # idle plan workers sleep at once (futex wake-ups on every call)
        ("neoverse-n1", None, None, {"TILEGEN_PLAN_SPIN": "0"}, 0),
    ]
IDS = ["neoverse-n1", "max-sme512", "neoverse-v1", "max-sve128", "cortex-a53",
       "neoverse-n1-spin0"][:len(CONFIGS)]

# every kind of check the machine makes, which a run is expected to have made
CHECKS = ("float64 reference checks", "get_rows checks", "matmul calls", "plan calls",
          "calls from concurrent threads", "calls racing close()", "calls in forked children",
          "save/load (new)", "refusals (ArgumentError)")


@pytest.fixture(scope="module")
def state_lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("statelib")
    tilegen.build_library(None, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("config", range(len(CONFIGS)), ids=IDS)
def test_runtime_state_machine(state_lib, tmp_path, config):
    cpu, sve_vl, sme_vl, env, examples = CONFIGS[config]
    examples = int(SOAK) if SOAK else examples
    seed = SEED + config
    replay = (f"seed {seed} (replay: TILEGEN_SOAK_SEED={SEED} TILEGEN_SOAK_EXAMPLES={examples} "
              f"TILEGEN_SOAK_STEPS={STEPS} pytest tests/test_state.py -k {IDS[config]})")
    # a fresh guest (no library of another test in it: the leak checks count threads and
    # fds); OpenBLAS without threads (it stops them at fork and starts them later)
    g = guest(cpu, sve_vl, sme_vl,
              env={**env, "OPENBLAS_NUM_THREADS": "1", "TILEGEN_TEST_FRESH": "state"})
    log = tmp_path / "steps.log"
    timeout = 300 + 2.0 * examples * STEPS
    try:
        r = g.call_with_timeout(timeout, "guest_state:run_state_machine", str(state_lib), seed,
                                examples, STEPS, log_path=str(log))
    except GuestCrashed as e:
        steps = log.read_text()[-8000:] if log.exists() else "(no step log)"
        pytest.fail(f"{replay}: the guest died or hung: {e}\n-- steps of the example --\n"
                    f"{steps}", pytrace=False)
    failure = r.pop("failure")
    print(f"\nstate machine on {IDS[config]} (seed {seed}, {examples} examples x {STEPS} steps): "
          + json.dumps(r, sort_keys=True))
    assert failure is None, (f"{replay}: {failure['error']}\n{failure['steps']}\n"
                             f"{failure['traceback']}")
    assert r["examples"] >= examples and r["steps"] >= examples * STEPS // 2, r
    missing = [c for c in CHECKS if not any(n for what, n in r["checks"].items()
                                            if what.startswith(c))]
    assert not missing, (missing, r["checks"])
