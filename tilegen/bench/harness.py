"""The timed jobs of ``tilegen bench`` (guest side: runs on the Arm CPU, or under qemu).

``run(config)`` loads the library and, for every job (weights kind or kernel, shape m x n x
k), times:

* ``kernel``: the micro-kernel alone, one call over the whole m x n on one thread, on an LHS
  and RHS packed beforehand (the layout objects' numpy packers);
* ``plan``: ``lib.plan(weights, m, threads=t)(x, out)`` for each thread count (LHS packing,
  the split over n, the kernels; what an application calls) -- for the kernels the library
  picks per kind;
* ``kleidiai``: with ``config["kleidiai"]``, each KleidiAI micro-kernel of the same job
  (``kai_run_<name>`` from KleidiAI's own shared object) on the same packed operands:
  tilegen's packed layouts are KleidiAI's byte for byte.

and once per run the streaming bandwidth (a numpy copy of ``bandwidth_mib`` MiB: bytes read +
written per second).  Every measurement follows :func:`tilegen.bench.stats.measure`.

``python -m tilegen.bench.harness CONFIG.json OUT.json`` runs it from JSON files (how the
host starts it in the guest); progress lines go to stderr.  A user error (a library that does
not load, a job its layouts refuse, no memory for the operands) is written to OUT.json as
``{"error": message}`` (exit 3), never a traceback; SIGINT (Ctrl-C) ends the run after the
rows already measured, which OUT.json holds with ``"interrupted": true`` (exit 130).

Inputs are drawn by :func:`job_inputs` (float activations and weights) and
:func:`job_ggml` (ggml blocks for the RHS formats that take only those: the K-quants), both
seeded, so a caller can recompute the reference result.  Every weights kind is timed: the
RHS layout class says whether its weights come as floats or as ggml blocks
(``PackedLayout.ggml_only``), the LHS is packed by the kernel's own LHS layout.
"""
from __future__ import annotations

import ctypes
import json
import signal
import sys
import time

import numpy as np

from ..callconv import Param
from ..generator.validate import parse_spec
from ..layout import LayoutError, lhs_layout_for, rhs_layout_for
from ..families import FAMILIES
from ..runtime import load
from ..runtime.binding import CTYPES
from ..runtime.errors import ArgumentError, LoadError
from ..runtime.select import KIND_FAMILIES
from .clock import (EMULATED_LABEL, ClockRoutines, core_frequency, cpu_id, cpufreq_max_ghz,
                    emulation, open_timer)
from .stats import Rule, measure, rule_dict

__all__ = ["job_inputs", "job_ggml", "run", "main", "DEFAULT_KINDS", "KINDS", "EXIT_ERROR",
           "EXIT_INTERRUPTED", "USER_ERRORS"]

#: every runtime weights kind (the family records' ``kinds``)
KINDS = tuple(k for fam in FAMILIES.values() for k in fam.kinds)
#: the kinds timed by default: each family's own (its first kind; f16 weights run the bf16 or
#: f32 kernels, timed as those kinds)
DEFAULT_KINDS = tuple(fam.kinds[0] for fam in FAMILIES.values() if fam.kinds)
# kinds whose float weights come in another dtype than float32 (tilegen.runtime.packing)
_FLOAT_DTYPE = {"f16": np.float16}
INF = float("inf")
EXIT_ERROR, EXIT_INTERRUPTED = 3, 130
# what a job or the library can refuse: a one-line error for the host, never a traceback
USER_ERRORS = (ValueError, LoadError, OSError, MemoryError)


def job_inputs(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(x (m, k), w (n, k)) float32 in [-1, 1), never zero-filled, from ``seed`` and the shape
    (w from ``seed``, n and k only: the jobs of one n x k at several m share their weights)."""
    x = np.random.default_rng([seed, m, n, k]).random((m, k), dtype=np.float32) * 2 - 1
    w = np.random.default_rng([seed, n, k]).random((n, k), dtype=np.float32) * 2 - 1
    return x, w


def job_ggml(seed: int, layout, n: int, k: int) -> np.ndarray | None:
    """Seeded random valid ggml blocks (n rows of k) for an RHS ``layout`` (object or class)
    that takes only those (``ggml_only``: the K-quants), else None (float weights)."""
    if layout.ggml_only is None:
        return None
    return layout.random_ggml(n, k, int(np.random.default_rng([seed, n, k]).integers(1 << 31)))


def _rhs(spec, lay, seed: int, w: np.ndarray) -> np.ndarray:
    """The job's weights packed by ``spec``'s RHS layout ``lay``: its ggml blocks, else
    quantised from the floats (quantised families) or the floats themselves."""
    n, k = w.shape
    raw = job_ggml(seed, lay, n, k)
    if raw is not None:
        return lay.pack_from_ggml(raw, n, k)
    return lay.pack_from_float(w) if spec.info.quantized else lay.pack(w)


def _pack_kind(lib, kind: str, seed: int, w: np.ndarray):
    """The job's weights of ``kind`` packed by the library (``lib.pack_weights``) for its pick."""
    n, k = w.shape
    raw = job_ggml(seed, lib.kernel_table.pairs(kind)[0].gemm.rhs_layout(), n, k)
    if raw is not None:
        return lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k)
    return lib.pack_weights(w.astype(_FLOAT_DTYPE.get(kind, np.float32)), kind=kind)


