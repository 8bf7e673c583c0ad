"""`tilegen` command line: generate, build, list, targets, info, analyze, tune, bench, check-abi,
export, emulate."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .families import FAMILIES
from .records import __version__


class CliError(Exception):
    """A user error: main prints ``tilegen <cmd>: error: <message>`` and returns 2."""


class _Interrupted(Exception):
    """Ctrl-C during a timing run: main prints ``tilegen <cmd>: <message>`` and returns 130."""


_GENERATE_PARTS = ("family", "isa", "tile", "kr", "sr")


def _cmd_generate(a: argparse.Namespace) -> int:
    from .generator import KernelSpec, parse_spec, render, validate
    from .generator.spec import parse_tile
    given = [f"--{x}" for x in _GENERATE_PARTS if getattr(a, x) is not None]
    if a.spec is not None:      # the spec string of build --kernel / analyze --kernel
        if given:
            raise CliError(f"give either a SPEC ({a.spec!r}) or --family/--isa/--tile/--kr/--sr, "
                           f"not both (got {', '.join(given)})")
        spec = parse_spec(a.spec)
    else:
        missing = [f"--{x}" for x in ("family", "isa", "tile") if getattr(a, x) is None]
        if missing:
            raise CliError(f"{', '.join(missing)} required, or one SPEC as build --kernel takes "
                           f"(FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am], e.g. q4_K:sme2:4vlx1vl:i16)")
        mr, mr_vl, nr, nr_vl = parse_tile(a.tile)
        spec = validate(KernelSpec(a.family, a.isa, mr, nr, kr=a.kr, sr=a.sr, mr_vl=mr_vl,
                                   nr_vl=nr_vl))
    r = render(spec, a.format)
    out = Path(a.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{spec.name}.S").write_text(r.text)
    print(spec.name)
    return 0


def _cmd_build(a: argparse.Namespace) -> int:
    from .build import build_library, default_specs, get_target
    kernels = a.kernel or None
    if a.isa is not None:   # the preset's defaults of these ISAs, plus any --kernel
        from .records import ISAS
        isas = [i.strip() for i in a.isa.split(",")]
        if not all(isas):
            raise CliError(f"--isa {a.isa!r} has an empty item: give a comma-separated list of "
                           f"ISAs from {', '.join(ISAS)}")
        kernels = [s.spec_string for s in default_specs(get_target(a.target), isas)] + (a.kernel or [])
    res = build_library(kernels, target=a.target, out_dir=a.output, fmt=a.format,
                        cc=a.cc, quiet=a.quiet)
    if not a.quiet:
        for k in res.manifest["kernels"]:
            print(k["name"])
        print(f"{res.library} ({len(res.manifest['kernels'])} kernels)")
    return 0


def _cmd_list(a: argparse.Namespace) -> int:
    from .build import default_specs, get_target
    for s in default_specs(get_target(a.target)):
        print(f"{s.spec_string:<24} {s.name}")
    return 0


def _cmd_targets(a: argparse.Namespace) -> int:
    from .build import TARGETS, default_specs
    seen = set()
    for name, t in sorted(TARGETS.items()):
        if t.name in seen:
            continue
        seen.add(t.name)
        alias = f" (= {', '.join(t.aliases)})" if t.aliases else ""
        print(f"{t.name}{alias}: {t.fmt}; features {','.join(sorted(t.features))}; "
              f"{len(default_specs(t))} default kernels")
        if a.verbose:
            for s in default_specs(t):
                print(f"    {s.spec_string:<28} {s.name}")
    return 0


def _cmd_info(a: argparse.Namespace) -> int:
    from .runtime.cpu import detect
    cpu = detect()
    print(f"machine: {cpu.machine}")
    print(f"features: {', '.join(sorted(cpu.features)) or '(none: not an Arm64 CPU)'}")
    if cpu.detected != cpu.features:
        print(f"detected: {', '.join(sorted(cpu.detected))} (TILEGEN_ISA / TILEGEN_SME applied)")
    print(f"SVE vector length: {cpu.sve_vl or '-'} bits; SME streaming vector length: "
          f"{cpu.sme_vl or '-'} bits")
    if a.lib:
        from .runtime import load
        from .runtime.select import KIND_FAMILY
        lib = load(a.lib)
        if lib.vl_bytes:
            print("vector lengths read through the library: " + ", ".join(
                f"{kind.upper()} {8 * b} bits" for kind, b in sorted(lib.vl_bytes.items())))
        for k in lib.kernels.values():
            tile = f" ({k.mr}x{k.nr} here)" if k.spec.vl_scaled and lib.runnable(k) else ""
            print(f"  {'ok  ' if lib.runnable(k) else 'no  '}{k.name}{tile}")
        for kind in KIND_FAMILY:
            try:
                pair = lib.kernel_table.pairs(kind)[0]
            except Exception as e:  # noqa: BLE001 - report, don't fail
                print(f"{kind}: {e}")
                continue
            gemv = pair.gemv.name if pair.gemv else pair.gemm.name
            large = (f"; large-m gemm (m >= {pair.large_from}) {pair.large.name}"
                     if pair.large is not None else "")
            print(f"{kind}: gemm {pair.gemm.name}; gemv (m <= {lib.gemv_threshold}) {gemv}{large}")
    return 0


def _cmd_analyze(a: argparse.Namespace) -> int:
    import json as _json
    from .analysis.mca import HEADER, MODELS, AnalyzeError, analyze
    from .build import default_specs, get_target
    from .generator import parse_spec
    from .analysis.mca import MODEL_SVE_VL
    from .analysis.sme import SME_HEADER, SME_LEGEND, UNIT_HEADER, UNIT_LEGEND, sme_report
    specs = [parse_spec(k) for k in a.kernel] if a.kernel else default_specs(get_target(a.target))
    models = a.cpu_model or list(MODELS)
    sme = [s for s in specs if s.isa_info.vl_kind == "sme"]
    try:
        # SVE loops on the models that have SVE; SME by instruction mix (no llvm-mca model)
        reports = [analyze(s, m) for s in specs if s not in sme for m in models
                   if s.isa_info.vl_kind != "sve" or m in MODEL_SVE_VL or a.cpu_model]
        mixes = [sme_report(s) for s in sme]      # SME: static instruction mix (analysis.sme)
    except (AnalyzeError, ValueError) as e:
        print(f"tilegen analyze: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(_json.dumps([r.as_dict() for r in reports] + [x.as_dict() for x in mixes], indent=2))
    else:
        if reports:
            print(HEADER)
            for r in reports:
                print(r.row())
        if mixes:
            print(SME_HEADER)
            for x in mixes:
                print(x.row())
            print(f"({SME_LEGEND})")
            print(UNIT_HEADER)
            for x in mixes:
                print(x.unit_row())
            print(f"({UNIT_LEGEND})")
    if a.plot:
        from .analysis.plot import efficiency_chart
        efficiency_chart(reports, models, a.plot)
    return 0


def _check_timing_args(a: argparse.Namespace, target: str | None) -> str:
    """The shared timing options of `bench` / `tune` checked before anything runs (one-line
    errors): the numbers finite and in range, and when emulating the qemu model and vector
    lengths (as `emulate` checks them); the qemu model to run on."""
    from .bench.report import BenchError, check_timing_options, guest_cpu, will_emulate
    try:
        check_timing_options(rel_ci=a.rel_ci, budget=a.budget, freq_ghz=a.freq_ghz,
                             bandwidth_mib=a.bandwidth_mib)
    except BenchError as e:
        raise CliError(str(e)) from None
    cpu = a.cpu or guest_cpu(target)
    if will_emulate():
        from .emulate.runner import EmulateError, validate
        try:
            validate(cpu, a.sve_vl, a.sme_vl)
        except EmulateError as e:
            raise CliError(str(e)) from None
    return cpu


def _bench_config(a: argparse.Namespace, lib: str, tmp: str) -> dict:
    """The harness configuration of `tilegen bench` / `tune --measure` (see tilegen.bench)."""
    from .bench.report import build_clock_routines
    rule = {"rel_ci": a.rel_ci, "budget_s": a.budget}
    so = build_clock_routines(tmp)
    return {"lib": str(Path(lib).resolve()), "rule": rule, "clock": a.clock,
            "freq_ghz": a.freq_ghz, "clock_routines": str(so) if so else None,
            "bandwidth_mib": a.bandwidth_mib, "seed": 0}


def _spec_or_none(text):
    """The KernelSpec of a spec string (None: not a spec)."""
    from .generator import parse_spec
    from .records import SpecError
    try:
        return parse_spec(text)
    except (SpecError, TypeError, AttributeError):
        return None


def _cmd_bench(a: argparse.Namespace) -> int:
    import tempfile
    from .bench.report import (DEFAULT_SHAPES, BenchError, check_kinds, default_model, join,
                               kleidiai_config, parse_shape, parse_threads, run_harness, table,
                               to_json, will_emulate)
    from .runtime.library import read_manifest
    try:
        manifest = read_manifest(a.lib)
        target = manifest.get("target")
        cpu = _check_timing_args(a, target)
        fmt = manifest.get("format", "elf")
        if fmt != "elf" and will_emulate():
            raise CliError(f"{a.lib} holds a {fmt} library: the emulator runs Linux ELF "
                           f"libraries (Mach-O needs macOS); build one with --format elf")
        have = {k["name"] for k in manifest.get("kernels", [])}
        for kern in a.kernel or ():
            name = kern if kern in have else getattr(_spec_or_none(kern), "name", None)
            if name not in have:
                raise CliError(f"--kernel {kern!r}: {a.lib} has no such kernel (`tilegen info "
                               f"--lib {a.lib}` lists them)")
        check_kinds(a.kind or (), {getattr(_spec_or_none(k.get("spec")), "family", None)
                                   for k in manifest["kernels"]})
        shapes = [parse_shape(s) for s in a.shape] if a.shape else list(DEFAULT_SHAPES)
        threads = parse_threads(a.threads)
        with tempfile.TemporaryDirectory(prefix="tilegen-bench-") as tmp:
            cfg = _bench_config(a, a.lib, tmp)
            cfg.update(shapes=shapes, threads=threads, kernels=a.kernel, kinds=a.kind,
                       plan=not a.no_plan)
            if a.vs_kleidiai:
                cfg["kleidiai"] = kleidiai_config(a.vs_kleidiai)
            raw = run_harness(cfg, cpu=cpu, sve_vl=a.sve_vl, sme_vl=a.sme_vl)
    except BenchError as e:
        raise CliError(str(e)) from None
    if raw.get("interrupted"):      # Ctrl-C: the rows measured so far, one line, exit 130
        done = len(raw["rows"])
        if done:
            doc = join(raw, str(a.lib), target, a.cpu_model or default_model(target))
            print(to_json(doc) if a.json else table(doc), flush=True)
        total = f" of {raw['jobs']}" if "jobs" in raw else ""
        print(f"tilegen bench: interrupted: {done}{total} measurements done"
              + (" (printed above)" if done else ""), file=sys.stderr)
        return 130
    if not raw["rows"]:
        why = "; ".join(f"{name}: {why}" for name, why in raw.get("skipped", [])) or "no job"
        raise CliError(f"nothing to time: {why}")
    doc = join(raw, str(a.lib), target, a.cpu_model or default_model(target))
    print(to_json(doc) if a.json else table(doc))
    return 0


def _per_block(scores) -> str:
    """What a model score is per: the kernels' marked block (``block_k`` of their reports:
    32 k, or a K-quant's 256-k super-block)."""
    ks = sorted({s.report.block_k for s in scores}) or [32]
    return " / ".join("32-k block" if k == 32 else f"{k}-k super-block" for k in ks)


