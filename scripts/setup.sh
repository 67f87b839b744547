#!/usr/bin/env bash
# Create .venv (if missing) and install k3scale with every extra. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL (the cluster storage's server; tests start throwaway ones): Debian's package.
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "note: PostgreSQL is not installed (apt-get install postgresql); its tests will fail" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
# torch==2.13.0 is pinned exactly in pyproject.toml: pip takes the CPU wheel on local disk.
.venv/bin/python -m pip install -q -e '.[dev,kernels,export]'
# Build the fused CPU kernels (k3scale/ops/cpu/build.py) for this CPU now, ahead of any run, so
# no trial compiles; without a compiler (or AVX2) the torch paths are used, and runs say so.
.venv/bin/python -c "from k3scale.ops.cpu.build import status; print(status())"
