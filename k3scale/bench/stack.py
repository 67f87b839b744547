"""`k3scale bench stack`: what stacking trials into one batched model can buy on a CPU.

Issue 34 asked for trials stacked M to a process, expecting batched matmuls to beat M separate
steps. For each rung of the v2 ladders (the fast path, the study shape, one thread, as a trial
runs) this times, interleaved in one process, M members' forward+backward:
- `separate`: each member's own step, one after another (M trials as they run today);
- `stacked`: the M members as one model under vmap (`train/stacked.py`);
- `folded`: one member at M times the batch: the same tokens and FLOPs with every matmul one
  GEMM over all rows and every kernel one call. A stacked step does the same arithmetic with
  per-member weights, so it can do no better: this is the ceiling of any stacking;
- the same two compiled (`torch.compile`, warm cache), for stacking and compiling together;
- one member's optimizer step (Muon and AdamW), the part of a trial's step outside
  forward+backward, whose share bounds what batching the optimizer across members could add.

Ratios are per member: a ratio of 2 would be twice the training tokens per CPU-second per trial.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from k3scale.bench.compile import MODELS, training_model
from k3scale.bench.timing import median_times
from k3scale.bench.train import NUM_THREADS, STUDY
from k3scale.config import OptimConfig
from k3scale.optim.muon import build_optimizer
from k3scale.track.provenance import git_state
from k3scale.train.stacked import StackedForward

MEMBERS = {"full": 4, "quick": 2}
ROUNDS = {"full": 5, "quick": 2}


def _step(model: torch.nn.Module, rows: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(rows[:, :-1], targets=rows[:, 1:], with_logits=False).loss.backward()

    return step


def measure(name: str, members: int, rounds: int) -> dict:
    """Separate, stacked, folded (eager and compiled) and the optimizer share at one rung."""
    # Members share one initialisation (`training_model` seeds it): the timing does not depend
    # on the weights.
    models = [training_model(name, "cpu") for _ in range(members)]
    tokens = torch.randint(
        0, models[0].cfg.vocab_size, (members, STUDY.batch_size, STUDY.seq_len + 1)
    )
    stacked = StackedForward(models)
    folded_rows = tokens.flatten(0, 1)
    # Static shapes: each batch gets its own graph, as a trial's single shape does.
    compiled = torch.compile(models[0], dynamic=False)
    optimizer = build_optimizer(models[0], OptimConfig())
    own_steps = [_step(model, rows) for model, rows in zip(models, tokens, strict=True)]

    def stacked_step() -> None:
        for model in models:
            model.zero_grad(set_to_none=True)
        stacked(tokens).loss.sum().backward()

    def separately(steps: list[Callable[[], None]]) -> Callable[[], None]:
        return lambda: [step() for step in steps]

    torch._dynamo.reset()
    seconds = median_times(
        {
            "separate": separately(own_steps),
            "stacked": stacked_step,
            "folded": _step(models[0], folded_rows),
            "compiled_separate": separately([_step(compiled, tokens[0])] * members),
            "compiled_folded": _step(compiled, folded_rows),
            "optimizer": optimizer.step,
        },
        rounds,
    )
    torch._dynamo.reset()
    separate = seconds["separate"]
    member_step = separate / members + seconds["optimizer"]
    return {
        "name": name,
        "members": members,
        **{f"{key}_ms": value * 1e3 for key, value in seconds.items()},
        "stacked_speedup": separate / seconds["stacked"],
        "folded_speedup": separate / seconds["folded"],
        "compiled_speedup": separate / seconds["compiled_separate"],
        "compiled_folded_speedup": separate / seconds["compiled_folded"],
        "optimizer_share": seconds["optimizer"] / member_step,
    }


def run(quick: bool) -> dict:
    """Every rung of `compile.MODELS` (quick: the first, 2 members).

    Returns:
        `{"runs": [{"name", "members", "<way>_ms" for separate, stacked, folded,
        compiled_separate, compiled_folded and optimizer, "stacked_speedup", "folded_speedup",
        "compiled_speedup", "compiled_folded_speedup", "optimizer_share"}], "rounds",
        "num_threads", "seq_len", "batch_size", "git_sha", "git_dirty"}`.
    """
    setting = "quick" if quick else "full"
    previous_threads = torch.get_num_threads()
    sha, dirty = git_state()
    try:
        torch.set_num_threads(NUM_THREADS)
        runs = [
            measure(name, MEMBERS[setting], ROUNDS[setting])
            for name in MODELS[: 1 if quick else None]
        ]
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "runs": runs,
        "rounds": ROUNDS[setting],
        "num_threads": NUM_THREADS,
        "seq_len": STUDY.seq_len,
        "batch_size": STUDY.batch_size,
        "git_sha": sha,
        "git_dirty": dirty,
    }


COLUMNS = (
    ("separate_ms", "separate ms"),
    ("stacked_ms", "stacked ms"),
    ("folded_ms", "folded ms"),
    ("stacked_speedup", "stacked"),
    ("folded_speedup", "folded (ceiling)"),
    ("compiled_speedup", "compiled"),
    ("compiled_folded_speedup", "compiled + folded"),
    ("optimizer_share", "optimizer share"),
)


def _cells(run: dict) -> list[str]:
    return [f"{run[key]:.1f}" if key.endswith("_ms") else f"{run[key]:.2f}" for key, _ in COLUMNS]


def _caption(result: dict) -> str:
    members = result["runs"][0]["members"]
    return (
        f"{members} members' forward+backward, {result['batch_size']} x {result['seq_len']} "
        f"tokens each, {result['num_threads']} thread, median of {result['rounds']} interleaved "
        "rounds (process CPU time); ratios are separate over each way (per member tokens/s)"
    )


def _span(result: dict, key: str) -> str:
    values = [run_[key] for run_ in result["runs"]]
    return f"{min(values):.2f}-{max(values):.2f}"


def summary(result: dict) -> str:
    """The ranges over rungs, for the prose around the table."""
    return (
        f"Per member, against separate steps: stacked {_span(result, 'stacked_speedup')}x, "
        f"folded (the ceiling of any stacking) {_span(result, 'folded_speedup')}x, compiled "
        f"{_span(result, 'compiled_speedup')}x, compiled and folded "
        f"{_span(result, 'compiled_folded_speedup')}x; the optimizer step is "
        f"{_span(result, 'optimizer_share')} of a trial's step."
    )


def render(result: dict) -> str:
    header = f"{'model':<7}" + "".join(f"{label:>19}" for _, label in COLUMNS)
    lines = [_caption(result), "", header]
    for run_ in result["runs"]:
        lines.append(f"{run_['name']:<7}" + "".join(f"{c:>19}" for c in _cells(run_)))
    return "\n".join([*lines, "", summary(result)])


def markdown(result: dict) -> str:
    """The table analysis/README.md embeds, with its provenance."""
    lines = [
        f"`k3scale bench stack` at commit `{result['git_sha'][:7]}`: {_caption(result)}.",
        "",
        "| model | " + " | ".join(label for _, label in COLUMNS) + " |",
        "| --- |" + " ---: |" * len(COLUMNS),
    ]
    for run_ in result["runs"]:
        lines.append(f"| {run_['name']} | " + " | ".join(_cells(run_)) + " |")
    return "\n".join([*lines, "", summary(result)]) + "\n"
