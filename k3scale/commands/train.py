"""`k3scale train`: one training run from a model preset (or a config function) and overrides."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path

from k3scale.errors import K3ScaleError

# Token counts are logged as float64 metrics (MLflow has no other kind); above 2**53 consecutive
# counts are no longer distinct, so a budget beyond that is refused as an input error.
MAX_BUDGET_TOKENS = 2**53


def register(sub) -> None:
    parser = sub.add_parser(
        "train",
        help="train one run (a preset plus --set overrides); --dry-run prints the plan",
        description="Train one run and log it to MLflow (or only to its JSONL replica).",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", default="k3-t1", help="model preset (see `k3scale model list`)")
    source.add_argument(
        "--config",
        metavar="MODULE:FUNCTION",
        help="a function returning a RunConfig: PATH.py:FUNCTION or package.module:FUNCTION",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="dotted override checked against the config, e.g. --set optim.lr=1e-3 (repeatable)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="train N optimizer steps: sets train.budget_tokens to N x batch_size x seq_len",
    )
    parser.add_argument("--out", help="run folder (sets train.out_dir)")
    parser.add_argument("--tracking-uri", help="MLflow server URL (default: replica only)")
    parser.add_argument("--experiment", help="MLflow experiment name (sets track.experiment)")
    parser.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the dataset and the schedule, print N, D, C and the LR schedule, train nothing",
    )
    parser.set_defaults(handler=run_train)


def run_train(args) -> int:
    from k3scale.config import RunConfig, apply_overrides

    cfg = _load_function(args.config)() if args.config else _preset_config(args.preset)
    if not isinstance(cfg, RunConfig):
        raise K3ScaleError(f"{args.config} returned {type(cfg).__name__}, not a RunConfig")
    extra = list(args.overrides)
    if args.out:
        extra.append(f"train.out_dir={args.out}")
    if args.tracking_uri:
        extra.append(f"track.tracking_uri={args.tracking_uri}")
    if args.experiment:
        extra.append(f"track.experiment={args.experiment}")
    cfg = apply_overrides(cfg, extra)
    if args.steps is not None:
        cfg = _with_steps(cfg, args.steps, args.overrides)
    epochs = check_inputs(cfg)
    if epochs > 1:
        print(
            f"k3scale train: warning: the run reads its training split {epochs:.3g} times "
            "(it repeats its data); lower the budget or use a larger dataset",
            file=sys.stderr,
        )
    if args.dry_run:
        print(describe_run(cfg))
        return 0
    from k3scale.ops.cpu.build import slow_path_notice
    from k3scale.train import train
    from k3scale.train.device import run_device

    if run_device(cfg).type == "cpu" and (notice := slow_path_notice()):
        print(f"k3scale train: {notice}", file=sys.stderr)
    result = train(cfg, resume=not args.no_resume)
    print(
        f"{result.status}: {result.steps} steps, {result.tokens:,} tokens, "
        f"train {result.final_train_loss:.4f}, val id {result.final_val_id_loss:.4f}, "
        f"val ood {result.final_val_ood_loss:.4f}, {result.tokens_per_s:,.0f} tokens/s, "
        f"MFU {result.mfu:.1%}, run {result.run_id} in {result.out_dir}"
    )
    return 0 if result.status in ("finished", "stopped") else 1


def _with_steps(cfg, steps: int, overrides: list[str]):
    if steps < 1:
        raise K3ScaleError(f"--steps {steps}: must be >= 1")
    if any(o.partition("=")[0].strip() == "train.budget_tokens" for o in overrides):
        raise K3ScaleError("give --steps or --set train.budget_tokens, not both")
    budget = steps * cfg.train.batch_size * cfg.data.seq_len
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, budget_tokens=budget))


def check_inputs(cfg) -> float:
    """Refuse what would fail later (a missing dataset, an impossible schedule, a budget too
    large to count, a device or backend this machine lacks) before anything is built; returns
    how many times the run reads its training split.

    Raises:
        K3ScaleError: one line naming the setting to change.
    """
    from k3scale.data import open_dataset
    from k3scale.data.dataset import HEADER, resolve_dataset_dir
    from k3scale.data.loader import count_windows
    from k3scale.train import plan_run
    from k3scale.train.device import run_device

    run_device(cfg)
    if cfg.train.budget_tokens > MAX_BUDGET_TOKENS:
        raise K3ScaleError(
            f"train.budget_tokens={cfg.train.budget_tokens:.3g} is above 2**53 ({MAX_BUDGET_TOKENS:.2g}) "
            "tokens, beyond what a run can count exactly"
        )
    folder = resolve_dataset_dir(cfg.data.dataset, cfg.data.root)
    if not (folder / HEADER).is_file():
        raise K3ScaleError(
            f"no prepared dataset {cfg.data.dataset!r} under data.root={cfg.data.root} "
            f"({folder} has no {HEADER}); point --set data.root=DIR (or data.dataset=PATH) at "
            "one, or prepare it with `k3scale data prepare`"
        )
    dataset = open_dataset(cfg.data.dataset, root=cfg.data.root)
    try:
        plan = plan_run(cfg)
    except ValueError as exc:  # the schedule's own checks name the setting
        raise K3ScaleError(str(exc)) from None
    windows = count_windows(dataset.num_tokens("train"), cfg.data.seq_len)
    if windows < 1:
        raise K3ScaleError(
            f"the training split of {dataset.path} is shorter than one window of data.seq_len="
            f"{cfg.data.seq_len} tokens"
        )
    return plan.total_steps * cfg.train.batch_size / windows


def describe_run(cfg) -> str:
    """The dry-run text: sizes, tokens, compute under both conventions and the schedule."""
    from k3scale.models import accounting
    from k3scale.optim.schedules import schedule_summary
    from k3scale.train import plan_run
    from k3scale.train.device import resolve_device

    plan = plan_run(cfg)
    device = resolve_device(cfg.train.device)
    tokens = plan.total_steps * plan.batch_tokens
    n_total = accounting.num_params_total(cfg.model)
    n_active = accounting.num_params_active(cfg.model)
    f6 = accounting.flops_per_token_6n(cfg.model)
    fa = accounting.flops_per_token(cfg.model, cfg.data.seq_len)
    lines = [
        f"model       {cfg.model.family}: d_model {cfg.model.d_model}, {cfg.model.num_layers} layers",
        f"N           total {n_total:,}  active {n_active:,} (no input embedding, head included)",
        f"D           {tokens:,} tokens = {plan.total_steps} steps x {plan.batch_tokens:,} "
        f"tokens/step ({cfg.train.batch_size} seqs x {cfg.data.seq_len}); "
        f"{plan.micro_steps} micro-batches/step",
        f"C           6*N_active*D = {f6 * tokens:.4g} FLOPs; with attention cores = {fa * tokens:.4g}",
        f"optimizer   Muon + AdamW, peak lr {cfg.optim.lr:g}, "
        f"per-head Muon {'on' if cfg.optim.per_head_muon else 'off'}",
        f"device      {device.type} (train.device={cfg.train.device}), {cfg.train.precision}, "
        f"model.backend={cfg.model.backend}",
        schedule_summary(tokens, plan.batch_tokens, cfg.optim.lr, cfg.schedule),
    ]
    return "\n".join(lines)


def _preset_config(name: str):
    from k3scale.config import OptimConfig, RunConfig
    from k3scale.models.presets import get_preset

    model = get_preset(name)
    # K3 trains with Per-Head Muon (K3 section 2.5), as in studies; `--set optim.per_head_muon=false`
    # turns it off.
    return RunConfig(model=model, optim=OptimConfig(per_head_muon=model.family == "k3"))


def _load_function(spec: str):
    target, sep, name = spec.partition(":")
    if not sep or not name:
        raise K3ScaleError(f"--config {spec!r}: expected MODULE:FUNCTION")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise K3ScaleError(f"--config: no file {path}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise K3ScaleError(f"--config: cannot import {target!r} ({exc})") from None
    if not hasattr(module, name):
        raise K3ScaleError(f"--config: {target} has no function {name!r}")
    return getattr(module, name)
