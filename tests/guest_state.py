"""Guest side of tests/test_state.py: a hypothesis ``RuleBasedStateMachine`` over the runtime,
run whole inside the emulated aarch64 Python (hypothesis drives it here; the host starts it
with a seed and reads the summary).

The machine loads and closes libraries (``close()``, ``with``), packs weights of every kind
(floats in both layouts, float16 for f16/bf16, ggml blocks as bytes or arrays, per-op
packings), adopts, replaces kernel tables and gemv thresholds, saves and loads packings
(overwriting and unlinking files in use), makes and calls plans, calls matmul and plans from
several Python threads (closing a library while they run), forks and calls in the child, and
drops objects in any order.  Invariants:

- ``lib.matmul(x, w, threads=t)`` from any thread, in a forked child, batched or into
  ``out=`` is bit-identical to ``lib.matmul(x, w, threads=1)`` on the same packing and
  arguments, which is within a bound derived from the formats of the float64 product of the
  dequantised weights and x (the kernel's activation rounding plus f32 accumulation);
- a plan is bit-identical to the matmul of the moment it was made, for every row count, also
  after ``set_table`` and ``gemv_threshold`` changes (a plan keeps its kernel table);
- ``get_rows`` is the dequantisation of the source, computed here with the formats' numpy
  helpers; adopt, save/load and file overwrites keep those values;
- after ``close()`` matmul, plan and plan calls raise ArgumentError, packing and get_rows work;
- no step hangs: threads and forked children are waited for with a timeout, and a watchdog
  (faulthandler) dumps every thread's stack and ends the process if a step takes too long;
- after each example (every object deleted, then gc) the Python threads, the OS threads, the
  file descriptors and the file mappings are back to their count before it.

The step log (``log_path``) holds the current example's steps: after a crash or a hang it is
the reproducer.
"""
from __future__ import annotations

import faulthandler
import functools
import gc
import math
import os
import pickle
import select
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter

import numpy as np

import tilegen
from tilegen.layout.api import can_repack
from tilegen.layout.bf16 import bf16_to_f32, f32_to_bf16_rne
from tilegen.layout.ggml import (dequantize_q4_0, f16_bits_to_f32, quantize_q4_0, quantize_q8_0,
                                 split_q4_0)
from tilegen.layout.rhs_int8 import quantize_per_channel, requantize_q8_0
from tilegen.runtime.cpu import detect
from tilegen.runtime.errors import ArgumentError
from tilegen.runtime.packed import PackedLayouts, PackedWeights, dequantize_packed_rows
from tilegen.runtime.select import kind_table

from f64_bound import f64_bound

KINDS = ("f32", "f16", "bf16", "q4_0", "q4_0_dx", "q8_0")
GGML_KINDS = ("q4_0", "q4_0_dx", "q8_0")
BLOCKED = ("q4_0", "q4_0_dx")           # k a multiple of 32
NO_BIAS = ("q4_0",)                      # qsi4c32pscalef16 has no bias
THREADS = (1, 2, 3, 4, 7)
ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 33)
CLAMPS = (None, None, (-0.5, 0.5), (0.0, math.inf), (-math.inf, 1.0))
X_SCALES = (1.0, 1e-3, 50.0)
WAIT = 60.0          # seconds a thread or a forked child may take before it counts as hung

_STATS: dict = {}
_CFG: dict = {}


# -- helpers ----------------------------------------------------------------------------
def _same(a, b) -> bool:
    """Bit-identical float32 arrays."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype == np.float32 and np.array_equal(
        np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


def _bf16(a) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16_rne(np.asarray(a, np.float32)))


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _counts() -> tuple[int, int, int]:
    return threading.active_count(), _tasks(), _fds()


def _settle(target, seconds: float) -> tuple[int, int, int]:
    """The counts once they equal ``target`` (threads take a moment to end; gc runs), or as
    they are after ``seconds``."""
    end = time.monotonic() + seconds
    while (now := _counts()) != target and time.monotonic() < end:
        gc.collect()
        time.sleep(0.01)
    return now


def _mapped(path: str) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line.strip() for line in f if path in line]


def _runnable(lib, kind: str) -> list:
    """The runnable entries of lib's table for ``kind`` (what the runtime selects from)."""
    return [p for p in lib.table(kind) if p.features <= lib.cpu.features
            and all(lib.runnable(k) for k in (p.gemm, p.gemv) if k is not None)]


def _plan_threads(lib) -> list:
    """The plan pool's worker threads of lib (none when it never made a plan)."""
    drv = lib.__dict__.get("_driver")       # without loading it
    return list(drv.pool.threads) if drv and drv.pool is not None else []


def _settle_threads(lib, seconds: float = 5.0) -> list:
    """The library's live threads (matmul pool, plan pool) once they have ended, or as they
    are after ``seconds``: a closed library's threads end (joined, or shut down when the pool
    was replaced) at once or shortly after."""
    end = time.monotonic() + seconds
    while True:
        live = [t.name for t in lib.workers.threads() + _plan_threads(lib) if t.is_alive()]
        if not live or time.monotonic() > end:
            return live
        time.sleep(0.01)


