"""`study status` and `study report` find the folder the main job made, and refuse a preset the
folder did not run (issue 37: they answered "no study" for main.sh's folders, and listed every
cell "(not started)" for another preset with exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from k3scale.commands.study import COMMIT_CHARS, study_folder
from k3scale.errors import K3ScaleError
from k3scale.track.provenance import git_state

ROOT = Path(__file__).resolve().parents[2]


def _folder(root: Path, name: str, preset: str) -> Path:
    folder = root / "studies" / name
    folder.mkdir(parents=True)
    (folder / "study.json").write_text(json.dumps({"study": "k2_vs_k3", "preset": preset}))
    return folder


def test_the_main_jobs_folder_at_this_commit_is_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sha = git_state()[0][:COMMIT_CHARS]
    made = _folder(tmp_path, f"k2_vs_k3-demo-{sha}", "demo")
    assert study_folder("k2_vs_k3", "demo", None).resolve() == made
    plain = _folder(tmp_path, "k2_vs_k3-demo", "demo")
    assert study_folder("k2_vs_k3", "demo", None).resolve() == plain  # `study run`'s own first


def test_a_folder_of_another_preset_is_refused(tmp_path):
    folder = _folder(tmp_path, "k2_vs_k3-demo-x", "demo")
    with pytest.raises(K3ScaleError, match="holds the 'demo' preset of k2_vs_k3, not 'cpu_v2'"):
        study_folder("k2_vs_k3", "cpu_v2", str(folder))
    done = subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "study", "status", "experiments/k2_vs_k3.py",
         "--preset", "cpu_v2", "--study-dir", str(folder)],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "pass --preset demo" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", *args],
        capture_output=True, text=True, cwd=cwd, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_preset_never_run_names_the_preset_and_the_folders_that_exist(tmp_path):
    _folder(tmp_path, "k2_vs_k3-demo-abc", "demo")
    study = str(ROOT / "experiments" / "k2_vs_k3.py")
    for command in ("report", "status"):
        done = _cli("study", command, study, "--preset", "cpu_v3", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "preset 'cpu_v3'" in line and "studies/k2_vs_k3-demo-abc (demo)" in line
    misspelt = _cli("study", "report", study, "--preset", "dmeo", cwd=tmp_path)
    assert misspelt.returncode == 2 and "has no preset 'dmeo'" in misspelt.stderr
    assert not (tmp_path / "studies" / "k2_vs_k3-cpu_v3").exists()


def test_a_report_without_a_fit_names_the_step_that_is_missing(tmp_path):
    folder = _folder(tmp_path, "k2_vs_k3-demo", "demo")
    study = str(ROOT / "experiments" / "k2_vs_k3.py")
    done = _cli("study", "report", study, "--preset", "demo", cwd=tmp_path)
    assert done.returncode == 2 and "has no tables yet" in done.stderr
    assert "k3scale study run" in done.stderr
    (folder / "tables").mkdir()
    (folder / "tables" / "runs.parquet").write_bytes(b"")
    done = _cli("study", "report", study, "--preset", "demo", cwd=tmp_path)
    assert done.returncode == 2
    assert f"k3scale fit k2_vs_k3 --from {Path('studies/k2_vs_k3-demo/tables')}" in done.stderr


def test_ui_refuses_a_study_folder_that_does_not_exist_and_creates_nothing(tmp_path):
    done = _cli("ui", "--study-dir", "studies/k2_vs_k3-dmeo", "--port", "0", cwd=tmp_path)
    assert done.returncode == 2 and "no study folder studies/k2_vs_k3-dmeo" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_report_and_status_read_a_folder_without_importing_torch(tmp_path):
    """Reading a record needs no numerics: `status` and `report` took about 8 s (issue 51),
    4 of them importing torch and the training code; the test holds the imports, not a time."""
    probe = (
        "import sys, contextlib, io\n"
        "from k3scale.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['study', 'report', 'experiments/k2_vs_k3.py', '--preset', 'cpu_v3',\n"
        "          '--study-dir', 'analysis/results/k2_vs_k3-cpu_v3', '--brief'])\n"
        "print(sorted(m for m in ('torch', 'k3scale.sweep.run', 'k3scale.bench.calibrate')\n"
        "             if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
