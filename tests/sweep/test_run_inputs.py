"""`k3scale study run|plan` refuse bad input with one line and exit 2, before starting anything.

Each case runs the real command as a child process on the sample corpus; none gets as far as
Ray or an MLflow server, so each takes seconds. Resuming a study under another commit or other
data is refused the same way; the recorded identity comes from a first `check_identity`, the
call a study's first start makes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3scale.data.sample import prepare_sample
from k3scale.errors import K3ScaleError
from k3scale.sweep.declaration import load_study
from k3scale.sweep.identity import check_identity, current_identity
from k3scale.sweep.planner import plan_cells
from tests.sweep.test_study_runs import study_command

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "experiments" / "k2_vs_k3.py"
SMOKE_CELLS = [c.key for c in plan_cells(load_study(SMOKE), load_study(SMOKE).preset("smoke"))]
TINY_STUDY = """
from k3scale.sweep.declaration import SearchSpace, Study, StudyPreset

SMOKE = StudyPreset(
    sizes={{"k2": ("k2-t0",), "k3": ("k3-t0",)}},
    budgets={budgets},
    search=SearchSpace(lr_low=1e-3, lr_high=1e-2, batch_sizes=(8,)),
    trials_per_cell=1,
)
STUDY = Study(name="tiny", archs={archs}, schedules={schedules}, presets={{"smoke": SMOKE}})
"""


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return root


def k3scale(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


def run_smoke(study_dir: Path, data_root: Path, *extra: str) -> subprocess.CompletedProcess:
    # study_command's arguments after `python -m k3scale.cli`.
    return k3scale(*study_command(SMOKE, study_dir, data_root)[3:], *extra)


def one_line_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0], lines[0]
    assert "internal error" not in lines[0] and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (("--ray-address", "127.0.0.1:9"), "no Ray cluster answers at 127.0.0.1:9"),
        (("--ray-address", "auto"), "cannot join the Ray cluster at auto"),
        (("--tracking-uri", "ftp://example.invalid/x"), "expected the http(s) URL"),
    ],
    ids=["dead-address", "auto-without-cluster", "ftp-tracking-uri"],
)
def test_bad_service_addresses_fail_fast_and_start_nothing(data_root, tmp_path, flags, fragment):
    started = time.monotonic()
    result = run_smoke(tmp_path / "study", data_root, *flags)
    one_line_error(result, fragment)
    assert time.monotonic() - started < 30
    # Refused before the study's MLflow server (and its folder mlflow/) was started.
    assert not (tmp_path / "study" / "mlflow").exists()


def test_a_file_as_study_dir_is_refused_and_left_alone(data_root, tmp_path):
    target = tmp_path / "not-a-folder"
    target.write_bytes(b"precious")
    one_line_error(run_smoke(target, data_root), "is a file, not a folder")
    assert target.read_bytes() == b"precious"


def test_resume_under_another_commit_is_refused(data_root, tmp_path):
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    fingerprint = json.loads((data_root / "sample" / "dataset.json").read_text())["fingerprint"]
    started = {**current_identity(fingerprint), "git_sha": "0" * 40, "git_dirty": "false"}
    check_identity(f"sqlite:///{study_dir / 'optuna.db'}", started, False, SMOKE_CELLS)
    before = (study_dir / "optuna.db").read_bytes()
    one_line_error(run_smoke(study_dir, data_root), "started at commit 000000000000")
    assert (study_dir / "optuna.db").read_bytes() == before


def test_resume_on_another_kernel_path_is_refused(data_root, tmp_path, monkeypatch):
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    fingerprint = json.loads((data_root / "sample" / "dataset.json").read_text())["fingerprint"]
    started = {**current_identity(fingerprint), "kernel_path": "fused"}
    check_identity(f"sqlite:///{study_dir / 'optuna.db'}", started, False, SMOKE_CELLS)
    monkeypatch.setenv("K3SCALE_CPU_KERNELS", "0")
    one_line_error(run_smoke(study_dir, data_root), "started on the fused kernel path")


def test_resume_on_other_data_is_refused_even_with_allow_code_change(data_root, tmp_path):
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    started = current_identity("another-dataset-fingerprint")
    check_identity(f"sqlite:///{study_dir / 'optuna.db'}", started, False, SMOKE_CELLS)
    result = run_smoke(study_dir, data_root, "--allow-code-change")
    one_line_error(result, "started on data another-dataset-fingerprint")


def test_check_identity_records_once_and_allows_a_code_change_only_when_asked(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = {"git_sha": "a" * 40, "git_dirty": "false", "data_fingerprint": "f1"}
    assert check_identity(storage, first, allow_code_change=False, studies=["cell"]) == first
    assert check_identity(storage, first, allow_code_change=False, studies=["cell"]) == first
    later = {**first, "git_sha": "b" * 40}
    with pytest.raises(K3ScaleError, match="--allow-code-change"):
        check_identity(storage, later, allow_code_change=False, studies=["cell"])
    notes = []
    assert (
        check_identity(storage, later, allow_code_change=True, studies=["cell"], log=notes.append)
        == first
    )
    assert "aaaaaaaaaaaa -> bbbbbbbbbbbb" in notes[0]
    fused = {**first, "kernel_path": "fused"}
    storage = f"sqlite:///{tmp_path / 'paths.db'}"
    check_identity(storage, fused, allow_code_change=False, studies=["cell"])
    with pytest.raises(K3ScaleError, match="started on the fused kernel path"):
        check_identity(
            storage, {**fused, "kernel_path": "torch"}, allow_code_change=False, studies=["cell"]
        )
    notes = []
    check_identity(
        storage, {**fused, "kernel_path": "torch"}, True, studies=["cell"], log=notes.append
    )
    assert "(fused -> torch)" in notes[0]
    dirty = {**first, "git_dirty": "true"}
    with pytest.raises(K3ScaleError, match=r"now at aaaaaaaaaaaa \(dirty\)"):
        check_identity(storage, dirty, allow_code_change=False, studies=["cell"])


@pytest.mark.parametrize(
    ("archs", "schedules", "budgets", "fragment"),
    [
        ("()", '("cosine",)', "(16_384,)", "study: archs must be a non-empty tuple"),
        ('("k2", "k4")', '("cosine",)', "(16_384,)", "study: archs: unknown 'k4'"),
        ('("k2",)', '("cosine", "linear")', "(16_384,)", "study: schedules: unknown 'linear'"),
        ('("k2",)', '("cosine",)', '("1e5",)', "preset: budgets: '1e5' is not a finite int"),
    ],
    ids=["no-archs", "unknown-arch", "unknown-schedule", "string-budget"],
)
@pytest.mark.parametrize("action", ["plan", "run"])
def test_bad_declarations_are_one_line_in_plan_and_run(
    tmp_path, action, archs, schedules, budgets, fragment
):
    study = tmp_path / "tiny.py"
    study.write_text(TINY_STUDY.format(archs=archs, schedules=schedules, budgets=budgets))
    result = k3scale("study", action, str(study), "--preset", "smoke")
    one_line_error(result, fragment)
