"""Shared fixtures: built libraries and emulated-CPU guest sessions."""
from __future__ import annotations

from pathlib import Path

import pytest

import tilegen
from tilegen.emulate.remote import GuestSession

TESTS_DIR = Path(__file__).resolve().parent
# qemu CPU models the execution tests run on.
EXEC_CPUS = ("cortex-a53", "neoverse-n1", "neoverse-v1", "max")
F32_TILES = ("6x16", "4x16", "8x8", "4x24", "5x12", "1x16", "1x4")
# tiles no KleidiAI kernel has, which the allocator accepts
F32_EXTRA_TILES = ("3x8", "7x12", "2x28", "13x4")

_sessions: dict[tuple, GuestSession] = {}


def guest(cpu: str, sve_vl: int | None = None, sme_vl: int | None = None,
          env: dict[str, str] | None = None) -> GuestSession:
    """A persistent guest Python per (CPU model, vector lengths, environment)."""
    key = (cpu, sve_vl, sme_vl, tuple(sorted((env or {}).items())))
    s = _sessions.get(key)
    if s is None:
        s = _sessions[key] = GuestSession(cpu, sve_vl, sme_vl, paths=[str(TESTS_DIR)], env=env)
    return s


# SME kernels are opt-in at run time (TILEGEN_SME); tests that run them enable it.
SME_ON = {"TILEGEN_SME": "1"}


def draw_examples(strategy, n: int) -> list:
    """n examples (at least) of a hypothesis strategy, drawn deterministically, for tests that
    run their cases batched (one emulator session per configuration, not one call each)."""
    from hypothesis import HealthCheck, given, settings
    drawn: list = []

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(c=strategy)
    def collect(c):
        drawn.append(c)

    collect()
    return drawn


def pytest_sessionfinish(session, exitstatus):
    for s in _sessions.values():
        s.close()


@pytest.fixture(scope="session")
def f32_lib(tmp_path_factory) -> Path:
    """A library with every f32 tile of the suite, built for generic Armv8 (NEON)."""
    out = tmp_path_factory.mktemp("f32lib")
    specs = [f"f32:neon:{t}" for t in F32_TILES + F32_EXTRA_TILES]
    tilegen.build_library(specs, target="generic-armv8", out_dir=out)
    return out
