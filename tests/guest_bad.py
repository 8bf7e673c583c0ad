"""Malformed calls across the public API, run inside the guest (a crash there is reported as
GuestCrashed by the host, never a dead suite).  CASES: name -> (expected exception, regex)."""
from __future__ import annotations

import numpy as np

import tilegen
from guest_calls import BAD_KERNEL_CALLS, _lib, bad_kernel_call

F32 = "matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla"
Q4 = "matmul_clamp_f32_qsi8d32p4x4_qsi4c32p4x4_4x4_neon"      # runs on every CPU
f = np.float32


def _q4_inputs(lib):
    kern = lib.kernel(Q4)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 64)).astype(f)
    w = rng.normal(size=(8, 64)).astype(f)
    return kern, kern.lhs_layout(32).pack(x), kern.rhs_layout(32).pack_from_float(w)


def _stale():
    from tilegen.layout.f32 import F32PackedRHS
    return tilegen.PackedWeights(F32PackedRHS(20), 8, 16, np.zeros(20 * 4 * 17, np.uint8))


def _other_format():
    """q4_0 weights (read as qsi4c32pscalef16) recorded in the qsi4c32p format."""
    from tilegen.layout.rhs_int4 import QSI4C32P
    lay = QSI4C32P(4, 8, 2)
    return tilegen.PackedWeights(lay, 8, 64, np.zeros(lay.packed_size(8, 64), np.uint8), False,
                                 "q4_0")


def _ro_out():
    o = np.zeros((2, 8), f)
    o.flags.writeable = False
    return o


