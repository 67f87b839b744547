#!/usr/bin/env bash
# GPU check of the Triton kernels (correctness + times vs torch/fla): bash benchmarks/gpu_check.sh
# Exit 0: all checks pass; 1: a check failed; 2: no NVIDIA GPU (nothing run). Extra args go to
# gpu_check.py (e.g. --quick).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || PYTHON=python3
exec "$PYTHON" benchmarks/gpu_check.py "$@"
