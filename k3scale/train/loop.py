"""`train(cfg) -> RunResult`: one training run, from a RunConfig to logged metrics.

Reads like nanoGPT's loop: build the pieces, then per optimizer step set the LR from tokens seen,
accumulate gradients over micro-batches, clip, step, update MoE balancing biases and apply
QK-Clip, log, evaluate, checkpoint. Same seed, same losses to the bit on CPU; a resumed run
replays exactly the losses of an uninterrupted one; a WSD branch started from a trunk's fork
checkpoint equals a straight WSD run of its budget. The model is built on CPU (so its
initialisation does not depend on the device) and then moved to `train.device`, where every
batch, the optimizer state and bf16 autocast follow it.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from k3scale.config import RunConfig, config_hash, flatten
from k3scale.data import TrainWindows, eval_windows, open_dataset
from k3scale.errors import K3ScaleError
from k3scale.models import accounting, build_model
from k3scale.models.balancing import update_balancing
from k3scale.models.model import mla_modules
from k3scale.ops.cpu.build import kernel_path
from k3scale.optim.muon import build_optimizer
from k3scale.optim.qk_clip import qk_clip
from k3scale.optim.schedules import StepLRs
from k3scale.track import schema
from k3scale.track.heartbeat import Heartbeat
from k3scale.track.tracker import RunTracker, abandon_attempt, provenance
from k3scale.train.checkpoint import LATEST, fork_name, load_checkpoint, save_checkpoint
from k3scale.train.device import run_device
from k3scale.train.distributed import average_gradients, mean_over_ranks, world
from k3scale.train.evaluate import mean_loss
from k3scale.train.perf import matmul_peak_flops, mfu, synchronize

# MLflow step of the `final/*` summary values (see `train`).
SUMMARY_STEP = 0


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """What a run ended with; every number here is also in the tracker and the replica."""

    status: str
    """finished or diverged."""
    run_id: str
    """Tracker run id (MLflow run id, or a local id when logging to the replica only)."""
    config_hash: str
    """Identity of the run's config."""
    steps: int
    """Optimizer steps taken."""
    tokens: int
    """Training tokens seen."""
    final_train_loss: float
    """Main-head train loss of the last good step (nats/token)."""
    final_val_id_loss: float
    """In-distribution validation loss at the end (nats/token)."""
    final_val_ood_loss: float
    """Out-of-distribution validation loss at the end (nats/token)."""
    losses: tuple[float, ...]
    """Main-head train loss of every step, resumed history included."""
    tokens_per_s: float
    """Training throughput over the steps of this process (evaluation excluded, and a compiled
    run's first step, which compiles)."""
    mfu: float
    """Model FLOP utilisation against the matmul peak measured in this process."""
    out_dir: str
    """Folder with the checkpoints and the JSONL replica."""
    time_s: dict[str, float] = field(default_factory=dict)
    """Wall seconds of this call by phase: `setup` (data, model, tracker, peak probe), `steps`,
    `eval`, `track` (MLflow calls after setup), `checkpoint` (saves), `compile` (a compiled run's
    first step), `total`. Process-local,
    not logged; the sweep reads it for its overhead figures."""


@dataclass(kw_only=True)
class _State:
    step: int = 0
    losses: list[float] = field(default_factory=list)
    first_loss: float | None = None
    run_id: str | None = None
    final: dict[str, Any] | None = None
    last_eval: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class _Plan:
    batch_tokens: int
    total_steps: int
    micro_steps: int
    rank_sequences: int
    lrs: StepLRs