def _cases(lib, libdir, tmp):
    x = np.ones((2, 16), f)
    pw = lib.pack_weights(np.ones((8, 16), f))
    kern, lq, rq = _q4_inputs(lib)
    d = lambda m=5, n=8: np.zeros((m, n), f)  # noqa: E731
    return {
        "q4 lhs_packed too small": (lambda: kern(lq[:-1], rq, d(), k=64, bl=32), "ArgumentError", "lhs_packed has"),
        "q4 k not a multiple of bl": (lambda: kern(lq, rq, d(), k=48, bl=32), "ArgumentError", "multiple of bl"),
        "q4 bl not a multiple of 32": (lambda: kern(lq, rq, d(), k=64, bl=16), "ArgumentError", "bl=16 must be a multiple of 32"),
        "q4 raw bytes without k/bl": (lambda: kern(lq, rq, d()), "ArgumentError", "k and bl are needed"),
        "q4 negative k": (lambda: kern(lq, rq, d(), k=-64, bl=32), "ArgumentError", "k must be a positive int"),
        "q4 foreign PackedWeights (f32 layout)": (lambda: kern(lq, pw, d()), "ArgumentError", r"packed weights are f32p\d+x1b"),
        "matmul x float64": (lambda: lib.matmul(x.astype(np.float64), pw), "ArgumentError", "float32"),
        "matmul x 1-D": (lambda: lib.matmul(np.ones(16, f), pw), "ArgumentError", "shape"),
        "matmul k mismatch": (lambda: lib.matmul(np.ones((2, 15), f), pw), "ArgumentError", "k=15"),
        "matmul weights not packed": (lambda: lib.matmul(x, np.ones((8, 16), f)), "ArgumentError", "PackedWeights"),
        "matmul threads=0": (lambda: lib.matmul(x, pw, threads=0), "ArgumentError", "threads must be a positive int"),
        "matmul threads=-2": (lambda: lib.matmul(x, pw, threads=-2), "ArgumentError", "threads must be a positive int"),
        "matmul threads='2'": (lambda: lib.matmul(x, pw, threads="2"), "ArgumentError", "threads must be a positive int"),
        "matmul threads=2.5": (lambda: lib.matmul(x, pw, threads=2.5), "ArgumentError", "threads must be a positive int"),
        "matmul threads=2.0": (lambda: lib.matmul(x, pw, threads=np.float64(2)), "ArgumentError", "threads must be a positive int"),
        "matmul threads=True": (lambda: lib.matmul(x, pw, threads=True), "ArgumentError", "threads must be a positive int"),
        "matmul threads=np.int64(0)": (lambda: lib.matmul(x, pw, threads=np.int64(0)), "ArgumentError", "threads must be a positive int"),
        "matmul out wrong shape": (lambda: lib.matmul(x, pw, out=np.zeros((2, 9), f)), "ArgumentError", "out must be"),
        "matmul out read-only": (lambda: lib.matmul(x, pw, out=_ro_out()), "ArgumentError", "out must be"),
        "select stale PackedWeights (nr not in library)": (lambda: lib.select(_stale(), 2), "ArgumentError", "no runnable kernel reads f32p20x1b.*lib.adopt"),
        "matmul PackedWeights of another format": (lambda: lib.matmul(np.ones((2, 64), f), _other_format()), "ArgumentError", "cannot repack qsi4c32p4x4"),
        "adopt not PackedWeights": (lambda: lib.adopt(np.ones((8, 16), f)), "ArgumentError", "must be PackedWeights"),
        "set_table empty": (lambda: lib.set_table("q4_0", []), "ArgumentError", "must not be empty"),
        "pack_weights nr no kernel has": (lambda: lib.pack_weights(np.ones((8, 16), f), nr=7), "ArgumentError", "no f32 kernel with nr=7"),
        "matmul bias wrong shape": (lambda: lib.matmul(x, pw, bias=np.ones(3, f)), "ArgumentError", "bias must be float32"),
        "matmul clamp NaN": (lambda: lib.matmul(x, pw, clamp=(float("nan"), 1.0)), "ArgumentError", "NaN"),
        "matmul clamp NaN max": (lambda: lib.matmul(x, pw, clamp=(0.0, float("nan"))), "ArgumentError", "NaN"),
        "matmul clamp min > max": (lambda: lib.matmul(x, pw, clamp=(1, -1)), "ArgumentError", r"min 1\.0 > max -1\.0"),
        "matmul clamp one value": (lambda: lib.matmul(x, pw, clamp=(0,)), "ArgumentError", r"a \(min, max\) pair of numbers or None"),
        "matmul clamp scalar": (lambda: lib.matmul(x, pw, clamp=0), "ArgumentError", r"a \(min, max\) pair of numbers or None"),
        "matmul clamp strings": (lambda: lib.matmul(x, pw, clamp=("0", "1")), "ArgumentError", r"a \(min, max\) pair of numbers or None"),
        "matmul empty x": (lambda: lib.matmul(np.ones((0, 16), f), pw), "ArgumentError", "no rows"),
        "pack_weights unknown kind": (lambda: lib.pack_weights(np.ones((8, 16), f), kind="q8"), "ArgumentError", "unknown weights kind"),
        "pack_weights f16 given float32": (lambda: lib.pack_weights(np.ones((8, 16), f), kind="f16"), "ArgumentError", "float16"),
        "pack_weights ggml bytes without n": (lambda: lib.pack_weights(kind="q4_0", from_ggml=np.zeros(36, np.uint8), k=64), "ArgumentError", "needs n and k"),
        "pack_weights q4_0 k not multiple of 32": (lambda: lib.pack_weights(np.ones((4, 40), f), kind="q4_0"), "ArgumentError", "32"),
        "pack_weights q4_0 with bias (its layout has none)": (lambda: lib.pack_weights(np.ones((4, 64), f), kind="q4_0", bias=np.ones(4, f)), "ArgumentError", "no bias"),
        "pack_weights q4_0 ggml with bias": (lambda: lib.pack_weights(kind="q4_0", from_ggml=np.zeros(4 * 2 * 18, np.uint8), n=4, k=64, bias=np.ones(4, f)), "ArgumentError", "no bias"),
        "pack_weights 4-D weights": (lambda: lib.pack_weights(np.ones((2, 2, 8, 16), f)), "ArgumentError", "2-D"),
        "get_rows index out of range": (lambda: lib.get_rows(pw, [8]), "ArgumentError", "out of range"),
        "get_rows negative index": (lambda: lib.get_rows(pw, [-1]), "ArgumentError", "out of range"),
        "get_rows float indices": (lambda: lib.get_rows(pw, [1.5]), "ArgumentError", "integer"),
        "workspace_size m=0": (lambda: lib.workspace_size("q4_0", 0, 8, 64), "ArgumentError", "m must be a positive int"),
        "workspace_size unknown op": (lambda: lib.workspace_size("q5_1", 1, 8, 64), "ArgumentError", "unknown weights kind"),
        "kernel unknown name": (lambda: lib.kernel("matmul_nope"), "KeyError", "no kernel"),
        "pack_lhs m_idx_start negative": (lambda: lib.pack_lhs("qsi8d32p", x.repeat(4, 1), mr=4, kr=8, sr=2, m_idx_start=-1), "ArgumentError", "m_idx_start"),
        "pack_lhs no such packer": (lambda: lib.pack_lhs("qsi8d32p", x, mr=3, kr=8, sr=2), "ArgumentError", "no qsi8d32p packer"),
        "pack_lhs unknown format (numpy)": (lambda: tilegen.pack_lhs("q9", x, mr=4, kr=8, sr=2), "LayoutError", "q9"),
        "load missing directory": (lambda: tilegen.load(tmp + "/nowhere"), "LoadError", "no manifest.json"),
        "PackedWeights.load truncated": (lambda: _truncated(tmp, pw), "LoadError", "truncated"),
        "PackedWeights.load foreign file": (lambda: _junk(tmp), "LoadError", "not a tilegen"),
        "spec over the register budget": (lambda: tilegen.parse_spec("f32:neon:8x16"), "SpecError", "42 vector registers"),
        "spec unknown family": (lambda: tilegen.KernelSpec("q5_k", "neon", 4, 4), "SpecError", "unknown family"),
        "spec unparsable string": (lambda: tilegen.parse_spec("f32/neon/4x4"), "SpecError", "cannot parse"),
        "spec unknown isa": (lambda: tilegen.KernelSpec("f32", "avx512", 4, 4), "SpecError", "unknown isa"),
        "build unknown target": (lambda: tilegen.build_library(["f32:neon:4x4"], target="pentium4", out_dir=tmp + "/b"), "TargetError", "unknown target"),
        "build kernel the target lacks": (lambda: tilegen.build_library(["q4_0:i8mm:8x4"], target="cortex-a53", out_dir=tmp + "/b"), "TargetError", "needs i8mm"),
        "default kernels of an unknown ISA": (lambda: tilegen.build.default_specs(tilegen.build.get_target("cortex-a53"), ["avx"]), "TargetError", "unknown isa"),
    }


