"""`study status` and `study report` find the folder the main job made, and refuse a preset the
folder did not run (issue 37: they answered "no study" for main.sh's folders, and listed every
cell "(not started)" for another preset with exit 0)."""

from __future__ import annotations

import json
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
