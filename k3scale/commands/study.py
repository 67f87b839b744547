"""`k3scale study`: plan, run, submit and follow tuned scaling studies."""

from __future__ import annotations

import math
from pathlib import Path

from k3scale.errors import K3ScaleError

# scripts/main.sh names its study folders after the commit's first 12 hex digits.
COMMIT_CHARS = 12


def register(sub) -> None:
    parser = sub.add_parser("study", help="plan, run, submit and follow a study (experiments/*.py)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    run = actions.add_parser("run", help="run (or resume) a study to completion")
    _common(run)
    run.add_argument(
        "--ray-address", help="join a running Ray cluster (default: embedded local Ray)"
    )
    run.add_argument(
        "--tracking-uri", help="MLflow server (default: a local server in the study folder)"
    )
    run.add_argument("--storage", help="Optuna storage URL (default: SQLite in the study folder)")
    run.add_argument("--data-root", default="data_cache", help="prepared datasets folder")
    run.add_argument(
        "--dataset",
        default=None,
        help="prepared dataset name under --data-root (default: the preset's, english_mix unless "
        "it names another)",
    )
    run.add_argument(
        "--allow-code-change",
        action="store_true",
        help="resume a study started at another commit (each run's git_sha tag names its own)",
    )
    run.add_argument(
        "--reuse-runs",
        metavar="DIR",
        action="append",
        default=[],
        help="another study folder whose finished runs this study copies instead of training "
        "them again when config, commit, kernel path and data all match (repeatable)",
    )
    run.set_defaults(handler=_run)

    plan = actions.add_parser("plan", help="print cells, trials and estimated compute; run nothing")
    _common(plan)
    plan.add_argument(
        "--measure",
        action="store_true",
        help="train each rung a few steps on this machine now (seconds per rung) and estimate "
        "the wall-clock from those rates instead of the committed studies' model",
    )
    plan.add_argument("--data-root", default="data_cache", help="with --measure: datasets folder")
    plan.add_argument(
        "--dataset", default=None, help="with --measure: prepared dataset (default: the preset's)"
    )
    plan.set_defaults(handler=_plan)

    submit = actions.add_parser("submit", help="submit the study to a Ray cluster as a Ray Job")
    _common(submit)
    submit.add_argument(
        "--address", required=True, help="Ray dashboard address, e.g. http://HEAD:8265"
    )
    submit.add_argument("--tracking-uri", help="MLflow server the cluster can reach")
    submit.add_argument("--storage", help="Optuna storage URL the cluster can reach")
    submit.add_argument(
        "--data-root", default="data_cache", help="prepared datasets folder on the cluster"
    )
    submit.add_argument(
        "--dataset",
        default=None,
        help="prepared dataset name under --data-root (default: the preset's, english_mix unless "
        "it names another)",
    )
    submit.set_defaults(handler=_submit)

    report = actions.add_parser(
        "report", help="headline numbers of a finished study, its dashboard and MLflow UI"
    )
    _common(report)
    report.add_argument(
        "--markdown",
        action="store_true",
        help="print only the report's numeric tables in Markdown (analysis/README.md embeds them)",
    )
    report.add_argument(
        "--brief",
        action="store_true",
        help="print only the answer to each claim, the re-run check, the dashboard and the "
        "browse line (the main job's last screen); nothing is logged",
    )
    report.add_argument(
        "--tracking-uri",
        help="MLflow server to log fit.json and the dashboard to (default: the study folder's)",
    )
    report.set_defaults(handler=_report)

    status = actions.add_parser("status", help="progress of a study from its storage")
    _common(status)
    status.add_argument("--storage", help="Optuna storage URL (default: the study folder's)")
    status.set_defaults(handler=_status)


def _common(parser) -> None:
    parser.add_argument("study", help="study file, e.g. experiments/k2_vs_k3.py")
    parser.add_argument("--preset", default="demo", help="smoke, demo, cpu, gpu or cluster")
    parser.add_argument("--study-dir", help="study folder (default: studies/<name>-<preset>)")


def _run(args) -> int:
    import sys

    from k3scale.sweep.run import run_study

    record = run_study(
        args.study,
        args.preset,
        study_dir=args.study_dir,
        ray_address=args.ray_address,
        tracking_uri=args.tracking_uri,
        storage=args.storage,
        data_root=args.data_root,
        dataset=args.dataset,
        allow_code_change=args.allow_code_change,
        reuse_from=tuple(args.reuse_runs),
    )
    trials = record["trials"]
    if trials["failed"]:
        total = sum(trials.values())
        print(
            f"k3scale study run: {trials['failed']} of {total} trials failed "
            f"(their errors are in the log above; `k3scale study status` lists them by cell)",
            file=sys.stderr,
        )
        return 1
    return 0


def _plan(args) -> int:
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.planner import cell_flops, estimate_cost, plan_cells

    study = load_study(args.study)
    preset = study.preset(args.preset)
    print(f"study {study.name}, preset {args.preset}: {study.description}")
    for cell in plan_cells(study, preset):
        print(
            f"  {cell.key:40s} {preset.planned_trials_per_cell:3d} trials x "
            f"{cell_flops(study, cell, preset):.3g} FLOPs"
        )
    cost = estimate_cost(study, preset)
    print(
        f"{cost['cells']} cells, {cost['tuning_trials']} tuning trials + {cost['extra_runs']} extra runs; "
        f"{cost['tokens']:,} tuning tokens, {cost['flops']:.3g} FLOPs (WSD trunks counted once)"
    )
    print(_search_ranges(preset))
    if args.measure:
        print(_measured_wall_clock(study, preset, args.data_root, args.dataset or preset.dataset))
    else:
        print(_wall_clock(study, preset))
    return 0


def _measured_wall_clock(study, preset, data_root: str, dataset: str) -> str:
    """The wall-clock on this machine from each rung's training rate, measured now."""
    import os

    from k3scale.commands.output import at_place
    from k3scale.sweep.planner import FIXED_TRIAL_S, estimate_wall_s_at_rates
    from k3scale.sweep.rates import MEASURED_STEPS, preset_batch, rung_rates

    if preset.gpus_per_trial > 0:
        return "wall-clock: not measured (a GPU preset; this measures CPU trials)"
    compiled = (
        ", compiled: the first step, which compiles, not in the rate" if preset.compile else ""
    )
    print(
        f"training each rung {MEASURED_STEPS} steps on {dataset} "
        f"({preset.threads_per_trial} thread(s){compiled}):"
    )
    rates = rung_rates(study, preset, data_root=data_root, dataset=dataset)
    slots = max(1, (os.cpu_count() or 1) // preset.threads_per_trial)
    minutes = estimate_wall_s_at_rates(study, preset, rates, slots) / 60
    return (
        f"wall-clock: about {at_place(minutes, math.floor(math.log10(minutes)))} min on this "
        f"machine ({slots} trials at a time), grid extensions not counted\n  model: seconds "
        f"per trial = (training tokens + evaluation tokens / 3) / the rung's rate + "
        f"{FIXED_TRIAL_S:g} s, rates measured now, one trial alone, at {preset_batch(preset)} x "
        f"{preset.seq_len} tokens per step (two trials at once may each run slower)"
    )


def _search_ranges(preset) -> str:
    if preset.lr_grid is not None:
        return _lr_grid(preset)
    space = preset.search
    return (
        f"search: peak lr log-uniform in [{space.lr_low:g}, {space.lr_high:g}], batch size in "
        f"{{{', '.join(str(b) for b in space.batch_sizes)}}} sequences of {preset.seq_len} "
        f"tokens; {preset.trials_per_cell} trials per cell (seed {preset.seeds[0]}), "
        f"{_reruns(preset.seeds)}; lr_min {preset.lr_min:g}, warmup "
        f"{preset.warmup_fraction:.0%} of the smallest budget"
    )


def _lr_grid(preset) -> str:
    from k3scale.sweep.grid import grid_lrs

    grid = preset.lr_grid
    low, high = preset.lr_span()
    sizes = [size for ladder in preset.sizes.values() for size in ladder]
    if len({grid.for_size(size).center for size in sizes}) == 1:
        points = f"peak lr {_lrs(grid_lrs(grid.for_size(sizes[0])))}"
    else:
        points = "; ".join(
            f"{size} peak lr {_lrs(grid_lrs(grid.for_size(size)))}" for size in sizes
        )
    return (
        f"lr grid: {points} ({grid.points} points, x{grid.ratio:g} apart), batch size "
        f"{grid.batch_size} sequences of {preset.seq_len} tokens, every cell (seed "
        f"{preset.seeds[0]}); up to {grid.max_extensions} more lr per cell one step past an end "
        f"holding its best (lr {low:.3g} to {high:.3g}), not in the counts above; "
        f"{_reruns(preset.seeds)}; lr_min {preset.lr_min:g}, warmup "
        f"{preset.warmup_fraction:.0%} of the smallest budget"
    )


def _lrs(lrs) -> str:
    return ", ".join(f"{lr:.3g}" for lr in lrs)


def _reruns(seeds) -> str:
    if len(seeds) < 2:
        return "best point not re-run"
    return f"best point re-run with seeds {', '.join(str(s) for s in seeds[1:])}"


def _wall_clock(study, preset) -> str:
    """The estimated wall-clock on this machine, and the model behind it."""
    import os

    from k3scale.sweep.planner import estimate_wall_s, measured_throughput

    if preset.gpus_per_trial > 0:
        return "wall-clock: not estimated (no measured throughput of GPU trials in the repository)"
    model = measured_throughput()
    if model is None:
        return "wall-clock: not estimated (no committed study results to fit a throughput model to)"
    import torch

    from k3scale.commands.output import at_place
    from k3scale.train.perf import measure_matmul_peak

    torch.set_num_threads(preset.threads_per_trial)
    peak = measure_matmul_peak(torch.float32)
    slots = max(1, (os.cpu_count() or 1) // preset.threads_per_trial)
    minutes = estimate_wall_s(study, preset, model, peak, slots) / 60
    return (
        f"wall-clock: about {at_place(minutes, math.floor(math.log10(minutes)))} min on this "
        f"machine ({slots} trials at a time)\n  model: seconds per trial = tokens x (a + F/R + "
        f"c N/B) + {model.trial_overhead_s:.1f} s, F = FLOPs per token, N = parameters, B = "
        "tokens per step, per arch ("
        + ", ".join(
            f"{arch}: a {model.per_token_s[arch] * 1e6:.0f} us, R "
            f"{model.flops_per_s[arch] / 1e9:.0f} GFLOP/s, c {model.step_s_per_param[arch]:.2g} s"
            for arch in sorted(model.per_token_s)
        )
        + f") fitted to {model.num_runs} committed runs in {_relative(model.source)}, scaled by their "
        f"fp32 matmul peak {model.peak_flops / 1e9:.0f} GFLOP/s over this machine's, "
        f"{peak / 1e9:.0f} GFLOP/s on {preset.threads_per_trial} thread(s), measured now"
    )


def _relative(path: str) -> str:
    import os

    return os.path.relpath(path)


def _submit(args) -> int:
    from pathlib import Path

    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from k3scale.sweep.declaration import load_study

    study = load_study(args.study)
    study.preset(args.preset)
    command = [
        "k3scale",
        "study",
        "run",
        args.study,
        "--preset",
        args.preset,
        "--data-root",
        args.data_root,
    ]
    for flag, value in (
        ("--dataset", args.dataset),
        ("--tracking-uri", args.tracking_uri),
        ("--storage", args.storage),
        ("--study-dir", args.study_dir),
    ):
        if value:
            command += [flag, value]
    try:
        client = JobSubmissionClient(args.address)
    except AuthenticationError as exc:
        raise K3ScaleError(_refused(args.address, exc)) from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise K3ScaleError(f"cannot reach the Ray dashboard at {args.address}: {first}") from None
    job_id = client.submit_job(
        entrypoint=" ".join(command),
        runtime_env={
            "working_dir": str(Path.cwd()),
            "env_vars": job_env(),
            "excludes": [".venv", "studies", "data_cache", ".git", "runs"],
        },
    )
    print(f"submitted {study.name} ({args.preset}) as Ray job {job_id}")
    print(f"follow it:  ray job logs --follow {job_id} --address {args.address}")
    print(f"its state:  ray job status {job_id} --address {args.address}")
    return 0


def _refused(address: str, exc: Exception) -> str:
    """One line for a dashboard that wants Ray's token: Ray's own message spans paragraphs."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (
        f"the Ray dashboard at {address} refused this client: {first} (the cluster runs with "
        "token authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to a file "
        "holding its token)"
    )


def job_env() -> dict[str, str]:
    """Environment of a submitted study's job. No RAY_AUTH_* variable: the job runs under the
    cluster's own auth mode and token, and this client reaches the cluster with the mode and
    token of the caller's environment (Ray's RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH), never with
    auth turned off on its behalf. The caller's MLflow credentials (MLFLOW_TRACKING_USERNAME,
    MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN) go with the job, so its trials log as the
    caller on every node; like any runtime env they are visible to holders of the Ray token."""
    from k3scale.track.sending import credentials_env

    return {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", **credentials_env()}


def _status(args) -> int:
    import json

    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.folder import STUDY_JSON, UTILIZATION_MEANS
    from k3scale.sweep.status import study_status

    study = load_study(args.study)
    preset = study.preset(args.preset)
    folder = study_folder(study.name, args.preset, args.study_dir)
    storage = args.storage or f"sqlite:///{(folder / 'optuna.db').resolve()}"
    if not args.storage and not (folder / "optuna.db").exists():
        raise K3ScaleError(
            f"no study at {folder} (run `k3scale study run {args.study} --preset {args.preset}`)"
        )
    print(study_status(study, preset, storage))
    record = folder / STUDY_JSON
    data = json.loads(record.read_text()) if record.exists() else {}
    if "utilization" in data:
        # The MLflow URL of a finished run points at a server that has stopped: not printed.
        print(
            f"last completed run: {_trial_counts(data['trials'])}, utilization "
            f"{data['utilization']:.2f} {UTILIZATION_MEANS}, wall {data['wall_s'] / 60:.1f} min; browse its runs with "
            f"`k3scale ui --study-dir {folder}`"
        )
    return 0


def study_folder(study_name: str, preset: str, study_dir: str | None) -> Path:
    """The folder `status` and `report` read: --study-dir, else `study run`'s default, else the
    one the main job makes at this commit (`studies/<study>-<preset>-<commit>`, scripts/main.sh).

    Raises:
        K3ScaleError: the folder's study.json names another preset (its cells are not these).
    """
    import json

    from k3scale.sweep.folder import STUDY_JSON, default_study_dir
    from k3scale.track.provenance import git_state

    folder = Path(study_dir) if study_dir else default_study_dir(study_name, preset)
    if not study_dir and not folder.exists():
        versioned = folder.with_name(f"{folder.name}-{git_state()[0][:COMMIT_CHARS]}")
        folder = versioned if versioned.exists() else folder
    if not folder.is_dir():
        raise K3ScaleError(_no_folder(study_name, preset, folder))
    record = folder / STUDY_JSON
    ran = json.loads(record.read_text()).get("preset") if record.exists() else None
    if ran is not None and ran != preset:
        raise K3ScaleError(
            f"{folder} holds the {ran!r} preset of {study_name}, not {preset!r}: pass --preset {ran}"
        )
    return folder


def _no_folder(study_name: str, preset: str, folder: Path) -> str:
    """What to do when the study folder is not there: the folders that do hold this study."""
    found = study_folders(study_name)
    where = (
        "folders of this study here: " + ", ".join(f"{f} ({p})" for f, p in found)
        if found
        else "no folder here holds this study"
    )
    return (
        f"no {study_name} study with preset {preset!r} at {folder}; {where}. Pass --study-dir "
        f"and --preset for one of those, or run `k3scale study run <study file> --preset {preset}`"
    )


def study_folders(study_name: str) -> list[tuple[Path, str]]:
    """Each folder under studies/ and analysis/results/ whose study.json names this study, with
    its preset."""
    import json

    from k3scale.sweep.folder import STUDY_JSON

    out = []
    for root in (Path("studies"), Path("analysis") / "results"):
        for record in sorted(root.glob(f"*/{STUDY_JSON}")):
            try:
                doc = json.loads(record.read_text())
            except (OSError, ValueError):
                continue
            if doc.get("study") == study_name:
                out.append((record.parent, str(doc.get("preset"))))
    return out


def _trial_counts(trials: dict) -> str:
    return ", ".join(f"{trials.get(k, 0)} {k}" for k in ("finished", "failed", "diverged"))


def _report(args) -> int:
    import json

    from k3scale.bench.power import design_power
    from k3scale.ops.kernel_path import KernelPath
    from k3scale.scaling.answers import answer_lines, answers_markdown
    from k3scale.scaling.headline import headline_lines, markdown_tables, rerun_text
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.folder import STUDY_JSON, UTILIZATION_MEANS

    study = load_study(args.study)
    study.preset(args.preset)  # a misspelt preset is named before any folder is looked for
    folder = study_folder(study.name, args.preset, args.study_dir)
    fit_path, page = folder / "fit.json", folder / "dashboard.html"
    if not fit_path.exists():
        raise K3ScaleError(_no_fit(study, args, folder, fit_path))
    doc = json.loads(fit_path.read_text())
    if args.markdown:
        print(answers_markdown(doc) + markdown_tables(doc), end="")
        return 0
    record = json.loads((folder / STUDY_JSON).read_text()) if (folder / STUDY_JSON).exists() else {}
    print(f"== {study.name} ({args.preset}): {study.description}")
    if "utilization" in record:
        print(
            f"trials: {_trial_counts(record['trials'])}; utilization "
            f"{record['utilization']:.2f} {UTILIZATION_MEANS}, sweep {record['sweep_s'] / 60:.1f} min"
        )
    if path := record.get("kernel_path"):
        print(f"kernel path: {KernelPath(**path).describe()}")
    for line in answer_lines(doc) or ["no comparison in this fit"]:
        print(f"ANSWER: {line}")
    if power := design_power(study.name, args.preset):
        print(power)
    if args.brief:
        check = doc.get("results", {}).get("rerun_check")
        print(rerun_text(check) if check else "re-runs: none in this fit")
    else:
        for line in headline_lines(doc):
            print(line)
    if page.exists():
        print(f"dashboard: {page.resolve()}  (open it in a browser; works offline)")
    if args.brief:
        if (folder / "mlflow").exists():
            print(f"browse runs: k3scale ui --study-dir {folder}")
        return 0
    _log_summary(folder, study.name, args.preset, args.tracking_uri)
    print(f"browse runs: k3scale ui --study-dir {folder}")
    return 0


def _no_fit(study, args, folder: Path, fit_path: Path) -> str:
    """The fix for a folder without fit.json: fit its tables, or finish the study first."""
    from k3scale.sweep.folder import STUDY_JSON, TABLES

    tables = folder / TABLES
    fit = f"`k3scale fit {study.analysis or study.name} --from {tables} --out {fit_path}`"
    if (tables / "runs.parquet").exists():
        return f"no {fit_path}: fit the study's tables first with {fit}"
    state = "has no study.json" if not (folder / STUDY_JSON).exists() else "has no tables yet"
    return (
        f"no {fit_path}: {folder} {state}; `k3scale study run {args.study} --preset "
        f"{args.preset} --study-dir {folder}` runs (or resumes) the study, then {fit} fits it"
    )


def _log_summary(folder, study_name: str, preset: str, tracking_uri: str | None) -> None:
    """fit.json and the dashboard as artifacts of the study's summary run in MLflow; the report
    itself never fails for want of a server."""
    import sys

    from k3scale.sweep.tracking import log_study_summary, summary_experiment
    from k3scale.track.server import study_store

    if tracking_uri is None and not study_store(folder).db_path.exists():
        # A folder of exported results (analysis/results) has no MLflow store; none is created.
        print(f"fit and dashboard not logged to MLflow: {folder} has no MLflow store")
        return
    try:
        run_id = log_study_summary(folder, study_name, preset, tracking_uri, log=lambda _: None)
    except K3ScaleError as exc:
        print(f"fit and dashboard not logged to MLflow: {exc}", file=sys.stderr)
        return
    print(f"MLflow: fit.json and dashboard in run {run_id} of {summary_experiment(study_name)!r}")
