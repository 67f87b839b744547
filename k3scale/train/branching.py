"""WSD branching (methods.md section 1.5): one stable trunk, many decay branches.

A WSD run's LR up to its decay start does not depend on its budget, so the largest budget's run
(the trunk) saves a checkpoint at the decay start of every smaller budget, and each smaller budget
resumes from that checkpoint and runs only its decay. The fork step is where the two LR sequences
first differ, found by comparing them step by step, so a branch replays a straight run of its
budget exactly (same weights, optimizer state, data position and RNG at the fork).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from k3scale.config import RunConfig
from k3scale.errors import K3ScaleError
from k3scale.track import schema
from k3scale.track.replica import read_replica
from k3scale.train.checkpoint import fork_name
from k3scale.train.loop import RunResult, plan_run, train


def fork_step(trunk: RunConfig, branch: RunConfig) -> int:
    """First step at which the branch's LR differs from the trunk's (its decay start)."""
    trunk_lrs = plan_run(trunk).lrs
    branch_lrs = plan_run(branch).lrs
    for step, (a, b) in enumerate(zip(trunk_lrs, branch_lrs)):
        if a != b:
            return step
    return len(branch_lrs)


def trunk_config(cfg: RunConfig, budgets: list[int]) -> RunConfig:
    """The largest budget's run, saving a fork checkpoint for each smaller budget."""
    if cfg.schedule.kind != "wsd":
        raise K3ScaleError(f"WSD branching needs schedule.kind=wsd, not {cfg.schedule.kind}")
    largest = max(budgets)
    trunk = _with_budget(cfg, largest, cfg.train.out_dir)
    batch_tokens = cfg.train.batch_size * cfg.data.seq_len
    forks = sorted(
        fork_step(trunk, _with_budget(cfg, budget, cfg.train.out_dir)) * batch_tokens
        for budget in set(budgets)
        if budget != largest
    )
    return _replace_train(trunk, fork_tokens=tuple(forks))


def branch_config(cfg: RunConfig, budget: int, out_dir: str) -> RunConfig:
    """A branch equals a straight WSD run of `budget`: same config, its own folder."""
    return _with_budget(cfg, budget, out_dir)


def run_branches(
    cfg: RunConfig, branches: list[RunConfig], extra_tags: dict[str, str] | None = None
) -> dict[int, RunResult]:
    """Train the trunk and every branch from the trunk's checkpoint at its fork.

    Each branch is a run of its own: a straight WSD run of a smaller budget (its own folder,
    name, tags, evaluation and checkpoint intervals), logged as a child run of the trunk.

    Args:
        cfg: the trunk's run; trained to the largest budget of it and the branches.
        branches: the straight runs to fork, e.g. `branch_config(cfg, budget, out_dir)`.
        extra_tags: tags added to the trunk and every branch (a sweep task's attempt).

    Returns:
        Results by budget, the trunk's included.
    """
    for branch in branches:
        _check_branch(cfg, branch)
    trunk = trunk_config(cfg, [cfg.train.budget_tokens, *(b.train.budget_tokens for b in branches)])
    trunk_run = train(trunk, extra_tags=extra_tags)
    results = {trunk.train.budget_tokens: trunk_run}
    for branch in sorted(branches, key=lambda b: b.train.budget_tokens):
        step = fork_step(trunk, branch)
        tokens = step * cfg.train.batch_size * cfg.data.seq_len
        results[branch.train.budget_tokens] = train(
            branch,
            start_from=Path(trunk.train.out_dir) / fork_name(tokens),
            history=trunk_history(trunk, step),
            extra_tags={
                **(extra_tags or {}),
                schema.TAG_TRUNK_RUN_ID: trunk_run.run_id,
                schema.TAG_FORK_STEP: str(step),
                schema.MLFLOW_PARENT_RUN_ID: trunk_run.run_id,
            },
        )
    return results


def trunk_history(trunk: RunConfig, step: int) -> list[tuple[int, str, float]]:
    """The trunk's logged curve points up to the fork `step` (its replica's), summaries left
    out: a branch logs them first, so its charts in MLflow start at step 1, not at the fork."""
    return [
        (at, key, value)
        for at, key, value in read_replica(Path(trunk.train.out_dir)).metrics
        if 1 <= at <= step and not key.startswith(schema.FINAL_PREFIX)
    ]


def _check_branch(trunk: RunConfig, branch: RunConfig) -> None:
    """A branch may differ from its trunk only where a straight run of its budget does."""
    own = ("budget_tokens", "out_dir", "eval_interval_tokens", "checkpoint_interval_tokens")
    train_cfg = dataclasses.replace(
        branch.train,
        fork_tokens=trunk.train.fork_tokens,
        **{k: getattr(trunk.train, k) for k in own},
    )
    shared = ("model", "data", "optim", "schedule")
    if train_cfg != trunk.train or any(getattr(branch, f) != getattr(trunk, f) for f in shared):
        raise K3ScaleError(
            f"WSD branch {branch.train.out_dir} differs from its trunk beyond budget, folder, "
            "evaluation, checkpoints and tracking: it would not replay a straight run"
        )
    if branch.train.budget_tokens >= trunk.train.budget_tokens:
        raise K3ScaleError(
            f"WSD branch budget {branch.train.budget_tokens} must be below its trunk's "
            f"({trunk.train.budget_tokens})"
        )


def _with_budget(cfg: RunConfig, budget: int, out_dir: str) -> RunConfig:
    return _replace_train(cfg, budget_tokens=budget, out_dir=out_dir, fork_tokens=())


def _replace_train(cfg: RunConfig, **changes) -> RunConfig:
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **changes))
