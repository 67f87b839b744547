"""`k3scale export`: MLflow (or JSONL replicas) -> runs.parquet + curves.parquet."""

from __future__ import annotations

import os


def register(sub) -> None:
    parser = sub.add_parser(
        "export",
        help="write a study's run table and curves as parquet (from MLflow or replicas)",
        description="Export one MLflow experiment to runs.parquet and curves.parquet (their "
        "columns: k3scale/scaling/inputs/tables.py). Reads the server in batches; falls back to the "
        "JSONL replicas under --replicas when no server answers.",
    )
    parser.add_argument("--experiment", required=True, help="MLflow experiment (= study) name")
    parser.add_argument("--tracking-uri", help="MLflow URI (default $MLFLOW_TRACKING_URI)")
    parser.add_argument("--replicas", help="folder searched recursively for replica.jsonl")
    parser.add_argument("--out", required=True, help="output folder")
    parser.set_defaults(handler=run_export)


def run_export(args) -> int:
    from pathlib import Path

    from k3scale.scaling.inputs.sources import run_batches
    from k3scale.scaling.inputs.tables import CURVES_FILE, RUNS_FILE, write_table_batches

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    batches, source = run_batches(
        args.experiment, uri, Path(args.replicas) if args.replicas else None
    )
    out = Path(args.out)
    runs, points = write_table_batches(batches, out)
    print(
        f"{runs} runs, {points} curve points from {source} -> {out / RUNS_FILE}, {out / CURVES_FILE}"
    )
    return 0