def _settle_py_threads(target: int, seconds: float) -> int:
    end = time.monotonic() + seconds
    while (now := threading.active_count()) != target and time.monotonic() < end:
        time.sleep(0.01)
    return now


def _plan_and_call(lib, pw, m, threads, x, made):
    p = lib.plan(pw, m, threads=threads)
    made.append(p)
    return p(x)


def _bf16_runs(lib) -> bool:
    return bool(_runnable(lib, "bf16"))


def _adoptable(lib, pw) -> bool:
    """Whether lib.adopt(pw) (so matmul and plan) succeeds with lib's tables as they are now
    (the rules of Library.adopt / route, restated)."""
    if isinstance(pw, PackedLayouts):
        try:
            best = lib.best_kernels(pw.kind)
        except ArgumentError:
            return False
        for op in ("gemm", "gemv"):
            one = pw.for_op(op)
            cands = [best[op]]
            for p in _runnable(lib, pw.kind):
                cands += [p.gemv, p.gemm] if op == "gemv" else [p.gemm]
            if not any(c is not None and lib.runnable(c) and c.rhs_matches(one) for c in cands):
                return False
        return True
    kind = pw.kind
    if kind == "bf16" and not _bf16_runs(lib):
        kind = "f16"
    pairs = _runnable(lib, kind)
    bl = pw.bl or 32
    return any(p.gemm.rhs_matches(pw) or can_repack(pw.layout, p.gemm.rhs_layout(bl))
               for p in pairs)


