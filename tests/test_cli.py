"""The `k3scale` command: one-line errors with non-zero exits, and the frozen command surface."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from k3scale.cli import build_parser, main
from k3scale.data.sample import prepare_sample

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory) -> tuple[str, ...]:
    """`--set` flags pointing a run at the committed sample, prepared in a temporary folder."""
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return ("--set", f"data.root={root}", "--set", "data.dataset=sample")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def surface(parser: argparse.ArgumentParser, prefix: str = "k3scale") -> dict[str, str]:
    """Every command path and its flags and positionals, as one sorted string each."""
    items = sorted(s for a in parser._actions for s in a.option_strings)
    items += [
        f"<{a.dest}>"
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    out = {prefix: " ".join(items)}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(surface(sub, f"{prefix} {name}"))
    return out


def test_help_lists_every_command_group():
    result = run_cli("--help")
    assert result.returncode == 0
    groups = ("data", "model", "train", "study", "export", "fit", "predict", "dashboard", "bench")
    for group in (*groups, "ui"):
        assert f"    {group}" in result.stdout


def test_main_returns_2_on_a_bad_override_and_debug_raises():
    assert main(["train", "--set", "optim.lr=x", "--dry-run"]) == 2
    with pytest.raises(Exception, match=r"optim\.lr: expected a float"):
        main(["--debug", "train", "--set", "optim.lr=x", "--dry-run"])


def test_dry_run_of_a_huge_budget_returns_at_once(sample_data):
    """A 1e11-token budget (24M steps) once took 29 s and 1.4 GB building a per-step LR list;
    1e23 hung (issue 23; it is now refused, see tests/test_bad_input.py)."""
    result = run_cli("train", *sample_data, "--set", "train.budget_tokens=1e11", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "last step" in result.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--preset", "k3-t0"), "per-head Muon on"),
        (("--preset", "k2-t0"), "per-head Muon off"),
        (("--preset", "k3-t0", "--set", "optim.per_head_muon=false"), "per-head Muon off"),
    ],
)
def test_k3_runs_outside_a_study_default_to_per_head_muon(sample_data, args, expected):
    result = run_cli("train", *args, *sample_data, "--dry-run")
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_the_command_surface_is_frozen():
    """Adding or removing a command or flag is a deliberate change: update FROZEN with it."""
    assert surface(build_parser()) == FROZEN


FROZEN = {
    "k3scale": "--debug --help -h",
    "k3scale bench": "--draws --help --json --lr-grid --noise --preset --quick --seed-effects-from "
    "--seeds --studies --study --workers --write-tables -h <name>",
    "k3scale dashboard": "--fit --from --help --js --layout --metric --out --png --preset "
    "--studies-root -h <study>",
    "k3scale data": "--help -h",
    "k3scale data info": "--help --json --root -h <dataset>",
    "k3scale data prepare": (
        "--bin --for --force --help --name --ood --out --preset --seed --text --vocab-size -h"
    ),
    "k3scale data verify": "--help --root -h <dataset>",
    "k3scale export": "--experiment --help --out --replicas --tracking-uri -h",
    "k3scale fit": "--at --baseline --bootstrap --check --compute-col --d-col --exclude-col --experiment "
    "--from --grid --group-col --help --json --loss --loss-col --n-col --out "
    "--replicas --seed --tracking-uri --workers -h <analysis> <csv>",
    "k3scale model": "--help -h",
    "k3scale predict": "--cell --compute --conv --help --json --out -h <fit>",
    "k3scale model info": "--help --json --seq-len --set -h <preset>",
    "k3scale model list": "--help --json -h",
    "k3scale study": "--help -h",
    "k3scale study plan": "--data-root --dataset --help --measure --preset --study-dir -h <study>",
    "k3scale study report": (
        "--brief --help --markdown --preset --study-dir --tracking-uri -h <study>"
    ),
    "k3scale study run": "--allow-code-change --data-root --dataset --help --preset --ray-address "
    "--reuse-runs --storage --study-dir --tracking-uri -h <study>",
    "k3scale study status": "--help --preset --storage --study-dir -h <study>",
    "k3scale study submit": "--address --data-root --dataset --help --preset --storage --study-dir "
    "--tracking-uri -h <study>",
    "k3scale train": "--config --dry-run --experiment --help --no-resume --out --preset --set "
    "--steps --tracking-uri -h",
    "k3scale ui": "--artifacts-dir --backend-store-uri --help --host --i-know --port --study-dir -h",
}
