"""A CLI that fits habits (issue 21, point 3), through the real command.

Progress lines for `train` (also into a pipe) and a heartbeat for long fits; `--steps`; dry runs
that check the data and warn when a run repeats it; fit numbers rounded to their intervals;
`study plan` with a wall-clock estimate and the search ranges; help texts that cite only files
in the repository; Ray's auth mode never turned off on the user's behalf (issue 23).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from k3scale.cli import _ENTRY_ENV, build_parser
from k3scale.commands.output import heartbeat, with_interval
from k3scale.commands.study import job_env
from k3scale.data.sample import prepare_sample
from tests.test_cli import surface

ROOT = Path(__file__).resolve().parents[1]
# A 3-step run of the smallest K2 on the sample: seconds.
TINY_TRAIN = (
    *("--preset", "k2-t0", "--set", "data.seq_len=64", "--set", "data.eval_tokens=1024"),
    *("--set", "train.batch_size=4", "--set", "train.micro_batch_size=4"),
)


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory) -> tuple[str, ...]:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return ("--set", f"data.root={root}", "--set", "data.dataset=sample")


def k3scale(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real command with stdout and stderr as pipes (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def test_train_prints_progress_lines_into_a_pipe_and_takes_steps(sample_data, tmp_path):
    done = k3scale("train", *TINY_TRAIN, *sample_data, "--steps", "3", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("finished: 3 steps, 768 tokens")
    progress = [line for line in done.stderr.splitlines() if line.startswith("step ")]
    assert progress, done.stderr
    assert re.fullmatch(
        r"step 3/3 \(100%\)  loss \d+\.\d{3}  [\d,]+ tokens/s  elapsed [\dhms]+  ETA 0s",
        progress[-1],
    ), progress[-1]


def test_steps_replace_the_token_budget(sample_data):
    done = k3scale("train", *TINY_TRAIN, *sample_data, "--steps", "7", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "1,792 tokens = 7 steps x 256 tokens/step" in done.stdout


def test_dry_run_warns_when_the_run_repeats_its_data(sample_data):
    repeats = k3scale("train", *TINY_TRAIN, *sample_data, "--steps", "5000", "--dry-run")
    assert repeats.returncode == 0, repeats.stderr
    assert re.search(r"warning: the run reads its training split [\d.]+ times", repeats.stderr)
    once = k3scale("train", *TINY_TRAIN, *sample_data, "--steps", "5", "--dry-run")
    assert once.returncode == 0 and "warning" not in once.stderr, once.stderr


def test_study_plan_prints_wall_clock_model_and_search_ranges():
    done = k3scale("study", "plan", "experiments/k2_vs_k3.py", "--preset", "smoke")
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"search: peak lr log-uniform in \[[\d.e-]+, [\d.e-]+\], batch size in \{[\d, ]+\}",
        done.stdout,
    )
    assert re.search(
        r"wall-clock: about [\d.]+ min on this machine \(\d+ trials at a time\)", done.stdout
    )
    assert "committed runs in analysis/results" in done.stdout
    assert "matmul peak" in done.stdout


def test_fit_prints_numbers_to_the_digits_their_intervals_justify(tmp_path):
    rows = [
        {"C": c, "L": (2.0 + 2000.0 * (k * c) ** -0.2) * (1 + 0.01 * np.sin(i)), "g": g}
        for g, k in (("a", 1.0), ("b", 2.5))
        for i, c in enumerate(np.logspace(16, 20, 12))
    ]
    pl.DataFrame(rows).write_csv(tmp_path / "f.csv")
    done = k3scale(
        *("fit", "frontier", str(tmp_path / "f.csv"), "--compute-col", "C", "--loss-col", "L"),
        *("--group-col", "g", "--baseline", "a", "--at", "1e18", "--bootstrap", "40"),
        *("--workers", "1"),
    )
    assert done.returncode == 0, done.stderr
    quoted = re.findall(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]", done.stdout)
    assert len(quoted) >= 7, done.stdout
    for value, low, high in quoted:
        decimals = {len(x.partition(".")[2]) for x in (value, low, high)}
        assert len(decimals) == 1, (value, low, high)
    assert "shared exponent: p = 0." in done.stdout
    assert not re.search(r"\d\.\d{6,}", done.stdout), done.stdout


def test_with_interval_rounds_to_two_digits_of_the_half_width():
    assert with_interval(1.81723, [1.7751, 1.8772]) == "1.817 [1.775, 1.877]"
    assert with_interval(480.4, [300.2, 680.9]) == "480 [300, 680]"
    assert with_interval(2.4952, None) == "2.495"
    assert with_interval(None, [1.0, 2.0]) == "undefined"
    assert with_interval(3.2e9, [2.9e9, 3.6e9]) == "3.20e+09 [2.90e+09, 3.60e+09]"


def test_heartbeat_reports_a_long_block_and_stays_quiet_for_a_short_one():
    quiet, loud = io.StringIO(), io.StringIO()
    with heartbeat("fitting", after_s=5.0, every_s=5.0, out=quiet):
        pass
    with heartbeat("fitting", after_s=0.05, every_s=0.05, out=loud):
        time.sleep(0.3)
    assert quiet.getvalue() == ""
    assert loud.getvalue().startswith("fitting: 0 s so far\n") and loud.getvalue().count("\n") >= 2


@pytest.mark.slow
def test_a_long_surface_fit_shows_that_it_is_working():
    from tests.scaling.reference import reference_file

    path = reference_file("epoch-chinchilla", "chinchilla_NDL.csv")
    done = k3scale(
        *("fit", "surface", str(path), "--n-col", "N_params", "--d-col", "D_tokens"),
        *("--loss-col", "loss", "--bootstrap", "100", "--workers", "1"),
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "k3scale fit surface: fitting, 100 bootstrap resamples on 1 process(es): 5 s so far" in (
        done.stderr
    )


def help_texts() -> str:
    parser = build_parser()
    texts = [parser.format_help()]

    def walk(p) -> None:
        for action in p._actions:
            if hasattr(action, "choices") and isinstance(action.choices, dict):
                for sub in action.choices.values():
                    texts.append(sub.format_help())
                    walk(sub)

    walk(parser)
    assert len(texts) == len(surface(parser))
    return "\n".join(texts)


def test_help_texts_cite_only_files_in_the_repository():
    # A citation is a Markdown document or a path from a folder (not part of a URL); placeholders
    # (DIR/train.bin, analysis/ANALYSIS.py) and file-name pairs (runs.parquet/curves.parquet)
    # are not.
    paths = re.findall(r"(?<![/\w.-])([a-z][\w-]*(?:/[\w.-]+)+\.\w+)", help_texts())
    cited = {p for p in paths if not re.search(r"/[A-Z_]+\.\w+$", p)}
    cited |= set(re.findall(r"\b[\w.-]+\.md\b", help_texts()))
    assert "k3scale/scaling/inputs/tables.py" in cited
    missing = sorted(c for c in cited if not (ROOT / c).exists())
    assert not missing, f"help cites files not in the repository: {missing}"


def test_entry_points_leave_rays_auth_mode_to_the_user(tmp_path):
    assert "RAY_AUTH_MODE" not in _ENTRY_ENV
    assert not any(key.startswith("RAY_AUTH") for key in job_env())
    probe = (
        "import os; from k3scale.cli import set_entry_environment; set_entry_environment(); "
        "print(os.environ.get('RAY_AUTH_MODE'))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    unset = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    token = subprocess.run(
        [sys.executable, "-c", probe],
        env={**env, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
    )
    assert (unset.stdout.strip(), token.stdout.strip()) == ("None", "token")
    # No module sets auth off for anyone: the local Ray uses token auth (k3scale/sweep/run.py).
    sources = [p for p in (ROOT / "k3scale").rglob("*.py") if '"disabled"' in p.read_text()]
    assert not [p for p in sources if "RAY_AUTH_MODE" in p.read_text()], sources


def test_study_plan_measure_trains_each_rung_and_estimates_from_those_rates(tmp_path):
    prepare_sample(tmp_path, vocab_size=512)
    done = k3scale(
        *("study", "plan", "experiments/k2_vs_k3.py", "--preset", "smoke", "--measure"),
        *("--data-root", str(tmp_path), "--dataset", "sample"),
    )
    assert done.returncode == 0, done.stderr
    rates = re.findall(r"^  (k[23]-\w+): ([\d,]+) tokens/s over 16 steps$", done.stdout, re.M)
    assert {size for size, _ in rates} == {"k2-t0", "k3-t0"}
    assert all(int(rate.replace(",", "")) > 0 for _, rate in rates)
    assert re.search(r"wall-clock: about [\d.]+ min on this machine", done.stdout)
    assert "rates measured now" in done.stdout and "committed runs" not in done.stdout
