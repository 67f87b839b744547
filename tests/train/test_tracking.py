"""The trainer's tracking against real local MLflow servers (platform.md section 4).

A tiny run with `track.tracking_uri` set must land in MLflow with its flattened config and
derived sizes as params, the provenance and identity tags, every per-step and final metric, and
the resolved config as an artifact; the logged LR is the analytic schedule to the bit; a server
that dies mid-run costs no metric (the JSONL replica has everything, and replays into another
server); an unreachable server at start is one clear error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from k3scale.cli import main as cli_main
from k3scale.config import config_hash, flatten, to_dict
from k3scale.data import open_dataset
from k3scale.errors import K3ScaleError
from k3scale.models import accounting
from k3scale.optim.schedules import step_lrs
from k3scale.track import schema
from k3scale.track.provenance import git_state
from k3scale.track.replica import read_replica, replica_lines, upload_replica
from k3scale.track.server import free_port, start_local_server
from k3scale.train import train
from tests.train.conftest import tiny_run

NUM_STEPS = 12
BATCH_TOKENS = 64 * 8
LOG_INTERVAL_STEPS = 4
STUDY_TAGS = (
    (schema.TAG_STUDY, "trainer-tests"),
    (schema.TAG_CELL, "k3-tiny"),
    (schema.TAG_SIZE, "d16"),
)
LOG_BATCH_REQUEST = re.compile(r'"POST /api/2\.0/mlflow/runs/log-batch HTTP')
PER_STEP_METRICS = (schema.METRIC_TRAIN_LOSS, schema.METRIC_LR, schema.METRIC_TOKENS)
# Every train.diagnostics_interval_steps (default 10) and at the last step.
DIAGNOSTIC_METRICS = (
    schema.METRIC_FLOPS,
    schema.METRIC_TOKENS_PER_S,
    schema.METRIC_MFU,
    "grad_norm",
    "qk_clip/max_logit",
    "router/max_load_ratio",
)
FINAL_METRICS = tuple(
    schema.FINAL_PREFIX + name
    for name in ("train_loss", "val_id_loss", "val_ood_loss", "tokens", "tokens_per_s", "mfu")
)


def _tracked_run(root: Path, out_dir: Path, tracking_uri: str, **train):
    # Every LOG_INTERVAL_STEPS steps, whatever the time: what the batching tests count.
    train = {"log_interval_steps": LOG_INTERVAL_STEPS, "log_interval_s": 0.0, **train}
    cfg = tiny_run("k3", root, out_dir, budget_tokens=BATCH_TOKENS * NUM_STEPS, **train)
    track = dataclasses.replace(
        cfg.track,
        tracking_uri=tracking_uri,
        experiment=f"trainer-{uuid.uuid4().hex[:8]}",
        run_name="tiny",
        tags=STUDY_TAGS,
    )
    return dataclasses.replace(cfg, track=track)


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def _log_batch_calls(log_path: Path, previous: int = -1, wait_s: float = 3.0) -> int:
    """log-batch requests in the server's access log (waits briefly for the log to catch up)."""
    deadline = time.monotonic() + wait_s
    while True:
        count = len(LOG_BATCH_REQUEST.findall(log_path.read_text(errors="replace")))
        if count != previous or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


@pytest.fixture(scope="module")
def tracked(mlflow_local_server, sample_root, tmp_path_factory):
    """One finished tracked run: (config, RunResult, MLflow run, log-batch requests it made)."""
    cfg = _tracked_run(sample_root, tmp_path_factory.mktemp("tracked"), mlflow_local_server.url)
    calls_before = _log_batch_calls(mlflow_local_server.log_path, wait_s=0)
    result = train(cfg)
    calls = _log_batch_calls(mlflow_local_server.log_path, previous=calls_before) - calls_before
    run = MlflowClient(mlflow_local_server.url).get_run(result.run_id)
    return cfg, result, run, calls


def test_params_are_the_flattened_config_and_derived_sizes(tracked):
    cfg, _, run, _ = tracked
    derived = {
        schema.PARAM_N_TOTAL: accounting.num_params_total(cfg.model),
        schema.PARAM_N_ACTIVE: accounting.num_params_active(cfg.model),
        schema.PARAM_FLOPS_PER_TOKEN_6N: accounting.flops_per_token_6n(cfg.model),
        schema.PARAM_FLOPS_PER_TOKEN_ATTN: accounting.flops_per_token(cfg.model, cfg.data.seq_len),
        schema.PARAM_BATCH_TOKENS: BATCH_TOKENS,
    }
    expected = {key: str(value) for key, value in {**flatten(cfg), **derived}.items()}
    del expected["track.tracking_uri"]
    assert run.data.params == expected
    assert run.data.params["model.moe.balancing"] == "quantile"
    assert run.data.params["optim.lr"] == "0.01"


