#!/usr/bin/env bash
# The cluster path rehearsed on this machine (issue 22): PostgreSQL, MLflow with basic auth, a Ray
# head and two worker nodes with token auth, a study submitted as a Ray Job, a worker node killed
# mid-trial, MLflow and PostgreSQL restarted. Prints one line per check; exit 1 if any fails.
# Options: --workers N, --trials N, --out report.json, --keep (see k3scale/bench/rehearsal.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
[ -x .venv/bin/python ] || bash scripts/setup.sh
exec .venv/bin/python -m k3scale.bench.rehearsal "$@"
