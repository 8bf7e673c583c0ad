"""Q4_K kernels (family q4_K: q8kp x q4kp; i8mm SMMLA, dotprod SDOT, plain NEON) under
emulation, bit-exact against tilegen.reference.kquant on random valid ggml blocks.  The
reference is computed from the float activations and the ggml blocks (``matmul_blocks``), not
from the packed buffers the kernel reads, so a packer and a kernel that disagree on a byte's
place fail here (issue #30 item 8)."""
from __future__ import annotations

from pathlib import Path

import pytest

import tilegen

from kquant_exec import KQ_CPUS, run_neon_kernel

KQ_SPECS = ("q4_K:i8mm:8x4", "q4_K:i8mm:4x8", "q4_K:i8mm:4x4", "q4_K:i8mm:12x4",
            "q4_K:i8mm:1x4", "q4_K:i8mm:1x8",
            "q4_K:dotprod:8x4", "q4_K:dotprod:4x8", "q4_K:dotprod:4x4", "q4_K:dotprod:1x4",
            "q4_K:dotprod:1x16",
            "q4_K:neon:4x4", "q4_K:neon:8x4", "q4_K:neon:1x8")
ALL_SPECS = [tilegen.parse_spec(s) for s in KQ_SPECS]


@pytest.fixture(scope="session")
def kq_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("kq4lib")
    tilegen.build_library(ALL_SPECS, target="linux-aarch64-all", out_dir=out)
    return out


@pytest.mark.parametrize("cpu", KQ_CPUS)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=lambda s: s.spec_string)
def test_q4k_kernel(spec, cpu, kq_lib):
    run_neon_kernel(spec, cpu, kq_lib)


def test_q4k_refusals():
    """Tiles the strategies cannot serve are refused with the rule."""
    for text, words in (("q4_K:i8mm:8x4:k8:s2", "kr=16"), ("q4_K:dotprod:4x4:k16:s2", "kr=8"),
                        ("q4_K:i8mm:4x6", "multiple of 4"), ("q4_K:i8mm:6x4", "multiple of 4"),
                        ("q4_K:dotprod:4x4:k8:s1", "sr must be 2")):
        with pytest.raises(tilegen.SpecError, match=words):
            tilegen.parse_spec(text)