def _expected_rows(kind: str, w32: np.ndarray, wsrc, raw, fmt: str) -> np.ndarray:
    """The values packed weights of ``kind`` hold, from their source, with numpy helpers."""
    n, k = w32.shape
    if kind == "f32":
        return w32
    if kind in ("f16", "bf16"):
        v = np.asarray(wsrc).astype(np.float32)
        return _bf16(v) if fmt.startswith("bf16") else v
    if kind == "q8_0":
        q, s = requantize_q8_0(raw, n, k) if raw is not None else quantize_per_channel(w32)
        return (q.astype(np.float32) * s[:, None]).astype(np.float32)
    raw = raw if raw is not None else quantize_q4_0(w32)
    if kind == "q4_0":
        return dequantize_q4_0(raw, n, k)
    u, d = split_q4_0(raw, n, k)               # q4_0_dx: the f16 scales rounded to bf16
    s = bf16_to_f32(f32_to_bf16_rne(f16_bits_to_f32(d)))
    vals = (u.astype(np.int16) - 8).astype(np.float32).reshape(n, k // 32, 32)
    return (vals * s[..., None]).astype(np.float32).reshape(n, k)


def _check_f64(kern, rec, x, y, bias, clamp, what: str) -> None:
    """y (from kernel ``kern``) against float64 x @ deq.T (+ biases, clamped), within the
    bound of :func:`f64_bound.f64_bound` for the kernel's family."""
    ref, bound = f64_bound(kern.family, x, rec.deq, (rec.bias, bias))
    if clamp is not None:
        ref = np.clip(ref, clamp[0], clamp[1])
    err = np.abs(y.astype(np.float64) - ref)
    bad = ~(err <= bound)
    _count("float64 reference checks")
    assert not bad.any(), (
        f"{what}: {int(bad.sum())} outputs off the float64 reference beyond the derived bound "
        f"(kernel {kern.name}, {rec.kind}); worst err {float(np.nanmax(err / bound)):.3g} x bound")


class LibRec:
    def __init__(self, name, lib, how):
        self.name, self.lib, self.how = name, lib, how


class PackRec:
    def __init__(self, name, pw, kind, deq, bias, src, path=None):
        self.name, self.pw, self.kind, self.deq, self.bias = name, pw, kind, deq, bias
        self.src, self.path = src, path
        self.n, self.k = deq.shape


class PlanRec:
    def __init__(self, name, plan, pack, m, threads, refs):
        self.name, self.plan, self.pack, self.m, self.threads = name, plan, pack, m, threads
        self.refs = refs          # rows -> (x, the matmul result when the plan was made)
        self.closed = False


def _log(line: str, mode: str = "a") -> None:
    path = _CFG.get("log_path")
    if path:
        with open(path, mode) as f:
            f.write(line + "\n")


def _fatal(msg: str) -> None:
    """A hang: every thread's stack on stderr, the step log marked, the process ended (a stuck
    thread would poison every later example)."""
    _log("FATAL: " + msg)
    sys.stderr.write(f"state machine: {msg}\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(70)


def _step(fn):
    """Count and log the step; a watchdog ends the process (stacks on stderr) if it hangs."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self, **kw):
        _STATS["steps"] += 1
        _STATS["rules"][name] += 1
        _log(f"{name}({', '.join(f'{a}={v!r}' for a, v in kw.items())})")
        faulthandler.dump_traceback_later(_CFG["step_timeout"], exit=True)
        t0 = time.monotonic()
        try:
            return fn(self, **kw)
        except BaseException:
            self.failed = True
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()
            _STATS["seconds"][name] += time.monotonic() - t0
    return wrapper


def _count(what: str, n: int = 1) -> None:
    _STATS["checks"][what] += n


def _refused(fn, what: str, text: str = "closed") -> None:
    try:
        fn()
    except ArgumentError as e:
        assert text in str(e), f"{what}: {e}"
        _count("refusals (ArgumentError)")
        return
    raise AssertionError(f"{what}: no ArgumentError")


def _join(threads, what: str) -> None:
    end = time.monotonic() + WAIT
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    if hung:
        _fatal(f"{what}: threads {hung} still running after {WAIT:.0f} s")


# -- the machine -------------------------------------------------------------------------
def make_machine(kinds):
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

    IDX = st.integers(0, 15)
    SEED = st.integers(0, 2**32 - 1)

    class RuntimeMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            _STATS["examples"] += 1
            t0 = time.monotonic()
            self.base = _settle(_CFG["base"], 10)
            _STATS["seconds"]["(init)"] += time.monotonic() - t0
            self.tmp = tempfile.mkdtemp(prefix="tg-state-")
            self.libs: list[LibRec] = []
            self.packs: list[PackRec] = []
            self.plans: list[PlanRec] = []
            self.serial = 0
            self.failed = False
            _log(f"# example {_STATS['examples']} (seed {_CFG['seed']}); base {self.base}",
                 "w")

        # -- bookkeeping ---------------------------------------------------------------
        def _name(self, prefix):
            self.serial += 1
            return f"{prefix}{self.serial}"

        def _pick_lib(self, li):
            """Library ``li`` of the open ones (the closed ones when none is open: their
            refusals)."""
            libs = [L for L in self.libs if not L.lib.closed] or self.libs
            return libs[li % len(libs)]

        def _any_lib(self):
            """A lib for get_rows (any, open or closed), or None (dequantize_packed_rows)."""
            return self.libs[0].lib if self.libs else None

        def _rows(self, pw, idx):
            lib = self._any_lib()
            return lib.get_rows(pw, idx) if lib is not None else dequantize_packed_rows(pw, idx)

        def _check_rows(self, rec, rng, what):
            got = self._rows(rec.pw, np.arange(rec.n))
            assert _same(got, rec.deq), f"{what}: get_rows != the dequantised source"
            _count("get_rows checks")
            idx = rng.integers(0, rec.n, size=3)
            assert _same(self._rows(rec.pw, idx), rec.deq[idx]), f"{what}: get_rows(subset)"
            if isinstance(rec.pw, PackedLayouts):
                for op in ("gemm", "gemv"):
                    assert _same(dequantize_packed_rows(rec.pw.for_op(op), np.arange(rec.n)),
                                 rec.deq), f"{what}: {op} packing rows"

        def _x(self, rng, m, k):
            return (rng.standard_normal((m, k)) * X_SCALES[int(rng.integers(3))]
                    ).astype(np.float32)

        def _ref(self, lib, rec, x, bias=None, clamp=None, what=""):
            """lib.matmul(threads=1) now, checked against float64 and against adopt-once."""
            y = lib.matmul(x, rec.pw, bias=bias, clamp=clamp, threads=1)
            adopted = lib.adopt(rec.pw)
            kern = lib.route(adopted, x.shape[0])[1]
            _check_f64(kern, rec, x, y, bias, clamp, what or f"{rec.name} m={x.shape[0]}")
            y2 = lib.matmul(x, adopted, bias=bias, clamp=clamp, threads=1)
            assert _same(y, y2), f"{rec.name}: matmul != matmul on adopt(w)"
            return y

        def _callables(self, rng, count):
            """``count`` (label, call, reference) of matmuls on open libs and plan calls, the
            references computed now (this thread, threads=1)."""
            pairs = [(L, P) for L in self.libs if not L.lib.closed for P in self.packs
                     if _adoptable(L.lib, P.pw)]
            plans = [Q for Q in self.plans if not Q.closed and not Q.plan.lib.closed]
            out = []
            for _ in range(count):
                if plans and (not pairs or rng.integers(2)):
                    Q = plans[int(rng.integers(len(plans)))]
                    r = sorted(Q.refs)[int(rng.integers(len(Q.refs)))]
                    x, ref = Q.refs[r]
                    out.append((f"{Q.name}(rows={r})", functools.partial(Q.plan, x), ref))
                elif pairs:
                    L, P = pairs[int(rng.integers(len(pairs)))]
                    m = ROWS[int(rng.integers(len(ROWS)))]
                    t = THREADS[int(rng.integers(len(THREADS)))]
                    x = self._x(rng, m, P.k)
                    ref = self._ref(L.lib, P, x)
                    out.append((f"{L.name}.matmul({P.name}, m={m}, threads={t})",
                                functools.partial(L.lib.matmul, x, P.pw, threads=t), ref))
            return out

        def _has_work(self):
            return any(not Q.closed and not Q.plan.lib.closed for Q in self.plans) or (
                any(not L.lib.closed for L in self.libs) and self.packs)

        # -- libraries -----------------------------------------------------------------
        PACK = dict(kind=st.sampled_from(kinds),
                    src=st.sampled_from(("float", "float", "ggml", "ggml bytes", "for_ops")),
                    layout=st.sampled_from(("nk", "kn")), n=st.integers(1, 40),
                    kb=st.integers(1, 3), odd_k=st.booleans(), bias=st.booleans(), seed=SEED)
        HOW = st.sampled_from(("load", "load", "with"))

        @initialize(how=HOW, **PACK)
        @_step
        def start(self, how, **pack):
            """Every example starts with a library and a packing."""
            self._load(how)
            self._pack(0, **pack)

        @precondition(lambda self: len(self.libs) < 3)
        @rule(how=HOW)
        @_step
        def load(self, how):
            self._load(how)

        def _load(self, how):
            lib = tilegen.load(_CFG["libdir"])
            if how == "with":
                lib = lib.__enter__()
            self.libs.append(LibRec(self._name("L"), lib, how))

        @precondition(lambda self: any(not L.lib.closed for L in self.libs))
        @rule(li=IDX, twice=st.booleans())
        @_step
        def close(self, li, twice):
            open_libs = [L for L in self.libs if not L.lib.closed]
            L = open_libs[li % len(open_libs)]
            lib = L.lib
            threads = lib.workers.threads() + _plan_threads(lib)
            if L.how == "with":
                lib.__exit__(None, None, None)
            else:
                lib.close()
            if twice:
                lib.close()
            assert lib.closed
            live = [t.name for t in threads if t.is_alive()]
            assert not live, f"threads of {L.name} alive after close() returned: {live}"
            assert lib.workers.threads() == [] and _plan_threads(lib) == []
            if self.packs:
                P = self.packs[li % len(self.packs)]
                x = np.ones((2, P.k), np.float32)
                _refused(lambda: lib.matmul(x, P.pw), "matmul after close")
                _refused(lambda: lib.plan(P.pw, 2), "plan after close")
            for Q in self.plans:
                if Q.plan.lib is lib:
                    r = min(Q.refs)
                    _refused(lambda: Q.plan(Q.refs[r][0]), f"{Q.name} after close")

        @precondition(lambda self: self.libs)
        @rule(li=IDX, kind=st.sampled_from(kinds), mode=st.sampled_from(
            ("reverse", "one", "rotate", "default", "gemv_threshold")), j=IDX)
        @_step
        def set_table(self, li, kind, mode, j):
            """Replace a kernel table (runnable pairs: one, all rotated, the whole table
            reversed, the default), or set gemv_threshold (0..3)."""
            lib = self.libs[li % len(self.libs)].lib
            if mode == "gemv_threshold":
                lib.gemv_threshold = j % 4
                return
            table = list(lib.table(kind))
            run = _runnable(lib, kind)
            if not run:
                return
            if mode == "reverse":
                new = table[::-1]
            elif mode == "one":
                new = [run[j % len(run)]]
            elif mode == "rotate":
                new = run[j % len(run):] + run[:j % len(run)]
            else:
                new = kind_table(lib.kernels.values(), kind)
            lib.set_table(kind, new)
            assert lib.table(kind) == new

        # -- weights ---------------------------------------------------------------------
        @precondition(lambda self: self.libs)
        @rule(li=IDX, **PACK)
        @_step
        def pack(self, li, **pack):
            self._pack(li, **pack)

        def _pack(self, li, kind, src, layout, n, kb, odd_k, bias, seed):
            lib = self.libs[li % len(self.libs)].lib
            rng = np.random.default_rng(seed)
            if src.startswith("ggml") and kind not in GGML_KINDS:
                src = "float"
            if src.startswith("ggml"):
                layout = "nk"
            k = 32 * kb - (19 if odd_k and kind not in BLOCKED and not src.startswith("ggml")
                           else 0)
            w = rng.standard_normal((n, k)).astype(np.float32)
            if seed % 7 == 0:
                w[seed % n] = 0            # an all-zero row: zero scales
            b = rng.standard_normal(n).astype(np.float32) if bias and kind not in NO_BIAS \
                else None
            wsrc = w.astype(np.float16) if kind == "f16" or (kind == "bf16" and seed % 2) else w
            raw = None
            kw = {"kind": kind, "bias": b}
            if src.startswith("ggml"):
                raw = quantize_q8_0(w) if kind == "q8_0" else quantize_q4_0(w)
                kw.update(from_ggml=raw.tobytes() if src == "ggml bytes" else raw, n=n, k=k)
                args = ()
            else:
                args = (wsrc if layout == "nk" else np.ascontiguousarray(wsrc.T),)
                kw["layout"] = layout
                if src == "for_ops":
                    kw["for_ops"] = ("gemm", "gemv")
            if kind == "bf16" and not _bf16_runs(lib):
                _refused(lambda: lib.pack_weights(*args, **kw), "bf16 without bf16 kernels",
                         "bf16")
                return
            pw = lib.pack_weights(*args, **kw)
            _count(f"packings {kind}")
            assert (pw.n, pw.k, pw.kind, pw.has_bias) == (n, k, kind, b is not None)
            first = pw.for_op("gemm") if isinstance(pw, PackedLayouts) else pw
            deq = _expected_rows(kind, w, wsrc, raw, first.format)
            rec = PackRec(self._name("W"), pw, kind, deq, b, src)
            self._check_rows(rec, rng, f"pack {rec.name} {kind} {src} {layout}")
            if not isinstance(pw, PackedLayouts):
                assert lib.adopt(pw) is pw, "a fresh packing is not the layout lib reads"
            self.packs.append(rec)

        @precondition(lambda self: self.libs and self.packs)
        @rule(li=IDX, pi=IDX, seed=SEED)
        @_step
        def adopt(self, li, pi, seed):
            lib = self.libs[li % len(self.libs)].lib
            P = self.packs[pi % len(self.packs)]
            rng = np.random.default_rng(seed)
            if not _adoptable(lib, P.pw):
                _refused(lambda: lib.adopt(P.pw), f"adopt {P.name}", "")
                return
            a = lib.adopt(P.pw)
            assert lib.adopt(a) is a, "adopt is not idempotent"
            if a is P.pw:
                return
            assert (a.n, a.k, a.has_bias) == (P.n, P.k, P.bias is not None)
            assert a.kind == P.kind or (P.kind in ("f16", "bf16") and a.kind == "f16"), a.kind
            rec = PackRec(self._name("W"), a, a.kind, P.deq, P.bias, f"adopt({P.name})")
            _count("adopt repacks")
            self._check_rows(rec, rng, f"adopt {P.name}")
            if not lib.closed:
                x = self._x(rng, int(ROWS[seed % len(ROWS)]), P.k)
                assert _same(lib.matmul(x, a, threads=1), lib.matmul(x, P.pw, threads=1))
            self.packs.append(rec)

        @precondition(lambda self: self.packs)
        @rule(pi=IDX, dest=st.sampled_from(("new", "new", "overwrite", "unlink")), j=IDX,
              seed=SEED)
        @_step
        def save_load(self, pi, dest, j, seed):
            P = self.packs[pi % len(self.packs)]
            rng = np.random.default_rng(seed)
            if isinstance(P.pw, PackedLayouts):
                _refused(lambda: P.pw.save(os.path.join(self.tmp, "x.tgpw")),
                         "PackedLayouts.save", "cannot be saved")
                return
            loaded = [Q for Q in self.packs if Q.path is not None]
            if dest == "overwrite" and loaded:
                old = loaded[j % len(loaded)]
                path = old.path
            else:
                old = None
                path = os.path.join(self.tmp, self._name("f") + ".tgpw")
            P.pw.save(path)
            q = PackedWeights.load(path)
            if dest == "unlink":
                os.unlink(path)
            assert np.array_equal(np.asarray(q.data), np.asarray(P.pw.data)), "bytes changed"
            for f in ("n", "k", "kind", "has_bias", "format", "nr", "kr", "sr", "bl"):
                assert getattr(q, f) == getattr(P.pw, f), f
            rec = PackRec(self._name("W"), q, P.kind, P.deq, P.bias, f"load({P.name})", path)
            self._check_rows(rec, rng, f"load {P.name}")
            _count(f"save/load ({dest})")
            if old is not None:      # the weights loaded from the replaced file keep theirs
                self._check_rows(old, rng, f"{old.name} after its file was replaced")
            self.packs.append(rec)

        @precondition(lambda self: self.packs)
        @rule(pi=IDX, seed=SEED)
        @_step
        def get_rows(self, pi, seed):
            P = self.packs[pi % len(self.packs)]
            self._check_rows(P, np.random.default_rng(seed), f"get_rows {P.name}")

        # -- calls -----------------------------------------------------------------------
        @precondition(lambda self: self.libs and self.packs)
        @rule(li=IDX, pi=IDX, m=st.sampled_from(ROWS), threads=st.sampled_from(THREADS),
              bias=st.booleans(), clamp=st.sampled_from(CLAMPS),
              out=st.sampled_from(("new", "out", "batched")), seed=SEED)
        @_step
        def matmul(self, li, pi, m, threads, bias, clamp, out, seed):
            L = self._pick_lib(li)
            P = self.packs[pi % len(self.packs)]
            lib = L.lib
            rng = np.random.default_rng(seed)
            x = self._x(rng, m, P.k)
            cb = rng.standard_normal(P.n).astype(np.float32) if bias else None
            if lib.closed:
                _refused(lambda: lib.matmul(x, P.pw), "matmul on a closed library")
                return
            if not _adoptable(lib, P.pw):
                _refused(lambda: lib.matmul(x, P.pw), f"matmul {P.name}", "")
                return
            ref = self._ref(lib, P, x, cb, clamp)
            if out == "out":
                o = np.full((m, P.n), np.nan, np.float32)
                y = lib.matmul(x, P.pw, bias=cb, clamp=clamp, threads=threads, out=o)
                assert y is o
            elif out == "batched" and m % 2 == 0:
                y = lib.matmul(x.reshape(2, m // 2, P.k), P.pw, bias=cb, clamp=clamp,
                               threads=threads).reshape(m, P.n)
            else:
                y = lib.matmul(x, P.pw, bias=cb, clamp=clamp, threads=threads)
            assert _same(y, ref), f"{L.name}.matmul({P.name}, threads={threads}) != threads=1"
            _count("matmul calls")

        @precondition(lambda self: self.libs and self.packs)
        @rule(li=IDX, pi=IDX, m=st.sampled_from(ROWS), threads=st.sampled_from(THREADS),
              bias=st.booleans(), clamp=st.sampled_from(CLAMPS), seed=SEED)
        @_step
        def plan(self, li, pi, m, threads, bias, clamp, seed):
            L = self._pick_lib(li)
            P = self.packs[pi % len(self.packs)]
            lib = L.lib
            rng = np.random.default_rng(seed)
            cb = rng.standard_normal(P.n).astype(np.float32) if bias else None
            if lib.closed:
                _refused(lambda: lib.plan(P.pw, m), "plan on a closed library")
                return
            if not _adoptable(lib, P.pw):
                _refused(lambda: lib.plan(P.pw, m), f"plan {P.name}", "")
                return
            p = lib.plan(P.pw, m, bias=cb, clamp=clamp, threads=threads)
            refs = {}
            for r in sorted({m, 1, max(1, m // 2)}):
                x = self._x(rng, r, P.k)
                refs[r] = (x, self._ref(lib, P, x, cb, clamp))
            Q = PlanRec(self._name("Q"), p, P.name, m, threads, refs)
            for r, (x, ref) in refs.items():
                assert _same(p(x), ref), f"{Q.name} rows={r} != matmul"
                _count("plan calls")
            self.plans.append(Q)

        @precondition(lambda self: self.plans)
        @rule(qi=IDX, which=IDX, mode=st.sampled_from(("plain", "out", "batched", "strided")))
        @_step
        def call_plan(self, qi, which, mode):
            Q = self.plans[qi % len(self.plans)]
            r = sorted(Q.refs)[which % len(Q.refs)]
            x, ref = Q.refs[r]
            p = Q.plan
            if Q.closed or p.lib.closed:
                _refused(lambda: p(x), f"{Q.name} of a closed library")
                return
            if mode == "out":
                o = np.full(ref.shape, np.nan, np.float32)
                y = p(x, o)
                assert y is o
            elif mode == "batched" and r % 2 == 0:
                y = p(x.reshape(2, r // 2, -1)).reshape(ref.shape)
            elif mode == "strided":
                xs = np.zeros((r, 2 * x.shape[1]), np.float32)
                xs[:, ::2] = x
                y = p(xs[:, ::2])
            else:
                y = p(x)
            assert _same(y, ref), f"{Q.name} rows={r} ({mode}) != the matmul when planned"
            _count("plan calls")

        @precondition(lambda self: self.plans)
        @rule(qi=IDX)
        @_step
        def close_plan(self, qi):
            Q = self.plans[qi % len(self.plans)]
            Q.plan.close()
            Q.closed = True
            r = min(Q.refs)
            _refused(lambda: Q.plan(Q.refs[r][0]), f"{Q.name} after plan.close()")

        @precondition(lambda self: self._has_work())
        @rule(nthreads=st.integers(2, 4), nops=st.integers(2, 8), seed=SEED)
        @_step
        def concurrent(self, nthreads, nops, seed):
            """Matmuls (mixed threads=) and plan calls from several Python threads."""
            tasks = self._callables(np.random.default_rng(seed), nops)
            bad, errors = [], []

            def worker(j):
                for i in list(range(j, len(tasks), nthreads)) * 2:
                    label, call, ref = tasks[i]
                    try:
                        if not _same(call(), ref):
                            bad.append(label)
                    except BaseException as e:      # noqa: BLE001 - the error is the result
                        errors.append(f"{label}: {e!r}")
            ths = [threading.Thread(target=worker, args=(j,), name=f"caller-{j}")
                   for j in range(nthreads)]
            for t in ths:
                t.start()
            _join(ths, "concurrent calls")
            _count("calls from concurrent threads", 2 * len(tasks))
            assert not bad and not errors, (bad, errors)

        @precondition(lambda self: any(not L.lib.closed for L in self.libs) and self.packs)
        @rule(li=IDX, nthreads=st.integers(1, 3), nops=st.integers(1, 6), seed=SEED)
        @_step
        def close_while_calling(self, li, nthreads, nops, seed):
            """Threads call matmul and plans of one library, and make plans and call them,
            while this thread closes it: each call gives the right bits or ArgumentError
            (closed), nothing hangs, and afterwards no thread of the library is left and every
            plan made (before or during the close) refuses."""
            open_libs = [L for L in self.libs if not L.lib.closed]
            L = open_libs[li % len(open_libs)]
            lib = L.lib
            rng = np.random.default_rng(seed)
            pairs = [P for P in self.packs if _adoptable(lib, P.pw)]
            if not pairs:
                return
            tasks, made = [], []
            for _ in range(nops):
                P = pairs[int(rng.integers(len(pairs)))]
                m = ROWS[int(rng.integers(len(ROWS)))]
                t = THREADS[int(rng.integers(len(THREADS)))]
                x = self._x(rng, m, P.k)
                ref = self._ref(lib, P, x)
                how = int(rng.integers(3))
                if how == 0:
                    p = lib.plan(P.pw, m, threads=t)
                    made.append(p)
                    tasks.append((f"plan({P.name}, m={m}, threads={t})",
                                  functools.partial(p, x), ref))
                elif how == 1:
                    tasks.append((f"lib.plan({P.name}, m={m}, threads={t})(x)",
                                  functools.partial(_plan_and_call, lib, P.pw, m, t, x, made),
                                  ref))
                else:
                    tasks.append((f"matmul({P.name}, m={m}, threads={t})",
                                  functools.partial(lib.matmul, x, P.pw, threads=t), ref))
            bad, errors = [], []
            started = threading.Barrier(nthreads + 1)

            def worker(j):
                started.wait()
                for i in list(range(j, len(tasks), nthreads)) * 3:
                    label, call, ref = tasks[i]
                    try:
                        if not _same(call(), ref):
                            bad.append(label)
                        _count("calls racing close(): right")
                    except ArgumentError as e:
                        if "closed" not in str(e):
                            errors.append(f"{label}: {e!r}")
                        _count("calls racing close(): refused")
                    except BaseException as e:      # noqa: BLE001
                        errors.append(f"{label}: {e!r}")
            ths = [threading.Thread(target=worker, args=(j,), name=f"closer-caller-{j}")
                   for j in range(nthreads)]
            for t in ths:
                t.start()
            started.wait()
            time.sleep(float(rng.random()) * 0.01)
            lib.close()
            _join(ths, f"calls while {L.name} closed")
            tasks.clear()
            assert not bad and not errors, (bad, errors)
            left = _settle_threads(lib)
            assert left == [], f"threads of {L.name} left after close() with calls in flight: " \
                               f"{left}"
            for p in made:
                _refused(lambda: p(np.zeros((1, p.k), np.float32)),
                         "a plan made before or while its library closed")
            made.clear()

        @precondition(lambda self: self._has_work())
        @rule(nops=st.integers(1, 4), background=st.booleans(), seed=SEED)
        @_step
        def fork(self, nops, background, seed):
            """fork (optionally while another thread calls), compute in the child, report
            through a pipe; the parent waits with a timeout and checks the bits."""
            tasks = self._callables(np.random.default_rng(seed), nops)
            stop = threading.Event()
            bg_bad: list = []

            def busy():
                while not stop.is_set():
                    for label, call, ref in tasks:
                        try:
                            if not _same(call(), ref):
                                bg_bad.append(label)
                        except BaseException as e:  # noqa: BLE001
                            bg_bad.append(f"{label}: {e!r}")
            th = None
            if background:
                th = threading.Thread(target=busy, name="fork-background")
                th.start()
                time.sleep(0.002)
            rd, wr = os.pipe()
            pid = os.fork()
            if pid == 0:      # child: only this thread exists; report, never return
                try:
                    os.close(rd)
                    res = []
                    for label, call, ref in tasks:
                        try:
                            res.append((label, "ok" if _same(call(), ref) else "different"))
                        except BaseException as e:  # noqa: BLE001
                            res.append((label, repr(e)))
                    # closing every library ends the threads the child started (its pools)
                    for L in self.libs:
                        L.lib.close()
                    for Q in self.plans:
                        Q.plan.lib.close()
                    left = _settle_py_threads(1, 5.0)
                    res.append(("threads in the child after close()", "ok" if left == 1
                                else f"{left}: {[t.name for t in threading.enumerate()]}"))
                    data = pickle.dumps(res)
                    while data:
                        data = data[os.write(wr, data):]
                finally:
                    os._exit(0)
            os.close(wr)
            data, status, hung = b"", None, False
            end = time.monotonic() + WAIT
            try:
                while True:
                    left = end - time.monotonic()
                    if left <= 0:
                        hung = True
                        break
                    r, _, _ = select.select([rd], [], [], min(left, 1.0))
                    if r:
                        chunk = os.read(rd, 65536)
                        if not chunk:
                            break
                        data += chunk
                while not hung and status is None:
                    done, st_ = os.waitpid(pid, os.WNOHANG)
                    if done:
                        status = st_
                    elif time.monotonic() > end:
                        hung = True
                    else:
                        time.sleep(0.005)
                if hung:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            finally:
                os.close(rd)
                stop.set()
                if th is not None:
                    _join([th], "fork's background caller")
            assert not hung, f"forked child hung (> {WAIT:.0f} s) on {[t[0] for t in tasks]}"
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child status {status}"
            res = pickle.loads(data)
            assert [r[0] for r in res[:-1]] == [t[0] for t in tasks]
            assert all(r[1] == "ok" for r in res), res
            _count("forked children")
            _count("calls in forked children", len(tasks))
            assert not bg_bad, bg_bad
            for label, call, ref in tasks:           # the parent goes on as before
                assert _same(call(), ref), f"{label} in the parent after fork"

        # -- dropping ----------------------------------------------------------------------
        @precondition(lambda self: self.libs or self.packs or self.plans)
        @rule(what=st.sampled_from(("pack", "plan", "lib")), i=IDX, collect=st.booleans())
        @_step
        def delete(self, what, i, collect):
            lst = {"pack": self.packs, "plan": self.plans, "lib": self.libs}[what]
            if not lst:
                return
            rec = lst.pop(i % len(lst))
            rec.__dict__.clear()
            del rec
            if collect:
                gc.collect()

        def teardown(self):
            t0 = time.monotonic()
            try:
                self._teardown()
            finally:
                _STATS["seconds"]["(teardown)"] += time.monotonic() - t0

        def _teardown(self):
            faulthandler.dump_traceback_later(_CFG["step_timeout"], exit=True)
            try:
                order = _STATS["examples"] % 3   # drop in varying orders, never close
                lists = [self.plans, self.packs, self.libs]
                for lst in lists[order:] + lists[:order]:
                    while lst:
                        lst.pop().__dict__.clear()
                    gc.collect()
                py, tasks, fds = self.base
                _settle((py, tasks + 1, fds), 20)    # + the watchdog's thread
            finally:
                faulthandler.cancel_dump_traceback_later()
            now = _settle(self.base, 5)       # the watchdog's own thread ends
            maps = _mapped(self.tmp)
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.failed:
                return      # the step's error is the report (its traceback holds objects)
            names = sorted(t.name for t in threading.enumerate())
            assert now == self.base, (f"leak after deleting everything: (python threads, "
                                      f"OS threads, fds) {self.base} -> {now}; threads {names}")
            assert not maps, f"files still mapped: {maps}"

    return RuntimeMachine


def run_state_machine(libdir: str, seed: int = 0, max_examples: int = 10,
                      stateful_step_count: int = 30, kinds=KINDS, log_path: str | None = None,
                      step_timeout: float = 240.0) -> dict:
    """Run the machine under hypothesis (seeded, no database, no deadline); returns the
    examples and steps run, the count per rule, and the failure (exception, traceback and
    hypothesis's minimal reproducing steps) or None."""
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        # OpenBLAS stops its threads at fork and starts them at the next BLAS call: the OS
        # thread count would move on its own
        raise RuntimeError("run the state machine with OPENBLAS_NUM_THREADS=1 (a fresh guest)")
    from hypothesis import HealthCheck, Phase, seed as hseed, settings
    from hypothesis.reporting import with_reporter
    from hypothesis.stateful import get_state_machine_test
    _STATS.clear()
    _STATS.update(examples=0, steps=0, rules=Counter(), seconds=Counter(), checks=Counter())
    _CFG.clear()
    gc.collect()
    _CFG.update(libdir=libdir, seed=seed, log_path=log_path, step_timeout=step_timeout,
                base=_counts())
    machine = make_machine(tuple(kinds))
    s = settings(max_examples=max_examples, stateful_step_count=stateful_step_count,
                 deadline=None, database=None, derandomize=False, print_blob=False,
                 suppress_health_check=list(HealthCheck),
                 phases=(Phase.explicit, Phase.generate, Phase.shrink))
    test = hseed(seed)(get_state_machine_test(machine, settings=s))
    report: list[str] = []
    failure = None
    t0 = time.monotonic()
    with with_reporter(report.append):
        try:
            test()
        except BaseException as e:      # noqa: BLE001 - the failure is the result
            failure = {"error": f"{type(e).__name__}: {e}"[:4000],
                       "traceback": "".join(traceback.format_exception(e))[-12000:],
                       "steps": "\n".join(str(r) for r in report)[-12000:]}
    return {"examples": _STATS["examples"], "steps": _STATS["steps"],
            "rules": dict(_STATS["rules"]), "failure": failure, "base": _CFG["base"],
            "checks": dict(_STATS["checks"]),
            "rule_seconds": {k: round(v, 2) for k, v in _STATS["seconds"].items()},
            "seconds": time.monotonic() - t0, "features": sorted(detect().features)}