def _tune_table(r, top: int, measured: dict | None = None) -> list[str]:
    per = _per_block(r.scores)
    lines = [f"{r.family} {r.regime} on {r.target} (llvm-mca -mcpu={r.model}): {r.n_tiles} tiles "
             f"the allocator accepts, {len(r.scores)} distinct kernels (+N: tiles with the same code)",
             f"score = MACs per cycle over one {per} of the tile"
             + ("" if per == "32-k block" else " (cyc/32k: its 32-k share)")
             + " (hot loop after the bar)"
             if measured is None else
             f"score = measured {measured['method']['unit']} at {measured['method']['shapes'][r.regime]} "
             f"({measured['method']['label']}); the model's score after the bar",
             f"{'rank':>4} {'spec':<28} {'kernel':<62} {'blkMAC/c' if measured is None else 'measured':>9} {'cyc/32k':>8} {'vregs':>5} "
             f"{'RHS B/MAC':>9} | {'cyc/it':>7} {'eff':>6} {'MAC/cyc':>7}"]
    for i, s in enumerate(r.scores[:top], 1):
        rep = s.report
        more = len(r.same_code.get(s.spec.spec_string, ()))
        label = s.spec.spec_string + (f" (+{more})" if more else "")
        model = (f"{s.block_cycles:8.1f} {s.cand.vregs:5d} {s.cand.rhs_bytes_per_mac:9.4f} | "
                 f"{rep.cycles_per_iter:7.2f} {100 * rep.efficiency:5.1f}% "
                 f"{rep.macs_per_cycle:7.1f}" if rep is not None else
                 f"{'-':>8} {s.cand.vregs:5d} {s.cand.rhs_bytes_per_mac:9.4f} | {'-':>7} "
                 f"{'-':>6} {'-':>7}")
        value = f"{s.value:9.2f}" if measured is None else f"{s.value:9.4g}"
        lines.append(f"{i:>4} {label:<28} {s.spec.name:<62} {value} {model}"
                     + ("" if measured is None else " model " + (
                         "- (not modelled)" if s.model_value is None else f"{s.model_value:.2f}")))
    return lines


