"""The sweep driver: the only Optuna writer; ask, launch a Ray task, tell, across all cells.

It keeps every slot busy (cheap cells first, the least-served cell next so none starves), shares
WSD trunks across budgets, re-runs each cell's best point with more seeds and runs the shared
(LR, batch) arm once a cell's tuning is done. A preset with an LR grid runs the grid's points in
every cell and extends the grid while a cell's best sits at an end. Killed at any moment and
restarted with the same command, it resumes from the Optuna storage: finished trials are never
rerun, and trials left RUNNING are launched again (their runs resume from their checkpoints).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from k3scale.config import config_hash
from k3scale.errors import TrackingUnreachableError
from k3scale.sweep import sources
from k3scale.sweep.declaration import LRGrid, Study, StudyPreset
from k3scale.sweep.ledger import StudyLedger
from k3scale.sweep.planner import Cell, plan_cells, runs_shared_arm, trial_config
from k3scale.sweep.progress import Progress, Stall
from k3scale.sweep.reuse import ReusableRun, copy_run, ended_runs, run_result
from k3scale.track import schema
from k3scale.track.heartbeat import read_beat, stall_after_s

# What a diverged trial is told: worse than any trained model, but finite so TPE stays sane.
DIVERGED_OBJECTIVE = 50.0
# Relaunches of a trial whose run could not reach MLflow before training (the server died
# between the driver's check and the run's start); each one follows a fresh server check.
MAX_TRACKING_RELAUNCHES = 3
# How long the driver waits for an MLflow server it does not own to answer again (seconds).
TRACKING_OUTAGE_S = 300.0
# Ray's auth mode is not set here: a trial's process has the mode of the Ray that started it.
_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}


def failure_text(exc: BaseException) -> str:
    """What failed, in one line: a Ray task error's own cause (its first line is Ray's
    traceback header, which names no reason)."""
    cause = getattr(exc, "cause", None) or exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first[:300]}"


@dataclass(frozen=True, kw_only=True)
class SweepContext:
    study: Study
    preset: StudyPreset
    study_dir: Path
    storage: str
    tracking_uri: str
    data_root: str
    dataset: str = "english_mix"
    reuse: dict[str, ReusableRun] = field(default_factory=dict)
    """Config hash -> a run of another study this one reuses instead of training it."""


@dataclass
class _Job:
    """One in-flight Ray task and the trials it will tell."""

    ref: Any
    params: dict
    tells: list[tuple[StudyLedger, optuna.trial.Trial | None, int, Cell]]
    label: str
    started: float
    relaunch: Callable[[], None] | None = None
    relaunches: int = 0
    # The run folders its task trains in (a WSD trunk's branches too): where it beats.
    folders: tuple[Path, ...] = ()


@dataclass
class _Counters:
    finished: int = 0
    failed: int = 0
    diverged: int = 0
    busy_s: float = 0.0
    tokens: int = 0
    launched: int = 0
    reused: int = 0
    run_ids: list[str] = field(default_factory=list)
    timings: list[dict[str, float]] = field(default_factory=list)
    """Per finished task, `task_timing`: where its slot's time went."""


# Phases of a run's time (RunResult.time_s); steps are the training, the rest its fixed cost.
RUN_PHASES = ("setup", "steps", "eval", "track", "checkpoint")


def task_timing(output: dict, slot_s: float) -> dict[str, float]:
    """Where one task's slot time went: `slot_s` from launch to the driver seeing the result
    (worker start, transfers and the driver's own turn included), the worker's `busy_s` (imports
    included) and `import_s`, and per phase summed over the task's runs (`RunResult.time_s`).
    `overhead_s` = slot time minus training-step time: the trial's fixed cost."""
    runs = [r.get("time_s") or {} for r in output["results"].values()]
    phases = {f"{k}_s": sum(r.get(k, 0.0) for r in runs) for k in RUN_PHASES}
    return {
        "slot_s": slot_s,
        "busy_s": float(output["busy_s"]),
        "import_s": float(output.get("import_s", 0.0)),
        **phases,
        "runs": float(len(runs)),
        "overhead_s": slot_s - phases["steps_s"],
    }


