"""A tiny prepared dataset (from the committed sample) and tiny run configs for trainer tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from k3scale.config import DataConfig, OptimConfig, RunConfig, ScheduleConfig, TrainConfig
from k3scale.data.sample import prepare_sample
from k3scale.models.presets import k2_config, k3_config

VOCAB = 512


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=VOCAB)
    return root


def tiny_run(family: str, root: Path, out_dir: Path, **train) -> RunConfig:
    """A few-second run on the sample: d_model 16, 2 layers, MoE on, 64-token windows."""
    model = (k3_config if family == "k3" else k2_config)(16, 2, vocab_size=VOCAB)
    train_cfg = dict(
        budget_tokens=64 * 8 * 12,
        batch_size=8,
        micro_batch_size=4,
        seed=0,
        eval_interval_tokens=64 * 8 * 4,
        out_dir=str(out_dir),
        num_threads=1,
    )
    train_cfg.update(train)
    return RunConfig(
        model=model,
        data=DataConfig(dataset="sample", root=str(root), seq_len=64, eval_tokens=1024),
        optim=OptimConfig(lr=1e-2, per_head_muon=family == "k3"),
        schedule=ScheduleConfig(kind="cosine", warmup_tokens=64 * 8, lr_min=1e-5),
        train=TrainConfig(**train_cfg),
    )


def with_schedule(cfg: RunConfig, **changes) -> RunConfig:
    return dataclasses.replace(cfg, schedule=dataclasses.replace(cfg.schedule, **changes))
