"""`k3scale fit`: scaling-law fits.

- `k3scale fit ANALYSIS --from DIR|mlflow --out fit.json`: run recipe `analysis/ANALYSIS.py` on the
  run tables and write a deterministic fit artifact with provenance.
- `k3scale fit surface CSV --n-col N --d-col D --loss-col L [--exclude-col C] --json`:
  Chinchilla surface of any table (Epoch's protocol).
- `k3scale fit frontier CSV --compute-col C --loss-col L --group-col G --baseline NAME --json`:
  per-group frontiers, compute multipliers and the shared-exponent test.
"""

from __future__ import annotations

import argparse
import os

from k3scale.errors import K3ScaleError

GENERIC = ("surface", "frontier")


def register(sub) -> None:
    parser = sub.add_parser(
        "fit",
        help="fit scaling laws: a study recipe, or `surface`/`frontier` on any CSV",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "analysis",
        metavar="ANALYSIS",
        help="recipe name in analysis/ (e.g. cosine_vs_wsd, k2_vs_k3), or `surface` / `frontier`",
    )
    parser.add_argument("csv", nargs="?", metavar="CSV", help="input table (surface/frontier)")
    recipe = parser.add_argument_group("recipe")
    recipe.add_argument(
        "--from",
        dest="source",
        metavar="DIR|mlflow",
        help="folder with runs.parquet/curves.parquet, or `mlflow`",
    )
    recipe.add_argument("--experiment", help="MLflow experiment (with --from mlflow)")
    recipe.add_argument("--tracking-uri", help="MLflow tracking URI (with --from mlflow)")
    recipe.add_argument("--replicas", help="replica folder, fallback for --from mlflow")
    recipe.add_argument("--out", help="fit artifact path (JSON)")
    recipe.add_argument("--loss", default="final_val_ood_loss", help="loss column of the runs")
    recipe.add_argument(
        "--grid",
        choices=("epoch", "coarse"),
        default="epoch",
        help="surface start grid (epoch: 4,500 starts)",
    )
    table = parser.add_argument_group("surface / frontier")
    table.add_argument("--n-col")
    table.add_argument("--d-col")
    table.add_argument("--loss-col")
    table.add_argument("--exclude-col", help="rows where this column is non-zero are excluded")
    table.add_argument("--compute-col")
    table.add_argument("--group-col")
    table.add_argument("--baseline")
    table.add_argument("--at", help="comma-separated compute values for M(C)")
    table.add_argument("--json", action="store_true", help="print one JSON object")
    common = parser.add_argument_group("bootstrap")
    common.add_argument(
        "--bootstrap",
        type=int,
        default=1000,
        metavar="N",
        help="bootstrap resamples (0 = none; default 1000)",
    )
    common.add_argument("--seed", type=int, default=0)
    common.add_argument("--workers", type=int, default=0, help="processes (default: all cores)")
    parser.set_defaults(handler=run_fit)


def _workers(args) -> int:
    return args.workers if args.workers > 0 else max(1, len(os.sched_getaffinity(0)))


def run_fit(args) -> int:
    if args.bootstrap < 0:
        raise K3ScaleError("fit: --bootstrap must be >= 0")
    if args.analysis in GENERIC:
        return _fit_table(args, _workers(args))
    return _fit_recipe(args, _workers(args))


def _require(args, *names: str) -> None:
    missing = [f"--{n.replace('_', '-')}" for n in names if not getattr(args, n)]
    if not args.csv:
        missing.insert(0, "CSV")
    if missing:
        raise K3ScaleError(f"fit {args.analysis}: missing {', '.join(missing)}")


def _fit_table(args, workers: int) -> int:
    import json

    from k3scale.scaling import generic
    from k3scale.scaling.result import round_floats

    if args.analysis == "surface":
        _require(args, "n_col", "d_col", "loss_col")
        out = generic.surface_from_csv(
            args.csv,
            n_col=args.n_col,
            d_col=args.d_col,
            loss_col=args.loss_col,
            exclude_col=args.exclude_col,
            num_resamples=args.bootstrap,
            seed=args.seed,
            workers=workers,
            grid=args.grid,
        )
    else:
        _require(args, "compute_col", "loss_col", "group_col", "baseline")
        at = generic.parse_compute_list(args.at) if args.at else None
        out = generic.frontier_from_csv(
            args.csv,
            compute_col=args.compute_col,
            loss_col=args.loss_col,
            group_col=args.group_col,
            baseline=args.baseline,
            at=at,
            num_resamples=args.bootstrap,
            seed=args.seed,
            workers=workers,
        )
    if args.json:
        print(json.dumps(round_floats(out), sort_keys=True))
    else:
        print(generic.render(args.analysis, out))
    return 0


def _fit_recipe(args, workers: int) -> int:
    from pathlib import Path

    from k3scale.scaling import artifact, study
    from k3scale.scaling.tables import build_tables, load_tables

    if not args.source or not args.out:
        raise K3ScaleError("fit: a recipe needs --from DIR|mlflow and --out fit.json")
    recipe = artifact.load_recipe(args.analysis)
    if args.source == "mlflow":
        from k3scale.scaling.sources import collect_runs

        if not args.experiment:
            raise K3ScaleError("fit: --from mlflow needs --experiment NAME")
        uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        found, source = collect_runs(
            args.experiment, uri, Path(args.replicas) if args.replicas else None
        )
        runs, curves = build_tables(found)
    else:
        runs, curves = load_tables(Path(args.source))
        source = f"tables {args.source}"
    options = study.StudyOptions(
        loss=args.loss,
        num_resamples=args.bootstrap,
        seed=args.seed,
        workers=workers,
        surface_grid=args.grid,
    )
    results = recipe.run(runs, curves, options)
    opts = {k: v for k, v in options.to_dict().items() if k != "workers"}
    payload = {
        "analysis": args.analysis,
        "provenance": artifact.provenance(runs, opts, source.split(" ")[0]),
        "results": results,
    }
    path = artifact.write_artifact(Path(args.out), payload)
    print(f"wrote {path} ({runs.height} runs, table {payload['provenance']['table_hash'][:12]})")
    return 0
