"""Run tables: replicas -> tables, MLflow -> parquet -> the same fit, hashing, CLI export."""

from __future__ import annotations

import dataclasses
import uuid

import polars as pl
import pyarrow.parquet as pq
import pytest

from k3scale.cli import main
from k3scale.errors import K3ScaleError
from k3scale.scaling import study
from k3scale.scaling.inputs.sources import replica_batches
from k3scale.scaling.inputs.tables import (
    RUN_SCHEMA,
    RunData,
    build_tables,
    curve_rows,
    load_tables,
    table_hash,
    write_table_batches,
    write_tables,
)
from k3scale.track import schema
from tests.scaling.synthetic import log_to_mlflow, synthetic_runs, write_replicas

OPTIONS = study.StudyOptions(num_resamples=30, computes=("c_6n",))


def _frontier_from(runs: pl.DataFrame) -> dict:
    usable, _ = study.usable_runs(runs, OPTIONS)
    estimates, _noise = study.cell_estimates(usable, OPTIONS)
    return study.compute_optimal_comparison(estimates, "arch", "k2", OPTIONS)


def test_replicas_to_tables_have_the_contract_columns(tmp_path):
    runs = synthetic_runs("replica-study", archs=("k3",), sizes=("t0", "t1"), budgets=(40_000_000,))
    write_replicas(runs, tmp_path / "replicas")
    assert (
        main(
            [
                "export",
                "--experiment",
                "replica-study",
                "--replicas",
                str(tmp_path / "replicas"),
                "--out",
                str(tmp_path / "tables"),
            ]
        )
        == 0
    )
    table, curves = load_tables(tmp_path / "tables")
    assert table.columns[: len(RUN_SCHEMA)] == list(RUN_SCHEMA)
    assert table.height == len(runs)
    row = table.filter(pl.col("run_id") == runs[0].run_id).row(0, named=True)
    assert row["c_6n"] == pytest.approx(6 * 1_000_000 * row["tokens"])
    assert row["status"] == "finished" and row["arch"] == "k3" and row["lr"] == 1e-3
    assert row["param.optim.lr"] == "0.001"
    assert row["final_val_ood_loss"] is not None and row["batch_tokens"] == 4096
    assert set(curves.columns) == {"run_id", "step", "tokens", "metric", "value"}
    assert "final/val_ood_loss" not in curves["metric"].to_list()
    assert curves.filter(pl.col("metric") == "train/loss")["tokens"].null_count() == 0


def test_table_hash_ignores_row_order_and_sees_changes():
    runs, _ = build_tables(synthetic_runs("h", archs=("k3",), sizes=("t0",), budgets=(40_000_000,)))
    assert table_hash(runs) == table_hash(runs.reverse())
    changed = runs.with_columns(pl.col("lr") * 2)
    assert table_hash(changed) != table_hash(runs)


def test_mlflow_export_round_trip_gives_the_same_fit(mlflow_server, tmp_path):
    experiment = f"roundtrip-{uuid.uuid4().hex[:8]}"
    runs = synthetic_runs(
        experiment, sizes=("t0", "t1", "t2"), budgets=(40_000_000,), lrs=(1e-3, 5e-3, 2e-2)
    )
    log_to_mlflow(runs, mlflow_server, experiment)
    assert (
        main(
            [
                "export",
                "--experiment",
                experiment,
                "--tracking-uri",
                mlflow_server,
                "--out",
                str(tmp_path / "tables"),
            ]
        )
        == 0
    )
    exported, curves = load_tables(tmp_path / "tables")
    assert exported.height == len(runs)
    assert curves.height == sum(
        1 for r in runs for _, key, _ in r.metrics if not key.startswith("final/")
    )
    direct, _ = build_tables(runs)
    # Same fit from the exported table as from the source runs (ids differ, values do not).
    assert _frontier_from(exported) == _frontier_from(direct)
    write_tables(exported, curves, tmp_path / "again")
    assert table_hash(load_tables(tmp_path / "again")[0]) == table_hash(exported)


