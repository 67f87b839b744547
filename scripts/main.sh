#!/usr/bin/env bash
# The README's main job: set up from nothing, build the corpus, run both flagship studies live on
# the embedded defaults (local Ray, a local MLflow server on SQLite, the built-in corpus), fit and
# render them, refit the committed reference studies offline from their tables, and end on one
# screen that says what each found. PRESET=smoke bash scripts/main.sh for a quick pass.
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
mkdir -p studies
log=studies/main-$preset-$version.log
: >"$log"
start=$(date +%s)

# step NAME COMMAND...: the command's output goes to the log; one line here says how it went.
step() {
  local name=$1 t
  shift
  t=$(date +%s)
  if "$@" >>"$log" 2>&1; then
    echo "== $name: done in $(($(date +%s) - t)) s"
  else
    echo "== $name: FAILED after $(($(date +%s) - t)) s; the end of $log:"
    tail -n 20 "$log"
    exit 1
  fi
}

echo "== main job, preset $preset; build and tool output goes to $log"
step "setup (.venv, packages, fused kernels)" bash scripts/setup.sh
# Which path training takes, in one line a person sees (a SLOW PATH line says why and the cost).
.venv/bin/python -c "from k3scale.ops.cpu.build import slow_path_notice, status; print('==', slow_path_notice() or status())"
k3=.venv/bin/k3scale
studies=(cosine_vs_wsd k2_vs_k3)
for study in "${studies[@]}"; do
  step "corpus for $study $preset" $k3 data prepare --for "experiments/$study.py" --preset "$preset"
done

# The live studies: their progress lines show here.
for study in "${studies[@]}"; do
  dir=studies/$study-$preset-$version
  $k3 study run "experiments/$study.py" --preset "$preset" --study-dir "$dir"
  step "fit $study" $k3 fit "$study" --from "$dir/tables" --out "$dir/fit.json"
  step "dashboard $study" $k3 dashboard --from "$dir/tables" --fit "$dir/fit.json" \
    --layout "$study" --out "$dir/dashboard.html"
done

# The reference studies (the newest committed design of each), refitted offline from their
# committed tables: what the platform finds at the scale this machine reaches in a sitting.
references=()
for study in "${studies[@]}"; do
  folder=$(ls -d analysis/results/"$study"-cpu_v* 2>/dev/null | sort -V | tail -n 1)
  [ -n "$folder" ] || continue
  ref=studies/reference-$version/$(basename "$folder")
  mkdir -p "$ref"
  cp "$folder/study.json" "$ref/"
  step "refit $(basename "$folder") from its committed tables" \
    $k3 fit "$study" --from "$folder" --out "$ref/fit.json"
  step "dashboard $(basename "$folder")" $k3 dashboard --from "$folder" --fit "$ref/fit.json" \
    --layout "$study" --out "$ref/dashboard.html"
  ran=$(.venv/bin/python -c "import json, sys; print(json.load(open(sys.argv[1]))['preset'])" "$folder/study.json")
  references+=("$study:$ran:$ref")
done

echo
echo "==== What the live $preset studies found (a small design: see analysis/README.md for its power)"
for study in "${studies[@]}"; do
  $k3 study report "experiments/$study.py" --preset "$preset" \
    --study-dir "studies/$study-$preset-$version" --brief
  echo
done
echo "==== What the committed reference studies find (refitted here from their tables)"
for entry in "${references[@]}"; do
  IFS=: read -r study ref_preset ref <<<"$entry"
  $k3 study report "experiments/$study.py" --preset "$ref_preset" --study-dir "$ref" --brief
  echo
done
echo "== main job done in $((($(date +%s) - start) / 60)) min $((($(date +%s) - start) % 60)) s; full log $log"
