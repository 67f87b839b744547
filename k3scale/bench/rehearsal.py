"""The cluster path rehearsed on one machine (issue 22): real parts, a node lost mid-study.

`k3scale study submit` sends a study to a Ray cluster whose trials log to an MLflow server and
whose Optuna storage is a PostgreSQL database. This builds that cluster from the real programs,
each its own process on 127.0.0.1 (`k3scale.bench.local_cluster`):

- PostgreSQL (`LocalPostgres`): a database for each study's Optuna storage, one for MLflow;
- `mlflow server` on that backend with basic authentication, artifacts served from a folder
  every node reaches (the stand-in for a shared filesystem); the trials log as a non-admin
  user whose credentials travel in the environment (MLFLOW_TRACKING_USERNAME/PASSWORD);
- Ray: a head (no CPUs: it runs the jobs' drivers, not trials) and `workers` worker nodes of
  one CPU each, every one a `ray start --block` process, with Ray's token authentication.

It submits the smoke preset of both flagship studies as Ray Jobs and, while they run, kills the
worker node running a trial (its `ray start`, raylet, agents and workers, by pid), then restarts
the MLflow server, then PostgreSQL. Then it counts, per study: trials expected (the plan),
finished (Optuna and MLflow), duplicated and lost; checks that the lost node's trial was retried
(attempt 2 in its MLflow tags) and that requests without credentials are refused by MLflow and
by Ray; and exports each study's tables from the server, stops it, and refits and renders the
dashboard from the tables alone.

    python -m k3scale.bench.rehearsal --out rehearsal.json    (scripts/cluster_rehearsal.sh)

Everything lives in a temporary folder and every process it starts is stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from k3scale.bench.local_cluster import (
    ROOT,
    START_TIMEOUT_S,
    AuthMlflow,
    RayCluster,
    environment,
    wait_for,
)
from k3scale.bench.local_postgres import LocalPostgres
from k3scale.errors import K3ScaleError

JOB_TIMEOUT_S = 1800.0
TERMINAL = ("FAILED", "STOPPED", "SUCCEEDED")
# The offline refit of a study whose job failed: not attempted.
NOT_REFITTED = {
    "fit_exit": None,
    "dashboard_exit": None,
    "dashboard_bytes": 0,
    "said": "job failed",
}
# The flagship studies (experiments/NAME.py), each at its smoke preset, and their analyses.
STUDIES = ("cosine_vs_wsd", "k2_vs_k3")
PRESET = "smoke"
JOB_POLL_S = 10.0
JOB_QUERY = (
    "import sys\n"
    "from ray.job_submission import JobSubmissionClient\n"
    "client = JobSubmissionClient(sys.argv[1])\n"
    "print(client.get_job_status(sys.argv[2]).value)\n"
    "sys.stdout.write(client.get_job_logs(sys.argv[2]) if sys.argv[3] == '1' else '')\n"
)


def _attempts(root: Path) -> dict[Path, list[dict]]:
    """Every trial folder's attempts (k3scale/sweep/worker.py writes one line per attempt)."""
    out = {}
    for path in root.rglob("attempts.jsonl"):
        with contextlib.suppress(OSError, ValueError):
            out[path.parent] = [json.loads(line) for line in path.read_text().splitlines()]
    return out


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "k3scale.cli", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)


