"""Every bad input we know of, through the real `k3scale` command (issue 23).

Each case runs `python -m k3scale.cli ...` as a child process and must end with exit code 2,
exactly one line on stderr, no traceback, and every file that was already there (a good
fit.json, run tables, a study file, a file given as a folder) byte-identical afterwards. The
cases are the inputs issue 23 lists plus the ones handled before it, so they stay handled.

The children run a few at a time (each one mostly waits on imports): the whole sweep takes
well under a minute on 2 cores. Cases that need a running service are elsewhere
(tests/sweep/test_run_inputs.py covers resuming under another commit or other data).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import polars as pl
import pytest

from k3scale.data.sample import prepare_sample
from k3scale.scaling.inputs.tables import build_tables, write_tables
from tests.scaling.synthetic import synthetic_runs
from tests.sweep.test_run_inputs import TINY_STUDY

ROOT = Path(__file__).resolve().parents[1]
GOOD_FIT = b'{"analysis": "an earlier good fit"}\n'
# Children at once: they are import-bound, so a few overlap well even on 2 cores.
PARALLEL = 4
FAST_FIT = ("--bootstrap", "0", "--grid", "coarse", "--workers", "1")


def cases(w: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """id -> (arguments after `k3scale`, a fragment the one stderr line must hold)."""
    data = ("--set", f"data.root={w / 'data'}", "--set", "data.dataset=sample")
    smoke = ("study", "run", "experiments/k2_vs_k3.py", "--preset", "smoke")
    run = (*smoke, "--data-root", str(w / "data"), "--dataset", "sample")
    fit = ("--out", str(w / "fit.json"), *FAST_FIT)
    surface = ("--n-col", "N", "--d-col", "D", "--loss-col", "L", *FAST_FIT)
    frontier = ("--compute-col", "C", "--loss-col", "L", "--group-col", "g", "--baseline", "a")
    return {
        # Arguments and overrides.
        "unknown-command": (("nonsense",), "invalid choice"),
        "unknown-flag": (("train", "--no-such-flag"), "unrecognized arguments"),
        "unknown-key": (("train", "--set", "optim.lrr=1", "--dry-run"), "unknown key 'lrr'"),
        "override-without-equals": (("train", "--set", "optim.lr", "--dry-run"), "a.b.c=value"),
        "unknown-preset": (("train", "--preset", "nope", "--dry-run"), "nope"),
        "lr-not-a-number": (("train", "--set", "optim.lr=x", "--dry-run"), "expected a float"),
        "lr-inf": (("train", "--set", "optim.lr=inf", "--dry-run"), "must be finite and > 0"),
        "budget-a-string": (
            ("train", "--set", "train.budget_tokens=lots", "--dry-run"),
            "expected an int",
        ),
        "budget-1e23": (
            ("train", *data, "--set", "train.budget_tokens=1e23", "--dry-run"),
            "above 2**53",
        ),
        "budget-one-step": (("train", *data, "--steps", "1", "--dry-run"), "at least 2"),
        "steps-and-budget": (
            ("train", *data, "--steps", "5", "--set", "train.budget_tokens=4096", "--dry-run"),
            "not both",
        ),
        "steps-zero": (("train", *data, "--steps", "0", "--dry-run"), "must be >= 1"),
        "warmup-past-the-end": (
            ("train", *data, "--steps", "20", "--set", "schedule.warmup_tokens=10000000"),
            "schedule.warmup_tokens",
        ),
        "missing-dataset": (
            ("train", "--set", f"data.root={w / 'nowhere'}", "--dry-run"),
            "no prepared dataset 'english_mix'",
        ),
        "config-not-module-function": (("train", "--config", "nope"), "MODULE:FUNCTION"),
        "unknown-model": (("model", "info", "k9-t0"), "k9-t0"),
        "missing-data-info": (("data", "info", "nope", "--root", str(w / "data")), "nope"),
        # Study declarations and services.
        "missing-study-file": (("study", "plan", "experiments/missing.py"), "does not exist"),
        "malformed-study": (("study", "plan", str(w / "malformed.py")), "malformed.py"),
        "unknown-arch": (("study", "plan", str(w / "k4.py"), "--preset", "smoke"), "'k4'"),
        "unknown-schedule": (
            ("study", "plan", str(w / "linear.py"), "--preset", "smoke"),
            "unknown 'linear'",
        ),
        "no-archs": (("study", "run", str(w / "no_archs.py"), "--preset", "smoke"), "archs"),
        "budget-string-in-study": (
            ("study", "plan", str(w / "string_budget.py"), "--preset", "smoke"),
            "not a finite int",
        ),
        "unknown-study-preset": (
            ("study", "plan", "experiments/k2_vs_k3.py", "--preset", "nope"),
            "has no preset 'nope'",
        ),
        "run-missing-dataset": (
            (*smoke, "--data-root", str(w / "nowhere"), "--study-dir", str(w / "s1")),
            "no prepared dataset",
        ),
        # The study names the build its models need, and refuses one they cannot read.
        "run-missing-small-vocab-dataset": (
            (
                *("study", "run", "experiments/k2_vs_k3.py", "--preset", "cpu_v2"),
                *("--data-root", str(w / "nowhere"), "--study-dir", str(w / "s7")),
            ),
            "--name english_mix_v512 --vocab-size 512",
        ),
        "run-dataset-vocab-too-large": (
            (
                *("study", "run", "experiments/k2_vs_k3.py", "--preset", "cpu_v2"),
                *("--data-root", str(w / "data_1024"), "--dataset", "sample"),
                *("--study-dir", str(w / "s8")),
            ),
            "larger than the study's models' 512",
        ),
        "dead-ray-address": (
            (*run, "--study-dir", str(w / "s2"), "--ray-address", "127.0.0.1:9"),
            "no Ray cluster answers at 127.0.0.1:9",
        ),
        "ftp-tracking-uri": (
            (*run, "--study-dir", str(w / "s3"), "--tracking-uri", "ftp://example.invalid/x"),
            "expected the http(s) URL",
        ),
        "study-dir-a-file": (
            (*run, "--study-dir", str(w / "precious.txt")),
            "is a file, not a folder",
        ),
        "submit-to-nothing": (
            (
                *("study", "submit", "experiments/k2_vs_k3.py", "--preset", "smoke"),
                *("--address", "http://127.0.0.1:9"),
            ),
            "cannot reach the Ray dashboard",
        ),
        "status-of-no-study": (
            ("study", "status", "experiments/k2_vs_k3.py", "--study-dir", str(w / "s4")),
            "no k2_vs_k3 study with preset 'demo' at",
        ),
        "report-without-fit": (
            ("study", "report", "experiments/k2_vs_k3.py", "--study-dir", str(w / "s5")),
            "fit.json",
        ),
        "ui-on-all-interfaces": (
            ("ui", "--study-dir", str(w / "s6"), "--host", "0.0.0.0"),
            "--i-know",
        ),
        # Fits: a good fit.json must survive every one of them.
        "zero-row-table": (("fit", "k2_vs_k3", "--from", str(w / "empty"), *fit), "has no rows"),
        "recipe-of-another-study": (
            ("fit", "cosine_vs_wsd", "--from", str(w / "tables"), *fit),
            "does not match the table",
        ),
        "unknown-recipe": (("fit", "nope", "--from", str(w / "tables"), *fit), "nope"),
        "out-a-folder": (
            ("fit", "k2_vs_k3", "--from", str(w / "tables"), "--out", str(w), *FAST_FIT),
            "is a folder",
        ),
        "garbage-parquet": (
            ("fit", "k2_vs_k3", "--from", str(w / "garbage"), *fit),
            "not a readable parquet",
        ),
        "garbage-parquet-dashboard": (
            ("dashboard", "--from", str(w / "garbage"), "--out", str(w / "page.html")),
            "not a readable parquet",
        ),
        "negative-bootstrap": (
            ("fit", "k2_vs_k3", "--from", str(w / "tables"), "--bootstrap", "-1", *fit[:2]),
            "--bootstrap must be >= 0",
        ),
        "surface-one-point-repeated": (
            ("fit", "surface", str(w / "repeated.csv"), *surface),
            "got 1 distinct",
        ),
        "surface-empty-csv": (("fit", "surface", str(w / "empty.csv"), *surface), "is empty"),
        "surface-binary-csv": (
            ("fit", "surface", str(w / "binary.csv"), *surface),
            "is not a readable CSV",
        ),
        "frontier-binary-csv": (
            ("fit", "frontier", str(w / "binary.csv"), *frontier),
            "is not a readable CSV",
        ),
        "surface-missing-columns": (("fit", "surface", str(w / "repeated.csv")), "missing"),
    }


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """Good and bad inputs side by side: the good ones must come out unchanged."""
    w = tmp_path_factory.mktemp("bad-input")
    prepare_sample(w / "data", vocab_size=512)
    prepare_sample(w / "data_1024", vocab_size=1024)
    runs, curves = build_tables(synthetic_runs("k2_vs_k3", sizes=("t0", "t1"), lrs=(1e-3,)))
    write_tables(runs, curves, w / "tables")
    write_tables(runs.clear(), curves.clear(), w / "empty")
    (w / "fit.json").write_bytes(GOOD_FIT)
    (w / "precious.txt").write_bytes(b"precious")
    (w / "garbage").mkdir()
    (w / "s5").mkdir()  # a study folder that holds no fit yet
    for name in ("runs.parquet", "curves.parquet"):
        (w / "garbage" / name).write_bytes(b"not parquet at all\n" * 10)
    pl.DataFrame({"N": [1e8] * 10, "D": [1e9] * 10, "L": [3.0] * 10}).write_csv(w / "repeated.csv")
    (w / "empty.csv").write_bytes(b"")
    (w / "binary.csv").write_bytes(bytes(range(256)) * 4)
    (w / "malformed.py").write_text(
        "from k3scale.sweep.declaration import Study\nSTUDY = Study(name=1)\n"
    )
    for name, archs, schedules, budgets in (
        ("k4", '("k2", "k4")', '("cosine",)', "(16_384,)"),
        ("linear", '("k2",)', '("cosine", "linear")', "(16_384,)"),
        ("no_archs", "()", '("cosine",)', "(16_384,)"),
        ("string_budget", '("k2",)', '("cosine",)', '("1e5",)'),
    ):
        text = TINY_STUDY.format(archs=archs, schedules=schedules, budgets=budgets)
        (w / f"{name}.py").write_text(text)
    return w


def fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of every file under `folder`: what must not change."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def k3scale(args: tuple[str, ...]) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "k3scale.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    return done, time.monotonic() - started


@pytest.fixture(scope="module")
def outcomes(workspace) -> tuple[dict, dict[str, str], dict[str, str]]:
    """Every case run once (a few at a time), with the workspace before and after."""
    before = fingerprint(workspace)
    todo = cases(workspace)
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = dict(zip(todo, pool.map(k3scale, [args for args, _ in todo.values()])))
    return results, before, fingerprint(workspace)


@pytest.mark.parametrize("case", sorted(cases(Path("/w"))))
def test_bad_input_exits_2_with_one_line_and_touches_nothing(case, workspace, outcomes):
    results, before, after = outcomes
    (done, seconds), fragment = results[case], cases(workspace)[case][1]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(lines) == 1, done.stderr[-2000:]
    assert fragment in lines[0], lines[0]
    assert "Traceback" not in done.stderr and "internal error" not in lines[0]
    # "No hangs" (issue 23): a refused input is refused at once, services included.
    assert seconds < 60, f"{case} took {seconds:.0f} s"
    changed = sorted(k for k in before if before[k] != after.get(k))
    assert not changed, f"files changed or removed: {changed}"
