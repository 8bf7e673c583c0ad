"""Calling conventions of the generated routines: one :class:`Abi` record per convention.

Every stage that calls, declares or records a kernel or an LHS packer reads its record here:
the manifest (``params``), the library's C header and the export (:meth:`Abi.prototype`,
:attr:`Abi.ctypes`, :meth:`Abi.arguments` for a KleidiAI run function calling a tilegen
kernel), the ctypes binding (:meth:`Abi.arguments`, :attr:`Abi.lhs_rows`, :attr:`Abi.takes_bl`,
:attr:`Abi.packs_rows`) and the plan driver (``driver_kind`` / ``driver_fn``: the C driver's
argument switch is rendered from these records).

A parameter has a C name and type, and a *role*: what it is whatever the convention calls it
(``lhs`` and ``lhs_packed`` are both the LHS operand, ``clamp_min`` and ``scalar_min`` both the
lower clamp).  Callers give values (or C expressions) by role; :meth:`Abi.arguments` puts
them in the convention's order.

The plan driver's ABI is here too (:data:`CONSTANTS`, :data:`STRUCTS` and the field tables):
the build renders the driver's C from it (:mod:`tilegen.build.driver`) and the runtime mirrors
it in ctypes and checks it at load (:mod:`tilegen.runtime.driver`).

A bottom module: standard library only, imported by every stage.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

__all__ = ["Param", "Abi", "ABIS", "F32", "Q4", "Q8", "BF16", "PACKER_ABIS", "LHS_BL", "LHS_ROWS",
           "DRIVER_ABI", "ST_OK", "ST_LIMIT", "ST_SLOW", "ST_BUSY", "KERNEL_KINDS", "PACK_KINDS", "P_NONE",
           "P_GIVEN", "CONSTANTS", "PACK_FIELDS", "MM_FIELDS", "PLAN_FIELDS", "POOL_FIELDS",
           "STRUCTS", "C_FLAGS", "C_TYPES"]


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str      # C spelling: size_t, float, const void*, void*, ...
    role: str = ""  # what the argument is (default: its name)

    def __post_init__(self) -> None:
        if not self.role:
            object.__setattr__(self, "role", self.name)


@dataclass(frozen=True)
class Abi:
    """One calling convention: its parameters, and how each stage passes them."""

    name: str
    params: tuple[Param, ...]
    # the plan driver's argument kind (its C constant) and function-pointer type; the
    # conventions of one kind take the same C types and the driver passes them the same values
    driver_kind: str
    driver_fn: str
    # the binding packs f32 rows given as the LHS with the kernel's LHS layout first (bf16)
    packs_rows: bool = False
    # packers: the lhs argument points at row 0 of the whole matrix, not at row m_idx_start
    lhs_at_row0: bool = False
    kleidiai: str = ""      # the KleidiAI routines of this convention

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(p.role for p in self.params)

    @property
    def ctypes(self) -> tuple[str, ...]:
        return tuple(p.ctype for p in self.params)

    @property
    def lhs_rows(self) -> bool:
        """The LHS is f32 rows with a row stride (or one packed block of rows, 4k apart)."""
        return "lhs_stride" in self.roles

    @property
    def takes_bl(self) -> bool:
        """The routine takes the block length of its quantised operands."""
        return "bl" in self.roles

    def c_params(self) -> str:
        """The C parameter list: ``size_t m, size_t n, ...``."""
        return ", ".join(f"{p.ctype} {p.name}" for p in self.params)

    def prototype(self, symbol: str) -> str:
        """``void symbol(size_t m, ...)`` (no semicolon)."""
        return f"void {symbol}({self.c_params()})"

    def arguments(self, by_role: Mapping) -> tuple:
        """The values (or C expressions) of ``by_role`` in this convention's order."""
        return tuple(by_role[p.role] for p in self.params)

    def spelled(self, **ctypes: str) -> tuple[Param, ...]:
        """The parameters with some C types spelled otherwise (``dst="float*"``)."""
        return tuple(replace(p, ctype=ctypes[p.name]) if p.name in ctypes else p
                     for p in self.params)