def test_tags_name_identity_data_code_versions_and_plan(tracked, sample_root):
    cfg, result, run, _ = tracked
    tags = run.data.tags
    assert tags[schema.TAG_CONFIG_HASH] == config_hash(cfg) == result.config_hash
    assert tags[schema.TAG_DATA_FINGERPRINT] == open_dataset("sample", root=sample_root).fingerprint
    assert tags[schema.TAG_STATUS] == schema.STATUS_FINISHED
    assert run.info.status == "FINISHED"
    sha, dirty = git_state()
    assert tags[schema.TAG_GIT_SHA] == sha and tags[schema.TAG_GIT_DIRTY] == dirty
    assert re.fullmatch(r"[0-9a-f]{40}|unknown", sha)
    assert tags[schema.TAG_VERSION_TORCH] == torch.__version__
    for key in (schema.TAG_VERSION_TRITON, schema.TAG_VERSION_CUDA, schema.TAG_DEVICE):
        assert tags[key], key
    assert tags[schema.TAG_ARCH] == "k3"
    assert tags[schema.TAG_SCHEDULE] == "cosine"
    assert tags[schema.TAG_BUDGET_TOKENS] == str(BATCH_TOKENS * NUM_STEPS)
    assert tags[schema.TAG_BACKEND] == "cpu"
    # Study bookkeeping passes through from track.tags.
    assert {key: tags[key] for key, _ in STUDY_TAGS} == dict(STUDY_TAGS)


def test_every_step_and_final_metric_is_logged_in_batches(tracked, mlflow_server):
    cfg, result, run, log_batch_calls = tracked
    client = MlflowClient(mlflow_server)
    steps = list(range(1, NUM_STEPS + 1))
    for key in PER_STEP_METRICS:
        assert [step for step, _ in _history(client, result.run_id, key)] == steps, key
    assert [v for _, v in _history(client, result.run_id, schema.METRIC_TRAIN_LOSS)] == list(
        result.losses
    )
    tokens = [float(s * BATCH_TOKENS) for s in steps]
    assert [v for _, v in _history(client, result.run_id, schema.METRIC_TOKENS)] == tokens
    assert cfg.train.diagnostics_interval_steps == 10 and NUM_STEPS == 12
    for key in DIAGNOSTIC_METRICS:
        assert [step for step, _ in _history(client, result.run_id, key)] == [10, 12], key
    flops_per_token = accounting.flops_per_token(cfg.model, cfg.data.seq_len)
    flops = [v for _, v in _history(client, result.run_id, schema.METRIC_FLOPS)]
    assert flops == [tokens[9] * flops_per_token, tokens[11] * flops_per_token]
    for key in (schema.METRIC_TOKENS_PER_S, schema.METRIC_MFU):
        assert all(v > 0 for _, v in _history(client, result.run_id, key)), key
    assert all(v < 1 for _, v in _history(client, result.run_id, schema.METRIC_MFU))

    # Evaluations every 4 steps before the end (4, 8), then the final one at step 12.
    for key in (schema.METRIC_VAL_ID_LOSS, schema.METRIC_VAL_OOD_LOSS):
        assert [s for s, _ in _history(client, result.run_id, key)] == [4, 8, 12], key
    final = run.data.metrics
    assert set(FINAL_METRICS) <= set(final)
    assert final[schema.FINAL_PREFIX + "train_loss"] == result.losses[-1]
    assert final[schema.FINAL_PREFIX + "val_id_loss"] == result.final_val_id_loss
    assert final[schema.FINAL_PREFIX + "val_ood_loss"] == result.final_val_ood_loss
    assert final[schema.FINAL_PREFIX + "tokens"] == result.tokens
    assert final[schema.FINAL_PREFIX + "mfu"] == result.mfu
    # One log_batch per logging interval plus start and finish, never one per step or metric.
    assert 0 < log_batch_calls <= NUM_STEPS // LOG_INTERVAL_STEPS + 3, log_batch_calls


def test_logged_lr_is_the_analytic_schedule_exactly(tracked, mlflow_server):
    cfg, result, _, _ = tracked
    expected = step_lrs(NUM_STEPS, BATCH_TOKENS, cfg.optim.lr, cfg.schedule)
    logged = _history(MlflowClient(mlflow_server), result.run_id, schema.METRIC_LR)
    assert logged == list(zip(range(1, NUM_STEPS + 1), expected, strict=True))
    assert len(set(expected)) > NUM_STEPS // 2, "warmup and cosine decay, not a constant"


