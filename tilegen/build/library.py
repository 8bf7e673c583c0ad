"""Assemble generated kernels into one shared library plus ``manifest.json``.

Output is reproducible: sources are written in sorted kernel-name order, objects and the
library are built from sorted inputs, and nothing carries a timestamp.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from ..generator.manifest import (MANIFEST_NAME, kernel_entry, packer_entry, render_digest,
                                  table_digest)
from ..generator.render import render
from ..generator import packers as _packers
from .cheader import getters_c, header
from .driver import source as driver_source
from ..generator.packers import PackerSpec, packer_for, streaming_packer_for
from ..generator.render import ABI_PROBE, Rendered, render_abi_probe, render_vl_query
from ..generator.spec import KernelSpec
from ..generator.validate import parse_spec, validate
from ..records import __version__
from .defaults import default_specs
from .targets import Target, TargetError, get_target
from .toolchain import Toolchain, ToolchainError, discover
from .tuned import tuned_roles

__all__ = ["BuildError", "BuildResult", "build_library", "library_filename", "MANIFEST_NAME",
           "kernel_entry"]

HEADER_NAME = "tilegen_kernels.h"
MANIFEST_VERSION = 3      # 2: kernel and packer entries are spec, name, symbol, params;
#                           3: kernel entries also carry their descriptor


class BuildError(RuntimeError):
    """Assembling or linking failed; the message names the kernel and the assembler error."""


@dataclass(frozen=True)
class BuildResult:
    out_dir: Path
    library: Path
    manifest_path: Path
    manifest: dict


def library_filename(fmt: str) -> str:
    return "libtilegen.dylib" if fmt == "macho" else "libtilegen.so"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_DIAG = re.compile(r"^(?P<file>[^:\n]+\.S):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<kind>error|warning):\s*(?P<msg>.*)$",
                   re.M)


def _assembler_error(spec: KernelSpec, src: Path, text: str, output: str) -> BuildError:
    lines = text.splitlines()
    details = []
    for m in _DIAG.finditer(output):
        if m["kind"] != "error":
            continue
        n = int(m["line"])
        code = lines[n - 1].strip() if 0 < n <= len(lines) else "?"
        details.append(f"  {src.name}:{n}: {code}\n    -> {m['msg']}")
    body = "\n".join(details) if details else output.strip()
    return BuildError(f"assembling kernel {spec.name} failed:\n{body}")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, SOURCE_DATE_EPOCH="0", ZERO_AR_DATE="1")
    return subprocess.run(cmd, capture_output=True, text=True, env=env)


def _support_object(tc: Toolchain, out: Path, name: str, text: str, what: str, *flags: str) -> Path:
    """Write and compile one of the library's non-kernel sources (getters, ABI probe)."""
    src = out / "src" / name
    src.write_text(text)
    obj = out / "obj" / (src.stem + ".o")
    p = _run(tc.assemble_cmd(src, obj, *flags))
    if p.returncode != 0:
        raise BuildError(f"building {what} failed:\n{(p.stderr + p.stdout).strip()}")
    return obj


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.done = total, 0
        self.enabled = not quiet and sys.stderr.isatty()

    def step(self, name: str) -> None:
        self.done += 1
        if self.enabled:
            sys.stderr.write(f"\r[{self.done}/{self.total}] {name[:70]:<70}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _with_roles(entry: dict, roles: set[str]) -> dict:
    entry = dict(entry, preferred="pair" in roles)
    best = [r[5:] for r in ("best_gemm", "best_gemv") if r in roles]
    if best:
        entry["best"] = best[0]
    return entry


def build_library(specs: Iterable[KernelSpec | PackerSpec | str] | None = None, target: str | Target = "generic-armv8",
                  out_dir: str | os.PathLike = "out", fmt: str | None = None, cc: str | None = None,
                  quiet: bool = True, jobs: int | None = None) -> BuildResult:
    """Generate, assemble and link ``specs`` (default: the target's default kernels).

    Writes ``out_dir/src/<name>.S``, ``out_dir/obj/<name>.o``, the library and the manifest.
    Every q4 kernel brings the generated NEON LHS quant-pack routine it reads.
    """
    tgt = target if isinstance(target, Target) else get_target(target)
    fmt = fmt or tgt.fmt
    extra_packers: list[PackerSpec] = []
    roles: dict[str, set[str]] = {}
    if specs is None:
        spec_list = default_specs(tgt)
        # "preferred": the tuned pair, which the runtime tries first; "best": the best gemm /
        # gemv of any layout (weights packed with for_ops=("gemm", "gemv"))
        roles = tuned_roles(tgt)
    else:
        spec_list = []
        for s in specs:
            if isinstance(s, PackerSpec):
                extra_packers.append(s)
            else:
                spec_list.append(parse_spec(s) if isinstance(s, str) else validate(s))
    if not spec_list and not extra_packers:
        raise BuildError(f"no kernels to build for target {tgt.name}")
    for s in spec_list:
        if not tgt.supports(s):
            missing = sorted(set(s.features) - tgt.features)
            raise TargetError(f"kernel {s.name} needs {', '.join(missing)}, which target "
                              f"{tgt.name} lacks (it has {', '.join(sorted(tgt.features))})")
    uniq = {s.name: s for s in spec_list}
    spec_list = [uniq[n] for n in sorted(uniq)]
    # every kernel's packer; SME kernels also the streaming twin (the runtime packs with it)
    pk = {p.name: p for p in extra_packers + [f(s) for s in spec_list
                                              for f in (packer_for, streaming_packer_for)]
          if p is not None}
    packer_list = [pk[n] for n in sorted(pk)]
    tc: Toolchain = discover(fmt, cc)

    out = Path(out_dir)
    (out / "src").mkdir(parents=True, exist_ok=True)
    (out / "obj").mkdir(parents=True, exist_ok=True)
    rendered = [render(s, fmt) for s in spec_list] + [
        Rendered(p, fmt, p.symbol(fmt), _packers.render(p, fmt)) for p in packer_list]
    progress = _Progress(len(rendered), quiet)

    def assemble(r):
        src = out / "src" / f"{r.spec.name}.S"
        obj = out / "obj" / f"{r.spec.name}.o"
        src.write_text(r.text)
        p = _run(tc.assemble_cmd(src, obj))
        if p.returncode != 0:
            raise _assembler_error(r.spec, src, r.text, p.stderr + p.stdout)
        progress.step(r.spec.name)
        return obj

    with ThreadPoolExecutor(max_workers=jobs or min(4, os.cpu_count() or 1)) as ex:
        objs = list(ex.map(assemble, rendered))
    # KleidiAI-style getters (freestanding C from the layout objects) and the C header
    kspecs = [r.spec for r in rendered if isinstance(r.spec, KernelSpec)]
    objs.append(_support_object(tc, out, "tilegen_getters.c", getters_c(kspecs), "the getters",
                                "-O2", "-ffreestanding", "-fno-stack-protector"))
    objs.append(_support_object(tc, out, f"{ABI_PROBE}.S", render_abi_probe(fmt), "the ABI probe"))
    objs.append(_support_object(tc, out, "tilegen_vl_query.S", render_vl_query(fmt),
                                "the vector-length queries"))
    # the plan driver (tilegen.runtime.driver): prepared matmuls, one native call per thread
    objs.append(_support_object(tc, out, "tilegen_driver.c", driver_source(), "the plan driver",
                                "-O2", "-ffreestanding", "-fno-stack-protector", "-fno-builtin",
                                *(("-mno-outline-atomics",) if fmt == "elf" else ())))
    (out / HEADER_NAME).write_text(header(kspecs, packer_list))
    kernels = [_with_roles(kernel_entry(r.spec, r.symbol), roles.get(r.spec.name, set()))
               for r in rendered if isinstance(r.spec, KernelSpec)]
    packers = [packer_entry(r.spec, r.symbol) for r in rendered if isinstance(r.spec, PackerSpec)]
    # the library carries the digest of the table the manifest lists (checked at load)
    objs.append(_support_object(tc, out, "tilegen_manifest_digest.S",
                                render_digest(table_digest(kernels, packers, fmt, ABI_PROBE), fmt),
                                "the kernel-table digest"))
    lib = out / library_filename(fmt)
    p = _run(tc.link_cmd(objs, lib))
    if p.returncode != 0:
        raise BuildError(f"linking {lib.name} failed:\n{(p.stderr + p.stdout).strip()}")

    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "tilegen_version": __version__,
        "target": tgt.name,
        "target_features": sorted(tgt.features),
        "format": fmt,
        "library": lib.name,
        "sha256": _sha256(lib),
        "toolchain": tc.describe(),
        "kernels": kernels,
        "packers": packers,
        "header": HEADER_NAME,
        "abi_probe": ABI_PROBE,
    }
    mpath = out / MANIFEST_NAME
    mpath.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return BuildResult(out, lib, mpath, manifest)


__all__ += ["ToolchainError", "TargetError"]
