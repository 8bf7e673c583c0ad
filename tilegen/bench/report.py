"""``tilegen bench`` on the host: build the clock routines, run the harness on the Arm CPU
(in-process on aarch64, in the guest Python under qemu elsewhere), join its timings with the
llvm-mca model of each kernel (:mod:`tilegen.analysis.mca`, host side), print a table or JSON.

The JSON document (``SCHEMA_ID``) is described key by key in :data:`SCHEMA` and in
docs/cli.md; :func:`check_schema` checks a document against it.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from ..analysis.mca import AnalyzeError, analyze
from ..build.targets import get_target
from ..build.toolchain import ToolchainError, discover
from ..generator.render import render_template
from ..generator.validate import parse_spec
from ..records import ISAS, __version__
from ..runtime.checks import MAX_THREADS
from .clock import ADD_CHAIN, EMULATED_LABEL

__all__ = ["SCHEMA_ID", "SCHEMA", "DEFAULT_SHAPES", "BenchError", "build_clock_routines",
           "kleidiai_config", "run_harness", "join", "check_schema", "table", "parse_shape",
           "parse_threads", "check_timing_options", "check_kinds", "guest_cpu",
           "default_model", "progress", "will_emulate", "to_json", "MAX_JOB_BYTES",
           "TIMING_RANGES"]

SCHEMA_ID = "tilegen-bench/1"
# decode and prefill of a 4096 x 4096 projection, then a llama-7B layer's other shapes
# (hidden 4096, FFN 11008: gate/up n = 11008, down k = 11008) at m = 1 and 128
DEFAULT_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, 4096, 4096), (128, 4096, 4096),
    (1, 11008, 4096), (1, 4096, 11008), (128, 11008, 4096), (128, 4096, 11008))


class BenchError(ValueError):
    """A bench request that cannot be served (the message says why)."""


# -- schema ------------------------------------------------------------------------------
_NUM, _OPT_NUM = (int, float), (int, float, type(None))
_TIMING = {"reps": int, "batch": int, "stop": str, "median_ns": _NUM, "ci95_ns": list,
           "rel_ci": _OPT_NUM, "min_ns": _NUM, "max_ns": _NUM, "iqr_ns": list,
           "median_cycles": _OPT_NUM}
#: key -> type(s), or a nested dict for an object, or [dict] for a list of objects
SCHEMA = {
    "schema": str, "tilegen": str, "library": str, "target": (str, type(None)), "label": str,
    "machine": {"cpu": str, "cpu_features": list, "vl_bytes": dict, "emulated": bool,
                "emulation_check": str, "label": str, "counter": str, "counter_why": str,
                "core_ghz": _OPT_NUM, "core_ghz_source": str, "cntfrq_hz": (int, type(None)),
                "cpufreq_max_ghz": _OPT_NUM, "rule": dict,
                "stream": {"bytes": int, "timing": _TIMING, "bytes_per_s": _NUM}},
    "model": (str, type(None)),
    "interrupted": bool,
    "skipped": [list],
    "rows": [{"what": str, "kind": str, "kernel": str, "spec": str, "m": int, "n": int, "k": int,
              "threads": int, "weights_bytes": int, "timing": _TIMING, "cycles_counted": bool,
              "label": str, "gflops": _NUM, "cycles": _OPT_NUM, "cycles_source": str,
              "macs_per_cycle": _OPT_NUM, "macs_per_cycle_per_thread": _OPT_NUM,
              "weights_bytes_per_s": _NUM, "stream_fraction": _NUM,
              "model_macs_per_cycle": _OPT_NUM, "model_note": str, "ratio_to_model": _OPT_NUM}],
}


def _check(value, schema, where: str, out: list[str]) -> None:
    if isinstance(schema, dict):
        if not isinstance(value, dict):
            out.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        for key, sub in schema.items():
            if key not in value:
                out.append(f"{where}.{key}: missing")
            else:
                _check(value[key], sub, f"{where}.{key}", out)
    elif isinstance(schema, list):
        if not isinstance(value, list):
            out.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, v in enumerate(value):
            _check(v, schema[0], f"{where}[{i}]", out)
    else:
        types = schema if isinstance(schema, tuple) else (schema,)
        if isinstance(value, bool) and bool not in types:
            out.append(f"{where}: expected {'/'.join(t.__name__ for t in types)}, got bool")
        elif not isinstance(value, types):
            out.append(f"{where}: expected {'/'.join(t.__name__ for t in types)}, got "
                       f"{type(value).__name__}")


def check_schema(doc) -> list[str]:
    """Every way ``doc`` departs from :data:`SCHEMA` (empty: it conforms)."""
    out: list[str] = []
    _check(doc, SCHEMA, "$", out)
    if isinstance(doc, dict) and doc.get("schema") != SCHEMA_ID:
        out.append(f"$.schema: expected {SCHEMA_ID!r}, got {doc.get('schema')!r}")
    return out


# -- arguments -----------------------------------------------------------------------------
#: the bound on a job's float operands: x (m*k), the weights (n*k) and the output (m*n), 4 bytes
#: each, at most 2 GiB together (the harness holds them, and their packed copies, at once)
MAX_JOB_BYTES = 2 << 30


def parse_shape(text: str, option: str = "--shape") -> tuple[int, int, int]:
    """``m,n,k``: three positive integers whose float operands fit :data:`MAX_JOB_BYTES`."""
    parts = text.split(",")
    if len(parts) != 3 or not all(re.fullmatch(r"[1-9][0-9]*", p.strip()) for p in parts):
        raise BenchError(f"{option} {text!r}: give m,n,k, three positive integers (e.g. 1,4096,4096)")
    m, n, k = (int(p) for p in parts)
    need = 4 * (m * k + n * k + m * n)
    if need > MAX_JOB_BYTES:
        raise BenchError(f"{option} {text!r}: the job's float operands (x {m}x{k}, weights "
                         f"{n}x{k}, output {m}x{n}) need {need / 2**30:.3g} GiB; the bound is "
                         f"{MAX_JOB_BYTES >> 30} GiB per job")
    return m, n, k


def parse_threads(text: str) -> list[int]:
    """``4`` (1..4), ``1..4``, or a list ``1,2,8``: counts from 1 to the runtime's limit
    (``tilegen.runtime.checks.MAX_THREADS``)."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:\.\.\s*(\d+))?\s*", text)
    if m and m.group(2) is not None:
        lo, hi = int(m.group(1)), int(m.group(2))
        out = list(range(lo, hi + 1))
    elif m:
        out = list(range(1, int(m.group(1)) + 1))
    elif re.fullmatch(r"\s*\d+(\s*,\s*\d+)+\s*", text):
        out = [int(p) for p in text.split(",")]
    else:
        out = []
    if not out or min(out) < 1:
        raise BenchError(f"--threads {text!r}: give N (1..N), A..B or a list A,B,C of counts >= 1")
    if max(out) > MAX_THREADS:
        raise BenchError(f"--threads {text!r}: at most {MAX_THREADS} threads (the runtime's "
                         f"threads= limit), got {max(out)}")
    return out


