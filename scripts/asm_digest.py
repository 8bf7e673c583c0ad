"""Byte-identity check for refactors: sha256 of every rendered kernel and of every preset library.

    python scripts/asm_digest.py snapshot before.json            # before the change
    python scripts/asm_digest.py snapshot after.json             # after it
    python scripts/asm_digest.py compare before.json after.json  # lists every difference

Kernels: every tile the tuner's grid accepts for every family on every target (gemm and gemv),
plus every target's default kernels and their LHS packers, each rendered as ELF and as Mach-O.
Libraries: every preset's default build: the library and its C header (``--no-libs`` skips
them; they need the toolchain).
Exports: every file of ``tilegen export kleidiai`` for linux-aarch64-all, neoverse-v2 --tuned
and apple-m4 (Mach-O).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tilegen.build.library import build_library, library_filename  # noqa: E402
from tilegen.build.targets import TARGETS  # noqa: E402
from tilegen.export.kleidiai import export_files  # noqa: E402
from tilegen.generator import packers  # noqa: E402
from tilegen.generator.render import render  # noqa: E402
from tilegen.analysis.tune import grid_specs  # noqa: E402


EXPORTS = (("linux-aarch64-all", False), ("neoverse-v2", True), ("apple-m4", False))


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def all_specs() -> dict:
    """spec string -> KernelSpec, over every target's accepted grid and default kernels."""
    return grid_specs()


def snapshot(libs: bool) -> dict:
    kernels, packs = {}, {}
    for key, spec in sorted(all_specs().items()):
        for fmt in ("elf", "macho"):
            kernels[f"{key}@{fmt}"] = _sha(render(spec, fmt).text.encode())
        p = packers.packer_for(spec)
        if p is not None:
            for fmt in ("elf", "macho"):
                packs[f"{p.name}@{fmt}"] = _sha(packers.render(p, fmt).encode())
    out = {"kernels": kernels, "packers": packs, "libraries": {}, "exports": {}}
    for target, tuned in EXPORTS:
        for f in export_files(target, tuned=tuned):
            out["exports"][f"{target}{'-tuned' if tuned else ''}:{f.path}"] = _sha(f.text.encode())
    if libs:
        with tempfile.TemporaryDirectory() as tmp:
            for tgt in dict.fromkeys(TARGETS.values()):
                d = Path(tmp) / tgt.name
                build_library(None, target=tgt, out_dir=d)
                out["libraries"][tgt.name] = _sha((d / library_filename(tgt.fmt)).read_bytes())
                for h in sorted(d.glob("*.h")):
                    out["libraries"][f"{tgt.name}:{h.name}"] = _sha(h.read_bytes())
    return out


def compare(a: dict, b: dict) -> int:
    bad = 0
    for part in ("kernels", "packers", "libraries", "exports"):
        x, y = a.get(part, {}), b.get(part, {})
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                bad += 1
                what = "missing after" if key not in y else "new" if key not in x else "differs"
                print(f"{part}: {key}: {what}")
        print(f"{part}: {len(x)} before, {len(y)} after")
    print("IDENTICAL" if not bad else f"{bad} differences")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot", help="write the digests to a JSON file")
    s.add_argument("out", help="output JSON file")
    s.add_argument("--no-libs", action="store_true", help="skip building the preset libraries")
    c = sub.add_parser("compare", help="compare two snapshots; exit 1 on any difference")
    c.add_argument("before", help="snapshot taken before the change")
    c.add_argument("after", help="snapshot taken after the change")
    args = ap.parse_args()
    if args.cmd == "snapshot":
        snap = snapshot(not args.no_libs)
        Path(args.out).write_text(json.dumps(snap, indent=1, sort_keys=True))
        print(f"{len(snap['kernels'])} kernel renders, {len(snap['packers'])} packer renders, "
              f"{len(snap['libraries'])} library files, {len(snap['exports'])} export files "
              f"-> {args.out}")
        return 0
    return compare(json.loads(Path(args.before).read_text()), json.loads(Path(args.after).read_text()))


if __name__ == "__main__":
    sys.exit(main())
