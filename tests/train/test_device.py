"""`train.device` (issue 24): cpu by default; auto resolved once per run and logged as what it
resolved to; cuda where there is none refused in one line, by `train` and by the CLI's dry run;
the CPU path unchanged to the bit; and the GPU check's training run, here on CPU."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from k3scale.config import ConfigError, TrainConfig, apply_overrides, config_hash, identity_dict
from k3scale.errors import K3ScaleError
from k3scale.sweep.declaration import load_study
from k3scale.track.replica import read_replica
from k3scale.train import train
from k3scale.train.device import resolve_device, run_device
from tests.train.conftest import tiny_run

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
HERE = "cuda" if HAS_CUDA else "cpu"
without_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks a machine without CUDA")


def with_device(cfg, device: str):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, device=device))


def k3scale_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "train", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_cpu_is_the_default_and_auto_resolves_to_what_torch_sees():
    assert TrainConfig().device == "cpu"
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device(HERE)


def test_an_unknown_device_names_the_key(sample_root, tmp_path):
    with pytest.raises(ConfigError, match=r"train\.device: must be one of"):
        TrainConfig(device="gpu")
    with pytest.raises(ConfigError, match=r"train\.device: 'gpu' is not one of"):
        apply_overrides(tiny_run("k3", sample_root, tmp_path), ["train.device=gpu"])


def test_the_device_is_not_part_of_a_runs_identity(sample_root, tmp_path):
    cfg = tiny_run("k3", sample_root, tmp_path)
    assert "device" not in identity_dict(cfg)["train"]
    hashes = {config_hash(with_device(cfg, device)) for device in ("cpu", "cuda", "auto")}
    assert hashes == {config_hash(cfg)}


@without_cuda
def test_cuda_here_is_one_clear_error_before_anything_is_built(sample_root, tmp_path):
    cfg = with_device(tiny_run("k3", sample_root, tmp_path / "run"), "cuda")
    with pytest.raises(
        ConfigError, match=r"^train\.device=cuda: .+; set train\.device=cpu or auto$"
    ):
        train(cfg)
    assert not (tmp_path / "run").exists()


@without_cuda
def test_the_dry_run_refuses_cuda_here_in_one_line_and_shows_the_resolved_device(sample_root):
    data = ("--set", f"data.root={sample_root}", "--set", "data.dataset=sample")
    refused = k3scale_train("--preset", "k3-t0", *data, "--set", "train.device=cuda", "--dry-run")
    assert refused.returncode == 2
    assert refused.stdout == ""
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("k3scale train: error: train.device=cuda: ")
    auto = k3scale_train("--preset", "k3-t0", *data, "--set", "train.device=auto", "--dry-run")
    assert auto.returncode == 0, auto.stderr
    assert "device      cpu (train.device=auto), fp32, model.backend=cpu" in auto.stdout


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter runs on CPU")
def test_the_triton_backend_on_cpu_is_refused(sample_root, tmp_path):
    cfg = tiny_run("k3", sample_root, tmp_path)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, backend="triton"))
    with pytest.raises(K3ScaleError, match=r"model\.backend=triton"):
        run_device(cfg)


def test_the_resolved_device_is_logged_as_the_device_param(sample_root, tmp_path):
    cfg = tiny_run("k3", sample_root, tmp_path, budget_tokens=64 * 8 * 3, eval_interval_tokens=0)
    train(with_device(cfg, "auto"))
    assert read_replica(tmp_path).params["train.device"] == HERE


def test_an_explicit_cpu_trains_to_the_same_bits_as_the_default(sample_root, tmp_path):
    default = train(tiny_run("k3", sample_root, tmp_path / "default", precision="bf16"))
    devices = ("cpu",) if HAS_CUDA else ("cpu", "auto")
    for device in devices:
        cfg = tiny_run("k3", sample_root, tmp_path / device, precision="bf16")
        run = train(with_device(cfg, device))
        assert run.losses == default.losses, device
        assert run.final_val_ood_loss == default.final_val_ood_loss, device


def test_a_resume_on_the_cpu_device_replays_the_default_run(sample_root, tmp_path):
    straight = train(tiny_run("k2", sample_root, tmp_path / "straight"))
    cfg = with_device(tiny_run("k2", sample_root, tmp_path / "resumed"), "cpu")
    assert train(cfg, stop_after_steps=5).status == "stopped"
    resumed = train(cfg)
    assert resumed.losses == straight.losses
    assert resumed.final_val_ood_loss == straight.final_val_ood_loss


def test_gpu_presets_train_where_their_trial_is_placed():
    for file in ("k2_vs_k3.py", "cosine_vs_wsd.py"):
        study = load_study(ROOT / "experiments" / file)
        for name in ("gpu", "cluster"):
            assert study.preset(name).device == "auto", (file, name)
        assert study.preset("cpu").device == "cpu"


def test_the_gpu_checks_training_run_works_on_cpu_with_the_torch_backend(tmp_path):
    size = gpu_check.TrainingSize(
        preset="k3-t0", steps=3, seq_len=64, batch_size=4, eval_tokens=256
    )
    data = gpu_check.training_data(str(tmp_path / "no_data"), "english_mix", 8192, tmp_path)
    assert data.dataset == "sample" and "english_mix is not prepared" in data.note
    run = gpu_check.run_training_check("cpu", "torch", size, data, tmp_path / "run")
    assert run.status == "finished" and run.finite and len(run.losses) == 3
    assert run.step_ms > 0 and run.tokens_per_s > 0 and run.peak_gib is None
    rows = gpu_check.training_rows(run, dataclasses.replace(run, backend="triton"), size)
    assert [(r.op, r.path, r.ok) for r in rows] == [
        ("train k3-t0 3 steps", "torch", True),
        ("train k3-t0 3 steps", "triton", True),
    ]
    assert rows[0].error is None and rows[1].error == 0.0 and rows[1].vs_torch == 1.0
    drift = 1 + 2 * gpu_check.TOL_TRAIN_LOSS
    off = dataclasses.replace(run, backend="triton", val_loss=run.val_loss * drift)
    assert not gpu_check.training_rows(run, off, size)[1].ok


def test_the_gpu_checks_preset_trial_is_the_drivers_first_trial(tmp_path):
    study_file = ROOT / "experiments" / "k2_vs_k3.py"
    cfg, cell = gpu_check.first_trial_config(str(study_file), str(tmp_path), tmp_path)
    preset = load_study(study_file).preset("gpu")
    assert cell.budget_tokens == min(preset.budgets)
    assert (cfg.train.device, cfg.train.precision) == ("auto", "bf16")
    assert cfg.train.budget_tokens == cell.budget_tokens
    assert cfg.train.batch_size in preset.search.batch_sizes
    assert preset.search.lr_low <= cfg.optim.lr <= preset.search.lr_high