def _truncated(tmp, pw):
    p = tmp + "/w.tgpw"
    pw.save(p)
    with open(p, "rb") as fh:
        blob = fh.read()
    with open(p, "wb") as fh:
        fh.write(blob[:-5])
    return tilegen.PackedWeights.load(p)


def _junk(tmp):
    p = tmp + "/junk.bin"
    with open(p, "wb") as fh:
        fh.write(b"GGUF\x03\x00")
    return tilegen.PackedWeights.load(p)


def names(libdir: str, tmp: str) -> list[str]:
    return sorted(_cases(_lib(libdir), libdir, tmp)) + [f"kernel: {n}" for n in BAD_KERNEL_CALLS]


def run(libdir: str, f32_libdir: str, tmp: str, name: str):
    """Run case `name`; returns (exception type name, message) or raises if nothing raised."""
    import tilegen.build  # noqa: F401 - for the build cases
    try:
        if name.startswith("kernel: "):
            bad_kernel_call(f32_libdir, "matmul_clamp_f32_f32_f32p8x1b_3x8_neon_mla", name[8:])
        else:
            fn, _, _ = _cases(_lib(libdir), libdir, tmp)[name]
            fn()
    except Exception as e:  # noqa: BLE001 - the exception is the result
        return type(e).__name__, str(e)
    return None, "no exception"


def expected(libdir: str, tmp: str, name: str):
    if name.startswith("kernel: "):
        return "ArgumentError", ""
    _, t, rx = _cases(_lib(libdir), libdir, tmp)[name]
    return t, rx