def plan_run(cfg: RunConfig, world_size: int = 1) -> _Plan:
    """Steps, micro-batches and the per-step LR of a run (also what `--dry-run` prints)."""
    t = cfg.train
    if t.batch_size % world_size:
        raise K3ScaleError(
            f"train.batch_size={t.batch_size} is not divisible by {world_size} ranks"
        )
    rank_sequences = t.batch_size // world_size
    if rank_sequences % t.micro_batch_size and t.micro_batch_size < rank_sequences:
        raise K3ScaleError(
            f"train.batch_size per rank ({rank_sequences}) must be a multiple of "
            f"train.micro_batch_size ({t.micro_batch_size})"
        )
    batch_tokens = t.batch_size * cfg.data.seq_len
    total_steps = t.budget_tokens // batch_tokens
    if total_steps < 1:
        raise K3ScaleError(
            f"train.budget_tokens={t.budget_tokens} is less than one batch ({batch_tokens} tokens)"
        )
    micro = min(t.micro_batch_size, rank_sequences)
    return _Plan(
        batch_tokens=batch_tokens,
        total_steps=total_steps,
        micro_steps=rank_sequences // micro,
        rank_sequences=rank_sequences,
        lrs=StepLRs(total_steps, batch_tokens, cfg.optim.lr, cfg.schedule),
    )