class _Call:
    """A foreign routine bound to its arguments (ctypes objects made once): ``call()``."""

    def __init__(self, address: int, params, by_role: dict, keep: tuple) -> None:
        types = [CTYPES.get(p.ctype, ctypes.c_void_p) for p in params]
        self.fn = ctypes.CFUNCTYPE(None, *types)(address)
        self.args = [t(by_role[p.role]) for t, p in zip(types, params)]
        self.keep = keep            # the buffers the pointers point into

    def __call__(self) -> None:
        self.fn(*self.args)


def _operands(spec, vl, x: np.ndarray, w: np.ndarray, seed: int, lhs_rows: bool, packed=None):
    """(lhs buffer, lhs stride, rhs bytes, bl) of ``spec`` for x @ W.T (rhs: ``packed``'s
    bytes when given, else the job's weights packed by the spec's RHS layout)."""
    bl = (packed.bl if packed is not None else None) or 32
    if packed is not None:
        rhs = packed.data
    else:
        rhs = _rhs(spec, rhs_layout_for(spec, bl, vl), seed, w)
    k = x.shape[1]
    if lhs_rows:
        lhs = lhs_layout_for(spec, bl, vl).pack(x) if spec.packs_f32_lhs else x
        return np.ascontiguousarray(lhs), 4 * k, np.ascontiguousarray(rhs), bl
    return np.ascontiguousarray(lhs_layout_for(spec, bl, vl).pack(x)), 0, np.ascontiguousarray(rhs), bl


def _bound(address: int, params, spec, vl, x, w, seed, dst, packed=None) -> _Call:
    lhs_rows = any(p.role == "lhs_stride" for p in params)
    lhs, stride, rhs, bl = _operands(spec, vl, x, w, seed, lhs_rows, packed)
    m, n = dst.shape
    roles = {"m": m, "n": n, "k": x.shape[1], "bl": bl, "lhs": lhs.ctypes.data,
             "lhs_stride": stride, "rhs": rhs.ctypes.data, "dst": dst.ctypes.data,
             "dst_stride_row": dst.strides[0], "dst_stride_col": 4, "min": -INF, "max": INF}
    return _Call(address, params, roles, (lhs, rhs, dst))


def _progress(cfg: dict, i: int, total: int, text: str) -> None:
    if cfg.get("progress", True):
        print(f"tilegen bench: [{i}/{total}] {text}", file=sys.stderr, flush=True)


def _kernels_for(lib, names) -> list:
    out = []
    for s in names:
        name = s if s in lib.kernels else parse_spec(s).name
        if name not in lib.kernels:
            raise ValueError(f"kernel {s!r} is not in {lib.path}; it has "
                             f"{', '.join(sorted(lib.kernels))}")
        out.append(lib.kernels[name])
    return out


def _kai_kernels(cfg: dict, lib, kind: str, m: int):
    """The KleidiAI kernels of this job: same weights kind, regime and runnable here."""
    kai = cfg.get("kleidiai")
    if not kai:
        return []
    fams = KIND_FAMILIES.get(kind, (kind,))
    out = []
    for kk in kai["kernels"]:
        spec = parse_spec(kk["spec"])
        if spec.family not in fams or spec.is_gemv != (m == 1):
            continue
        if not set(kk["features"]) <= lib.cpu.features:
            continue
        vl = lib.vl_bytes.get(spec.vl_kind) if spec.vl_scaled else None
        if spec.vl_scaled and vl is None:
            continue
        out.append((kk, spec, vl))
    return out


def _refuses(kern, n: int, k: int) -> str | None:
    """Why ``kern``'s layouts cannot hold an n x k job (e.g. K-quants: k a multiple of 256),
    or None."""
    try:
        for lay in (kern.rhs_layout(), kern.lhs_layout()):     # (no packed LHS: None)
            if lay is not None:
                lay.packed_size(n, k)
    except LayoutError as e:
        return str(e)
    return None


