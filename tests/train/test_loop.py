"""The trainer: learning, determinism, resume, WSD branches, divergence, tracking."""

from __future__ import annotations

import dataclasses
import math

import pytest

from k3scale.track import schema
from k3scale.train import train
from k3scale.train.branching import branch_config, fork_step, run_branches, trunk_config
from tests.train.conftest import tiny_run, with_schedule


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_loss_falls_on_the_sample(family, sample_root, tmp_path):
    result = train(tiny_run(family, sample_root, tmp_path, budget_tokens=64 * 8 * 24))
    assert result.status == "finished"
    first = sum(result.losses[:3]) / 3
    last = sum(result.losses[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert math.isfinite(result.final_val_id_loss) and math.isfinite(result.final_val_ood_loss)
    assert result.tokens == 64 * 8 * 24


def test_same_seed_same_losses_to_the_bit(sample_root, tmp_path):
    a = train(tiny_run("k3", sample_root, tmp_path / "a"))
    b = train(tiny_run("k3", sample_root, tmp_path / "b"))
    assert a.losses == b.losses
    assert a.final_val_ood_loss == b.final_val_ood_loss
    c = train(tiny_run("k3", sample_root, tmp_path / "c", seed=1))
    assert c.losses != a.losses


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_resume_equals_uninterrupted(family, sample_root, tmp_path):
    straight = train(tiny_run(family, sample_root, tmp_path / "straight"))
    cfg = tiny_run(family, sample_root, tmp_path / "resumed")
    stopped = train(cfg, stop_after_steps=5)
    assert stopped.status == "stopped" and stopped.steps == 5
    resumed = train(cfg)
    assert resumed.losses == straight.losses
    assert resumed.final_val_ood_loss == straight.final_val_ood_loss
    again = train(cfg)
    assert again.steps == resumed.steps and again.final_val_ood_loss == resumed.final_val_ood_loss


def test_wsd_branch_equals_a_straight_wsd_run(sample_root, tmp_path):
    base = with_schedule(
        tiny_run("k3", sample_root, tmp_path / "trunk"), kind="wsd", decay_fraction=0.25
    )
    small, large = 64 * 8 * 8, 64 * 8 * 16
    straight_cfg = dataclasses.replace(
        base,
        train=dataclasses.replace(
            base.train, budget_tokens=small, out_dir=str(tmp_path / "straight")
        ),
    )
    straight = train(straight_cfg)
    trunk = trunk_config(base, [small, large])
    # Decay starts at 6 of 8 steps; its first step (p = 0) still runs at the peak LR.
    assert fork_step(trunk, straight_cfg) == 7
    trunk_cfg = dataclasses.replace(
        base, train=dataclasses.replace(base.train, budget_tokens=large)
    )
    results = run_branches(trunk_cfg, [branch_config(base, small, str(tmp_path / "branch"))])
    branch = results[small]
    assert branch.losses == straight.losses
    assert branch.final_val_ood_loss == straight.final_val_ood_loss
    assert results[large].steps == 16


def test_a_run_made_to_diverge_is_recorded_as_diverged(sample_root, tmp_path):
    cfg = tiny_run("k2", sample_root, tmp_path, budget_tokens=64 * 8 * 12)
    cfg = dataclasses.replace(cfg, optim=dataclasses.replace(cfg.optim, lr=1e3, grad_clip=0.0))
    result = train(cfg)
    assert result.status == schema.STATUS_DIVERGED
    assert result.steps < 12
    assert all(math.isfinite(x) for x in result.losses)


# The fast CPU path ("cpu" backend: KDA recurrence in C++, padded flash attention) and the torch
# reference compute the same functions in another summation order, so their fp32 losses part at
# the rounding level and training carries that over steps. Measured over 20 steps of these runs:
# largest difference 4.8e-7 (K2) and 2.4e-7 (K3); the bound leaves 20x for other CPUs' vector
# widths while staying far below a real change (a wrong gradient moves the loss by > 1e-2 in a
# few steps).
FAST_PATH_LOSS_TOLERANCE = 1e-5


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_fast_path_trains_like_the_reference_path(family, sample_root, tmp_path):
    runs = {}
    for backend in ("torch", "cpu"):
        cfg = tiny_run(family, sample_root, tmp_path / backend, budget_tokens=64 * 8 * 20)
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, backend=backend))
        runs[backend] = train(cfg)
    reference, fast = runs["torch"].losses, runs["cpu"].losses
    assert len(reference) == len(fast) == 20
    worst = max(abs(a - b) for a, b in zip(reference, fast, strict=True))
    print(f"{family}: largest loss difference over 20 steps {worst:.2e}")
    assert worst < FAST_PATH_LOSS_TOLERANCE
    assert runs["torch"].final_val_ood_loss == pytest.approx(
        runs["cpu"].final_val_ood_loss, abs=FAST_PATH_LOSS_TOLERANCE
    )