def _tune_measure(a: argparse.Namespace, tgt, rankings: dict) -> dict:
    """`tune --measure`: the top ``a.top`` kernels of each ranking built into one library and
    timed by the bench harness on this CPU (emulated on x86-64); the rankings by the timings."""
    import tempfile
    from .bench.report import BenchError, join, run_harness
    from .build import build_library
    from .analysis.tune import measured_ranking
    m, n, k = a.measure_shape
    shapes = {"gemm": (m, n, k), "gemv": (1, n, k)}
    # the model's top kernels, and as many that llvm-mca does not model (SME): timed alike
    top = {reg: [s.spec.spec_string for s in r.scores[:a.top]]
           + [c.spec.spec_string for c in r.unmodelled[:a.top]] for reg, r in rankings.items()}
    with tempfile.TemporaryDirectory(prefix="tilegen-tune-") as tmp:
        # ELF but on macOS: the library is timed here (a Mach-O target's too)
        build_library(sorted({s for v in top.values() for s in v}), target=tgt,
                      out_dir=Path(tmp) / "lib", quiet=True,
                      fmt=None if sys.platform == "darwin" else "elf")
        cfg = _bench_config(a, Path(tmp) / "lib", tmp)
        cfg.update(shapes=[], plan=False, threads=[1],
                   kernel_jobs=[[spec, *shapes[reg]] for reg in rankings for spec in top[reg]])
        try:
            raw = run_harness(cfg, cpu=a.guest_cpu, sve_vl=a.sve_vl, sme_vl=a.sme_vl)
        except BenchError as e:
            raise CliError(str(e)) from None
        if raw.get("interrupted"):
            raise _Interrupted(f"interrupted: {len(raw['rows'])} of {raw.get('jobs', '?')} "
                               f"kernels timed, nothing ranked or written")
        doc = join(raw, str(Path(tmp) / "lib"), tgt.name, rankings["gemm" if "gemm" in rankings
                                                                    else "gemv"].model)
    regime = {(s, shapes[reg]): reg for reg in rankings for s in top[reg]}
    docs = {reg: dict(doc, rows=[r for r in doc["rows"]
                                 if regime.get((r["spec"], (r["m"], r["n"], r["k"]))) == reg])
            for reg in rankings}
    for reg, d in docs.items():
        if not d["rows"]:
            why = "; ".join(f"{s}: {w}" for s, w in raw.get("skipped", [])) or "none ran"
            raise CliError(f"no {a.family} {reg} kernel was timed ({why})")
    per_cycle = all(r["macs_per_cycle"] for d in docs.values() for r in d["rows"])
    unit = "MACs/cycle" if per_cycle else "MACs/ns"
    thr = {reg: {r["spec"]: (r["macs_per_cycle"] if per_cycle else r["gflops"] / 2)
                 for r in d["rows"]} for reg, d in docs.items()}
    out = {reg: measured_ranking(rankings[reg], thr[reg]) for reg in rankings}
    mach = next(iter(docs.values()))["machine"]
    rows = {reg: {r["spec"]: r for r in d["rows"]} for reg, d in docs.items()}
    method = {"cpu": mach["cpu"], "cpu_features": mach["cpu_features"],
              "emulated": mach["emulated"], "emulation_check": mach["emulation_check"],
              "label": mach["label"], "counter": mach["counter_why"],
              "cycles": sorted({r["cycles_source"] for d in docs.values() for r in d["rows"]}),
              "unit": unit, "rule": mach["rule"],
              "shapes": {reg: ",".join(map(str, shp)) for reg, shp in shapes.items()
                         if reg in rankings}}
    ranking = {reg: [{"spec": s.spec.spec_string, "measured": round(s.value, 4),
                      "model": None if s.model_value is None else round(s.model_value, 3),
                      "median_ns": rows[reg][s.spec.spec_string]["timing"]["median_ns"],
                      "rel_ci": rows[reg][s.spec.spec_string]["timing"]["rel_ci"],
                      "reps": rows[reg][s.spec.spec_string]["timing"]["reps"]}
                     for s in r.scores] for reg, r in out.items()}
    return {"rankings": out, "method": method, "ranking": ranking, "emulated": mach["emulated"]}


