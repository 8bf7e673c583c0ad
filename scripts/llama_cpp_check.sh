#!/usr/bin/env bash
# llama.cpp as the real client of a KleidiAI source tree (issue #14): cross-build llama.cpp
# for aarch64 (KleidiAI OFF, ON against a `tilegen export kleidiai` tree, ON against the real
# KleidiAI v1.24.0 from ../shared/thirdparty/kleidiai), run a synthetic Q4_0/Q8_0/F16 llama
# model under qemu on several CPU models, compare logits and greedy tokens (export vs real:
# identical where the kernels are bit-exact).
#   scripts/llama_cpp_check.sh                       # export this checkout's tree, 3 builds
#   scripts/llama_cpp_check.sh --export /tmp/kai     # the ON build against that tree instead
#   scripts/llama_cpp_check.sh --off-only            # OFF build only (reference sanity)
#   scripts/llama_cpp_check.sh --help
# Needs what scripts/setup.sh provides (clang-19, lld-19, cmake, ninja, ccache, the venv
# with gguf);
# qemu, the arm64 cross sysroot and the llama.cpp sources are provisioned into the tilegen
# cache (~/.cache/tilegen) on first use. Exit 0: all within tolerance, 1: a comparison
# failed, 2: provisioning/build error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
for tool in clang-19 clang++-19 ld.lld-19 cmake ninja ccache; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "llama_cpp_check: $tool not found: run scripts/setup.sh first" >&2
        exit 2
    fi
done
if ! "$PY" -c 'import numpy, gguf' >/dev/null 2>&1; then
    echo "llama_cpp_check: $PY lacks numpy/gguf: run scripts/setup.sh (installs .[test])" >&2
    exit 2
fi
exec "$PY" scripts/llama_cpp_check.py "$@"