def _skip(skipped: list, name: str, why: str) -> None:
    if (name, why) not in skipped:
        skipped.append((name, why))


def _jobs(cfg: dict, lib, skipped: list) -> list[dict]:
    """Every timed measurement of the run, in order (without running anything); kernels this
    CPU cannot run, and shapes a kernel's layouts cannot hold, go to ``skipped`` as
    (name, why)."""
    jobs = []
    threads = cfg.get("threads") or [1]
    # (kernel, shape) pairs: --kernel at every shape, and the explicit "kernel_jobs"
    pairs = [(s, shp) for shp in cfg["shapes"] for s in cfg.get("kernels") or ()]
    pairs += [(s, tuple(shp)) for s, *shp in cfg.get("kernel_jobs") or ()]
    for s, (m, n, k) in pairs:
        kern = _kernels_for(lib, [s])[0]
        if not lib.runnable(kern):
            try:
                kern.require_cpu()
                why = "not runnable on this CPU"
            except ArgumentError as e:      # the features it lacks (SME: TILEGEN_SME=1)
                why = str(e)
            _skip(skipped, kern.name, why)
            continue
        why = _refuses(kern, n, k)
        if why is not None:
            _skip(skipped, kern.name, f"shape {m},{n},{k}: {why}")
            continue
        jobs.append(dict(what="kernel", kind=kern.family, kernel=kern, m=m, n=n, k=k))
    if pairs:
        return jobs
    for m, n, k in cfg["shapes"]:
        for kind in cfg.get("kinds") or DEFAULT_KINDS:
            try:
                pair = lib.kernel_table.pairs(kind)[0]
            except Exception as e:  # noqa: BLE001 - this library has no runnable kernel of kind
                _skip(skipped, kind, str(e))
                continue
            why = _refuses(pair.gemm, n, k)
            if why is not None:
                _skip(skipped, kind, f"shape {m},{n},{k}: {why}")
                continue
            jobs.append(dict(what="kernel", kind=kind, kernel=None, m=m, n=n, k=k))
            if cfg.get("plan", True):
                jobs += [dict(what="plan", kind=kind, threads=t, m=m, n=n, k=k) for t in threads]
            jobs += [dict(what="kleidiai", kind=kind, kai=kai, m=m, n=n, k=k)
                     for kai in _kai_kernels(cfg, lib, kind, m)]
    return jobs


def _stream_bandwidth(cfg: dict, timer, rule: Rule) -> dict:
    nbytes = int(cfg.get("bandwidth_mib", 64) * 2**20)
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    s = measure(lambda: np.copyto(dst, src), timer, rule).summary()
    return {"bytes": nbytes, "timing": s, "bytes_per_s": 2 * nbytes / (s["median_ns"] * 1e-9)}


def run(cfg: dict) -> dict:
    """Run every job of ``cfg`` (see the module docstring and docs/cli.md); the raw timings.
    A KeyboardInterrupt (SIGINT) after the library loaded ends the run: the rows measured so
    far are returned with ``"interrupted": True``."""
    rule = Rule(**cfg.get("rule", {}))
    emulated, how = emulation()
    timer, why = open_timer(cfg.get("clock", "auto"))
    try:
        routines = ClockRoutines(cfg["clock_routines"]) if cfg.get("clock_routines") else None
        ghz, ghz_src = core_frequency(routines, cfg.get("freq_ghz"))
        lib = load(cfg["lib"])
        machine = {
            "cpu": cpu_id(), "cpu_features": sorted(lib.cpu.features),
            "vl_bytes": dict(lib.vl_bytes), "emulated": emulated, "emulation_check": how,
            "label": EMULATED_LABEL if emulated else "hardware timing",
            "counter": timer.name, "counter_why": why,
            "core_ghz": ghz, "core_ghz_source": ghz_src,
            "cntfrq_hz": routines.cntfrq() if routines else None,
            "cpufreq_max_ghz": cpufreq_max_ghz(), "rule": rule_dict(rule)}
        skipped: list = []
        rows: list = []
        jobs = _jobs(cfg, lib, skipped)
        out = {"machine": machine, "rows": rows, "skipped": skipped, "jobs": len(jobs),
               "interrupted": False}
        try:
            _run_jobs(cfg, lib, machine, jobs, timer, rule, rows, skipped)
        except KeyboardInterrupt:
            out["interrupted"] = True
    finally:
        timer.close()
    out["skipped"] = [list(x) for x in skipped]
    return out


