#!/usr/bin/env bash
# The README's test command: set up if needed, then run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