#: option -> (low, high, low included): the ranges of the numeric timing options (finite)
TIMING_RANGES = {"--rel-ci": (0.0, 1.0, False), "--budget": (0.0, 3600.0, False),
                 "--freq-ghz": (0.0, 100.0, False), "--bandwidth-mib": (1.0, 1024.0, True)}


def check_timing_options(**values) -> None:
    """BenchError unless each given option (``rel_ci=``, ``budget=``, ``freq_ghz=``,
    ``bandwidth_mib=``; None: not given) is finite and within :data:`TIMING_RANGES`."""
    for name, v in values.items():
        if v is None:
            continue
        opt = "--" + name.replace("_", "-")
        lo, hi, closed = TIMING_RANGES[opt]
        if not (math.isfinite(v) and (v >= lo if closed else v > lo) and v <= hi):
            raise BenchError(f"{opt} must be a finite number {'from' if closed else 'above'} "
                             f"{lo:g} {'to' if closed else 'up to'} {hi:g}, got {v}")


def check_kinds(kinds, families: set[str]) -> None:
    """BenchError unless every weights kind of ``kinds`` is a runtime kind (the records') that
    a kernel of ``families`` (the library's) serves."""
    from ..runtime.select import KIND_FAMILIES
    for kind in kinds:
        if kind not in KIND_FAMILIES:
            raise BenchError(f"--kind {kind!r}: unknown weights kind; known: "
                             f"{', '.join(KIND_FAMILIES)}")
        if not families & set(KIND_FAMILIES[kind]):
            have = [k for k, fams in KIND_FAMILIES.items() if families & set(fams)]
            raise BenchError(f"--kind {kind!r}: the library has no kernel of "
                             f"{' or '.join(KIND_FAMILIES[kind])}; it serves "
                             f"{', '.join(have) or 'no kind'}")


