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
host starts it in the guest); progress lines go to stderr.  Inputs are drawn by
:func:`job_inputs` (seeded), so a caller can recompute the reference result.
"""
from __future__ import annotations

import ctypes
import json
import sys
import time

import numpy as np

from ..callconv import Param
from ..generator.validate import parse_spec
from ..layout import lhs_layout_for, rhs_layout_for
from ..runtime import load
from ..runtime.binding import CTYPES
from ..runtime.select import KIND_FAMILIES
from .clock import (EMULATED_LABEL, ClockRoutines, core_frequency, cpu_id, cpufreq_max_ghz,
                    emulation, open_timer)
from .stats import Rule, measure, rule_dict

__all__ = ["job_inputs", "run", "main", "DEFAULT_KINDS"]

DEFAULT_KINDS = ("f32", "q4_0", "q4_0_dx", "q8_0", "bf16")
INF = float("inf")


def job_inputs(seed: int, m: int, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(x (m, k), w (n, k)) float32 in [-1, 1), never zero-filled, from ``seed`` and the shape."""
    rng = np.random.default_rng([seed, m, n, k])
    x = rng.random((m, k), dtype=np.float32) * 2 - 1
    w = rng.random((n, k), dtype=np.float32) * 2 - 1
    return x, w


class _Call:
    """A foreign routine bound to its arguments (ctypes objects made once): ``call()``."""

    def __init__(self, address: int, params, by_role: dict, keep: tuple) -> None:
        types = [CTYPES.get(p.ctype, ctypes.c_void_p) for p in params]
        self.fn = ctypes.CFUNCTYPE(None, *types)(address)
        self.args = [t(by_role[p.role]) for t, p in zip(types, params)]
        self.keep = keep            # the buffers the pointers point into

    def __call__(self) -> None:
        self.fn(*self.args)


def _operands(spec, vl, x: np.ndarray, w: np.ndarray, lhs_rows: bool, packed=None):
    """(lhs buffer, lhs stride, rhs bytes, bl) of ``spec`` for x @ w.T (rhs: ``packed``'s
    bytes when given, else packed from w by the spec's RHS layout)."""
    bl = (packed.bl if packed is not None else None) or 32
    if packed is not None:
        rhs = packed.data
    else:
        lay = rhs_layout_for(spec, bl, vl)
        rhs = lay.pack_from_float(w) if spec.info.quantized else lay.pack(w)
    k = x.shape[1]
    if lhs_rows:
        lhs = lhs_layout_for(spec, bl, vl).pack(x) if spec.packs_f32_lhs else x
        return np.ascontiguousarray(lhs), 4 * k, np.ascontiguousarray(rhs), bl
    return np.ascontiguousarray(lhs_layout_for(spec, bl, vl).pack(x)), 0, np.ascontiguousarray(rhs), bl


def _bound(address: int, params, spec, vl, x, w, dst, packed=None) -> _Call:
    lhs_rows = any(p.role == "lhs_stride" for p in params)
    lhs, stride, rhs, bl = _operands(spec, vl, x, w, lhs_rows, packed)
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


def _jobs(cfg: dict, lib, skipped: list) -> list[dict]:
    """Every timed measurement of the run, in order (without running anything); kernels this
    CPU cannot run go to ``skipped`` as (name, why)."""
    jobs = []
    threads = cfg.get("threads") or [1]
    # (kernel, shape) pairs: --kernel at every shape, and the explicit "kernel_jobs"
    pairs = [(s, shp) for shp in cfg["shapes"] for s in cfg.get("kernels") or ()]
    pairs += [(s, tuple(shp)) for s, *shp in cfg.get("kernel_jobs") or ()]
    for s, (m, n, k) in pairs:
        kern = _kernels_for(lib, [s])[0]
        if not lib.runnable(kern):
            if (kern.name, "not runnable on this CPU") not in skipped:
                skipped.append((kern.name, "not runnable on this CPU"))
            continue
        jobs.append(dict(what="kernel", kind=kern.family, kernel=kern, m=m, n=n, k=k))
    if pairs:
        return jobs
    for m, n, k in cfg["shapes"]:
        for kind in cfg.get("kinds") or DEFAULT_KINDS:
            try:
                lib.kernel_table.pairs(kind)
            except Exception as e:  # noqa: BLE001 - this library has no runnable kernel of kind
                if (kind, str(e)) not in skipped:
                    skipped.append((kind, str(e)))
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
    """Run every job of ``cfg`` (see the module docstring and docs/cli.md); the raw timings."""
    rule = Rule(**cfg.get("rule", {}))
    emulated, how = emulation()
    timer, why = open_timer(cfg.get("clock", "auto"))
    routines = ClockRoutines(cfg["clock_routines"]) if cfg.get("clock_routines") else None
    ghz, ghz_src = core_frequency(routines, cfg.get("freq_ghz"))
    lib = load(cfg["lib"])
    seed = int(cfg.get("seed", 0))
    machine = {
        "cpu": cpu_id(), "cpu_features": sorted(lib.cpu.features), "vl_bytes": dict(lib.vl_bytes),
        "emulated": emulated, "emulation_check": how,
        "label": EMULATED_LABEL if emulated else "hardware timing",
        "counter": timer.name, "counter_why": why,
        "core_ghz": ghz, "core_ghz_source": ghz_src,
        "cntfrq_hz": routines.cntfrq() if routines else None,
        "cpufreq_max_ghz": cpufreq_max_ghz(), "rule": rule_dict(rule)}
    skipped: list = []
    jobs = _jobs(cfg, lib, skipped)
    total = len(jobs) + 1
    t_start = time.perf_counter()
    machine["stream"] = _stream_bandwidth(cfg, timer, rule)
    _progress(cfg, 1, total, f"streaming copy of {machine['stream']['bytes'] >> 20} MiB: "
                             f"{machine['stream']['bytes_per_s'] / 1e9:.2f} GB/s")
    rows = []
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
            call = _bound(ctypes.cast(fn, ctypes.c_void_p).value, params, spec, vl, x, w, dst)
            row.update(kernel=f"kai_run_{kk['name']}", spec=spec.spec_string,
                       weights_bytes=int(call.keep[1].nbytes),
                       kleidiai_version=cfg["kleidiai"]["version"])
        elif job["what"] == "kernel":
            kern, packing = job["kernel"], None
            if kern is None:            # the library's pick for this kind and m
                key = (kind, n, k)
                if key not in weights:
                    weights[key] = lib.pack_weights(w, kind=kind)
                packing, kern = lib.route(weights[key], m)
            kern.require_cpu()
            call = _bound(kern.address, kern.abi.params, kern.spec, kern.vl_bytes, x, w, dst,
                          packing)
            row.update(kernel=kern.name, spec=kern.spec.spec_string,
                       weights_bytes=int(call.keep[1].nbytes))
        else:
            key = (kind, n, k)
            if key not in weights:
                weights[key] = lib.pack_weights(w, kind=kind)
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
    timer.close()
    return {"machine": machine, "rows": rows, "skipped": [list(x) for x in skipped]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m tilegen.bench.harness CONFIG.json OUT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        cfg = json.load(f)
    res = run(cfg)
    with open(argv[1], "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