def _run_jobs(cfg: dict, lib, machine: dict, jobs: list, timer, rule: Rule, rows: list,
              skipped: list) -> None:
    """Time ``jobs`` in order, appending each row to ``rows`` once it is measured."""
    seed = int(cfg.get("seed", 0))
    total = len(jobs) + 1
    t_start = time.perf_counter()
    machine["stream"] = _stream_bandwidth(cfg, timer, rule)
    _progress(cfg, 1, total, f"streaming copy of {machine['stream']['bytes'] >> 20} MiB: "
                             f"{machine['stream']['bytes_per_s'] / 1e9:.2f} GB/s")
    weights: dict[tuple, object] = {}
    kai_so = ctypes.CDLL(cfg["kleidiai"]["so"]) if cfg.get("kleidiai") else None
    for i, job in enumerate(jobs, 2):
        m, n, k, kind = job["m"], job["n"], job["k"], job["kind"]
        x, w = job_inputs(seed, m, n, k)
        dst = np.full((m, n), np.nan, np.float32)
        row = {"what": job["what"], "kind": kind, "m": m, "n": n, "k": k, "threads": 1}
        if job["what"] == "kleidiai":
            kk, spec, vl = job["kai"]
            fn = getattr(kai_so, f"kai_run_{kk['name']}", None)
            if fn is None:
                skipped.append((f"kai_run_{kk['name']}", f"not in KleidiAI {cfg['kleidiai']['version']}"))
                continue
            params = [Param(p["name"], p["ctype"], p["role"]) for p in kk["run"]]
            call = _bound(ctypes.cast(fn, ctypes.c_void_p).value, params, spec, vl, x, w, seed,
                          dst)
            row.update(kernel=f"kai_run_{kk['name']}", spec=spec.spec_string,
                       weights_bytes=int(call.keep[1].nbytes),
                       kleidiai_version=cfg["kleidiai"]["version"])
        elif job["what"] == "kernel":
            kern, packing = job["kernel"], None
            if kern is None:            # the library's pick for this kind and m
                key = (kind, n, k)
                if key not in weights:
                    weights[key] = _pack_kind(lib, kind, seed, w)
                packing, kern = lib.route(weights[key], m)
            kern.require_cpu()
            call = _bound(kern.address, kern.abi.params, kern.spec, kern.vl_bytes, x, w, seed,
                          dst, packing)
            row.update(kernel=kern.name, spec=kern.spec.spec_string,
                       weights_bytes=int(call.keep[1].nbytes))
        else:
            key = (kind, n, k)
            if key not in weights:
                weights[key] = _pack_kind(lib, kind, seed, w)
            plan = lib.plan(weights[key], m=m, threads=job["threads"])
            packing, kern = plan.route(m)

            def call(plan=plan, x=x, dst=dst):
                plan(x, out=dst)
            row.update(kernel=kern.name, spec=kern.spec.spec_string, threads=job["threads"],
                       weights_bytes=int(packing.nbytes))
        s = measure(call, timer, rule)
        row["timing"] = s.summary()
        row["cycles_counted"] = bool(s.cycles) and row["threads"] == 1
        if cfg.get("outputs"):
            row["out"] = dst.copy()
        rows.append(row)
        t = row["timing"]
        _progress(cfg, i, total, f"{row['what']} {kind} {row['kernel']} m={m} n={n} k={k} "
                                 f"threads={row['threads']}: {t['median_ns'] / 1e6:.3f} ms "
                                 f"({t['reps']} reps, stop: {t['stop']}; "
                                 f"{time.perf_counter() - t_start:.0f} s so far)")


def _interrupt_once(signum, frame) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m tilegen.bench.harness CONFIG.json OUT.json``: 0, or :data:`EXIT_ERROR` with
    ``{"error": message}`` in OUT.json, or :data:`EXIT_INTERRUPTED` (SIGINT) with the rows
    measured so far (``"interrupted": true``)."""
    # the first SIGINT raises KeyboardInterrupt from here on, later ones are ignored (the host
    # starts the guest with SIGINT ignored, so that a Ctrl-C during the interpreter's start-up
    # cannot print a traceback, and passes Ctrl-C on until the guest has written its rows)
    signal.signal(signal.SIGINT, _interrupt_once)
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tilegen.bench.harness CONFIG.json OUT.json", file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            cfg = json.load(f)
        res = run(cfg)
        rc = EXIT_INTERRUPTED if res["interrupted"] else 0
    except KeyboardInterrupt:       # before the library loaded: nothing was measured
        res, rc = {"interrupted": True, "rows": [], "skipped": []}, EXIT_INTERRUPTED
    except USER_ERRORS as e:
        res, rc = {"error": f"{e}"}, EXIT_ERROR
    with open(argv[1], "w") as f:
        json.dump(res, f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
