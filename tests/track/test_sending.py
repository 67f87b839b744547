"""Packing replica lines into MLflow calls within MLflow's batch limits (pure, no server)."""

from __future__ import annotations

from k3scale.track.sending import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAMS_TAGS_PER_BATCH,
    pack_sends,
    truncate,
    units_from_line,
)


def _metrics_line(step, num_values):
    values = {f"m{i}": float(i) for i in range(num_values)}
    return {"type": "metrics", "step": step, "timestamp": 7, "values": values}


def test_one_flush_of_many_steps_is_one_batch():
    units = [u for step in range(50) for u in units_from_line(step + 1, _metrics_line(step, 8), "")]
    sends = pack_sends(units)
    assert len(sends) == 1
    assert sum(len(u.metrics) for u in sends[0].units) == 400


def test_big_lines_are_split_within_limits():
    params = {"type": "params", "params": {f"p{i}": str(i) for i in range(250)}}
    units = units_from_line(1, params, "") + units_from_line(2, _metrics_line(0, 2500), "")
    sends = pack_sends(units)
    for send in sends:
        num_metrics = sum(len(u.metrics) for u in send.units)
        num_params = sum(len(u.params) for u in send.units)
        assert num_metrics <= MAX_METRICS_PER_BATCH
        assert num_params <= MAX_PARAMS_TAGS_PER_BATCH
        assert num_metrics + num_params <= 1000
    assert sum(len(u.params) for s in sends for u in s.units) == 250
    assert sum(len(u.metrics) for s in sends for u in s.units) == 2500
    # Units are not split again: params 100 + 100 + 50, metrics 1000 + 1000 + 500; the last
    # params unit cannot take 1000 metrics (1000 entities per call), the 500 can join nothing.
    assert len(sends) == 6


def test_a_tag_set_twice_goes_into_two_batches_in_order():
    first = units_from_line(1, {"type": "tags", "tags": {"k3scale.status": "x"}}, "")
    second = units_from_line(2, {"type": "tags", "tags": {"k3scale.status": "finished"}}, "")
    sends = pack_sends(first + second)
    assert [s.units[0].tags for s in sends] == [
        (("k3scale.status", "x"),),
        (("k3scale.status", "finished"),),
    ]


def test_artifacts_and_status_are_their_own_calls():
    lines = [
        _metrics_line(0, 2),
        {"type": "artifact", "name": "config.json", "path": "artifacts/config.json"},
        {"type": "status", "status": "failed", "end_time": 3},
        {"type": "sync", "sent_through_line": 3},
    ]
    units = [u for n, line in enumerate(lines, 1) for u in units_from_line(n, line, "/runs/a")]
    sends = pack_sends(units)
    assert [sorted(s.lines) for s in sends] == [[1], [2], [3]]
    assert sends[1].units[0].artifact_path == "/runs/a/artifacts/config.json"
    assert sends[2].units[0].status == "failed"


def test_truncate_respects_the_limit():
    assert truncate("abc", 5) == "abc"
    long = truncate("x" * 7000, 6000)
    assert len(long) == 6000 and long.endswith("[truncated]")
