"""config.json of a study's run holds its paths relative to the study folder, like its params,
so nothing a run logs carries one machine's absolute paths (issue 23)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from k3scale.config import load_run_config, to_dict
from k3scale.data.sample import prepare_sample
from k3scale.track.replica import read_replica
from k3scale.train import train
from tests.train.conftest import tiny_run


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return root


def logged_config(out_dir: Path) -> dict:
    return json.loads(read_replica(out_dir).artifacts["config.json"].read_text())


def test_a_study_run_logs_a_config_with_relative_paths(sample_root, tmp_path):
    study_dir = tmp_path / "study"
    out_dir = study_dir / "runs" / "cell" / "t000"
    cfg = tiny_run("k2", sample_root, out_dir)
    cfg = dataclasses.replace(
        cfg, track=dataclasses.replace(cfg.track, paths_relative_to=str(study_dir))
    )
    train(cfg, stop_after_steps=1)
    logged = logged_config(out_dir)
    assert logged["train"]["out_dir"] == "runs/cell/t000"
    assert logged["data"]["root"] == os.path.relpath(sample_root, study_dir)
    assert "paths_relative_to" not in logged["track"]
    assert str(tmp_path) not in json.dumps(logged)
    # Still a config: read from the study folder it is the run that was trained.
    rebuilt = load_run_config(logged)
    assert rebuilt.model == cfg.model and rebuilt.optim == cfg.optim


def test_a_run_outside_a_study_logs_its_config_as_given(sample_root, tmp_path):
    cfg = tiny_run("k3", sample_root, tmp_path / "run")
    train(cfg, stop_after_steps=1)
    expected = to_dict(cfg)
    del expected["track"]["tracking_uri"]  # where the run logs, not what it is
    assert logged_config(tmp_path / "run") == expected
