"""Run tables (INTERFACES.md section 9): one row per run, one table of curves, as parquet.

Sources (MLflow, JSONL replicas) produce `RunData`; `build_tables` turns them into
`runs.parquet` (typed columns + every param as `param.<dotted key>` strings) and
`curves.parquet` (`run_id, step, tokens, metric, value`). These tables are the only input of
the fits, and `table_hash` identifies them in fit artifacts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections.abc import Iterable
from pathlib import Path

import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.track import schema

RUNS_FILE = "runs.parquet"
CURVES_FILE = "curves.parquet"
PARAM_PREFIX = "param."

# Typed columns of runs.parquet in contract order (INTERFACES.md section 9).
RUN_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String,
    "experiment": pl.String,
    "run_name": pl.String,
    "status": pl.String,
    "study": pl.String,
    "cell": pl.String,
    "trial": pl.Int64,
    "arm": pl.String,
    "arch": pl.String,
    "schedule": pl.String,
    "size": pl.String,
    "budget_tokens": pl.Int64,
    "seed": pl.Int64,
    "config_hash": pl.String,
    "data_fingerprint": pl.String,
    "git_sha": pl.String,
    "trunk_run_id": pl.String,
    "fork_step": pl.Int64,
    "lr": pl.Float64,
    "lr_min": pl.Float64,
    "batch_size": pl.Int64,
    "seq_len": pl.Int64,
    "batch_tokens": pl.Int64,
    "n_total": pl.Int64,
    "n_active": pl.Int64,
    "flops_per_token_6n": pl.Float64,
    "flops_per_token_attn": pl.Float64,
    "tokens": pl.Int64,
    "c_6n": pl.Float64,
    "c_attn": pl.Float64,
    "final_train_loss": pl.Float64,
    "final_val_id_loss": pl.Float64,
    "final_val_ood_loss": pl.Float64,
}
CURVE_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.String,
    "step": pl.Int64,
    "tokens": pl.Int64,
    "metric": pl.String,
    "value": pl.Float64,
}
_TAG_COLUMNS = {
    "study": schema.TAG_STUDY,
    "cell": schema.TAG_CELL,
    "trial": schema.TAG_TRIAL,
    "arm": schema.TAG_ARM,
    "arch": schema.TAG_ARCH,
    "schedule": schema.TAG_SCHEDULE,
    "size": schema.TAG_SIZE,
    "budget_tokens": schema.TAG_BUDGET_TOKENS,
    "config_hash": schema.TAG_CONFIG_HASH,
    "data_fingerprint": schema.TAG_DATA_FINGERPRINT,
    "git_sha": schema.TAG_GIT_SHA,
    "trunk_run_id": schema.TAG_TRUNK_RUN_ID,
    "fork_step": schema.TAG_FORK_STEP,
}
# Tags that only some runs carry: a column only in tables that hold such a run.
OPTIONAL_TAG_COLUMNS = {"reused_from": schema.TAG_REUSED_FROM}
# Dotted config keys (k3scale/config.py) and derived params (schema.PARAM_*).
_PARAM_COLUMNS = {
    "seed": "train.seed",
    "lr": "optim.lr",
    "lr_min": "schedule.lr_min",
    "batch_size": "train.batch_size",
    "seq_len": "data.seq_len",
    "batch_tokens": schema.PARAM_BATCH_TOKENS,
    "n_total": schema.PARAM_N_TOTAL,
    "n_active": schema.PARAM_N_ACTIVE,
    "flops_per_token_6n": schema.PARAM_FLOPS_PER_TOKEN_6N,
    "flops_per_token_attn": schema.PARAM_FLOPS_PER_TOKEN_ATTN,
}
_FINAL_METRICS = {
    "final_train_loss": (schema.FINAL_PREFIX + "train_loss", schema.METRIC_TRAIN_LOSS),
    "final_val_id_loss": (schema.FINAL_PREFIX + "val_id_loss", schema.METRIC_VAL_ID_LOSS),
    "final_val_ood_loss": (schema.FINAL_PREFIX + "val_ood_loss", schema.METRIC_VAL_OOD_LOSS),
}
_MLFLOW_STATUS = {
    "FINISHED": "finished",
    "FAILED": "failed",
    "KILLED": "failed",
    "RUNNING": "running",
    "SCHEDULED": "running",
}


@dataclasses.dataclass(frozen=True)
class RunData:
    """One run as any source sees it.

    Attributes:
        run_id, experiment, run_name: identity.
        source_status: the source's own status (replica status or MLflow run status).
        params, tags: string maps as logged.
        metrics: (step, key, value) of every logged point.
    """

    run_id: str
    experiment: str
    run_name: str | None
    source_status: str | None
    params: dict[str, str]
    tags: dict[str, str]
    metrics: list[tuple[int, str, float]]


def _number(text: str | None, kind: type):
    if text is None or text == "" or text.lower() == "none":
        return None
    try:
        return kind(float(text)) if kind is int else kind(text)
    except ValueError:
        return None


def _last_values(metrics: list[tuple[int, str, float]]) -> dict[str, float]:
    """Value at the highest step of each key (later entries win ties)."""
    best: dict[str, tuple[int, float]] = {}
    for step, key, value in metrics:
        if key not in best or step >= best[key][0]:
            best[key] = (step, value)
    return {key: value for key, (_, value) in best.items()}


def run_row(run: RunData) -> dict:
    """The runs.parquet row of one run (typed columns, then `param.*` strings)."""
    row: dict = {"run_id": run.run_id, "experiment": run.experiment, "run_name": run.run_name}
    status = run.tags.get(schema.TAG_STATUS) or run.source_status
    row["status"] = _MLFLOW_STATUS.get(status, status) if status else None
    for column, tag in _TAG_COLUMNS.items():
        kind = RUN_SCHEMA[column]
        row[column] = _number(run.tags.get(tag), int) if kind == pl.Int64 else run.tags.get(tag)
    for column, key in _PARAM_COLUMNS.items():
        kind = int if RUN_SCHEMA[column] == pl.Int64 else float
        row[column] = _number(run.params.get(key), kind)
    if row["batch_tokens"] is None and row["batch_size"] and row["seq_len"]:
        row["batch_tokens"] = row["batch_size"] * row["seq_len"]
    if row["budget_tokens"] is None:
        row["budget_tokens"] = _number(run.params.get("train.budget_tokens"), int)
    last = _last_values(run.metrics)
    tokens = last.get(schema.FINAL_PREFIX + "tokens", last.get(schema.METRIC_TOKENS))
    row["tokens"] = int(tokens) if tokens is not None else None
    for column, conv in (("c_6n", "flops_per_token_6n"), ("c_attn", "flops_per_token_attn")):
        both = row[conv] is not None and row["tokens"] is not None
        row[column] = row[conv] * row["tokens"] if both else None
    for column, (final_key, curve_key) in _FINAL_METRICS.items():
        row[column] = last.get(final_key, last.get(curve_key))
    for column, tag in OPTIONAL_TAG_COLUMNS.items():
        if tag in run.tags:
            row[column] = run.tags[tag]
    for key, value in run.params.items():
        row[PARAM_PREFIX + key] = str(value)
    return row


def _is_extra(column: str) -> bool:
    """A string column outside RUN_SCHEMA: a param, or an optional tag."""
    return column.startswith(PARAM_PREFIX) or column in OPTIONAL_TAG_COLUMNS


def curve_rows(run: RunData) -> list[dict]:
    """curves.parquet rows of one run; `tokens` from the run's `tokens` metric at that step.

    A WSD branch's points up to its fork are its trunk's (logged for MLflow's charts): they are
    left to the trunk's rows, so every point is in the table once.
    """
    tokens_at = {step: value for step, key, value in run.metrics if key == schema.METRIC_TOKENS}
    batch_tokens = _number(run.params.get(schema.PARAM_BATCH_TOKENS), int)
    fork = _number(run.tags.get(schema.TAG_FORK_STEP), int) or 0
    rows = []
    for step, key, value in run.metrics:
        summary = key.startswith(schema.FINAL_PREFIX) or key == schema.METRIC_PEAK_LR
        if summary or 0 < step <= fork:
            continue
        tokens = tokens_at.get(step)
        if tokens is None and batch_tokens is not None:
            tokens = step * batch_tokens
        rows.append(
            {
                "run_id": run.run_id,
                "step": int(step),
                "tokens": int(tokens) if tokens is not None else None,
                "metric": key,
                "value": float(value),
            }
        )
    return rows


def build_tables(runs: list[RunData]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(runs, curves) DataFrames, rows sorted by run_id (curves by run_id, metric, step)."""
    ordered = sorted(runs, key=lambda r: r.run_id)
    return _runs_frame([run_row(r) for r in ordered]), _curves_frame(ordered)


def _runs_frame(rows: list[dict]) -> pl.DataFrame:
    param_cols = sorted({k for row in rows for k in row if _is_extra(k)})
    full_schema = {**RUN_SCHEMA, **dict.fromkeys(param_cols, pl.String)}
    return pl.DataFrame(
        [{col: row.get(col) for col in full_schema} for row in rows], schema=full_schema
    )


def _curves_frame(runs: list[RunData]) -> pl.DataFrame:
    curves = [c for r in runs for c in curve_rows(r)]
    # A resumed run logs again the steps after its last checkpoint: keep one point per step (the
    # later one; resumes are bit-exact, so both hold the same value).
    return (
        pl.DataFrame(curves, schema=CURVE_SCHEMA)
        .unique(subset=["run_id", "metric", "step"], keep="last", maintain_order=True)
        .sort(["run_id", "metric", "step"])
    )


def write_tables(runs: pl.DataFrame, curves: pl.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    """Write runs.parquet and curves.parquet into `out_dir` (created); returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs.write_parquet(out_dir / RUNS_FILE)
    curves.write_parquet(out_dir / CURVES_FILE)
    return out_dir / RUNS_FILE, out_dir / CURVES_FILE


def write_table_batches(batches: Iterable[list[RunData]], out_dir: Path) -> tuple[int, int]:
    """`write_tables(*build_tables(runs))` for runs that arrive in batches in run_id order,
    holding one batch at a time: each batch's curves and run rows are written as they come
    (one row group per batch in each file), and the run rows of earlier batches are widened to
    every param column seen when the batches end. The files hold the same tables. Returns (runs,
    curve points) written.

    Raises:
        K3ScaleError: the batches are not in run_id order (the curves would not be sorted).
    """
    import pyarrow.parquet as pq

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = out_dir / (RUNS_FILE + ".parts")
    runs_partial, curves_partial = (
        out_dir / (name + ".partial") for name in (RUNS_FILE, CURVES_FILE)
    )
    last_id, count, points, params = None, 0, 0, set()
    curve_schema = pl.DataFrame(schema=CURVE_SCHEMA).to_arrow().schema
    try:
        parts.mkdir(exist_ok=True)
        with pq.ParquetWriter(curves_partial, curve_schema) as writer:
            for batch in batches:
                ordered = sorted(batch, key=lambda r: r.run_id)
                if not ordered:
                    continue
                if last_id is not None and ordered[0].run_id <= last_id:
                    raise K3ScaleError("write tables: run batches must come in run_id order")
                frame = _runs_frame([run_row(r) for r in ordered])
                params.update(c for c in frame.columns if _is_extra(c))
                frame.write_parquet(parts / f"{count:012d}.parquet")
                curves = _curves_frame(ordered)
                writer.write_table(curves.to_arrow())
                last_id, count, points = (
                    ordered[-1].run_id,
                    count + len(ordered),
                    points + curves.height,
                )
        _join_run_parts(sorted(parts.glob("*.parquet")), params, runs_partial)
    except BaseException:
        # The tables already there stay as they were.
        runs_partial.unlink(missing_ok=True)
        curves_partial.unlink(missing_ok=True)
        raise
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    runs_partial.replace(out_dir / RUNS_FILE)
    curves_partial.replace(out_dir / CURVES_FILE)
    return count, points


def _join_run_parts(parts: list[Path], params: set[str], out: Path) -> None:
    """One run table from per-batch parts, each widened to every param column (null where a
    batch's runs lack one), read and written one part at a time."""
    import pyarrow.parquet as pq

    full_schema = {**RUN_SCHEMA, **dict.fromkeys(sorted(params), pl.String)}
    if not parts:
        _runs_frame([]).write_parquet(out)
        return
    with pq.ParquetWriter(out, pl.DataFrame(schema=full_schema).to_arrow().schema) as writer:
        for part in parts:
            frame = pl.read_parquet(part)
            missing = [
                pl.lit(None, dtype).alias(c)
                for c, dtype in full_schema.items()
                if c not in frame.columns
            ]
            writer.write_table(frame.with_columns(missing).select(list(full_schema)).to_arrow())


def load_tables(directory: Path) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Read (runs, curves) written by `write_tables`.

    Raises:
        K3ScaleError: a file is missing (run `k3scale export` first), is not parquet, or lacks
            a column of the contract.
    """
    directory = Path(directory)
    tables = []
    for name, columns in ((RUNS_FILE, RUN_SCHEMA), (CURVES_FILE, CURVE_SCHEMA)):
        path = directory / name
        if not path.exists():
            raise K3ScaleError(
                f"load tables: {path} not found; run `k3scale export --out {directory}` first"
            )
        tables.append(_read_table(path, columns))
    return tables[0], tables[1]


def _read_table(path: Path, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    try:
        table = pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise K3ScaleError(
            f"load tables: {path} is not a readable parquet file ({reason}); export it again"
        ) from None
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise K3ScaleError(
            f"load tables: {path} lacks column(s) {missing}; export it again with `k3scale export`"
        )
    return table


def table_hash(runs: pl.DataFrame) -> str:
    """sha256 of the run table's content: columns sorted by name, rows by run_id, CSV-encoded.

    Independent of parquet encoding details and of row/column order in the file.
    """
    ordered = runs.select(sorted(runs.columns))
    if "run_id" in ordered.columns:
        ordered = ordered.sort("run_id")
    text = ordered.cast({c: pl.String for c in ordered.columns}).write_csv(null_value="<null>")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
