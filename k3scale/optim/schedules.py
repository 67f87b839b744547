"""Learning-rate schedules as pure functions of tokens seen (methods.md section 1).

Conventions (every schedule):

* Step s of a run with `batch_tokens` tokens per step is evaluated at `tokens_seen = s *
  batch_tokens`, the tokens consumed *before* that step. A run of `total_tokens` takes
  `num_steps = total_tokens // batch_tokens` steps (a remainder smaller than one batch is not
  trained), so its last step is at `end = (num_steps - 1) * batch_tokens`.
* Warmup: linear from 0 at `tokens_seen = 0` to `peak_lr` at `tokens_seen = warmup_tokens`
  (the first step therefore has lr 0). `warmup_tokens = 0` disables it.
* Cosine: from `peak_lr` at the warmup end to the absolute `lr_min` at `end`,
  `p = (tokens_seen - W) / (end - W)`.
* WSD: the decay fraction counts against the whole run, warmup included (Hägele et al. 2024):
  decay start `S = total_tokens - round(decay_fraction * total_tokens)`, with `S >= W` enforced.
  `lr = peak_lr` for `W <= tokens_seen <= S`, then `lr_min + (peak_lr - lr_min) * g(p)` with
  `p = (tokens_seen - S) / (end - S)`; exponential is the geometric interpolation
  `peak_lr * (lr_min / peak_lr) ** p` and needs `lr_min > 0`.
* Cosine and WSD return exactly `lr_min` at `end` and beyond. Constant stays at `peak_lr`.

WSD branching (methods.md 1.5): steps before `S` do not depend on the budget, so a budget's decay
can fork from a trunk checkpoint saved at any step boundary in `[W, S]`; `wsd_fork_tokens` gives
the latest one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from k3scale.config import ScheduleConfig


def num_steps(total_tokens: int, batch_tokens: int) -> int:
    """Optimizer steps of a run: `total_tokens // batch_tokens`."""
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be >= 1, got {batch_tokens}")
    return total_tokens // batch_tokens


def last_step_tokens(total_tokens: int, batch_tokens: int) -> int:
    """Tokens seen before the last step, `(num_steps - 1) * batch_tokens` (needs >= 2 steps)."""
    steps = num_steps(total_tokens, batch_tokens)
    if steps < 2:
        raise ValueError(
            f"train.budget_tokens: {total_tokens} tokens at {batch_tokens} tokens per step give "
            f"{steps} step(s); a schedule needs at least 2"
        )
    return (steps - 1) * batch_tokens


def wsd_decay_start_tokens(total_tokens: int, cfg: ScheduleConfig) -> int:
    """WSD decay start `S = total_tokens - round(decay_fraction * total_tokens)` in tokens.

    Steps with `tokens_seen <= S` run at the peak (after warmup); this is the latest point at
    which a budget of `total_tokens` may fork from a stable trunk.

    Raises:
        ValueError: the decay would start inside the warmup (`S < warmup_tokens`).
    """
    start = total_tokens - round(cfg.decay_fraction * total_tokens)
    if start < cfg.warmup_tokens:
        raise ValueError(
            f"schedule.decay_fraction: the WSD decay would start at {start} tokens, before the "
            f"warmup ends at {cfg.warmup_tokens}; lower decay_fraction or warmup_tokens"
        )
    return start


def wsd_fork_tokens(total_tokens: int, batch_tokens: int, cfg: ScheduleConfig) -> int:
    """Latest step boundary (a multiple of `batch_tokens`) at or before the WSD decay start."""
    return wsd_decay_start_tokens(total_tokens, cfg) // batch_tokens * batch_tokens


def decay_lr(progress: float, peak_lr: float, lr_min: float, shape: str) -> float:
    """WSD decay value at `progress` p in [0, 1]: `peak_lr` at p = 0, exactly `lr_min` at p = 1.

    Shapes g(p) (methods.md 1.3): linear `1 - p`, 1-sqrt `1 - sqrt(p)`, cosine
    `(1 + cos(pi p)) / 2`, square `1 - p^2`; exponential is geometric `peak (lr_min/peak)^p`.
    """
    if progress <= 0:
        return peak_lr
    if progress >= 1:
        return lr_min
    if shape == "exponential":
        if lr_min <= 0:
            raise ValueError("schedule.lr_min: must be > 0 for the exponential decay shape")
        return peak_lr * (lr_min / peak_lr) ** progress
    match shape:
        case "linear":
            g = 1 - progress
        case "1-sqrt":
            g = 1 - math.sqrt(progress)
        case "cosine":
            g = 0.5 * (1 + math.cos(math.pi * progress))
        case "square":
            g = 1 - progress**2
        case _:
            raise ValueError(f"schedule.decay_shape: unknown shape {shape!r}")
    return lr_min + (peak_lr - lr_min) * g


def lr_at(
    tokens_seen: int,
    total_tokens: int,
    peak_lr: float,
    cfg: ScheduleConfig,
    *,
    batch_tokens: int,
) -> float:
    """Learning rate of the step taken after `tokens_seen` tokens (conventions in the module doc).

    Args:
        tokens_seen: Tokens consumed before this step (`step * batch_tokens`), >= 0.
        total_tokens: The run's token budget D.
        peak_lr: Peak learning rate (after warmup).
        cfg: Schedule kind, warmup tokens, absolute floor `lr_min`, WSD decay fraction and shape.
        batch_tokens: Tokens per optimizer step; fixes the last step, where lr hits `lr_min`.

    Returns:
        The learning rate (float).

    Raises:
        ValueError: fewer than 2 steps, warmup not ending before the last step (cosine),
            WSD decay starting inside warmup or lasting under one step, or `peak_lr < lr_min`.
    """
    if tokens_seen < 0:
        raise ValueError(f"tokens_seen must be >= 0, got {tokens_seen}")
    if peak_lr <= 0:
        raise ValueError(f"optim.lr: the peak learning rate must be > 0, got {peak_lr}")
    end = last_step_tokens(total_tokens, batch_tokens)
    warmup = cfg.warmup_tokens
    start = _check_decay(total_tokens, peak_lr, cfg, end) if cfg.kind != "constant" else 0
    if tokens_seen < warmup:
        return peak_lr * tokens_seen / warmup
    if cfg.kind == "constant":
        return peak_lr
    if cfg.kind == "cosine":
        progress = (tokens_seen - warmup) / (end - warmup)
        return decay_lr(progress, peak_lr, cfg.lr_min, "cosine")
    return decay_lr((tokens_seen - start) / (end - start), peak_lr, cfg.lr_min, cfg.decay_shape)


def _check_decay(total_tokens: int, peak_lr: float, cfg: ScheduleConfig, end: int) -> int:
    """Validate a decaying schedule; returns where the decay starts (tokens seen)."""
    if peak_lr < cfg.lr_min:
        raise ValueError(f"optim.lr: peak {peak_lr} is below schedule.lr_min {cfg.lr_min}")
    if cfg.warmup_tokens >= end:
        raise ValueError(
            f"schedule.warmup_tokens: warmup ({cfg.warmup_tokens} tokens) must end before the "
            f"last step ({end} tokens seen), where the schedule reaches lr_min"
        )
    if cfg.kind == "cosine":
        return cfg.warmup_tokens
    start = wsd_decay_start_tokens(total_tokens, cfg)
    if start >= end:
        raise ValueError(
            f"schedule.decay_fraction: the WSD decay from {start} tokens would start at or after "
            f"the last step ({end} tokens seen); raise decay_fraction or the budget"
        )
    return start


class StepLRs(Sequence[float]):
    """The learning rate of every step of a run, computed when a step asks for it.

    Indexable and sized like `step_lrs(...)`, without its memory: a list of 1e11 steps takes
    minutes and gigabytes, which a dry run of a large budget must not pay (issue 23). The
    schedule is validated on construction, so a bad one fails before anything is allocated.
    """

    def __init__(
        self, total_steps: int, batch_tokens: int, peak_lr: float, cfg: ScheduleConfig
    ) -> None:
        self.total_steps = total_steps
        self.batch_tokens = batch_tokens
        self.peak_lr = peak_lr
        self.cfg = cfg
        self.last_lr = self[total_steps - 1]

    def __len__(self) -> int:
        return self.total_steps

    def __getitem__(self, step):  # type: ignore[override]
        if isinstance(step, slice):
            return [self[s] for s in range(*step.indices(self.total_steps))]
        if step < 0:
            step += self.total_steps
        if not 0 <= step < self.total_steps:
            raise IndexError(f"step {step} is outside a {self.total_steps}-step run")
        total_tokens = self.total_steps * self.batch_tokens
        return lr_at(
            step * self.batch_tokens,
            total_tokens,
            self.peak_lr,
            self.cfg,
            batch_tokens=self.batch_tokens,
        )


def step_lrs(
    total_steps: int, batch_tokens: int, peak_lr: float, cfg: ScheduleConfig
) -> list[float]:
    """Learning rate of every step of a `total_steps`-step run (the last one is `lr_min`).

    Args:
        total_steps: Optimizer steps (>= 2).
        batch_tokens: Tokens per step.
        peak_lr: Peak learning rate.
        cfg: Schedule.

    Returns:
        `[lr_at(s * batch_tokens, total_steps * batch_tokens, ...) for s in range(total_steps)]`.
    """
    return list(StepLRs(total_steps, batch_tokens, peak_lr, cfg))


def schedule_summary(
    total_tokens: int, batch_tokens: int, peak_lr: float, cfg: ScheduleConfig
) -> str:
    """Text description for `k3scale train --dry-run`: phases and lr at landmark steps.

    Args:
        total_tokens: Token budget D.
        batch_tokens: Tokens per optimizer step.
        peak_lr: Peak learning rate.
        cfg: Schedule.

    Returns:
        Multi-line text: kind, steps, warmup end, decay start (WSD), and a table of
        (step, tokens seen, lr, note) at the first step, warmup end, quarters, the first
        decay step (WSD) and the last step.
    """
    steps = num_steps(total_tokens, batch_tokens)
    end = last_step_tokens(total_tokens, batch_tokens)
    kind = (
        f"wsd ({cfg.decay_shape}, decay_fraction {cfg.decay_fraction:g})"
        if cfg.kind == "wsd"
        else cfg.kind
    )
    lines = [
        f"schedule: {kind}, peak lr {peak_lr:g}, lr_min {cfg.lr_min:g}",
        f"steps: {steps} x {batch_tokens:,} tokens = {steps * batch_tokens:,} of {total_tokens:,} "
        f"budget tokens; last step at {end:,} tokens seen",
        f"warmup: linear from 0 to peak over {cfg.warmup_tokens:,} tokens",
    ]
    warmup_step = math.ceil(cfg.warmup_tokens / batch_tokens)
    landmarks = {0: "first step", steps // 4: "25%", steps // 2: "50%", 3 * steps // 4: "75%"}
    landmarks[warmup_step] = "first step after warmup"
    if cfg.kind == "wsd":
        start = wsd_decay_start_tokens(total_tokens, cfg)
        fork = wsd_fork_tokens(total_tokens, batch_tokens, cfg)
        lines.append(f"decay start: {start:,} tokens (latest fork checkpoint at {fork:,} tokens)")
        landmarks[fork // batch_tokens + 1] = "first decay step"
    landmarks[steps - 1] = "last step"
    lines.append(f"{'step':<9} {'tokens_seen':<15} {'lr':<12} note")
    for step in sorted(s for s in landmarks if 0 <= s < steps):
        lr = lr_at(step * batch_tokens, total_tokens, peak_lr, cfg, batch_tokens=batch_tokens)
        lines.append(f"{step:<9d} {step * batch_tokens:<15,d} {lr:<12.6g} {landmarks[step]}")
    return "\n".join(lines)