def _finite(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    return v


def to_json(doc) -> str:
    """``doc`` as strict JSON (RFC 8259: non-finite numbers become null, never NaN/Infinity)."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False)


def guest_cpu(target: str | None) -> str:
    """The qemu model for a library built for ``target``: the target's own when qemu has it."""
    from ..emulate.runner import QEMU_CPU_MODELS
    return target if target in QEMU_CPU_MODELS else "max"


# -- host-side preparation -------------------------------------------------------------------
def build_clock_routines(out_dir: str | os.PathLike, cc: str | None = None) -> Path | None:
    """``templates/bench_timer.S.j2`` assembled and linked into ``out_dir/libtilegen_clock.so``
    (None when no toolchain is found: the harness then has no timer or core frequency)."""
    try:
        tc = discover("elf", cc)
    except ToolchainError:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src, obj, so = out / "tilegen_clock.S", out / "tilegen_clock.o", out / "libtilegen_clock.so"
    src.write_text(render_template("bench_timer.S.j2", fmt="elf", prefix="", lp=".L",
                                   chain=ADD_CHAIN, version=__version__))
    for cmd in (tc.assemble_cmd(src, obj), tc.link_cmd([obj], so)):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise BenchError(f"building the clock routines failed: {(p.stderr + p.stdout).strip()}")
    return so


def _kleidiai_tarball(path: Path) -> Path:
    if path.is_file():
        return path
    if path.is_dir():
        tars = sorted(path.glob("kleidiai-v*.tar.gz"),
                      key=lambda p: tuple(int(x) for x in re.findall(r"\d+", p.name)))
        if tars:
            return tars[-1]
        if (path / "kai" / "kai_common.h").is_file():
            raise BenchError(f"{path} is an extracted KleidiAI tree: give the release tarball it "
                             f"came from (or the directory holding it), which tilegen builds "
                             f"once into its cache")
    raise BenchError(f"--vs-kleidiai {path}: no KleidiAI release tarball (kleidiai-vX.Y.Z.tar.gz) "
                     f"there")


def _kai_features(name: str, spec: str) -> list[str]:
    """The CPU features KleidiAI's kernel ``name`` needs: its tilegen spec's, and those its
    name's ISA tokens say (a ``_sve_`` kernel runs SVE instructions even where tilegen's
    counterpart on the same layouts is NEON)."""
    feats = set(parse_spec(spec).features)
    for tok in set(name.split("_")) & {"dotprod", "i8mm", "sve", "sme", "sme2"}:
        feats |= set(ISAS[tok].features)
    return sorted(feats)


def kleidiai_config(path: str | os.PathLike, quiet: bool = False) -> dict:
    """KleidiAI built from a release tarball (or the newest in a directory: e.g.
    ``../shared/thirdparty/kleidiai``) by :func:`tilegen.emulate.provision.ensure_kleidiai_library`,
    and the micro-kernels llama.cpp names that read tilegen's packed layouts, with their run
    functions' parameters (the harness's ``config["kleidiai"]``)."""
    from ..emulate.provision import ProvisionError, ensure_kleidiai_library
    from ..export.kleidiai import ABIS, KERNELS
    tarball = _kleidiai_tarball(Path(path))
    try:
        kai = ensure_kleidiai_library(tarball, quiet=quiet)
    except ProvisionError as e:
        raise BenchError(str(e)) from None
    kernels = [{"name": kk.name, "spec": kk.spec, "features": _kai_features(kk.name, kk.spec),
                "run": [{"name": p.name, "ctype": p.ctype, "role": p.role}
                        for p in ABIS[kk.abi].run]}
               for kk in KERNELS if kk.same_layouts]
    return {"so": str(kai.shared), "version": kai.version, "kernels": kernels}


def will_emulate() -> bool:
    """Whether :func:`run_harness` times under qemu: this host is no Arm64 CPU."""
    from ..runtime.cpu import detect
    return not detect().is_arm64


def run_harness(cfg: dict, cpu: str = "max", sve_vl: int | None = None,
                sme_vl: int | None = None, emulate: bool | None = None) -> dict:
    """The harness's raw result: in this process on an Arm64 CPU, else (or with
    ``emulate=True``) in the guest Python on qemu model ``cpu`` (progress lines on stderr as
    they come).  A user error inside the harness (the library does not load, a job's layouts
    refuse it) is a BenchError with its one-line message.  Ctrl-C (SIGINT, KeyboardInterrupt
    here) ends the run: the result holds the rows measured so far and ``"interrupted": True``
    (no ``"machine"`` when it came before the library loaded)."""
    from .harness import EXIT_ERROR, EXIT_INTERRUPTED, USER_ERRORS
    if not (will_emulate() if emulate is None else emulate):
        from .harness import run
        try:
            return run(cfg)
        except KeyboardInterrupt:
            return {"interrupted": True, "rows": [], "skipped": []}
        except USER_ERRORS as e:
            raise BenchError(str(e)) from None
    from ..emulate.runner import EmulateError, guest_command
    with tempfile.TemporaryDirectory(prefix="tilegen-bench-") as tmp:
        cin, cout = Path(tmp) / "config.json", Path(tmp) / "result.json"
        cin.write_text(json.dumps(cfg))
        try:
            argv, env = guest_command(["python", "-m", "tilegen.bench.harness", str(cin),
                                       str(cout)], cpu=cpu, sve_vl=sve_vl, sme_vl=sme_vl)
        except EmulateError as e:
            raise BenchError(str(e)) from None
        # its own session (a terminal's Ctrl-C reaches this process only, which passes one
        # SIGINT on), started with SIGINT ignored until the harness's main takes it over
        p = subprocess.Popen(argv, env=env, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        interrupted = False
        try:
            p.wait()
        except KeyboardInterrupt:
            interrupted = True
            _stop(p)
        res = json.loads(cout.read_text()) if cout.is_file() else None
    if res is not None and p.returncode == EXIT_ERROR and "error" in res:
        raise BenchError(res["error"])
    if interrupted or p.returncode == EXIT_INTERRUPTED:
        res = res if res is not None and "rows" in res else {"rows": [], "skipped": []}
        return dict(res, interrupted=True)
    if p.returncode != 0 or res is None:
        raise BenchError(f"the bench harness failed in the emulated Python (cpu {cpu}, "
                         f"exit code {p.returncode}; its stderr is above)")
    return res


def _stop(p: subprocess.Popen, patience_s: float = 30.0) -> None:
    """Pass Ctrl-C on to the guest harness (again each second: it ignores SIGINT until its
    main runs) until it has written the rows measured so far; killed after ``patience_s``
    or at a second Ctrl-C."""
    import time
    end = time.monotonic() + patience_s
    try:
        while p.poll() is None and time.monotonic() < end:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:
        pass
    if p.poll() is None:
        p.kill()
        p.wait()


# -- joining with the model ------------------------------------------------------------------
def _model(spec_text: str, model: str | None, cache: dict) -> tuple[float | None, str]:
    if model is None:
        return None, "no llvm-mca model (the library's target has none; give --cpu-model)"
    key = (spec_text, model)
    if key not in cache:
        spec = parse_spec(spec_text)
        try:
            r = analyze(spec, model)
            v = r.block32_macs_per_cycle
            cache[key] = (v, f"llvm-mca -mcpu={model}, MACs/cycle over one 32-k block of the tile")
        except AnalyzeError as e:
            cache[key] = (None, f"not modelled: {str(e).splitlines()[0]}")
    return cache[key]


def join(raw: dict, library: str, target: str | None, model: str | None) -> dict:
    """The bench document: the harness's timings, the derived figures and the model's."""
    mach = raw["machine"]
    label = mach["label"]
    ghz = mach.get("core_ghz")
    stream = mach["stream"]["bytes_per_s"]
    cache: dict = {}
    rows = []
    for r in raw["rows"]:
        r = {k: v for k, v in r.items() if k != "out"}
        t = r["timing"]
        sec = t["median_ns"] * 1e-9
        macs = r["m"] * r["n"] * r["k"]
        if r["cycles_counted"] and t["median_cycles"]:
            cycles, src = t["median_cycles"], "perf_event (counted)"
        elif ghz:
            cycles, src = t["median_ns"] * ghz, f"wall time x {ghz:.3f} GHz ({mach['core_ghz_source']})"
        else:
            cycles, src = None, "none: no cycle counter and no core frequency (--freq-ghz)"
        mpc = macs / cycles if cycles else None
        mv, note = _model(r["spec"], model, cache)
        per_thread = mpc / r["threads"] if mpc is not None else None
        r.update(label=label, gflops=2 * macs / sec / 1e9, cycles=cycles, cycles_source=src,
                 macs_per_cycle=mpc, macs_per_cycle_per_thread=per_thread,
                 weights_bytes_per_s=r["weights_bytes"] / sec,
                 stream_fraction=r["weights_bytes"] / sec / stream,
                 model_macs_per_cycle=mv, model_note=note,
                 ratio_to_model=per_thread / mv if (per_thread is not None and mv) else None)
        rows.append(r)
    return {"schema": SCHEMA_ID, "tilegen": __version__, "library": str(library),
            "target": target, "label": label, "machine": mach, "model": model,
            "interrupted": bool(raw.get("interrupted")), "skipped": raw.get("skipped", []),
            "rows": rows}


def _f(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _short(kernel: str) -> str:
    """A kernel name without the prefix every matmul shares (KleidiAI's: ``kai:``)."""
    kai = kernel.startswith("kai_run_")
    name = kernel.removeprefix("kai_run_").removeprefix("matmul_clamp_f32_")
    return ("kai:" if kai else "") + name


def table(doc: dict) -> str:
    """The readable form of a bench document."""
    mach = doc["machine"]
    lines = []
    if mach["emulated"]:
        lines.append(f"*** {EMULATED_LABEL} ({mach['emulation_check']}) ***")
    ghz = mach["core_ghz"]
    lines += [f"library {doc['library']} (target {doc['target']}); model: "
              f"{doc['model'] or 'none'}",
              f"counter: {mach['counter_why']}",
              f"core clock: {_f(ghz, '.3f')} GHz ({mach['core_ghz_source']}); timer CNTFRQ_EL0 "
              f"{_f(mach['cntfrq_hz'] and mach['cntfrq_hz'] / 1e6, '.3f')} MHz (not the core clock)",
              f"streaming copy bandwidth: {mach['stream']['bytes_per_s'] / 1e9:.2f} GB/s "
              f"(bytes read + written, {mach['stream']['bytes'] >> 20} MiB numpy copy)",
              f"repetitions until the 95% CI of the median is within +-{100 * mach['rule']['rel_ci']:g}% "
              f"or {mach['rule']['budget_s']:g} s per measurement",
              "",
              f"{'what':<8} {'kind':<7} {'kernel':<62} {'m':>4} {'n':>6} {'k':>6} {'thr':>3} "
              f"{'median ms':>10} {'+-CI%':>6} {'reps':>5} {'GFLOP/s':>8} {'MAC/cyc':>8} "
              f"{'W GB/s':>7} {'%strm':>6} {'model':>6} {'meas/model':>10}"]
    for r in doc["rows"]:
        t = r["timing"]
        name = _short(r["kernel"])
        lines.append(
            f"{r['what']:<8} {r['kind']:<7} {name[:62]:<62} {r['m']:>4} {r['n']:>6} "
            f"{r['k']:>6} {r['threads']:>3} {t['median_ns'] / 1e6:10.3f} "
            f"{_f(t['rel_ci'] and 100 * t['rel_ci'], '6.1f'):>6} {t['reps']:>5} "
            f"{r['gflops']:8.2f} {_f(r['macs_per_cycle'], '8.2f'):>8} "
            f"{r['weights_bytes_per_s'] / 1e9:7.2f} "
            f"{(_f(100 * r['stream_fraction'], '5.0f') + '%') if r['m'] == 1 else '-':>6} "
            f"{_f(r['model_macs_per_cycle'], '6.1f'):>6} {_f(r['ratio_to_model'], '10.3f'):>10}")
    lines += ["", "kernel names without matmul_clamp_f32_ (kai: KleidiAI's kai_run_ function); "
              "MAC/cyc: all threads (cycles: " + ("; ".join(sorted({r['cycles_source'] for r in
              doc['rows']})) or "-") + "); meas/model: per thread against llvm-mca's "
              "32-k-block MACs/cycle; %strm: packed-weight bytes/s over the copy bandwidth (gemv)"]
    lines += [f"skipped: {name} ({why})" for name, why in doc["skipped"]]
    if doc.get("interrupted"):
        lines.append("*** interrupted (Ctrl-C): only the rows measured before it ***")
    if mach["emulated"]:
        lines.append(f"*** every figure above: {EMULATED_LABEL} ***")
    return "\n".join(lines)


def default_model(target: str | None) -> str | None:
    if target is None:
        return None
    try:
        return get_target(target).llvm_cpu or None
    except Exception:       # noqa: BLE001 - an unknown target: no model
        return None


def progress(text: str) -> None:
    print(f"tilegen bench: {text}", file=sys.stderr, flush=True)