def test_export_without_any_source_is_a_clear_error(tmp_path):
    with pytest.raises(K3ScaleError, match="give --tracking-uri URI or --replicas DIR"):
        from k3scale.scaling.inputs.sources import collect_runs

        collect_runs("x", None, None)
    assert (
        main(
            [
                "export",
                "--experiment",
                "x",
                "--tracking-uri",
                "http://127.0.0.1:9",
                "--out",
                str(tmp_path),
            ]
        )
        == 2
    )


def test_missing_tables_is_a_clear_error(tmp_path):
    with pytest.raises(K3ScaleError, match="run `k3scale export"):
        load_tables(tmp_path)


def test_streamed_export_writes_the_same_tables_one_batch_at_a_time(tmp_path):
    """`write_table_batches` (what export and a study's end use) against `build_tables`."""
    runs = synthetic_runs("stream", sizes=("t0", "t1", "t2"), budgets=(40_000_000,))
    write_replicas(runs, tmp_path / "replicas")
    batches = replica_batches(tmp_path / "replicas", "stream", batch_runs=4)
    assert write_table_batches(batches, tmp_path / "streamed")[0] == len(runs)
    write_tables(*build_tables(runs), tmp_path / "whole")
    streamed, whole = load_tables(tmp_path / "streamed"), load_tables(tmp_path / "whole")
    assert streamed[0].equals(whole[0]) and streamed[1].equals(whole[1])
    for name in ("runs.parquet", "curves.parquet"):
        groups = pq.ParquetFile(tmp_path / "streamed" / name).num_row_groups
        assert groups == -(-len(runs) // 4), name
    assert sorted(p.name for p in (tmp_path / "streamed").iterdir()) == [
        "curves.parquet",
        "runs.parquet",
    ]


def test_streamed_run_table_has_every_param_any_batch_has(tmp_path):
    # A param first seen in a later batch is a column of the whole table, null for earlier runs.
    runs = sorted(
        synthetic_runs("widen", archs=("k3",), sizes=("t0", "t1"), budgets=(40_000_000,)),
        key=lambda r: r.run_id,
    )
    runs[-1] = dataclasses.replace(runs[-1], params={**runs[-1].params, "train.extra": "7"})
    write_table_batches([runs[:2], runs[2:]], tmp_path / "streamed")
    write_tables(*build_tables(runs), tmp_path / "whole")
    streamed, whole = load_tables(tmp_path / "streamed"), load_tables(tmp_path / "whole")
    assert streamed[0].equals(whole[0])
    assert streamed[0]["param.train.extra"].to_list() == [None] * (len(runs) - 1) + ["7"]


def test_streamed_export_refuses_batches_out_of_order_and_keeps_old_tables(tmp_path):
    runs = sorted(
        synthetic_runs("order", archs=("k3",), sizes=("t0",), budgets=(40_000_000,)),
        key=lambda r: r.run_id,
    )
    write_tables(*build_tables(runs), tmp_path)
    before = load_tables(tmp_path)[0]
    with pytest.raises(K3ScaleError, match="run_id order"):
        write_table_batches([runs[1:], runs[:1]], tmp_path)
    assert load_tables(tmp_path)[0].equals(before)
    assert not list(tmp_path.glob("*.partial"))


def test_a_branch_s_copy_of_its_trunk_s_curve_and_the_peak_lr_stay_out_of_the_curves():
    """A WSD branch logs its trunk's points up to the fork (MLflow draws the whole curve) and
    every run logs `peak_lr` once: neither is a curve point of its own."""
    points = [(0, schema.METRIC_PEAK_LR, 0.01), (0, schema.FINAL_PREFIX + "val_ood_loss", 3.0)]
    points += [(step, schema.METRIC_TRAIN_LOSS, 5.0 - 0.1 * step) for step in range(1, 9)]
    branch = RunData(
        run_id="b",
        experiment="e",
        run_name="b",
        source_status=schema.STATUS_FINISHED,
        params={},
        tags={schema.TAG_FORK_STEP: "5"},
        metrics=points,
    )
    assert [(r["step"], r["metric"]) for r in curve_rows(branch)] == [
        (step, schema.METRIC_TRAIN_LOSS) for step in (6, 7, 8)
    ]
    trunk = dataclasses.replace(branch, tags={})
    assert [r["step"] for r in curve_rows(trunk)] == list(range(1, 9))