def train(
    cfg: RunConfig,
    *,
    resume: bool = True,
    stop_after_steps: int | None = None,
    start_from: Path | None = None,
    extra_tags: dict[str, str] | None = None,
    history: list[tuple[int, str, float]] | None = None,
) -> RunResult:
    """Train one run.

    Args:
        cfg: the resolved run config.
        resume: continue from `out_dir/latest.pt` when it exists (a finished run returns at once).
        stop_after_steps: stop (with a checkpoint) after this many steps in total, as if
            interrupted; used by tests and by WSD trunks that end at their last fork.
        start_from: a WSD fork checkpoint to branch from (a new run; its lineage goes in tags).
        extra_tags: tags added to the run (e.g. trunk run id and fork step of a branch).
        history: (step, key, value) points a new run logs before its own (a WSD branch: its
            trunk's curve up to the fork).
    """
    call_started = time.perf_counter()
    if cfg.train.num_threads > 0:
        torch.set_num_threads(cfg.train.num_threads)
    device = run_device(cfg)
    rank, world_size = world()
    plan = plan_run(cfg, world_size)
    out_dir = Path(cfg.train.out_dir)
    heart = Heartbeat(out_dir, enabled=rank == 0)
    heart.beat("opening the dataset")
    dataset = open_dataset(cfg.data.dataset, root=cfg.data.root)
    _check_data(cfg, dataset)

    torch.manual_seed(cfg.train.seed)
    heart.beat("loading the kernels and building the model")
    model = build_model(cfg.model).to(device)
    optimizer = build_optimizer(model, cfg.optim)
    state = _State()
    resume_path = out_dir / LATEST
    if resume and resume_path.exists():
        _restore(load_checkpoint(resume_path, device), model, optimizer, state, keep_run=True)
    elif start_from is not None:
        _restore(load_checkpoint(start_from, device), model, optimizer, state, keep_run=False)

    if state.final is not None:
        # Already ended: its end was logged (replica first) before this checkpoint was written.
        # Reopening its MLflow run would mark it RUNNING again under this attempt's tags, with
        # nothing to end it (a WSD trunk retried for its branches was closed as FAILED).
        total = time.perf_counter() - call_started
        return _result(cfg, state, out_dir, 0.0, 0.0, time_s={"setup": total, "total": total})
    flops_per_token = accounting.flops_per_token(cfg.model, cfg.data.seq_len)
    heart.beat("opening its MLflow run")
    new_run = state.run_id is None
    tracker = _open_tracker(cfg, dataset, state.run_id, extra_tags, rank, out_dir, device)
    state.run_id = tracker.run_id if tracker else state.run_id
    if tracker and new_run:
        tracker.log_metrics(SUMMARY_STEP, {schema.METRIC_PEAK_LR: cfg.optim.lr})
        _log_history(tracker, history or [])

    # Shares the model's parameters and buffers; the first step pays the compile.
    step_model = torch.compile(model) if cfg.train.compile else model
    windows = TrainWindows(dataset, split="train", seq_len=cfg.data.seq_len, seed=cfg.train.seed)
    evals = {
        split: eval_windows(dataset, split, cfg.data.seq_len, cfg.data.eval_tokens)
        for split in ("val_id", "val_ood")
    }
    for module in mla_modules(model):
        module.track_max_logits = cfg.optim.qk_clip
    model.train()

    autocast = cfg.train.precision == "bf16"
    peak = matmul_peak_flops(torch.bfloat16 if autocast else torch.float32, device=device)
    busy_s, busy_tokens, eval_s = 0.0, 0, 0.0
    window_s, window_tokens = 0.0, 0  # steps since the last diagnostics point
    # Time outside the steps, by cause (issue 19: a trial's fixed cost): MLflow calls, checkpoints.
    costs = {"track": 0.0, "checkpoint": 0.0}
    send_at = 0.0  # monotonic time of the next mid-run metric batch (log_interval_s)
    setup_s = time.perf_counter() - call_started
    status = schema.STATUS_FINISHED
    last_step = (
        plan.total_steps if stop_after_steps is None else min(stop_after_steps, plan.total_steps)
    )
    progress = _progress_bar(plan.total_steps, state.step, rank, plan.batch_tokens)
    first_step = state.step
    for step in range(first_step, last_step):
        started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = plan.lrs[step]
        loss, step_metrics = _train_step(
            cfg, plan, model, step_model, optimizer, windows, step, rank, autocast, device
        )
        synchronize(device)
        elapsed = time.perf_counter() - started
        if step_model is not model and step == first_step:
            # This process's first compiled step compiles the graphs: a fixed cost, not a rate.
            costs["compile"] = elapsed
        else:
            busy_s += elapsed
            busy_tokens += plan.batch_tokens
        heart.beat(f"training, step {step + 1} of {last_step}", step_s=elapsed)
        if _diverged(loss, state.first_loss, cfg.train.divergence_factor):
            status = schema.STATUS_DIVERGED
            break
        state.first_loss = loss if state.first_loss is None else state.first_loss
        state.losses.append(loss)
        state.step = step + 1
        tokens = state.step * plan.batch_tokens
        metrics = {
            schema.METRIC_TRAIN_LOSS: loss,
            schema.METRIC_LR: plan.lrs[step],
            schema.METRIC_TOKENS: float(tokens),
        }
        window_s, window_tokens = window_s + elapsed, window_tokens + plan.batch_tokens
        if state.step % cfg.train.diagnostics_interval_steps == 0 or state.step == last_step:
            # Throughput over the steps since the last point: steadier than one step's.
            rate = window_tokens / window_s
            metrics.update(
                {
                    schema.METRIC_FLOPS: float(tokens * flops_per_token),
                    schema.METRIC_TOKENS_PER_S: rate,
                    schema.METRIC_MFU: mfu(flops_per_token, rate, peak),
                    **step_metrics,
                }
            )
            window_s, window_tokens = 0.0, 0
        if (
            _crosses(tokens, plan.batch_tokens, cfg.train.eval_interval_tokens)
            and state.step < plan.total_steps
        ):
            eval_started = time.perf_counter()
            heart.beat(f"evaluating at step {state.step}")
            state.last_eval = _evaluate(model, evals, cfg, autocast, device)
            eval_s += time.perf_counter() - eval_started
            metrics.update(state.last_eval)
        if tracker:
            with _timed(costs, "track"):
                tracker.log_metrics(state.step, metrics)
                if state.step % cfg.train.log_interval_steps == 0 and time.monotonic() >= send_at:
                    tracker.flush()
                    send_at = time.monotonic() + cfg.train.log_interval_s
        with _timed(costs, "checkpoint"):
            _save_periodic(cfg, plan, model, optimizer, state, out_dir, tokens, rank)
        if progress:
            progress.update(1)
            progress.set_postfix(loss=f"{loss:.3f}")
    if progress:
        progress.close()

    tokens_per_s = busy_tokens / busy_s if busy_s > 0 else 0.0
    utilisation = mfu(flops_per_token, tokens_per_s, peak)

    def time_s() -> dict[str, float]:
        total = time.perf_counter() - call_started
        return {"setup": setup_s, "steps": busy_s, "eval": eval_s, **costs, "total": total}

    if state.step < plan.total_steps and status == schema.STATUS_FINISHED:
        # Stopped early on purpose: the checkpoint is the resume point; the run stays open.
        with _timed(costs, "checkpoint"):
            _save(out_dir / LATEST, model, optimizer, state, rank)
        if tracker:
            with _timed(costs, "track"):
                tracker.close()
        return _result(
            cfg, state, out_dir, tokens_per_s, utilisation, status="stopped", time_s=time_s()
        )

    # A diverged model's weights are garbage: it ends with its last good evaluation.
    heart.beat("final evaluation and logging")
    eval_started = time.perf_counter()
    final = (
        _evaluate(model, evals, cfg, autocast, device)
        if status == schema.STATUS_FINISHED
        else _last_good(state)
    )
    eval_s += time.perf_counter() - eval_started
    state.final = {
        "status": status,
        schema.FINAL_PREFIX + "train_loss": state.losses[-1] if state.losses else math.nan,
        schema.FINAL_PREFIX + "val_id_loss": final[schema.METRIC_VAL_ID_LOSS],
        schema.FINAL_PREFIX + "val_ood_loss": final[schema.METRIC_VAL_OOD_LOSS],
        schema.FINAL_PREFIX + "tokens": float(state.step * plan.batch_tokens),
        schema.FINAL_PREFIX + "tokens_per_s": tokens_per_s,
        schema.FINAL_PREFIX + "mfu": utilisation,
    }
    if tracker:
        with _timed(costs, "track"):
            tracker.log_metrics(state.step, final)
            # MLflow has no summary metric type; its UI (3.17, RunsChartsCardConfig) draws a
            # metric whose latest step is 0 as a bar per run, and one at a step >= 1 as a line
            # chart (one point here). So final values go at step 0, under their `final/*` names
            # (the run tables read those keys).
            summary = {k: v for k, v in state.final.items() if k != "status"}
            tracker.log_metrics(SUMMARY_STEP, summary)
            tracker.finish(status)
    with _timed(costs, "checkpoint"):
        _save(out_dir / LATEST, model, optimizer, state, rank)
    return _result(cfg, state, out_dir, tokens_per_s, utilisation, time_s=time_s())