class Driver:
    """Runs one study to completion on an initialised Ray."""

    def __init__(self, ctx: SweepContext, slots: int, log=print, tracking=None) -> None:
        self.ctx = ctx
        self.tracking = tracking
        self.slots = max(1, slots)
        self.log = log
        self.cells = plan_cells(ctx.study, ctx.preset)
        seed, sampled = ctx.preset.seeds[0], ctx.preset.lr_grid is None
        objective = f"final_{ctx.study.objective}"
        # Ledgers: the driver is the only writer, so reads between its writes come from memory.
        self.tuning = {
            c.key: StudyLedger(
                sources.open_cell_study(ctx.storage, c, seed, sampled, metric=objective), log
            )
            for c in self.cells
        }
        # A cell's study of extra runs is made when its first run is queued (optuna-dashboard
        # listed an empty one per cell otherwise); a resumed driver reopens those that exist.
        self.objective = objective
        made = sources.study_names(ctx.storage)
        self.extra = {
            c.key: self._open_extra(c) for c in self.cells if sources.extra_name(c) in made
        }
        self.jobs: list[_Job] = []
        self.counters = _Counters()
        self.extras_queued: set[str] = set()
        self.logged = finished_runs_by_hash(ctx.tracking_uri, ctx.study.name)
        self.progress = Progress(self.cells, ctx.preset.planned_trials_per_cell, log)
        import ray

        self._remote = ray.remote(_run_payload_entry).options(
            num_cpus=ctx.preset.threads_per_trial,
            num_gpus=ctx.preset.gpus_per_trial,
            max_retries=ctx.preset.max_retries,
            retry_exceptions=False,
        )

    def run(self) -> _Counters:
        """Launch, wait and tell until no work is left."""
        self._enqueue_grids()
        self._relaunch_stale()
        while True:
            self._extend_grids()
            self._enqueue_extras()
            started = False
            while len(self.jobs) < self.slots and self._launch_next():
                started = True
            if not self.jobs and not started:
                break
            if not self.jobs:
                # Every trial started was told at once (reused, or found in MLflow): their
                # cells may be tuned now, with extra runs to queue.
                continue
            if self.progress.due():
                self._print_progress()
            self._wait_one()
        self._print_progress()
        return self.counters

    # -- choosing work -------------------------------------------------------------------------

    def _launch_next(self) -> bool:
        for cell in sorted(self.cells, key=self._served):
            if self._launch_extra(cell) or self._launch_tuning(cell):
                return True
        return False

    def _served(self, cell: Cell) -> tuple[int, int]:
        """Least-served cells first; ties go to the cheaper cell (cells are cost-sorted)."""
        study = self._driving_study(cell)
        return (
            sources.count(study, TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING),
            self.cells.index(cell),
        )

    def _driving_study(self, cell: Cell) -> StudyLedger:
        return self.tuning[self._trunk_cell(cell).key]

    def _trunk_cell(self, cell: Cell) -> Cell:
        """The largest-budget WSD cell of the same (arch, size) when trunks are shared."""
        if cell.schedule != "wsd" or not self.ctx.preset.share_wsd_trunks:
            return cell
        return Cell(
            arch=cell.arch,
            size=cell.size,
            budget_tokens=max(self.ctx.preset.budgets_for(cell.size)),
            schedule="wsd",
        )

    def _launch_tuning(self, cell: Cell) -> bool:
        if self._trunk_cell(cell) != cell:
            return False
        study = self.tuning[cell.key]
        if self.ctx.preset.lr_grid is not None:
            # Grid cells run only what was queued: the grid's points and its extensions.
            if not sources.count(study, TrialState.WAITING):
                return False
        elif (
            sources.count(study, TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
            >= self.ctx.preset.trials_per_cell
        ):
            return False
        trial = study.ask(sources.tuning_distributions(self.ctx.preset))
        self._launch(cell, study, trial, sources.TUNED)
        return True

    def _open_extra(self, cell: Cell) -> StudyLedger:
        study = sources.open_extra_study(self.ctx.storage, cell, metric=self.objective)
        return StudyLedger(study, self.log)

    def _extra_study(self, cell: Cell) -> StudyLedger:
        if cell.key not in self.extra:
            self.extra[cell.key] = self._open_extra(cell)
        return self.extra[cell.key]

    def _launch_extra(self, cell: Cell) -> bool:
        study = self.extra.get(cell.key)
        if study is None or not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return False
        trial = study.ask(sources.extra_distributions(self.ctx.preset))
        self._launch(cell, study, trial, trial.params["arm"])
        return True

    def _relaunch_stale(self) -> None:
        for cell in self.cells:
            for group in (self.tuning, self.extra):
                if cell.key not in group:
                    continue
                for trial in sources.stale_running(group[cell.key]):
                    arm = trial.params.get("arm", sources.TUNED)
                    self.log(
                        f"resuming {cell.key} trial {trial.number} (left running by a previous driver)"
                    )
                    self._launch(cell, group[cell.key], trial, arm)

    def _enqueue_grids(self) -> None:
        """Queue the grid's points in every driving study (a branch cell gets its trunk's)."""
        if self.ctx.preset.lr_grid is None:
            return
        for cell in self.cells:
            if self._trunk_cell(cell) == cell:
                sources.enqueue_grid(self.tuning[cell.key], self._grid(cell))

    def _extend_grids(self) -> None:
        """Queue an LR beyond each grid end that holds a cell's best, once its trials are in."""
        if self.ctx.preset.lr_grid is None:
            return
        for cell in self.cells:
            if self._trunk_cell(cell) != cell or cell.key in self.extras_queued:
                continue
            for lr in self._grid_extensions(cell) or ():
                self.log(f"{cell.key}: best LR at an end of the grid tried so far; adding {lr:.3g}")
                sources.enqueue_lr(self.tuning[cell.key], lr, self._grid(cell))

    def _grid(self, cell: Cell) -> LRGrid:
        return self.ctx.preset.lr_grid.for_size(cell.size)

    def _grid_extensions(self, driving: Cell) -> list[float] | None:
        """None while `driving`'s trials run or wait; else the LRs its grid still needs, judged
        on every budget its trials report to (a shared WSD trunk's branches included)."""
        study = self.tuning[driving.key]
        if sources.count(study, TrialState.RUNNING, TrialState.WAITING):
            return None
        budgets = [self.tuning[c.key] for c in self.cells if self._trunk_cell(c) == driving]
        return sources.grid_extensions(study, budgets, self._grid(driving))

    def _enqueue_extras(self) -> None:
        """Once a cell is tuned: its best point with the other seeds, and the shared arm."""
        preset, study = self.ctx.preset, self.ctx.study
        baseline = study.schedules_of(preset)[0]
        for cell in self.cells:
            if cell.key in self.extras_queued or not self._tuning_done(cell):
                continue
            self.extras_queued.add(cell.key)
            best = sources.best_params(self.tuning[cell.key])
            if best is None:
                continue
            for seed in preset.seeds[1:]:
                sources.enqueue_extra(self._extra_study(cell), best, seed, sources.SEED)
            if runs_shared_arm(study, preset) and cell.schedule == baseline:
                for other in self.cells:
                    if other.schedule != baseline and (
                        other.arch,
                        other.size,
                        other.budget_tokens,
                    ) == (cell.arch, cell.size, cell.budget_tokens):
                        sources.enqueue_extra(
                            self._extra_study(other), best, preset.seeds[0], sources.SHARED
                        )

    def _tuning_done(self, cell: Cell) -> bool:
        if self.ctx.preset.lr_grid is not None:
            # A trunk's budgets finish together: a later trunk trial may move any budget's best.
            return self._grid_extensions(self._trunk_cell(cell)) == []
        study = self.tuning[cell.key]
        if sources.count(study, TrialState.RUNNING, TrialState.WAITING):
            return False
        if self._trunk_cell(cell) != cell:
            study = self._driving_study(cell)
            if sources.count(study, TrialState.RUNNING):
                return False
        return (
            sources.count(study, TrialState.COMPLETE, TrialState.FAIL)
            >= self.ctx.preset.trials_per_cell
        )

    # -- launching and telling -----------------------------------------------------------------

    def _launch(
        self,
        cell: Cell,
        study: StudyLedger,
        trial: optuna.trial.Trial,
        arm: str,
        relaunches: int = 0,
    ) -> None:
        params, number = trial.params, trial.number
        seed = int(params.get("seed", self.ctx.preset.seeds[0]))
        trunk = (
            arm == sources.TUNED
            and cell.schedule == "wsd"
            and self._trunk_cell(cell) == cell
            and self.ctx.preset.share_wsd_trunks
            and len(self.ctx.preset.budgets_for(cell.size)) > 1
        )
        tag = f"{'e' if study.study_name.endswith('|extra') else 't'}{number:03d}"
        cfg = self._config(cell, params, seed, tag, arm)
        if not trunk and config_hash(cfg) in self.logged:
            # Trained before the driver died but never told: MLflow has its final metrics.
            self.log(f"{cell.key} trial {number}: finished run found in MLflow, not rerun")
            job = _Job(
                ref=None, params=dict(params), tells=[], label=f"{cell.key}#{number}", started=0.0
            )
            self._tell(study, trial, self.logged[config_hash(cfg)], job)
            return
        if self._reuse(cell, study, trial, cfg, trunk, (params, seed, tag, arm)):
            return
        payload: dict[str, Any] = {
            "config": _to_dict(cfg),
            "threads": self.ctx.preset.threads_per_trial,
            "env": _ENV,
        }
        tells = [(study, trial, cell.budget_tokens, cell)]
        if trunk:
            # Each branch is the straight run of its own cell (folder, name, tags), forked.
            branch_cells = self._branch_cells(cell)
            payload["branches"] = [
                _to_dict(self._config(c, params, seed, tag, arm)) for c in branch_cells
            ]
            tells += [(self.tuning[c.key], None, c.budget_tokens, c) for c in branch_cells]
        folders = [Path(payload["config"]["train"]["out_dir"])]
        folders += [Path(b["train"]["out_dir"]) for b in payload.get("branches", [])]
        ref = self._remote.remote(payload)
        self.counters.launched += 1
        self.jobs.append(
            _Job(
                ref=ref,
                params=dict(params),
                tells=tells,
                label=f"{cell.key}#{number}",
                started=time.time(),
                relaunch=lambda: self._launch(cell, study, trial, arm, relaunches + 1),
                relaunches=relaunches,
                folders=tuple(folders),
            )
        )

    def _branch_cells(self, cell: Cell) -> list[Cell]:
        """The WSD cells whose runs fork from `cell`'s trunk (its size's other budgets)."""
        return [
            Cell(arch=cell.arch, size=cell.size, budget_tokens=b, schedule="wsd")
            for b in self.ctx.preset.budgets_for(cell.size)
            if b != cell.budget_tokens
        ]

    def _reuse(self, cell: Cell, study, trial, cfg, trunk: bool, spec: tuple) -> bool:
        """Copy and tell the runs of another study this trial would train (a trunk: only when
        every branch is there too); False when any is missing."""
        if not self.ctx.reuse:
            return False
        # Here, not at the top: the driver process does not load torch otherwise.
        from k3scale.train.branching import trunk_config

        params, seed, tag, arm = spec
        branches = self._branch_cells(cell) if trunk else []
        configs = [self._config(c, params, seed, tag, arm) for c in branches]
        budgets = [cfg.train.budget_tokens, *(b.train.budget_tokens for b in configs)]
        trained = trunk_config(cfg, budgets) if trunk else cfg
        found = [self.ctx.reuse.get(config_hash(c)) for c in (trained, *configs)]
        if not all(found):
            return False
        job = _Job(ref=None, params=dict(params), tells=[], label=f"{cell.key}#{tag}", started=0.0)
        first = copy_run(found[0], cfg)
        self.log(f"{cell.key} trial {trial.number}: reused {found[0].origin}, not trained")
        lineage = {schema.TAG_TRUNK_RUN_ID: first["run_id"]}
        lineage[schema.MLFLOW_PARENT_RUN_ID] = first["run_id"]
        for branch, source, branch_cfg in zip(branches, found[1:], configs, strict=True):
            result = copy_run(source, branch_cfg, lineage)
            self._tell(self.tuning[branch.key], None, result, job, trained=False)
        self._tell(study, trial, first, job, trained=False)
        return True

    def _config(self, cell: Cell, params: dict, seed: int, tag: str, arm: str):
        return trial_config(
            self.ctx.study,
            self.ctx.preset,
            cell,
            lr=float(params["lr"]),
            batch_size=int(params["batch_size"]),
            seed=seed,
            out_dir=str(self.ctx.study_dir / "runs" / cell.slug / tag),
            data_root=self.ctx.data_root,
            dataset=self.ctx.dataset,
            # A server that died mid-study is restarted (or waited for) before a trial starts.
            tracking_uri=self.tracking.ensure_up() if self.tracking else self.ctx.tracking_uri,
            tags={schema.TAG_TRIAL: f"{cell.key}#{tag}", schema.TAG_ARM: arm},
            study_dir=str(self.ctx.study_dir),
        )

    def _wait_one(self) -> None:
        import ray

        # Bounded, so the progress line (and a stalled trial's name) keeps coming while all
        # running trials are busy or stuck.
        ready, _ = ray.wait(
            [job.ref for job in self.jobs], num_returns=1, timeout=self.progress.interval
        )
        if not ready:
            return
        job = next(j for j in self.jobs if j.ref == ready[0])
        self.jobs.remove(job)
        try:
            output = ray.get(job.ref)
        except Exception as exc:
            if (
                isinstance(exc, TrackingUnreachableError)
                and job.relaunches < MAX_TRACKING_RELAUNCHES
            ):
                # Nothing was trained: check (or restart) the server and run the trial again.
                self.log(
                    f"trial {job.label} could not reach MLflow before training: relaunching it"
                )
                if self.tracking is None:
                    self._wait_for_tracking()
                job.relaunch()
                return
            self.log(f"trial {job.label} failed: {failure_text(exc)}")
            for study, trial, _, _ in job.tells:
                if trial is not None:
                    study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            self.counters.failed += 1
            return
        self.counters.busy_s += float(output["busy_s"])
        self.counters.timings.append(task_timing(output, time.time() - job.started))
        for study, trial, budget, _ in job.tells:
            self._tell(study, trial, output["results"][str(budget)], job)

    def _wait_for_tracking(self) -> None:
        """A server this driver does not own (a cluster's) cannot be restarted from here: give
        it up to TRACKING_OUTAGE_S to answer again (a restart, a deploy) before relaunching."""
        from k3scale.track.server import server_answers

        deadline = time.monotonic() + TRACKING_OUTAGE_S
        while not server_answers(self.ctx.tracking_uri):
            if time.monotonic() > deadline:
                return  # the relaunch fails again, and the trial with it after a few
            self.log(f"waiting for the MLflow server at {self.ctx.tracking_uri}")
            time.sleep(10.0)

    def _tell(self, study, trial, result: dict, job: _Job, trained: bool = True) -> None:
        objective = result["final_" + self.ctx.study.objective]
        diverged = result["status"] == schema.STATUS_DIVERGED
        value = DIVERGED_OBJECTIVE if diverged or not math.isfinite(objective) else objective
        self.counters.tokens += int(result["tokens"]) if trained else 0
        self.counters.reused += not trained
        self.counters.run_ids.append(result["run_id"])
        self.counters.diverged += diverged
        self.counters.finished += not diverged
        if trial is None:
            # A WSD branch: the trunk's point, evaluated at this budget, joins this cell's study.
            study.add_trial(
                optuna.trial.create_trial(
                    params={k: job.params[k] for k in ("lr", "batch_size")},
                    distributions=sources.tuning_distributions(self.ctx.preset),
                    value=value,
                    user_attrs=_attrs(result),
                )
            )
            return
        study.set_user_attrs(trial, _attrs(result))
        study.tell(trial, value, skip_if_finished=True)

    def trial_totals(self) -> dict[str, int]:
        """Finished, diverged and failed results over the whole study (this and earlier drivers),
        from the Optuna storage: what study.json records and the exit code reports."""
        totals = {"finished": 0, "diverged": 0, "failed": 0}
        for study in (*self.tuning.values(), *self.extra.values()):
            for trial in study.get_trials(deepcopy=False):
                if trial.state == TrialState.FAIL:
                    totals["failed"] += 1
                elif trial.state == TrialState.COMPLETE:
                    diverged = trial.user_attrs.get("status") == schema.STATUS_DIVERGED
                    totals["diverged" if diverged else "finished"] += 1
        return totals

    def _trial_counts(self) -> tuple[int, int]:
        """(ended, planned) tuning trials over all cells (WSD branches count in their cells)."""
        per_cell = self.ctx.preset.planned_trials_per_cell
        ended = planned = 0
        for c in self.cells:
            study = self.tuning[c.key]
            done = sources.count(study, TrialState.COMPLETE, TrialState.FAIL)
            # Grid extensions join the plan once queued, so the ETA counts them while they run.
            queued = done + sources.count(study, TrialState.RUNNING, TrialState.WAITING)
            ended += done
            planned += max(per_cell, queued)
        return ended, planned

    def _print_progress(self) -> None:
        self.progress.print(
            self._best_by_cell(),
            len(self.jobs),
            self._trial_counts(),
            self._extra_counts(),
            stalled=[stall for job in self.jobs if (stall := job_stall(job, time.time()))],
        )

    def _extra_counts(self) -> tuple[int, int]:
        """(ended, queued so far) seed re-runs and shared-arm runs; queued as cells finish tuning."""
        ended = queued = 0
        for study in self.extra.values():
            trials = study.get_trials(deepcopy=False)
            queued += len(trials)
            ended += sum(t.state in (TrialState.COMPLETE, TrialState.FAIL) for t in trials)
        return ended, queued

    def _best_by_cell(self) -> dict[str, float | None]:
        best = {}
        for cell in self.cells:
            done = self.tuning[cell.key].get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            best[cell.key] = min((t.value for t in done), default=None)
        return best


def job_stall(job: _Job, now: float) -> Stall | None:
    """The job's stall, if no folder of it has beaten (nor has it started) within its limit."""
    beats = [b for b in (read_beat(folder) for folder in job.folders) if b is not None]
    last = max(beats, key=lambda b: b.time, default=None)
    # A resumed trial's folder holds its previous attempt's beat: the launch is newer then.
    alive_at = max(job.started, last.time if last else 0.0)
    if now - alive_at <= stall_after_s(last):
        return None
    doing = last.doing if last and last.time >= job.started else "starting (no heartbeat yet)"
    return Stall(job.label, now - alive_at, doing)


def finished_runs_by_hash(tracking_uri: str, experiment: str) -> dict[str, dict]:
    """Final results of the experiment's ended runs in MLflow, keyed by config hash."""
    return {r["config_hash"]: r for r in map(run_result, ended_runs(tracking_uri, experiment))}


def _attrs(result: dict) -> dict[str, Any]:
    keys = (
        "run_id",
        "status",
        "config_hash",
        "out_dir",
        "tokens",
        "final_val_ood_loss",
        "final_val_id_loss",
    )
    return {k: result[k] for k in keys}


def _to_dict(cfg) -> dict:
    from k3scale.config import to_dict

    return to_dict(cfg)


def _run_payload_entry(payload: dict) -> dict:
    from k3scale.sweep.worker import run_payload

    return run_payload(payload)


def default_slots(preset: StudyPreset) -> int:
    """Trials at once on this machine: cores / threads per trial."""
    return max(1, (os.cpu_count() or 1) // max(1, preset.threads_per_trial))