def _size(*names: str) -> tuple[Param, ...]:
    return tuple(Param(n, "size_t") for n in names)


_IN = ("const void*",)
_DST = (Param("dst", "void*"),) + _size("dst_stride_row", "dst_stride_col")
_CLAMP = (Param("clamp_min", "float", "min"), Param("clamp_max", "float", "max"))
_SCALAR = (Param("scalar_min", "float", "min"), Param("scalar_max", "float", "max"))
_PACKED = (Param("lhs_packed", *_IN, "lhs"), Param("rhs_packed", *_IN, "rhs"))

F32 = Abi("f32", _size("m", "n", "k") + (Param("lhs", *_IN),) + _size("lhs_stride")
          + (Param("rhs_packed", *_IN, "rhs"),) + _DST + _CLAMP, "K_F32", "f32_fn",
          kleidiai="kai_run_matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla")
Q4 = Abi("q4", _size("m", "n", "k", "bl") + _PACKED + _DST + _SCALAR, "K_Q4", "q4_fn",
         kleidiai="kai_run_matmul_clamp_f32_qsi8d32p..._qsi4c32p... / _qai8dxp..._qsi4c32p...")
Q8 = Abi("q8", _size("m", "n", "k") + _PACKED + _DST + _SCALAR, "K_Q8", "q8_fn",
         kleidiai="kai_run_matmul_clamp_f32_qai8dxp..._qsi8cxp... (no block length)")
BF16 = Abi("bf16", _size("m", "n", "k") + _PACKED + _DST + _CLAMP, "K_Q8", "q8_fn",
           packs_rows=True,
           kleidiai="kai_run_matmul_clamp_f32_bf16p..._bf16p...b (packed LHS and RHS)")

# kernel conventions, in the order of the driver's argument kinds (K_F32 = 0, ...)
ABIS: dict[str, Abi] = {a.name: a for a in (F32, Q4, Q8, BF16)}
# kernel family -> its convention (the family records will reference them)
# LHS packers (tilegen.generator.packers): kai_lhs_quant_pack_qsi8d32p_f32 takes the block
# length and row 0 of the whole matrix; the others (qai8dxp, bf16, f32p) the first row to pack
_PACK_TAIL = _size("mr", "kr", "sr", "m_idx_start") + (
    Param("lhs", *_IN),) + _size("lhs_stride") + (Param("lhs_packed", "void*"),)
LHS_BL = Abi("lhs_bl", _size("m", "k", "bl") + _PACK_TAIL, "P_QSI8D32P", "pk_bl_fn",
             lhs_at_row0=True, kleidiai="kai_run_lhs_quant_pack_qsi8d32p_f32")
LHS_ROWS = Abi("lhs_rows", _size("m", "k") + _PACK_TAIL, "P_ROWS", "pk_fn",
               kleidiai="kai_run_lhs_quant_pack_qai8dxp_f32, kai_run_lhs_pack_*_f32")
# packer conventions, in the order of the driver's packer kinds (after P_NONE)
PACKER_ABIS: dict[str, Abi] = {a.name: a for a in (LHS_BL, LHS_ROWS)}


# -- the plan driver's ABI (tilegen_driver.c; its ctypes mirror: tilegen.runtime.driver) -------

# the version of the driver's ABI (tilegen_driver_abi returns it)
DRIVER_ABI = 1

# run status
ST_OK, ST_LIMIT, ST_SLOW, ST_BUSY = 0, 1, 2, 3
# kernel argument lists: one kind per driver_kind of the kernel conventions, in their order
# (K_F32: lhs_stride; K_Q4: bl; K_Q8: q8_0 and bf16, neither)
KERNEL_KINDS: dict[str, int] = {
    k: i for i, k in enumerate(dict.fromkeys(a.driver_kind for a in ABIS.values()))}