def _train_step(
    cfg: RunConfig,
    plan: _Plan,
    model: nn.Module,
    step_model: nn.Module,
    optimizer: torch.optim.Optimizer,
    windows: TrainWindows,
    step: int,
    rank: int,
    autocast: bool,
    device: torch.device,
) -> tuple[float, dict[str, float]]:
    """One optimizer step over the global batch; returns the batch's mean main-head loss.
    `step_model` runs the forward: `model` itself, or it compiled."""
    first_window = step * cfg.train.batch_size + rank * plan.rank_sequences
    rows = windows.batch(first_window, plan.rank_sequences).astype(np.int64)
    batch = torch.from_numpy(rows).to(device)
    optimizer.zero_grad(set_to_none=True)
    ce_total = 0.0
    for micro in batch.chunk(plan.micro_steps):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = step_model(micro[:, :-1], targets=micro[:, 1:], with_logits=False)
        (out.loss / plan.micro_steps).backward()
        ce_total += float(out.ce_loss.detach()) / plan.micro_steps
    average_gradients(model)
    metrics: dict[str, float] = {}
    if cfg.optim.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        metrics["grad_norm"] = float(grad_norm)
    optimizer.step()
    metrics.update(_numeric(update_balancing(model)))
    if cfg.optim.qk_clip:
        metrics.update(_numeric(qk_clip(model, cfg.optim.qk_clip_tau)))
    return mean_over_ranks(ce_total), metrics


def _last_good(state: _State) -> dict[str, float]:
    nan = {schema.METRIC_VAL_ID_LOSS: math.nan, schema.METRIC_VAL_OOD_LOSS: math.nan}
    return {**nan, **state.last_eval}


def _numeric(stats: dict[str, Any] | None) -> dict[str, float]:
    return {k: float(v) for k, v in (stats or {}).items() if isinstance(v, int | float)}


def _diverged(loss: float, first_loss: float | None, factor: float) -> bool:
    if not math.isfinite(loss):
        return True
    return first_loss is not None and loss > factor * first_loss


