"""LR schedules (methods.md 1.1-1.5): landmarks, exact floor, WSD shapes and branching."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from k3scale.config import ConfigError, ScheduleConfig
from k3scale.optim.schedules import (
    StepLRs,
    decay_lr,
    last_step_tokens,
    lr_at,
    schedule_summary,
    step_lrs,
    wsd_decay_start_tokens,
    wsd_fork_tokens,
)

PEAK, FLOOR = 3e-3, 3e-5
SHAPES = ["linear", "1-sqrt", "cosine", "square", "exponential"]
# 100 steps of 10 tokens: last step at 990 tokens seen. WSD decay fraction 0.19 of the whole run:
# decay start 1000 - 190 = 810 (step 81), midpoint of the decay at 900 (step 90).
BATCH, STEPS, TOTAL = 10, 100, 1000
COSINE = ScheduleConfig(kind="cosine", warmup_tokens=100, lr_min=FLOOR)
WSD = ScheduleConfig(kind="wsd", warmup_tokens=100, lr_min=FLOOR, decay_fraction=0.19)


def lr(tokens: int, cfg: ScheduleConfig, total: int = TOTAL, batch: int = BATCH) -> float:
    return lr_at(tokens, total, PEAK, cfg, batch_tokens=batch)


def shape_value(shape: str, p: float) -> float:
    """Hand-written methods.md 1.3 table."""
    if shape == "exponential":
        return PEAK * (FLOOR / PEAK) ** p
    g = {
        "linear": 1 - p,
        "1-sqrt": 1 - math.sqrt(p),
        "cosine": 0.5 * (1 + math.cos(math.pi * p)),
        "square": 1 - p * p,
    }[shape]
    return FLOOR + (PEAK - FLOOR) * g


def test_warmup_is_linear_from_zero():
    for cfg in (COSINE, WSD):
        assert lr(0, cfg) == 0.0
        assert lr(50, cfg) == pytest.approx(PEAK / 2, rel=1e-12)
        assert lr(100, cfg) == PEAK


def test_cosine_landmarks():
    assert lr(100, COSINE) == PEAK
    # p = (545 - 100) / (990 - 100) = 0.5
    assert lr(545, COSINE) == pytest.approx((PEAK + FLOOR) / 2, rel=1e-12)
    assert lr(990, COSINE) == FLOOR
    assert lr(980, COSINE) > FLOOR


def test_wsd_landmarks_and_decay_fraction_counts_the_whole_run():
    assert wsd_decay_start_tokens(TOTAL, WSD) == 810
    assert all(lr(t, WSD) == PEAK for t in range(100, 811, 10))
    assert lr(820, WSD) < PEAK
    assert lr(990, WSD) == FLOOR


@pytest.mark.parametrize("shape", SHAPES)
def test_wsd_shapes(shape):
    cfg = dataclasses.replace(WSD, decay_shape=shape)
    assert decay_lr(0.0, PEAK, FLOOR, shape) == PEAK
    assert decay_lr(0.5, PEAK, FLOOR, shape) == pytest.approx(shape_value(shape, 0.5), rel=1e-12)
    assert decay_lr(1.0, PEAK, FLOOR, shape) == FLOOR
    assert lr(810, cfg) == PEAK  # p = 0
    assert lr(900, cfg) == pytest.approx(shape_value(shape, 0.5), rel=1e-12)  # p = 0.5
    assert lr(990, cfg) == FLOOR  # p = 1


def test_exponential_needs_a_positive_floor():
    with pytest.raises(ConfigError, match="lr_min"):
        ScheduleConfig(kind="wsd", lr_min=0.0, decay_shape="exponential")
    with pytest.raises(ValueError, match="lr_min"):
        decay_lr(0.5, PEAK, 0.0, "exponential")


@pytest.mark.parametrize(
    "cfg",
    [COSINE, dataclasses.replace(COSINE, lr_min=0.0, warmup_tokens=0)]
    + [dataclasses.replace(WSD, decay_shape=s) for s in SHAPES]
    + [dataclasses.replace(WSD, decay_shape="linear", lr_min=0.0)],
)
@pytest.mark.parametrize(("steps", "batch", "remainder"), [(6, 1000, 0), (37, 64, 0), (100, 10, 7)])
def test_last_step_is_exactly_lr_min_and_decay_is_monotone(cfg, steps, batch, remainder):
    cfg = dataclasses.replace(cfg, warmup_tokens=min(cfg.warmup_tokens, batch // 2))
    total = steps * batch + remainder  # a remainder under one batch is not trained
    lrs = [lr(s * batch, cfg, total, batch) for s in range(steps)]
    assert lrs[-1] == cfg.lr_min
    after_warmup = [x for s, x in enumerate(lrs) if s * batch >= cfg.warmup_tokens]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))
    assert lr(total, cfg, total, batch) == cfg.lr_min  # past the end stays on the floor


def test_step_lrs_matches_lr_at():
    lrs = step_lrs(STEPS, BATCH, PEAK, WSD)
    assert len(lrs) == STEPS
    assert lrs == [lr(s * BATCH, WSD) for s in range(STEPS)]
    assert lrs[-1] == FLOOR
    assert last_step_tokens(TOTAL, BATCH) == 990


def test_step_lrs_of_a_huge_run_cost_nothing_until_asked():
    """1e18 steps: a list would never finish; StepLRs answers at once."""
    steps = 10**18
    lrs = StepLRs(steps, BATCH, PEAK, WSD)
    assert len(lrs) == steps
    assert lrs[-1] == lrs.last_lr == FLOOR
    middle = steps // 2
    assert lrs[middle] == lr_at(middle * BATCH, steps * BATCH, PEAK, WSD, batch_tokens=BATCH)
    with pytest.raises(IndexError):
        lrs[steps]
    with pytest.raises(ValueError, match="at least 2"):
        StepLRs(1, BATCH, PEAK, WSD)


def test_constant_schedule():
    cfg = ScheduleConfig(kind="constant", warmup_tokens=100)
    assert lr(50, cfg) == pytest.approx(PEAK / 2)
    assert all(lr(t, cfg) == PEAK for t in range(100, 1000, 10))


def test_invalid_schedules_raise_with_the_field_named():
    with pytest.raises(ValueError, match="decay_fraction"):
        wsd_decay_start_tokens(
            TOTAL, dataclasses.replace(WSD, warmup_tokens=300, decay_fraction=0.8)
        )
    with pytest.raises(ValueError, match="warmup_tokens"):
        lr(0, dataclasses.replace(COSINE, warmup_tokens=990))
    with pytest.raises(ValueError, match="budget_tokens"):
        lr(0, COSINE, total=19, batch=10)  # a single step
    no_warmup = dataclasses.replace(COSINE, warmup_tokens=0)
    assert lr(10, no_warmup, total=20, batch=10) == FLOOR  # two steps: peak, then the floor
    with pytest.raises(ValueError, match="decay_fraction"):
        lr(0, dataclasses.replace(WSD, decay_fraction=0.005))  # decay shorter than one step
    with pytest.raises(ValueError, match="lr_min"):
        lr_at(0, TOTAL, FLOOR / 2, COSINE, batch_tokens=BATCH)


def test_wsd_branch_matches_trunk_before_its_fork():
    """methods.md 1.5: a budget's run equals the longest budget's trunk up to its fork point."""
    batch, trunk_total = 64, 64 * 500
    cfg = dataclasses.replace(WSD, warmup_tokens=640, decay_fraction=0.2)
    for branch_total in (64 * 120, 64 * 250 + 30, 64 * 401):
        fork = wsd_fork_tokens(branch_total, batch, cfg)
        assert fork % batch == 0
        assert fork <= wsd_decay_start_tokens(branch_total, cfg) < fork + batch
        for tokens in range(0, fork + batch, batch):  # every step the trunk runs for the branch
            assert lr(tokens, cfg, trunk_total, batch) == lr(tokens, cfg, branch_total, batch)
        assert lr(fork + batch, cfg, branch_total, batch) < PEAK


def test_summary_names_the_landmarks():
    text = schedule_summary(TOTAL, BATCH, PEAK, WSD)
    assert "decay start: 810 tokens" in text
    assert "last step at 990 tokens seen" in text
    last = next(line for line in text.splitlines() if line.endswith("last step"))
    assert float(last.split()[2]) == FLOOR
