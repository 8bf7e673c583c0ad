"""C ABI of each family's kernels (one place: manifest, runtime and C header use it)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Param", "SIGNATURES", "signature", "prototype"]


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str   # C spelling: size_t, float, const void*, void*, ...


SIGNATURES: dict[str, tuple[Param, ...]] = {
    # KleidiAI kai_run_matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla
    "f32": (
        Param("m", "size_t"), Param("n", "size_t"), Param("k", "size_t"),
        Param("lhs", "const void*"), Param("lhs_stride", "size_t"),
        Param("rhs_packed", "const void*"),
        Param("dst", "void*"), Param("dst_stride_row", "size_t"), Param("dst_stride_col", "size_t"),
        Param("clamp_min", "float"), Param("clamp_max", "float"),
    ),
    # KleidiAI kai_run_matmul_clamp_f32_qsi8d32p..._qsi4c32p... / _qai8dxp..._qsi4c32p...
    "q4": (
        Param("m", "size_t"), Param("n", "size_t"), Param("k", "size_t"), Param("bl", "size_t"),
        Param("lhs_packed", "const void*"), Param("rhs_packed", "const void*"),
        Param("dst", "void*"), Param("dst_stride_row", "size_t"), Param("dst_stride_col", "size_t"),
        Param("scalar_min", "float"), Param("scalar_max", "float"),
    ),
}
SIGNATURES["q4_0"] = SIGNATURES["q4_0_dx"] = SIGNATURES["q4_0_s1s0"] = SIGNATURES["q4"]
# KleidiAI kai_run_matmul_clamp_f32_qai8dxp..._qsi8cxp... (no block length)
SIGNATURES["q8_0"] = (
    Param("m", "size_t"), Param("n", "size_t"), Param("k", "size_t"),
    Param("lhs_packed", "const void*"), Param("rhs_packed", "const void*"),
    Param("dst", "void*"), Param("dst_stride_row", "size_t"), Param("dst_stride_col", "size_t"),
    Param("scalar_min", "float"), Param("scalar_max", "float"),
)
# KleidiAI kai_run_matmul_clamp_f32_bf16p..._bf16p...b (packed LHS and RHS, no block length)
SIGNATURES["bf16"] = (
    Param("m", "size_t"), Param("n", "size_t"), Param("k", "size_t"),
    Param("lhs_packed", "const void*"), Param("rhs_packed", "const void*"),
    Param("dst", "void*"), Param("dst_stride_row", "size_t"), Param("dst_stride_col", "size_t"),
    Param("clamp_min", "float"), Param("clamp_max", "float"),
)


def signature(family: str) -> tuple[Param, ...]:
    return SIGNATURES[family]


def prototype(family: str, name: str) -> str:
    args = ", ".join(f"{p.ctype} {p.name}" for p in SIGNATURES[family])
    return f"void {name}({args})"