def test_resolved_config_is_an_artifact(tracked, mlflow_server, tmp_path):
    cfg, result, _, _ = tracked
    client = MlflowClient(mlflow_server)
    assert [a.path for a in client.list_artifacts(result.run_id)] == ["config.json"]
    local = client.download_artifacts(result.run_id, "config.json", str(tmp_path))
    expected = json.loads(json.dumps(to_dict(cfg)))
    del expected["track"]["tracking_uri"]  # where the run logs, not what it is
    assert json.loads(Path(local).read_text()) == expected


def _kill_when_step_reached(
    replica: Path, pid: int, step: int, killed_at: list[int], done: threading.Event
) -> None:
    """Poll the run's replica; SIGKILL the server's process group once `step` is logged."""
    while not done.wait(0.01):
        if replica.exists():
            logged = [e["step"] for e in replica_lines(replica) if e["type"] == "metrics"]
            if logged and max(logged) >= step:
                os.killpg(pid, signal.SIGKILL)
                killed_at.append(max(logged))
                return


def test_server_dying_mid_run_loses_no_metric(sample_root, mlflow_server, tmp_path):
    dying = start_local_server(
        tmp_path / "dying.db",
        tmp_path / "dying-artifacts",
        log_path=tmp_path / "dying.log",
        timeout_s=120,
    )
    out_dir = tmp_path / "run"
    # Flush every step so the tracker meets the dead server while training continues.
    cfg = _tracked_run(sample_root, out_dir, dying.url, log_interval_steps=1)
    killed_at: list[int] = []
    done = threading.Event()
    killer = threading.Thread(
        target=_kill_when_step_reached,
        args=(out_dir / schema.REPLICA_FILE, dying.pid, 2, killed_at, done),
    )
    killer.start()
    try:
        result = train(cfg)
    finally:
        done.set()
        killer.join()
        dying.stop()

    assert result.status == schema.STATUS_FINISHED and result.steps == NUM_STEPS
    assert killed_at and killed_at[0] < NUM_STEPS - 2, killed_at
    record = read_replica(out_dir)
    assert record.status == schema.STATUS_FINISHED
    assert record.unsent_lines, "the server died mid-run: later lines never reached it"
    for key in PER_STEP_METRICS:
        assert [s for s, k, _ in record.metrics if k == key] == list(range(1, NUM_STEPS + 1)), key
    losses = [v for _, k, v in record.metrics if k == schema.METRIC_TRAIN_LOSS]
    assert losses == list(result.losses)
    assert set(FINAL_METRICS) <= {k for _, k, _ in record.metrics}

    # Nothing is lost: the replica replays into another server, complete.
    run_id = upload_replica(out_dir, mlflow_server)
    client = MlflowClient(mlflow_server)
    assert [v for _, v in _history(client, run_id, schema.METRIC_TRAIN_LOSS)] == losses
    run = client.get_run(run_id)
    assert run.data.tags[schema.TAG_STATUS] == schema.STATUS_FINISHED
    assert run.data.tags[schema.TAG_CONFIG_HASH] == result.config_hash


