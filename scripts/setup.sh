#!/usr/bin/env bash
# Idempotent set-up for a fresh x86-64 or aarch64 Debian/Ubuntu machine:
#   toolchain (clang-19, lld-19, llvm-19, and cmake + ninja + ccache for
#   scripts/llama_cpp_check.sh, from apt), a venv with tilegen + the `test` extra
#   (pytest, gguf, hypothesis, matplotlib for `analyze --plot`),
#   and (x86-64 hosts) the emulator cache: qemu-user 11, an aarch64 Python sysroot, wheels.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=0
for tool in clang-19 ld.lld-19 ld64.lld-19 llvm-mca-19 llvm-objdump-19 cmake ninja ccache; do
    command -v "$tool" >/dev/null 2>&1 || missing=1
done
if [ "$missing" = 1 ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
    echo "setup: installing clang-19 lld-19 llvm-19 cmake ninja-build ccache with apt" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-19 lld-19 llvm-19 cmake \
        ninja-build ccache >/dev/null
fi

PY="${PYTHON:-python3}"
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "tilegen needs Python >= 3.11"'
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! .venv/bin/python -c 'import tilegen, pytest, matplotlib' >/dev/null 2>&1 \
        || [ pyproject.toml -nt .venv/.tilegen-installed ]; then
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[test]'
    touch .venv/.tilegen-installed
fi
# Emulator: qemu-user >= 11, aarch64 Python 3.11 sysroot, numpy/pytest wheels (cached).
.venv/bin/tilegen emulate --provision-only