# LHS: f32 rows as they are (P_NONE); packed by a packer of each packer convention
# (P_QSI8D32P: bl argument; P_ROWS: qai8dxp, bf16 and f32p packers, no bl); packed by the caller
# into the workspace before the run (P_GIVEN)
PACK_KINDS: dict[str, int] = {k: i for i, k in enumerate(
    ("P_NONE", *dict.fromkeys(a.driver_kind for a in PACKER_ABIS.values()), "P_GIVEN"))}
P_NONE, P_GIVEN = PACK_KINDS["P_NONE"], PACK_KINDS["P_GIVEN"]
# the C source's #defines, in order
CONSTANTS: dict[str, int] = {"ABI": DRIVER_ABI, "ST_OK": ST_OK, "ST_LIMIT": ST_LIMIT,
                             "ST_SLOW": ST_SLOW, "ST_BUSY": ST_BUSY, **KERNEL_KINDS,
                             **PACK_KINDS}

# (name, type): u64, u32, f32, f64, ptr
PACK_FIELDS = (("m0", "u64"), ("m1", "u64"), ("lhs_off", "u64"))
MM_FIELDS = (("n0", "u64"), ("n1", "u64"), ("rhs_off", "u64"), ("ws_off", "u64"))
PLAN_FIELDS = (
    ("abi", "u64"), ("m", "u64"), ("n", "u64"), ("k", "u64"), ("bl", "u64"),
    ("kern_args", "u64"), ("pack_args", "u64"), ("private_pack", "u64"), ("check", "u64"),
    ("post_clamp", "u64"), ("fast", "u64"), ("pmr", "u64"), ("pkr", "u64"), ("psr", "u64"),
    ("kernel", "ptr"), ("packer", "ptr"), ("rhs", "ptr"), ("rhs_size", "u64"),
    ("npack", "u64"), ("nmm", "u64"), ("pack", "ptr"), ("mm", "ptr"), ("ws", "ptr"),
    ("bias", "ptr"), ("pool", "ptr"), ("spin", "u64"), ("limit", "f64"),
    ("cmin", "f32"), ("cmax", "f32"), ("post_min", "f32"), ("post_max", "f32"),
    # the fast call reads numpy's array objects: type, float32 descr and field offsets
    ("nd_type", "ptr"), ("f32_descr", "ptr"), ("off_type", "u64"), ("off_data", "u64"),
    ("off_nd", "u64"), ("off_dims", "u64"), ("off_descr", "u64"), ("off_flags", "u64"),
    # per call
    ("x", "ptr"), ("out", "ptr"),
    ("busy", "u32"), ("status", "u32"), ("next_pack", "u32"), ("next_mm", "u32"),
    ("packed", "u32"), ("computed", "u32"), ("waiters", "u32"),
    ("by_workers", "u32"),      # mm tasks pool workers ran, over all runs (diagnostics)
)
POOL_FIELDS = (
    ("gen", "u32"), ("sleepers", "u32"), ("busy", "u32"), ("active", "u32"), ("stop", "u32"),
    ("nworkers", "u32"), ("spin", "u64"), ("plan", "ptr"),
)

# the C structs, in the source's order
STRUCTS = (("tg_pack", PACK_FIELDS), ("tg_mm", MM_FIELDS), ("tg_plan", PLAN_FIELDS),
           ("tg_pool", POOL_FIELDS))

# numpy array flags the fast call needs (NPY_ARRAY_C_CONTIGUOUS, _ALIGNED, _WRITEABLE)
C_FLAGS = {"contiguous": 0x1, "aligned": 0x100, "writeable": 0x400}

# field types in C
C_TYPES = {"u64": "u64", "u32": "u32", "f32": "float", "f64": "double", "ptr": "void *"}