def test_a_run_resumed_after_its_server_moved_port_finishes_in_the_same_mlflow_run(
    sample_root, tmp_path
):
    """A study's local server restarted under load comes back on another port; the trial resumed
    from its checkpoint re-logs its params there. Logging the URI as a param made MLflow refuse
    that ("Changing param values is not allowed") and killed a 2-hour study's bookkeeping."""
    db, artifacts = tmp_path / "moving.db", tmp_path / "moving-artifacts"
    out_dir = tmp_path / "run"
    with start_local_server(db, artifacts, log_path=tmp_path / "first.log", timeout_s=120) as first:
        cfg = _tracked_run(sample_root, out_dir, first.url)
        stopped = train(cfg, stop_after_steps=NUM_STEPS // 2)
    assert stopped.steps == NUM_STEPS // 2
    other_port = next(port for port in iter(free_port, None) if f":{port}" not in first.url)
    with start_local_server(
        db, artifacts, port=other_port, log_path=tmp_path / "second.log", timeout_s=120
    ) as second:
        moved = dataclasses.replace(
            cfg, track=dataclasses.replace(cfg.track, tracking_uri=second.url)
        )
        result = train(moved)
        run = MlflowClient(second.url).get_run(result.run_id)
    assert result.run_id == stopped.run_id
    assert result.status == schema.STATUS_FINISHED and result.steps == NUM_STEPS
    assert run.info.status == "FINISHED"
    assert "track.tracking_uri" not in run.data.params
    assert run.data.params["optim.lr"] == str(cfg.optim.lr)


def test_a_finished_run_trained_again_leaves_its_mlflow_run_ended(
    mlflow_server, sample_root, tmp_path
):
    """A retried WSD trunk task trains its finished trunk again to reach its branches. That call
    reopened the trunk's MLflow run as RUNNING under the retry's tags and left it so, and the
    driver's wrap-up then closed it as FAILED (a flake of the driver-SIGKILL drill)."""
    cfg = _tracked_run(sample_root, tmp_path / "run", mlflow_server)
    first = train(cfg, extra_tags={schema.TAG_ATTEMPT: "1"})
    again = train(cfg, extra_tags={schema.TAG_ATTEMPT: "2"})
    run = MlflowClient(mlflow_server).get_run(first.run_id)
    assert again.run_id == first.run_id and again.status == schema.STATUS_FINISHED
    assert again.final_val_ood_loss == first.final_val_ood_loss
    assert run.info.status == "FINISHED"
    assert run.data.tags[schema.TAG_STATUS] == schema.STATUS_FINISHED
    assert run.data.tags[schema.TAG_ATTEMPT] == "1"


def test_unreachable_tracking_uri_at_start_is_one_clear_error(sample_root, tmp_path, capsys):
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = _tracked_run(sample_root, tmp_path / "run", dead)
    with pytest.raises(K3ScaleError, match="unreachable") as raised:
        train(cfg)
    assert dead in str(raised.value) and raised.value.__cause__ is None
    assert not (tmp_path / "run" / schema.REPLICA_FILE).exists()

    # Through the CLI: one line on stderr, exit status 2.
    code = cli_main(
        [
            "train",
            "--preset",
            "k2-t0",
            "--set",
            "data.dataset=sample",
            "--set",
            f"data.root={sample_root}",
            "--steps",
            "2",  # within one pass of the sample: no repeated-data warning besides the error
            "--out",
            str(tmp_path / "cli"),
            "--tracking-uri",
            dead,
        ]
    )
    # On a CPU without the fused kernels, the slow-path notice comes first (issue 31): a note,
    # not a second error.
    lines = capsys.readouterr().err.strip().splitlines()
    err = "\n".join(line for line in lines if "SLOW PATH" not in line)
    assert code == 2
    assert err.count("\n") == 0 and "unreachable" in err and dead in err, err


def test_a_study_run_logs_its_paths_relative_to_the_study_folder(sample_root, tmp_path):
    """Run tables must not carry one machine's absolute paths (issue 23)."""
    study_dir = tmp_path / "study"
    cfg = tiny_run("k2", sample_root, study_dir / "runs" / "cell" / "t000")
    cfg = dataclasses.replace(
        cfg, track=dataclasses.replace(cfg.track, paths_relative_to=str(study_dir))
    )
    train(cfg, stop_after_steps=1)
    params = read_replica(study_dir / "runs" / "cell" / "t000").params
    assert params["train.out_dir"] == "runs/cell/t000"
    assert params["data.root"] == os.path.relpath(sample_root, study_dir)
    assert "track.paths_relative_to" not in params


def test_a_tracked_run_times_its_mlflow_calls_and_checkpoints(tracked):
    # Issue 19's fixed-cost breakdown: each cause outside the steps is timed on its own, and the
    # phases never add up to more than the call's wall time.
    _, result, _, log_batch_calls = tracked
    phases = result.time_s
    assert log_batch_calls > 0 and phases["track"] > 0 and phases["checkpoint"] > 0
    parts = ("setup", "steps", "eval", "track", "checkpoint")
    assert sum(phases[k] for k in parts) <= phases["total"]


def test_mid_run_batches_wait_for_log_interval_s(mlflow_local_server, sample_root, tmp_path):
    # Issue 19: a batch costs a replica fsync and a server commit, so a fast run sends at most one
    # mid-run batch per log_interval_s; every point still arrives (the end sends the rest).
    cfg = _tracked_run(sample_root, tmp_path, mlflow_local_server.url, log_interval_s=3600.0)
    calls_before = _log_batch_calls(mlflow_local_server.log_path, wait_s=0)
    result = train(cfg)
    calls = _log_batch_calls(mlflow_local_server.log_path, previous=calls_before) - calls_before
    # The first interval's batch, then the run's end (start and finish as in the count above).
    assert 0 < calls <= 4, calls
    client = MlflowClient(mlflow_local_server.url)
    losses = [v for _, v in _history(client, result.run_id, schema.METRIC_TRAIN_LOSS)]
    assert losses == list(result.losses)
