#!/usr/bin/env bash
# Re-tune the shipped presets (tilegen/build/tuned/<target>.json): `tilegen tune --write` for
# every family tune models on each target (tilegen.analysis.tune.tunable_families: every family
# with a NEON or SVE realisation the target runs; SME-only families are not modelled).
#
#   bash scripts/tune_presets.sh                       # the four Neoverse presets, every family
#   bash scripts/tune_presets.sh neoverse-v2           # one preset
#   FAMILIES="iq4_nl mxfp4" bash scripts/tune_presets.sh   # only these families (each one's
#                                                      # entry is replaced, the others kept;
#                                                      # a target that cannot run one skips it)
#
# PYTHON picks the interpreter (default .venv/bin/python, else python3).  Timing: see
# tilegen/build/tuned/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(neoverse-n1 neoverse-n2 neoverse-v1 neoverse-v2)
for t in "${targets[@]}"; do
    fams=$("$PY" -c 'import os, sys
from tilegen.build import get_target
from tilegen.analysis.tune import tunable_families
want = os.environ.get("FAMILIES", "").split()
print(" ".join(f for f in tunable_families(get_target(sys.argv[1])) if not want or f in want))' "$t")
    for f in $fams; do
        echo "== $t $f"
        "$PY" -m tilegen tune --target "$t" --family "$f" --write --top 3
    done
done