class Rehearsal:
    """The whole rehearsal; `run()` returns its report (a dict) and stops everything it started."""

    def __init__(self, workers: int = 2, log=print) -> None:
        self.workers, self.log = workers, log
        self.folder = Path(tempfile.mkdtemp(prefix="k3scale-rehearsal-"))
        self.shared = self.folder / "shared"  # what every node mounts
        self.report: dict = {"folder": str(self.folder), "events": [], "studies": {}}
        self.started = time.monotonic()
        self._jobs_checked = 0.0

    def event(self, text: str) -> None:
        at = round(time.monotonic() - self.started, 1)
        self.report["events"].append({"t_s": at, "event": text})
        self.log(f"[{at:7.1f} s] {text}")

    def run(self) -> dict:
        with contextlib.ExitStack() as stack:
            self.shared.mkdir()
            databases = ("mlflow", *(f"optuna_{name}" for name in STUDIES))
            postgres = stack.enter_context(LocalPostgres(databases=databases))
            self.event(f"PostgreSQL on 127.0.0.1:{postgres.port}: {', '.join(databases)}")
            mlflow = AuthMlflow(
                self.folder, postgres.url("mlflow", "postgresql+psycopg"), self.shared / "artifacts"
            )
            stack.callback(mlflow.stop)
            mlflow.start()
            mlflow.create_user()
            self.event(f"MLflow with basic auth at {mlflow.url}, study user {mlflow.user[0]}")
            self.report["mlflow_refusals"] = mlflow.refusals()
            cluster = RayCluster(self.folder, self.workers)
            stack.callback(cluster.stop)
            cluster.start()
            self.event(f"Ray head + {self.workers} worker nodes, token auth, {cluster.dashboard}")
            self.report["ray_refusal"] = cluster.refusal_without_token(
                ROOT / "experiments" / f"{STUDIES[0]}.py"
            )
            data_root = self._data()
            env = {**cluster.env(), **mlflow.credentials()}
            jobs = {}
            for name in STUDIES:
                storage = postgres.url(f"optuna_{name}")
                jobs[name] = self._submit(name, cluster, mlflow, storage, data_root)
                # One at a time: two jobs unpacking the same working_dir at once on one machine
                # raced (the second driver died on a FileNotFoundError before it started).
                self._wait_started(name)
            self._disrupt(cluster, mlflow, postgres, jobs)
            for name, job in jobs.items():
                status, logs = self._wait_job(cluster, job)
                (self.folder / f"job-{name}.log").write_text(logs)
                self.event(f"{name}: job {job} ended {status}")
                self.report["studies"][name] = {
                    "job": {"id": job, "status": status, "log_tail": logs[-2000:]},
                    "optuna": self._optuna_counts(postgres.url(f"optuna_{name}")),
                }
            with environment({**os.environ, **mlflow.credentials()}):
                for name in STUDIES:
                    self.report["studies"][name]["mlflow"] = self._mlflow_counts(mlflow.url, name)
            # A failed job may have logged nothing to export: its report (with the end of its
            # job's log) says why, where a failed export would hide it.
            tables = {
                name: self._export(name, mlflow.url, env)
                for name in STUDIES
                if self.report["studies"][name]["job"]["status"] == "SUCCEEDED"
            }
            mlflow.stop()
            self.event("MLflow server stopped for good; refitting from the exported tables")
            for name in STUDIES:
                offline = self._offline(name, tables[name]) if name in tables else NOT_REFITTED
                self.report["studies"][name]["offline"] = offline
            self.report["ok"] = self._verdict()
        self.report["wall_s"] = round(time.monotonic() - self.started, 1)
        return self.report

    # -- the studies -----------------------------------------------------------------------------

    def _data(self) -> Path:
        from k3scale.data.sample import prepare_sample

        data_root = self.shared / "data"
        prepare_sample(data_root, vocab_size=512)
        return data_root

    def _submit(
        self, name: str, cluster: RayCluster, mlflow: AuthMlflow, storage: str, data_root: Path
    ) -> str:
        args = [
            "study", "submit", f"experiments/{name}.py", "--preset", PRESET,
            "--address", cluster.dashboard,
            "--tracking-uri", mlflow.url,
            "--storage", storage,
            "--study-dir", str(self.shared / "studies" / name),
            "--data-root", str(data_root),
            "--dataset", "sample",
        ]  # fmt: skip
        env = {**cluster.env(), **mlflow.credentials()}
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            done = _cli(*args, env=env)
            # The dashboard answers before the head's job agent does; Ray says to retry.
            if "No available agent" not in done.stderr or time.monotonic() > deadline:
                break
            time.sleep(3.0)
        found = re.search(r"as Ray job (\S+)", done.stdout)
        if done.returncode or not found:
            raise K3ScaleError(f"rehearsal: study submit failed: {done.stdout}{done.stderr}")
        self.event(f"submitted {name} ({PRESET}) as Ray job {found.group(1)}")
        return found.group(1)

    def _wait_started(self, name: str) -> None:
        study_json = self.shared / "studies" / name / "study.json"
        wait_for(f"{name}'s driver to start", study_json.exists, START_TIMEOUT_S)

    def _disrupt(self, cluster: RayCluster, mlflow: AuthMlflow, postgres, jobs: dict) -> None:
        """Kill a worker node mid-trial, then restart MLflow, then restart PostgreSQL."""
        studies = self.shared / "studies"
        victim: dict = {}

        def a_trial_runs_on_a_worker() -> bool:
            self._jobs_running(cluster, jobs)
            for folder, attempts in _attempts(studies).items():
                node = cluster.node_of(attempts[-1]["pid"])
                # Past its first checkpoint if it got there, else at least a few seconds in.
                if node is not None and (
                    (folder / "latest.pt").exists() or time.time() - attempts[-1]["time"] > 4.0
                ):
                    victim.update(folder=folder, node=node, attempts=len(attempts))
                    return True
            return False

        wait_for("a trial running on a worker node", a_trial_runs_on_a_worker, 900, poll_s=0.25)
        folder, node = victim["folder"], victim["node"]
        checkpoint = (folder / "latest.pt").exists()
        killed = cluster.kill(node)
        self.event(
            f"killed {node.name} ({len(killed)} processes: ray start, raylet, agents, workers) "
            f"while it ran {folder.relative_to(studies)} "
            f"({'past a checkpoint' if checkpoint else 'before its first checkpoint'})"
        )
        self.report["lost_node"] = {
            "node": node.name,
            "trial_dir": str(folder.relative_to(studies)),
            "had_checkpoint": checkpoint,
        }

        def retried() -> bool:
            self._jobs_running(cluster, jobs)
            return len(_attempts(studies).get(folder, [])) > victim["attempts"]

        wait_for("the lost node's trial to be retried", retried, 600)
        self.event(f"{folder.name} retried on another node")
        started = sum(len(a) for a in _attempts(studies).values())
        mlflow.stop()
        self.event("MLflow server stopped")
        time.sleep(10.0)
        mlflow.start()
        self.event("MLflow server started again on the same port")

        def another_trial_started() -> bool:
            self._jobs_running(cluster, jobs)
            return sum(len(a) for a in _attempts(studies).values()) > started

        wait_for("a trial to start after the MLflow restart", another_trial_started, 900)
        postgres.pause()
        self.event("PostgreSQL stopped")
        time.sleep(8.0)
        postgres.resume()
        self.event("PostgreSQL started again")

    def _jobs_running(self, cluster: RayCluster, jobs: dict) -> None:
        """Raise once every job has ended (checked at most every JOB_POLL_S)."""
        if time.monotonic() - self._jobs_checked < JOB_POLL_S:
            return
        self._jobs_checked = time.monotonic()
        statuses = [self._job_status(cluster, job, logs=False)[0] for job in jobs.values()]
        if all(status in TERMINAL for status in statuses):
            raise K3ScaleError(f"rehearsal: the jobs ended ({statuses}) before the disruptions")

    def _job_status(self, cluster: RayCluster, job: str, logs: bool = True) -> tuple[str, str]:
        """(status, logs) of a job, asked by a client process holding the cluster's token (the
        way `study submit` asks): Ray fixes a process's auth mode when it first reads it."""
        done = subprocess.run(
            [sys.executable, "-c", JOB_QUERY, cluster.dashboard, job, "1" if logs else "0"],
            capture_output=True,
            text=True,
            env=cluster.env(),
        )
        if done.returncode:
            raise K3ScaleError(f"rehearsal: cannot ask for job {job}: {done.stderr[-600:]}")
        status, _, text = done.stdout.partition("\n")
        return status.strip(), text

    def _wait_job(self, cluster: RayCluster, job: str) -> tuple[str, str]:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while True:
            status, _ = self._job_status(cluster, job, logs=False)
            if status in TERMINAL or time.monotonic() > deadline:
                return self._job_status(cluster, job)
            time.sleep(5.0)

    # -- the counts ------------------------------------------------------------------------------

    def _optuna_counts(self, storage: str) -> dict:
        """Trials by state over every study in the storage (cells, their extra runs)."""
        import optuna

        counts: dict[str, int] = {}
        for summary in optuna.study.get_all_study_summaries(storage=storage):
            study = optuna.load_study(study_name=summary.study_name, storage=storage)
            for trial in study.get_trials(deepcopy=False):
                counts[trial.state.name] = counts.get(trial.state.name, 0) + 1
        return counts

    def _mlflow_counts(self, url: str, name: str) -> dict:
        """Trial runs of the study's experiment: finished once, duplicated, left running,
        abandoned attempts, and the retried ones with their attempt and Ray node."""
        from mlflow.tracking import MlflowClient

        from k3scale.track import schema

        client = MlflowClient(url)
        experiment = client.get_experiment_by_name(name)
        if experiment is None:  # the study never started
            return {"finished": 0, "duplicated": 0, "running": 0, "abandoned_attempts": 0,
                    "untagged": 0, "retried": []}  # fmt: skip
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
        trials = [r for r in runs if schema.TAG_TRIAL in r.data.tags]
        finished = [r for r in trials if r.info.status == "FINISHED"]
        keys = [r.data.tags[schema.TAG_TRIAL] for r in finished]
        return {
            "finished": len(set(keys)),
            "duplicated": len(keys) - len(set(keys)),
            "running": sum(r.info.status == "RUNNING" for r in trials),
            "abandoned_attempts": sum(r.info.status == "FAILED" for r in trials),
            # A run that does not say which trial it was (its tags lost to a server restart).
            "untagged": len(runs) - len(trials),
            "retried": [
                {
                    "trial": r.data.tags[schema.TAG_TRIAL],
                    "attempt": int(r.data.tags.get(schema.TAG_ATTEMPT, "1")),
                    "ray_node": r.data.tags.get(schema.TAG_RAY_NODE),
                }
                for r in finished
                if int(r.data.tags.get(schema.TAG_ATTEMPT, "1")) > 1
            ],
        }

    def _export(self, name: str, url: str, env: dict[str, str]) -> Path:
        out = self.folder / "exported" / name
        done = _cli(
            "export", "--experiment", name, "--tracking-uri", url, "--out", str(out), env=env
        )
        if done.returncode:
            raise K3ScaleError(f"rehearsal: export of {name} failed: {done.stderr[-800:]}")
        return out

    def _offline(self, name: str, tables: Path) -> dict:
        """`k3scale fit` and `k3scale dashboard` on the exported tables, no server, no secrets."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "RAY_"))}
        fit = _cli("fit", name, "--from", str(tables), "--out", str(tables / "fit.json"), env=env)
        page = tables / f"{name}.html"
        dashboard = _cli(
            "dashboard", "--from", str(tables), "--fit", str(tables / "fit.json"),
            "--out", str(page), env=env,
        )  # fmt: skip
        return {
            "fit_exit": fit.returncode,
            "dashboard_exit": dashboard.returncode,
            "dashboard_bytes": page.stat().st_size if page.exists() else 0,
            "said": (fit.stderr + dashboard.stderr).strip()[-600:],
        }

    def _expected(self, name: str) -> int:
        from k3scale.sweep.declaration import load_study
        from k3scale.sweep.planner import estimate_cost

        study = load_study(ROOT / "experiments" / f"{name}.py")
        cost = estimate_cost(study, study.preset(PRESET))
        return cost["tuning_trials"] + cost["extra_runs"]

    def _verdict(self) -> dict[str, bool]:
        checks = {}
        retried = []
        for name, r in self.report["studies"].items():
            expected = self._expected(name)
            r["expected"] = expected
            r["lost"] = expected - r["mlflow"]["finished"]
            retried += r["mlflow"]["retried"]
            checks[f"{name}: job succeeded"] = r["job"]["status"] == "SUCCEEDED"
            checks[f"{name}: {expected} trials complete in Optuna, none failed"] = r["optuna"] == {
                "COMPLETE": expected
            }
            checks[f"{name}: {expected} finished in MLflow, 0 duplicated, 0 lost"] = (
                r["mlflow"]["finished"] == expected and r["mlflow"]["duplicated"] == 0
            )
            checks[f"{name}: no MLflow run left running"] = r["mlflow"]["running"] == 0
            checks[f"{name}: every MLflow run says which trial it was"] = (
                r["mlflow"]["untagged"] == 0
            )
            checks[f"{name}: refit and dashboard from the exported tables alone"] = (
                r["offline"]["fit_exit"] == 0
                and r["offline"]["dashboard_exit"] == 0
                and r["offline"]["dashboard_bytes"] > 0
            )
        refusals = self.report["mlflow_refusals"]
        ray = self.report["ray_refusal"]
        # Its folder is runs/<cell key, '|' as '_'>/<tag>; its MLflow trial tag is <key>#<tag>.
        lost = "/".join(Path(self.report["lost_node"]["trial_dir"]).parts[-2:])
        checks["the lost node's trial was retried (attempt 2 or more in its tags)"] = any(
            r["trial"].replace("|", "_").replace("#", "/") == lost and r["attempt"] >= 2
            for r in retried
        )
        checks["MLflow refuses requests without or with wrong credentials"] = refusals == {
            "no_credentials": 401,
            "wrong_password": 401,
            "study_user": 200,
        }
        checks["Ray refuses a job submission without the token"] = (
            ray["jobs_api_status"] == 401
            and ray["submit_exit"] == 2
            and "refused this client" in ray["submit_said"]
        )
        return checks


def render(report: dict) -> str:
    lines = []
    for name, r in report["studies"].items():
        lines.append(
            f"{name}: trials expected {r['expected']}, finished {r['mlflow']['finished']}, "
            f"duplicated {r['mlflow']['duplicated']}, lost {r['lost']}, abandoned attempts "
            f"{r['mlflow']['abandoned_attempts']}, retried {len(r['mlflow']['retried'])}"
        )
    lines += [f"{'ok  ' if ok else 'FAIL'} {check}" for check, ok in report["ok"].items()]
    for name, r in report["studies"].items():
        if r["job"]["status"] != "SUCCEEDED":  # what the driver said last: why it failed
            lines += [f"-- {name}: the end of its job's log", r["job"]["log_tail"]]
    lines.append(f"rehearsal took {report['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="Ray worker nodes (1 CPU each)")
    parser.add_argument("--out", help="write the report (JSON) here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    rehearsal = Rehearsal(workers=args.workers)
    try:
        report = rehearsal.run()
    finally:
        if not args.keep:
            shutil.rmtree(rehearsal.folder, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    return 0 if all(report["ok"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