def _cmd_tune(a: argparse.Namespace) -> int:
    import json as _json
    from .analysis.mca import AnalyzeError
    from .build import get_target
    from .build.tuned import reset_tuned, write_tuned
    from .analysis.tune import REGIMES, TuneError, pick_pair, tune, tuned_entry
    tgt = get_target(a.target)
    if a.reset:
        path = reset_tuned(tgt, a.family, a.tuned_dir)
        what = f"{a.family} of {tgt.name}" if a.family else tgt.name
        print(f"reset {what}: {path if path else 'nothing was tuned'}")
        return 0
    if not a.family:
        raise CliError("--family is required (unless --reset)")
    if a.m is not None and a.m < 1:
        raise CliError(f"--m must be >= 1, got {a.m}")
    if a.versus:
        return _tune_versus(a, tgt)
    if a.top is None:
        a.top = 8 if a.measure else 10
    if a.top < 1:
        raise CliError(f"--top must be >= 1 (rows per table), got {a.top}")
    if a.jobs is not None and a.jobs < 1:
        raise CliError(f"--jobs must be >= 1, got {a.jobs}")
    from .bench.report import BenchError, parse_shape
    a.guest_cpu = _check_timing_args(a, tgt.name)
    try:
        a.measure_shape = parse_shape(a.measure_shape, "--measure-shape")
    except BenchError as e:
        raise CliError(str(e)) from None
    if a.measure and a.measure_shape[0] < 2:
        raise CliError(f"--measure-shape: the gemm job needs m >= 2, got {a.measure_shape[0]}")
    if a.measure and a.write and not a.force:
        from .bench.report import will_emulate
        if will_emulate():      # the timings would come from qemu: refuse before timing
            raise CliError("this host is not an Arm64 CPU: `tune --measure` would time the "
                           "kernels under qemu (emulated: not a hardware timing), and a tuned "
                           "file is not written from emulated timings (--force writes it anyway)")
    shown = list(REGIMES) if a.m is None else ["gemv" if a.m == 1 else "gemm"]
    needed = list(REGIMES) if a.write else shown
    try:
        rankings, no_tiles = {}, {}
        for reg in needed:
            try:
                rankings[reg] = tune(tgt, a.family, reg, isa=a.isa, jobs=a.jobs,
                                     m=a.m if (reg == "gemm" and a.m and a.m > 1) else None,
                                     unmodelled=a.measure)
            except TuneError as e:      # e.g. q4_0_f16 has gemm kernels only: show the other
                if a.write or len(needed) == 1:
                    raise
                no_tiles[reg] = e
        if not rankings:
            raise next(iter(no_tiles.values()))
        for reg, e in no_tiles.items():
            print(f"tilegen tune: no {reg} ranking: {e}", file=sys.stderr)
        shown = [reg for reg in shown if reg in rankings]
        measured = _tune_measure(a, tgt, rankings) if a.measure else None
        if measured is not None:
            rankings = measured["rankings"]
        pair = pick_pair(rankings["gemm"], rankings["gemv"]) if a.write else None
    except (TuneError, AnalyzeError) as e:
        print(f"tilegen tune: error: {e}", file=sys.stderr)
        return 2
    written = None
    if pair is not None and measured is not None and measured["emulated"] and not a.force:
        for reg in shown:
            print("\n".join(_tune_table(rankings[reg], a.top, measured)))
        raise CliError(f"the timings are emulated ({measured['method']['emulation_check']}): "
                       f"{measured['method']['label']}; not writing a tuned file from them "
                       f"(--force writes it anyway)")
    if pair is not None:
        entry = tuned_entry(a.family, pair)
        if measured is not None:
            from dataclasses import replace
            entry = replace(entry, measured={"method": measured["method"],
                                             "ranking": measured["ranking"]})
        written = write_tuned(tgt, rankings["gemm"].model, entry, a.tuned_dir)
    if a.json:
        out = {"target": tgt.name, "model": rankings[needed[0]].model, "family": a.family,
               "measured": ({"method": measured["method"], "ranking": measured["ranking"]}
                            if measured is not None else None),
               "rankings": {reg: [dict(s.as_dict(), same_code=list(
                   rankings[reg].same_code.get(s.spec.spec_string, ())))
                   for s in rankings[reg].scores[:a.top]] for reg in shown},
               "not_modelled": {reg: [list(x) for x in rankings[reg].not_modelled] for reg in shown}}
        if pair is not None:
            ent = tuned_entry(a.family, pair)
            out["written"] = {"path": str(written), "gemm": pair.gemm.spec.spec_string,
                              "gemv": pair.gemv.spec.spec_string, "shared_rhs": pair.shared_rhs,
                              "best_gemm": ent.top_gemm.spec_string,
                              "best_gemv": ent.top_gemv.spec_string}
        from .bench.report import to_json
        print(to_json(out))     # strict JSON
        return 0
    for reg in shown:
        print("\n".join(_tune_table(rankings[reg], a.top, measured)))
        for spec, why in rankings[reg].not_modelled:
            print(f"not modelled: {spec}: {why}", file=sys.stderr)
        print()
    if pair is not None:
        for role, s, best in (("gemm", pair.gemm, pair.best_gemm), ("gemv", pair.gemv, pair.best_gemv)):
            note = "" if s is best else (f" (best alone: {best.spec.spec_string}, "
                                         f"{best.value:.2f}; this one {100 * s.value / best.value:.0f}%)")
            unit = (f"{measured['method']['unit']} measured" if measured is not None
                    else f"MACs/cycle over a {_per_block([s])}")
            print(f"{role}: {s.spec.spec_string:<26} {s.value:8.2f} {unit}{note}")
        ent = tuned_entry(a.family, pair)
        if (ent.top_gemm, ent.top_gemv) != (ent.gemm, ent.gemv):
            print(f"for_ops: best gemm {ent.top_gemm.spec_string} ({ent.scores['best_gemm']:.2f}), "
                  f"best gemv {ent.top_gemv.spec_string} ({ent.scores['best_gemv']:.2f}): "
                  f"pack_weights(..., for_ops=('gemm', 'gemv')) runs them on their own layouts")
        if not pair.shared_rhs:
            print(f"warning: no {a.family} gemm/gemv pair shares a packed RHS layout (nr, kr, sr); "
                  f"wrote the two winners, each needs its own packed weights", file=sys.stderr)
        print(f"wrote {written}")
    return 0


