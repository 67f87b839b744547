#!/usr/bin/env bash
# The README's main job: set up from nothing, build the corpus, run both flagship studies on the
# embedded defaults (local Ray, a local MLflow server on SQLite, the built-in corpus), fit, render
# the dashboards and print the headline numbers. PRESET=smoke bash scripts/main.sh for a quick pass.
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_USAGE_STATS_ENABLED=0 MLFLOW_DISABLE_TELEMETRY=true
# Huge pages for large allocations (k3scale/cli.py _ENTRY_ENV says why); read at process start.
export GLIBC_TUNABLES=${GLIBC_TUNABLES:-glibc.malloc.hugetlb=1}
preset=${PRESET:-demo}
# One study folder per code version: a study refuses to resume under another commit (its runs
# would mix code versions), so a rerun after a pull starts fresh and a rerun at the same commit
# resumes.
version=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unversioned)
start=$(date +%s)
bash scripts/setup.sh
echo "== setup done in $(( $(date +%s) - start )) s"
# Which path training takes, in one line a person sees (a SLOW PATH line says why and the cost).
.venv/bin/python -c "from k3scale.ops.cpu.build import slow_path_notice, status; print('==', slow_path_notice() or status())"
k3=.venv/bin/k3scale
$k3 data prepare
for study in cosine_vs_wsd k2_vs_k3; do
  dir=studies/$study-$preset-$version
  $k3 study run experiments/$study.py --preset "$preset" --study-dir "$dir"
  $k3 fit "$study" --from "$dir/tables" --out "$dir/fit.json"
  $k3 dashboard --from "$dir/tables" --fit "$dir/fit.json" --layout "$study" --out "$dir/dashboard.html"
done
echo
for study in cosine_vs_wsd k2_vs_k3; do
  $k3 study report experiments/$study.py --preset "$preset" --study-dir "studies/$study-$preset-$version"
  echo
done
echo "== main job done in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"
