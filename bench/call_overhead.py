"""Emulated call overhead and 2-thread speed-up: ``lib.plan`` vs ``lib.matmul`` vs numpy.

EMULATED (qemu-user), NOT HARDWARE.  One command on the host (x86-64 or aarch64):

    python bench/call_overhead.py                 # builds out/bench_<cpu>, runs the guest
    python bench/call_overhead.py --cpu neoverse-v1 --reps 30

It builds the target's default library, then runs itself in one emulated guest process
(``tilegen emulate --cpu CPU``), which measures:

- overhead: a 1x32x32 q4_0 matmul (gemv: pack the activations, one kernel call) through
  ``lib.matmul(x, w, out=o, threads=1)``, ``plan(x, o)`` and ``plan(x)`` (threads=1; also
  threads=2), against numpy's float32 ``x @ wt`` and ``np.matmul(x, wt, out=o)`` on the
  dequantised weights: per call, the best over --reps batches of --calls calls;
- speed-up: m = 1, n = k = 4096 q4_0 with 1 and 2 threads, ``lib.matmul`` and ``plan``: best
  of --reps single calls, the thread counts interleaved so that load changes hit both.  The
  CPU time over wall time of the 2-thread plan calls is printed too: 2.0 means both threads
  ran all the time; less means the machine (another process) took a core.

Writes bench/results/call_overhead_<cpu>.json and .md (``--out`` to change the directory).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))          # this checkout's tilegen

LABEL = "emulated (qemu), not hardware"


def _batch(fn, calls: int, reps: int) -> float:
    """Best per-call time (s) over reps batches of calls."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def guest(libdir: str, reps: int, calls: int) -> dict:
    import numpy as np
    import tilegen
    from tilegen.layout.ggml import dequantize_q4_0, quantize_q4_0

    lib = tilegen.load(libdir)
    rng = np.random.default_rng(0)
    res: dict = {"label": LABEL, "machine": platform.machine(), "load_before": os.getloadavg()}

    # -- per-call overhead, 1 x 32 x 32 -------------------------------------------------
    n = k = 32
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
    wq = lib.pack_weights(kind="q4_0", from_ggml=raw, n=n, k=k)
    wt = np.ascontiguousarray(dequantize_q4_0(raw, n, k).T)
    x = rng.normal(size=(1, k)).astype(np.float32)
    o = np.empty((1, n), np.float32)
    p1 = lib.plan(wq, 1, threads=1)
    p2 = lib.plan(wq, 1, threads=2)
    assert np.array_equal(p1(x), lib.matmul(x, wq, threads=1)) and np.array_equal(p2(x), p1(x))
    cases = {
        "numpy x @ wt": lambda: x @ wt,
        "numpy matmul(out=)": lambda: np.matmul(x, wt, out=o),
        "lib.matmul(out=) t1": lambda: lib.matmul(x, wq, out=o, threads=1),
        "plan(x, out) t1": lambda: p1(x, o),
        "plan(x) t1": lambda: p1(x),
        "plan(x, out) t2": lambda: p2(x, o),
    }
    over = {name: 1e6 * _batch(fn, calls, reps) for name, fn in cases.items()}
    res["overhead_us"] = over
    res["overhead_kernel"] = p1.kernel.name
    res["overhead_ratio_plan_vs_numpy"] = over["plan(x, out) t1"] / over["numpy x @ wt"]
    res["overhead_ratio_matmul_vs_numpy"] = over["lib.matmul(out=) t1"] / over["numpy x @ wt"]

    # -- 2-thread speed-up, m = 1, n = k = 4096 ----------------------------------------------
    n = k = 4096
    raw = quantize_q4_0(rng.normal(size=(n, k)).astype(np.float32))
    wq = lib.pack_weights(kind="q4_0", from_ggml=raw, n=n, k=k)
    x = rng.normal(size=(1, k)).astype(np.float32)
    o = np.empty((1, n), np.float32)
    plans = {t: lib.plan(wq, 1, threads=t) for t in (1, 2)}
    ref = lib.matmul(x, wq, threads=1)
    assert all(np.array_equal(p(x), ref) for p in plans.values())
    fns = {("plan", t): (lambda p=p: p(x, o)) for t, p in plans.items()}
    fns.update({("matmul", t): (lambda t=t: lib.matmul(x, wq, out=o, threads=t)) for t in (1, 2)})
    best = {key: float("inf") for key in fns}
    cpu2 = []
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for key, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
            best[key] = min(best[key], dt)
            if key == ("plan", 2):
                cpu2.append(dc / dt)
    res["gemv4096_ms"] = {f"{a} t{t}": 1e3 * v for (a, t), v in best.items()}
    res["gemv4096_kernel"] = plans[1].kernel.name
    res["speedup_plan_2t"] = best[("plan", 1)] / best[("plan", 2)]
    res["speedup_matmul_2t"] = best[("matmul", 1)] / best[("matmul", 2)]
    res["plan_2t_cpu_per_wall_median"] = sorted(cpu2)[len(cpu2) // 2]
    res["plan_2t_cpu_per_wall_max"] = max(cpu2)
    v2 = plans[2]._variants[1]        # how many column tasks the pool worker ran
    res["plan_2t_tasks_by_worker"] = f"{v2.s.by_workers} of {v2.s.nmm * (reps + 2)}"
    res["load_after"] = os.getloadavg()
    res["reps"], res["calls"] = reps, calls
    return res


def markdown(r: dict, cpu: str) -> str:
    o = r["overhead_us"]
    lines = [f"# Call overhead and 2-thread speed-up, qemu `{cpu}` ({r['label']})", "",
             f"Load average before/after: {r['load_before']} / {r['load_after']} "
             f"(the host had {os.cpu_count()} CPUs).", "",
             f"## Per call, 1 x 32 x 32 q4_0 (`{r['overhead_kernel']}`), best of {r['reps']} "
             f"batches of {r['calls']}", "", "| call | µs | / numpy `x @ wt` |", "|---|---:|---:|"]
    base = o["numpy x @ wt"]
    lines += [f"| `{name}` | {v:.1f} | {v / base:.2f} |" for name, v in o.items()]
    g = r["gemv4096_ms"]
    lines += ["", f"## m = 1, n = k = 4096 q4_0 (`{r['gemv4096_kernel']}`), best of {r['reps']}",
              "", "| call | ms |", "|---|---:|"]
    lines += [f"| `{name}` | {v:.2f} |" for name, v in g.items()]
    lines += ["", f"2-thread speed-up: plan {r['speedup_plan_2t']:.2f}x, lib.matmul "
                  f"{r['speedup_matmul_2t']:.2f}x; CPU time / wall time of the 2-thread plan "
                  f"calls: median {r['plan_2t_cpu_per_wall_median']:.2f}, best "
                  f"{r['plan_2t_cpu_per_wall_max']:.2f} (2.0: both threads ran throughout; less: "
                  f"another process had a core, and the speed-up is not the code's). Column "
                  f"tasks the pool worker ran: {r['plan_2t_tasks_by_worker']}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", default="neoverse-n1", help="qemu CPU model (and build target)")
    ap.add_argument("--target", default=None, help="build target (default: --cpu)")
    ap.add_argument("--lib", default=None, help="a built library (default: build one)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--guest", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.guest:           # inside the emulated Python: print the result as JSON
        print("RESULT " + json.dumps(guest(a.lib, a.reps, a.calls)), flush=True)
        return 0
    libdir = a.lib or str(ROOT / "out" / f"bench_{a.cpu}")
    if a.lib is None:
        import tilegen
        tilegen.build_library(None, target=a.target or a.cpu, out_dir=libdir)
    cmd = [sys.executable, "-m", "tilegen", "emulate", "--cpu", a.cpu, "--", "python",
           str(Path(__file__).resolve()), "--guest", "--lib", libdir, "--reps", str(a.reps),
           "--calls", str(a.calls)]
    if platform.machine() in ("aarch64", "arm64"):
        cmd = [sys.executable, *cmd[cmd.index("python") + 1:]]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        sys.stderr.write(p.stdout + p.stderr)
        return 1
    r = json.loads(line[len("RESULT "):])
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"call_overhead_{a.cpu}.json").write_text(json.dumps(r, indent=2) + "\n")
    md = markdown(r, a.cpu)
    (out / f"call_overhead_{a.cpu}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