def _crosses(tokens: int, batch_tokens: int, interval: int) -> bool:
    """True when this step's tokens crossed a multiple of `interval` (0 = never)."""
    return interval > 0 and tokens // interval > (tokens - batch_tokens) // interval


def _evaluate(
    model: nn.Module,
    evals: dict[str, np.ndarray],
    cfg: RunConfig,
    autocast: bool,
    device: torch.device,
) -> dict[str, float]:
    micro = cfg.train.micro_batch_size
    return {
        schema.METRIC_VAL_ID_LOSS: mean_loss(model, evals["val_id"], micro, autocast, device),
        schema.METRIC_VAL_OOD_LOSS: mean_loss(model, evals["val_ood"], micro, autocast, device),
    }


@contextmanager
def _timed(costs: dict[str, float], name: str):
    """Adds the block's wall seconds to `costs[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        costs[name] += time.perf_counter() - started


def _save_periodic(
    cfg, plan, model, optimizer, state, out_dir: Path, tokens: int, rank: int
) -> None:
    if tokens in cfg.train.fork_tokens:
        _save(out_dir / fork_name(tokens), model, optimizer, state, rank)
    if _crosses(tokens, plan.batch_tokens, cfg.train.checkpoint_interval_tokens):
        _save(out_dir / LATEST, model, optimizer, state, rank)


def _save(path: Path, model, optimizer, state: _State, rank: int) -> None:
    if rank != 0:
        return
    save_checkpoint(
        path,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": state.step,
            "losses": list(state.losses),
            "first_loss": state.first_loss,
            "run_id": state.run_id,
            "final": state.final,
            "last_eval": state.last_eval,
            "rng": torch.get_rng_state(),
            **_cuda_rng(model),
        },
    )


def _cuda_rng(model: nn.Module) -> dict[str, torch.Tensor]:
    """The CUDA generator's state of a run on a GPU (nothing for a CPU run's checkpoint)."""
    device = next(model.parameters()).device
    return {"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}


def _restore(payload: dict[str, Any], model, optimizer, state: _State, keep_run: bool) -> None:
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    # RNG states are CPU byte tensors whatever map_location placed them on.
    torch.set_rng_state(payload["rng"].cpu())
    device = next(model.parameters()).device
    if device.type == "cuda" and "cuda_rng" in payload:
        torch.cuda.set_rng_state(payload["cuda_rng"].cpu(), device)
    state.step = int(payload["step"])
    state.losses = [float(x) for x in payload["losses"]]
    state.first_loss = payload["first_loss"]
    if keep_run:
        state.run_id = payload["run_id"]
        state.final = payload["final"]
    state.last_eval = dict(payload.get("last_eval") or {})


def _check_data(cfg: RunConfig, dataset) -> None:
    if cfg.data.fingerprint is not None and cfg.data.fingerprint != dataset.fingerprint:
        raise K3ScaleError(
            f"data fingerprint {dataset.fingerprint} does not match data.fingerprint="
            f"{cfg.data.fingerprint}: re-run `k3scale data prepare` or update the config"
        )
    if dataset.vocab_size > cfg.model.vocab_size:
        raise K3ScaleError(
            f"the dataset's vocabulary ({dataset.vocab_size}) is larger than "
            f"model.vocab_size ({cfg.model.vocab_size})"
        )


def _open_tracker(cfg, dataset, run_id, extra_tags, rank, out_dir: Path, device: torch.device):
    if rank != 0:
        return None
    if run_id is None:
        # A previous attempt in this folder died before its first checkpoint: start over cleanly.
        abandon_attempt(out_dir, cfg.track.tracking_uri)
    hash_ = config_hash(cfg)
    kernel = kernel_path()
    tags = {
        schema.TAG_CONFIG_HASH: hash_,
        schema.TAG_DATA_FINGERPRINT: dataset.fingerprint,
        schema.TAG_ARCH: cfg.model.family,
        schema.TAG_BUDGET_TOKENS: str(cfg.train.budget_tokens),
        schema.TAG_SCHEDULE: cfg.schedule.kind,
        schema.TAG_BACKEND: cfg.model.backend,
        schema.TAG_KERNEL_PATH: kernel.name,
        schema.TAG_CPU_CAPABILITY: kernel.capability,
        **provenance(),
        **dict(cfg.track.tags),
        **(extra_tags or {}),
    }
    params = {**_logged_params(cfg, device), **_derived_params(cfg)}
    tracker = RunTracker(
        cfg.track.tracking_uri,
        cfg.track.experiment,
        cfg.track.run_name,
        tags,
        params,
        out_dir,
        run_id=run_id,
    )
    if run_id is None:
        tracker.log_artifact_json("config.json", _logged_config(cfg, device))
        tracker.log_dataset(dataset.name, dataset.fingerprint, _logged_path(cfg, dataset.path))
    return tracker


def _log_history(tracker: RunTracker, history: list[tuple[int, str, float]]) -> None:
    by_step: dict[int, dict[str, float]] = {}
    for step, key, value in history:
        by_step.setdefault(step, {})[key] = value
    for step in sorted(by_step):
        tracker.log_metrics(step, by_step[step])


def _logged_params(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """The flattened config with the device the run resolved (`auto` becomes cpu or cuda); a
    study's run logs its paths relative to the study folder.

    The tracking URI is left out: it is where the run is logged, not what it is, and a resumed
    run that re-logs its params after the server moved to another port would be refused by
    MLflow ("Changing param values is not allowed").
    """
    params = flatten(cfg)
    del params["track.tracking_uri"]
    params["train.device"] = device.type
    if cfg.track.paths_relative_to is None:
        return params
    del params["track.paths_relative_to"]
    for key in ("train.out_dir", "data.root"):
        params[key] = _logged_path(cfg, params[key])
    return params


def _logged_config(cfg: RunConfig, device: torch.device) -> dict[str, Any]:
    """config.json: the logged params nested again, so it has the same relative paths."""
    nested: dict[str, Any] = {}
    for key, value in _logged_params(cfg, device).items():
        *sections, name = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return nested


def _logged_path(cfg: RunConfig, path) -> str:
    base = cfg.track.paths_relative_to
    return str(path) if base is None else os.path.relpath(Path(path).resolve(), base)


def _derived_params(cfg: RunConfig) -> dict[str, int]:
    return {
        schema.PARAM_N_TOTAL: accounting.num_params_total(cfg.model),
        schema.PARAM_N_ACTIVE: accounting.num_params_active(cfg.model),
        schema.PARAM_FLOPS_PER_TOKEN_6N: accounting.flops_per_token_6n(cfg.model),
        schema.PARAM_FLOPS_PER_TOKEN_ATTN: accounting.flops_per_token(cfg.model, cfg.data.seq_len),
        schema.PARAM_BATCH_TOKENS: cfg.train.batch_size * cfg.data.seq_len,
    }


def _progress_bar(total: int, done: int, rank: int, batch_tokens: int):
    """Progress lines on stderr (rank 0), also when it is a file or a pipe (issue 21)."""
    if rank != 0:
        return None
    from k3scale.track.progress import ProgressLines

    return ProgressLines(total, done, batch_tokens)


def _result(
    cfg,
    state: _State,
    out_dir: Path,
    tokens_per_s: float,
    utilisation: float,
    status=None,
    time_s: dict[str, float] | None = None,
) -> RunResult:
    final = state.final or {}
    batch_tokens = cfg.train.batch_size * cfg.data.seq_len
    return RunResult(
        status=status or final.get("status", schema.STATUS_FINISHED),
        run_id=state.run_id or "",
        config_hash=config_hash(cfg),
        steps=state.step,
        tokens=state.step * batch_tokens,
        final_train_loss=final.get(schema.FINAL_PREFIX + "train_loss", math.nan),
        final_val_id_loss=final.get(schema.FINAL_PREFIX + "val_id_loss", math.nan),
        final_val_ood_loss=final.get(schema.FINAL_PREFIX + "val_ood_loss", math.nan),
        losses=tuple(state.losses),
        tokens_per_s=tokens_per_s,
        mfu=utilisation,
        out_dir=str(out_dir),
        time_s=time_s or {},
    )
