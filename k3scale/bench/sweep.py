"""`k3scale bench sweep`: a trial's fixed cost in a real study, and the sweep's utilization.

Runs the smoke preset of `experiments/cosine_vs_wsd.py` (cosine trials, and WSD trunks with
their branches) with `k3scale study run` in a temporary folder: its own local Ray, a local MLflow
server on SQLite and the committed sample text (vocab 512). The driver records, per finished
task, the slot's time from launch to result and the training-step time of its runs
(`sweep/driver.task_timing`); study.json keeps the medians. Printed:

- `fixed_overhead_s_per_trial`: median over tasks of slot time minus step time (worker start,
  imports, data and model setup, the matmul-peak probe, evaluation, checkpoints, MLflow calls,
  transfers and the driver's turn), and `overhead_by_phase_s`, its median split;
- `utilization`: busy trial time over the sweep's wall time times its cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from k3scale.data.sample import prepare_sample
from k3scale.errors import K3ScaleError
from k3scale.sweep.folder import UTILIZATION_MEANS

STUDY = Path(__file__).resolve().parents[2] / "experiments" / "cosine_vs_wsd.py"
PRESET = "smoke"
VOCAB = 512


def run(quick: bool) -> dict:
    """One smoke study; the overhead figures from its study.json (`quick` changes nothing: the
    smoke preset is already the smallest study).

    Returns:
        `{"fixed_overhead_s_per_trial", "fixed_overhead_s_max", "overhead_by_phase_s": {"imports", "run_setup",
        "evaluation", "tracking", "checkpoints", "other"}, "utilization", "trials", "sweep_s", "wall_s", "study",
        "preset", "load_avg_1min": [before, after], "git_sha"}`.
    """
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        root = Path(tmp)
        prepare_sample(root / "data", vocab_size=VOCAB)
        command = [
            sys.executable,
            "-m",
            "k3scale.cli",
            "study",
            "run",
            str(STUDY),
            "--preset",
            PRESET,
            "--study-dir",
            str(root / "study"),
            "--data-root",
            str(root / "data"),
            "--dataset",
            "sample",
        ]
        started = time.time()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:]
            raise K3ScaleError(f"bench sweep: the smoke study failed: {' '.join(tail)}")
        record = json.loads((root / "study" / "study.json").read_text())
    keys = (
        "fixed_overhead_s_per_trial",
        "fixed_overhead_s_max",
        "overhead_by_phase_s",
        "utilization",
        "trials",
    )
    return {
        **{key: record[key] for key in keys},
        "sweep_s": record["sweep_s"],
        "wall_s": round(time.time() - started, 1),
        "cores": record["cores"],
        "study": STUDY.stem,
        "preset": PRESET,
        "load_avg_1min": [load_before, os.getloadavg()[0]],
        "git_sha": record["identity"]["git_sha"],
    }


def render(result: dict) -> str:
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in result["overhead_by_phase_s"].items())
    trials = result["trials"]
    return "\n".join(
        [
            f"{result['study']} ({result['preset']}): {trials['finished']} trials finished, "
            f"sweep {result['sweep_s']:.0f} s on {result['cores']} cores "
            f"(load average {result['load_avg_1min'][0]:.1f} -> {result['load_avg_1min'][1]:.1f})",
            f"fixed_overhead_s_per_trial {result['fixed_overhead_s_per_trial']:.2f} s "
            f"(median over tasks of slot time minus training-step time; largest "
            f"{result['fixed_overhead_s_max']:.2f} s)",
            f"  median split: {phases}",
            f"utilization {result['utilization']:.2f} {UTILIZATION_MEANS}",
        ]
    )


def markdown(result: dict) -> str:
    """The fixed cost per trial and its split, as Markdown (analysis/README.md embeds it)."""
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in result["overhead_by_phase_s"].items())
    overhead = result["fixed_overhead_s_per_trial"]
    return (
        f"`k3scale bench sweep` at commit `{result['git_sha'][:7]}`: the {result['study']} "
        f"{result['preset']} study, {result['trials']['finished']} trials on "
        f"{result['cores']} cores. Fixed cost per trial (median of slot time minus step time): "
        f"**{overhead:.2f} s** (target 2 s: {'met' if overhead <= 2.0 else 'not met'}; the "
        f"largest, a fresh worker's first task, {result['fixed_overhead_s_max']:.2f} s). "
        f"Median split: {phases}. Utilization {result['utilization']:.2f}.\n"
    )
