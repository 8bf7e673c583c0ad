#!/usr/bin/env bash
# Main job: generate a kernel for a tile, build a library for a target, call it from Python
# (under qemu on x86-64 hosts, natively on aarch64) and check it against numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
TILE="${TILE:-7x12}" TARGET="${TARGET:-neoverse-n1}" CPU="${CPU:-neoverse-n1}" \
    exec .venv/bin/python scripts/demo.py
