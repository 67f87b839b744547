"""Replica writer and reader: round trip, a killed writer's partial line, corrupt lines."""

from __future__ import annotations

import json

import pytest

from k3scale.errors import K3ScaleError
from k3scale.track.replica import ReplicaWriter, find_replicas, read_replica
from k3scale.track.schema import REPLICA_FILE


def _write_run(path, num_steps=3):
    writer = ReplicaWriter(path)
    writer.write(
        {"type": "run", "run_id": "r1", "experiment": "e", "run_name": "n", "start_time": 5}
    )
    writer.write({"type": "params", "params": {"optim.lr": "0.001"}})
    writer.write({"type": "tags", "tags": {"k3scale.arch": "k2", "k3scale.size": "t0"}})
    for step in range(num_steps):
        values = {"train/loss": 1.0 / (step + 1), "lr": 0.1}
        writer.write({"type": "metrics", "step": step, "timestamp": 100 + step, "values": values})
    writer.write({"type": "tags", "tags": {"k3scale.arch": "k3"}})
    return writer


def test_round_trip_keeps_every_record(tmp_path):
    path = tmp_path / REPLICA_FILE
    writer = _write_run(path)
    writer.write({"type": "artifact", "name": "config.json", "path": "artifacts/config.json"})
    writer.write({"type": "status", "status": "diverged", "end_time": 9})
    writer.write({"type": "sync", "sent_through_line": 7, "unsent_lines": [8, 9]})
    writer.close()

    record = read_replica(tmp_path)
    assert (record.run_id, record.experiment, record.run_name) == ("r1", "e", "n")
    assert record.params == {"optim.lr": "0.001"}
    assert record.tags == {"k3scale.arch": "k3", "k3scale.size": "t0"}, "later tags win"
    assert record.metrics[:2] == [(0, "train/loss", 1.0), (0, "lr", 0.1)]
    assert len(record.metrics) == 6
    assert record.metric_timestamps == [100, 100, 101, 101, 102, 102]
    assert (record.status, record.start_time, record.end_time) == ("diverged", 5, 9)
    assert record.artifacts == {"config.json": tmp_path / "artifacts/config.json"}
    assert (record.sent_through_line, record.unsent_lines) == (7, [8, 9])


def test_reader_ignores_a_partial_last_line(tmp_path):
    path = tmp_path / REPLICA_FILE
    _write_run(path, num_steps=2).close()
    cut = json.dumps({"type": "metrics", "step": 2, "timestamp": 1, "values": {"lr": 0.5}})
    with open(path, "a") as file:
        file.write(cut[: len(cut) // 2])  # a process killed in the middle of a write
    record = read_replica(path)
    assert [step for step, _, _ in record.metrics] == [0, 0, 1, 1]
    assert record.status is None and record.end_time is None


def test_reader_rejects_a_corrupt_middle_line(tmp_path):
    path = tmp_path / REPLICA_FILE
    _write_run(path, num_steps=1).close()
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:10]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(K3ScaleError, match=":2: corrupt replica line"):
        read_replica(path)


def test_resumed_writer_cuts_the_partial_line_and_counts_on(tmp_path):
    path = tmp_path / REPLICA_FILE
    _write_run(path, num_steps=2).close()
    with open(path, "a") as file:
        file.write('{"type": "metr')
    writer = ReplicaWriter(path, resume=True)
    assert writer.num_lines == 6
    assert writer.write({"type": "metrics", "step": 2, "timestamp": 1, "values": {"lr": 0.5}}) == 7
    writer.close()
    assert read_replica(path).metrics[-1] == (2, "lr", 0.5)


def test_writer_refuses_to_overwrite_a_run(tmp_path):
    _write_run(tmp_path / REPLICA_FILE).close()
    with pytest.raises(K3ScaleError, match="already holds a run"):
        ReplicaWriter(tmp_path / REPLICA_FILE)


def test_reader_rejects_a_file_without_run_line(tmp_path):
    path = tmp_path / REPLICA_FILE
    path.write_text(json.dumps({"type": "params", "params": {}}) + "\n")
    with pytest.raises(K3ScaleError, match="not a k3scale replica"):
        read_replica(path)


def test_find_replicas_searches_recursively(tmp_path):
    for run in ("cell_a/trial_0", "cell_a/trial_1", "cell_b/trial_0/decay"):
        _write_run(tmp_path / run / REPLICA_FILE).close()
    (tmp_path / "cell_b" / "notes.jsonl").write_text("{}\n")
    found = find_replicas(tmp_path)
    assert [p.parent.relative_to(tmp_path).as_posix() for p in found] == [
        "cell_a/trial_0",
        "cell_a/trial_1",
        "cell_b/trial_0/decay",
    ]
