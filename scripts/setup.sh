#!/usr/bin/env bash
# Create .venv (if missing) and install k3scale with every extra. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 is pinned exactly in pyproject.toml: pip takes the CPU wheel on local disk.
.venv/bin/python -m pip install -q -e '.[dev,kernels,export]'