def _tune_versus(a: argparse.Namespace, tgt) -> int:
    """`tune --family F --versus G`: F against G as the runtime picks them (the tuned pairs),
    at their best tiles of any ISA, and on F's pick tile (tilegen.analysis.tune.versus)."""
    from .analysis.mca import AnalyzeError
    from .analysis.tune import REGIMES, TuneError, versus
    if a.versus not in FAMILIES:
        raise CliError(f"--versus: unknown family {a.versus!r}; known: {', '.join(FAMILIES)}")
    if a.write or a.reset or a.measure:
        raise CliError("--versus compares the model's scores: not with --write, --reset or --measure")
    regimes = list(REGIMES) if a.m is None else ["gemv" if a.m == 1 else "gemm"]
    try:
        rows = [versus(tgt, a.family, a.versus, reg, jobs=a.jobs, tuned_dir=a.tuned_dir)
                for reg in regimes]
    except (TuneError, AnalyzeError) as e:
        print(f"tilegen tune: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps([v.as_dict() for v in rows], indent=2))
        return 0

    def cell(s) -> str:
        return "–" if s is None else f"{s.spec.spec_string} {s.value:.2f}"

    def ratio(r) -> str:
        return "–" if r is None else f"{r:.3f}"

    print(f"{a.family} vs {a.versus} on {tgt.name} (llvm-mca -mcpu={rows[0].model}); "
          f"score = MACs per cycle over one 32-k block; ratio = {a.family} / {a.versus}")
    print(f"{'regime':<6} {'what':<10} {a.family:<34} {a.versus:<34} ratio")
    for v in rows:
        for what, pair, r in (("runtime", v.pick, v.pick_ratio), ("best tile", v.best, v.best_ratio),
                              ("same tile", v.same, v.same_ratio)):
            print(f"{v.regime:<6} {what:<10} {cell(pair[0]):<34} {cell(pair[1]):<34} {ratio(r)}")
    return 0


def _cmd_check_abi(a: argparse.Namespace) -> int:
    from .runtime.cpu import detect
    from .runtime.library import read_manifest
    if not detect().is_arm64:   # x86-64 host: run this same command in the emulated Python
        from .emulate.runner import EmulateError, validate
        try:
            validate(a.cpu, None, None)
        except EmulateError as e:
            raise CliError(str(e)) from None
        fmt = read_manifest(a.lib).get("format", "elf")
        if fmt != "elf":
            raise CliError(f"{a.lib} holds a {fmt} library: the emulator runs Linux ELF "
                           f"libraries (Mach-O needs macOS); build one with --format elf")
        from .emulate.cli import emulate_main
        return emulate_main(["--quiet", "--cpu", a.cpu, "--", "python", "-m", "tilegen",
                             "check-abi", str(Path(a.lib).resolve())], prog="tilegen check-abi")
    from .runtime import load
    results = load(a.lib).check_abi()
    bad = {k: v for k, v in results.items() if v}
    for name, regs in sorted(results.items()):
        print(f"{'FAIL' if regs else 'ok  '} {name}{': ' + ', '.join(regs) + ' not preserved' if regs else ''}")
    print(f"{len(results) - len(bad)} of {len(results)} routines preserve x19-x28, d8-d15, sp, FPCR")
    return 1 if bad else 0


def _cmd_export(a: argparse.Namespace) -> int:
    from .export.kleidiai import kquant_entries, llama_patch, write_tree
    if a.what not in ("kleidiai", "llama-patch"):
        raise CliError(f"unknown export {a.what!r}; known: kleidiai, llama-patch")
    tuned = "pairs" if a.tuned_pairs else a.tuned
    if a.what == "llama-patch":
        text = llama_patch(a.target, tuned)
        entries = [dict(type=e.family, isa=e.isa, gemm=e.gemm.spec, gemv=e.gemv.spec,
                        tuned=e.gemm.note.startswith("tuned") or e.gemv.note.startswith("tuned"))
                   for e in kquant_entries(a.target, tuned)]
        try:
            Path(a.output).write_text(text)
        except OSError as e:
            raise CliError(f"cannot write {a.output}: {e.strerror or e}") from None
        if a.json:
            print(json.dumps({"patch": a.output, "entries": entries}, indent=2))
            return 0
        for e in entries:
            print(f"{e['type']} {e['isa']}: {e['gemm']} + {e['gemv']}" + ("  [tuned]" if e["tuned"] else ""))
        print(f"{a.output}: llama.cpp patch, {len(entries)} table entries "
              f"(apply from llama.cpp's root: patch -p1 < {a.output})")
        return 0
    m = write_tree(a.output, target=a.target, tuned=tuned, force=a.force)
    if a.json:
        print(json.dumps(m, indent=2))
        return 0
    for k in m["kernels"]:
        tuned = "  [tuned]" if k["note"].startswith("tuned") else ""
        print(f"kai_run_{k['name']}: {k['spec']} ({k['impl']}){tuned}")
    for k in m["kquant_kernels"]:
        mark = ", tuned" if k["note"].startswith("tuned") else ""
        print(f"kai_run_{k['name']}: {k['spec']} ({k['impl']})  [K-quant, llama-kquants.patch{mark}]")
    print(f"{a.output}: {m['functions']} of {m['functions'] + len(m['missing_llama'])} llama.cpp kai_ "
          f"functions defined; {m['kquant_functions']} of "
          f"{m['kquant_functions'] + len(m['missing']) - len(m['missing_llama'])} that "
          f"llama-kquants.patch adds")
    if m["missing"]:
        print(f"missing ({len(m['missing'])}; tilegen.export.packers_c absent?): "
              + ", ".join(m["missing"]), file=sys.stderr)
        return 1
    return 0


def _timing_args(p: argparse.ArgumentParser) -> None:
    """The measurement options `bench` and `tune --measure` share."""
    p.add_argument("--rel-ci", type=float, default=0.02,
                   help="stop when the 95%% CI half-width of the median is within this "
                        "fraction of it (default 0.02)")
    p.add_argument("--budget", type=float, default=2.0, metavar="SECONDS",
                   help="time budget per measurement (default 2)")
    p.add_argument("--clock", choices=("auto", "perf", "wall"), default="auto",
                   help="auto: the cycle counter (perf_event_open) when permitted, else the "
                        "wall clock; perf: the counter or fail; wall: the wall clock")
    p.add_argument("--freq-ghz", type=float,
                   help="core clock for wall-time cycles (default: measured by a dependent-ADD "
                        "chain)")
    p.add_argument("--bandwidth-mib", type=float, default=64,
                   help="size of the streaming copy that measures the bandwidth (default 64)")
    p.add_argument("--cpu", help="qemu model when emulating (default: the target's when qemu "
                                 "has that model, else max)")
    p.add_argument("--sve-vl", type=int, metavar="BITS", help="SVE vector length when emulating")
    p.add_argument("--sme-vl", type=int, metavar="BITS", help="SME vector length when emulating")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tilegen", description="Arm64 matmul micro-kernel generator")
    p.add_argument("--version", action="version", version=f"tilegen {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="render one kernel to DIR/<name>.S")
    g.add_argument("spec", nargs="?", metavar="SPEC",
                   help="the kernel as build --kernel takes it: FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am] "
                        "(e.g. q4_K:sme2:4vlx1vl:i16); or the parts as options below")
    g.add_argument("--family", help=f"kernel family: {', '.join(FAMILIES)}")
    g.add_argument("--isa",
                   help="instruction set: neon, dotprod, i8mm, sve, sve_dotprod, sve_i8mm, sme, sme2")
    g.add_argument("--tile",
                   help="MRxNR, vl after mr or nr for vector-length units: 6x16, 4x4vl, 1vlx4vl")
    g.add_argument("--kr", type=int,
                   help="KleidiAI kr: k values per packed column step (default: the family's "
                        "for the ISA)")
    g.add_argument("--sr", type=int,
                   help="KleidiAI sr: kr is split into sr chunks of kr/sr values (default: the "
                        "family's for the ISA)")
    g.add_argument("--format", choices=("elf", "macho"), default="elf",
                   help="object format of the assembly (default elf)")
    g.add_argument("-o", "--output", default=".", metavar="DIR",
                   help="directory to write <name>.S to (default .)")
    g.set_defaults(fn=_cmd_generate)

    b = sub.add_parser("build", help="build a shared library + manifest for a target CPU")
    b.add_argument("--target", default="generic-armv8",
                   help="CPU preset (`tilegen targets`; default generic-armv8)")
    b.add_argument("--kernel", action="append", metavar="SPEC",
                   help="FAMILY:ISA:MRxNR[:kKR][:sSR][:i16][:am]; repeatable (default: the target's "
                        "kernels)")
    b.add_argument("--isa", help="only the preset's default kernels of these ISAs, e.g. neon,dotprod "
                                 "(--kernel adds more)")
    b.add_argument("--format", choices=("elf", "macho"),
                   help="object format (default: the target's; apple-* targets are macho)")
    b.add_argument("--cc", help="compiler driver to use (else TILEGEN_CC, else discovery)")
    b.add_argument("-o", "--output", default="out", metavar="DIR",
                   help="output directory: library, manifest, sources (default out)")
    b.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")
    b.set_defaults(fn=_cmd_build)

    ls = sub.add_parser("list", help="kernels a default build contains")
    ls.add_argument("--target", default="linux-aarch64-all",
                    help="CPU preset (default linux-aarch64-all)")
    ls.set_defaults(fn=_cmd_list)

    t = sub.add_parser("targets", help="list CPU presets")
    t.add_argument("-v", "--verbose", action="store_true", help="also list each preset's kernels")
    t.set_defaults(fn=_cmd_targets)

    i = sub.add_parser("info", help="detected CPU features (and which kernels of LIB can run)")
    i.add_argument("--lib", help="library directory")
    i.set_defaults(fn=_cmd_info)

    an = sub.add_parser("analyze", help="llvm-mca model of each kernel's hot loop")
    an.add_argument("--target", default="linux-aarch64-all",
                    help="analyze this preset's default kernels (default linux-aarch64-all)")
    an.add_argument("--kernel", action="append", metavar="SPEC",
                    help="analyze this kernel instead (repeatable)")
    an.add_argument("--cpu-model", action="append", metavar="MCPU",
                    help="llvm-mca -mcpu (repeatable; default neoverse-v2, -n2, -v1, apple-m4)")
    an.add_argument("--json", action="store_true", help="print JSON instead of tables")
    an.add_argument("--plot", metavar="PNG",
                    help="write a bar chart of the efficiencies to PNG (needs tilegen[plot])")
    an.set_defaults(fn=_cmd_analyze)

    tu = sub.add_parser("tune", help="rank every tile the allocator accepts by the llvm-mca model")
    tu.add_argument("--target", required=True, help="CPU preset with an llvm-mca model")
    tu.add_argument("--family", help=f"kernel family ({', '.join(FAMILIES)})")
    tu.add_argument("--m", type=int, metavar="M",
                    help="1: gemv tiles (mr == 1); M > 1: gemm tiles with 1 < mr <= M "
                         "(default: both regimes)")
    tu.add_argument("--isa", help="only this ISA (default: the family's ISAs the target has)")
    tu.add_argument("--top", type=int,
                    help="rows per table (default 10); with --measure: kernels timed per op "
                         "(default 8)")
    tu.add_argument("--write", action="store_true",
                    help="write the best gemm + gemv pair to the target's tuned file, which "
                         "default builds then use (tunes both regimes)")
    tu.add_argument("--reset", action="store_true",
                    help="remove the tuned file (or only --family's entry) and exit")
    tu.add_argument("--tuned-dir", metavar="DIR",
                    help="tuned files directory (default $TILEGEN_TUNED_DIR, else the package's)")
    tu.add_argument("--jobs", type=int, help="parallel llvm-mca runs (default: CPU count)")
    tu.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tu.add_argument("--measure", action="store_true",
                    help="build the model's top --top kernels per op and time them on this CPU "
                         "(`tilegen bench`); rank (and --write) by the timings")
    tu.add_argument("--measure-shape", default="128,4096,4096", metavar="M,N,K",
                    help="the gemm job of --measure (the gemv job is 1,N,K; default "
                         "128,4096,4096)")
    tu.add_argument("--versus", metavar="FAMILY",
                    help="compare --family with FAMILY instead of ranking: the runtime's picks "
                         "(the tuned pairs), the best tiles of any ISA, the same tile")
    tu.add_argument("--force", action="store_true",
                    help="with --measure --write: write a tuned file even from emulated timings")
    _timing_args(tu)
    tu.set_defaults(fn=_cmd_tune)

    be = sub.add_parser("bench", help="time kernels and prepared calls on this CPU (emulated on "
                                      "x86-64: labelled, not hardware timings)")
    be.add_argument("lib", help="library directory (from `tilegen build`)")
    be.add_argument("--kernel", action="append", metavar="NAME|SPEC",
                    help="time this kernel of LIB (repeatable; default: the kernel LIB picks per "
                         "weights kind and m, and the plan calls)")
    be.add_argument("--kind", action="append", metavar="KIND",
                    help="weights kinds to time (repeatable; default: each family's own kind "
                         "(f32, q4_0, ..., q4_K, q6_K, bf16), those LIB has kernels for)")
    be.add_argument("--shape", action="append", metavar="M,N,K",
                    help="a job shape (repeatable; default decode 1,4096,4096 and prefill "
                         "128,4096,4096, and a llama-7B layer's FFN shapes)")
    be.add_argument("--threads", default="1", metavar="N|A..B|A,B",
                    help="thread counts of the plan calls: N means 1..N (default 1)")
    be.add_argument("--no-plan", action="store_true", help="time the kernels only")
    _timing_args(be)
    be.add_argument("--cpu-model", metavar="MCPU",
                    help="llvm-mca -mcpu of the model column (default: the library target's)")
    be.add_argument("--vs-kleidiai", metavar="DIR",
                    help="also time KleidiAI's micro-kernels of the same jobs, built from a "
                         "release tarball or the directory holding it (../shared/thirdparty/"
                         "kleidiai: the newest)")
    be.add_argument("--json", action="store_true",
                    help="print the JSON document (schema tilegen-bench/1, docs/cli.md)")
    be.set_defaults(fn=_cmd_bench)

    ca = sub.add_parser("check-abi", help="run every kernel of LIB through the AAPCS64 probe")
    ca.add_argument("lib", help="library directory (from `tilegen build`)")
    ca.add_argument("--cpu", default="max", help="qemu model when emulating (default max)")
    ca.set_defaults(fn=_cmd_check_abi)

    ex = sub.add_parser("export", help="write a source tree other builds use in place of a library "
                                       "(kleidiai: KleidiAI v1.24.0 for llama.cpp, with the "
                                       "llama.cpp patch for its K-quant kernels; llama-patch: "
                                       "that patch alone)")
    ex.add_argument("what", choices=("kleidiai", "llama-patch"), help="what to export")
    ex.add_argument("--target", default="linux-aarch64-all",
                    help="CPU preset: object format, and the tuned tiles of --tuned "
                         "(default linux-aarch64-all)")
    ex.add_argument("--tuned", action="store_true",
                    help="where a tuned tile of the target reads the same packed layouts, it "
                         "stands behind the KleidiAI name (with its own getters)")
    ex.add_argument("--tuned-pairs", action="store_true",
                    help="--tuned, and a tuned gemm+gemv pair sharing its packed RHS replaces both "
                         "kernels of a llama.cpp table entry (same LHS layouts and RHS format, "
                         "other nr; llama.cpp packs with the getters' nr/kr/sr)")
    ex.add_argument("-o", "--output", required=True, metavar="PATH",
                    help="root of the tree (kleidiai: a missing or empty directory, or a "
                         "previous export, which holds TILEGEN_EXPORT.json), the patch file "
                         "(llama-patch)")
    ex.add_argument("--force", action="store_true",
                    help="write into a non-empty DIR that is not a previous export (its files "
                         "at the export's paths are overwritten)")
    ex.add_argument("--json", action="store_true", help="print the export manifest as JSON")
    ex.set_defaults(fn=_cmd_export)

    sub.add_parser("emulate", help="run CMD under qemu-user: emulate [--cpu MODEL] -- CMD...")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "emulate":  # everything after `--` belongs to the guest command
        from .emulate.cli import emulate_main
        return emulate_main(argv[1:])
    a = _parser().parse_args(argv)
    from .analysis.mca import AnalyzeError
    from .build import BuildError, TargetError, ToolchainError
    from .records import SpecError
    from .layout import LayoutError
    from .analysis.plot import PlotError
    from .runtime.library import LoadError
    from .analysis.tune import TuneError
    from .export.kleidiai import ExportError
    from .bench.report import BenchError
    try:
        rc = a.fn(a)
        sys.stdout.flush()      # a closed pipe raises here, not at interpreter exit
        return rc
    except _Interrupted as e:
        print(f"tilegen {a.cmd}: {e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:   # Ctrl-C before or between the timings: one line, no traceback
        if a.cmd not in ("bench", "tune"):
            raise
        print(f"tilegen {a.cmd}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # e.g. `tilegen list | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (CliError, SpecError, LayoutError, BuildError, TargetError, ToolchainError, LoadError,
            AnalyzeError, TuneError, PlotError, ExportError, BenchError, OSError) as e:
        print(f"tilegen {a.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
