"""`k3scale fit`: scaling-law fits.

- `k3scale fit ANALYSIS --from DIR|mlflow --out fit.json`: run recipe `analysis/ANALYSIS.py` (the
  project's folder only; or a .py path) on the run tables and write a deterministic fit artifact
  with provenance. An empty table, or one of another study, is refused and leaves --out as it was.
- `k3scale fit surface CSV --n-col N --d-col D --loss-col L [--exclude-col C] --json`:
  Chinchilla surface of any table (Epoch's protocol).
- `k3scale fit frontier CSV --compute-col C --loss-col L --group-col G --baseline NAME --json`:
  per-group frontiers, compute multipliers and the shared-exponent test.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from k3scale.errors import K3ScaleError

GENERIC = ("surface", "frontier")
MAX_SHOWN_DIFFERENCES = 20
# Study declarations: what each study (and its recipe of the same name) compares.
PROJECT_STUDIES = Path(__file__).resolve().parents[2] / "experiments"


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
    recipe.add_argument(
        "--check",
        metavar="FIT_JSON",
        help="then compare --out with this artifact (the CPU-independent rule of "
        "k3scale/scaling/reproduce.py); exit 1 unless it is reproduced",
    )
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

    from k3scale.commands.output import heartbeat
    from k3scale.scaling import generic
    from k3scale.scaling.values.result import round_floats

    beat = heartbeat(_fitting(args, workers))
    if args.analysis == "surface":
        _require(args, "n_col", "d_col", "loss_col")
        with beat:
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
        with beat:
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
    if out["duplicates"]:
        print(
            f"k3scale fit: warning: {out['duplicates']} duplicated row(s) of {args.csv} "
            "collapsed before fitting (a repeated point is one measurement)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(round_floats(out), sort_keys=True))
    else:
        print(render(args.analysis, out))
    return 0


def _fitting(args, workers: int) -> str:
    """What the heartbeat says runs: 'k3scale fit surface: fitting, 1000 bootstrap resamples on
    2 processes'."""
    resamples = f"{args.bootstrap} bootstrap resamples" if args.bootstrap else "no bootstrap"
    return f"k3scale fit {args.analysis}: fitting, {resamples} on {workers} process(es)"


def render(kind: str, out: dict) -> str:
    """Human summary of a generic fit; every number rounded to what its interval justifies."""
    from k3scale.commands.output import with_interval

    if kind == "surface":
        lines = [
            f"L(N,D) = E + A/N^alpha + B/D^beta on {out['n_points']} points "
            f"({out['excluded']} excluded); success={out['success']}"
        ]
        for name in ("E", "A", "B", "alpha", "beta", "a", "b"):
            lines.append(f"  {name:6s} {with_interval(out[name], out['ci'].get(name))}")
        return "\n".join(lines)
    lines = [f"baseline {out['baseline']}"]
    for name, fit in out["groups"].items():
        params = "  ".join(
            f"{p}={with_interval(fit[p], fit.get('ci', {}).get(p))}" for p in ("E", "A", "alpha")
        )
        lines.append(f"  {name}: {params}")
    for m in out["multiplier"]:
        ruling = "" if m.get("verdict") in (None, "identified") else f" ({m['verdict']})"
        lines.append(
            f"  M({m['compute']:.3g}) {m['group']} = {with_interval(m['value'], m.get('ci'))}"
            f"{ruling}"
        )
    shared = out["shared_exponent"]
    p_value = shared.get("p_value")
    if p_value is None:
        p_text = "p undefined"
    else:
        p_text = "p < 0.001" if p_value < 0.001 else f"p = {p_value:.3f}"
    lines.append(
        f"  shared exponent: {p_text}, "
        f"multiplier {with_interval(shared.get('multiplier'), shared.get('ci'))}"
    )
    return "\n".join(lines)


def _fit_recipe(args, workers: int) -> int:
    from k3scale.scaling import artifact, study

    if not args.source or not args.out:
        raise K3ScaleError("fit: a recipe needs --from DIR|mlflow and --out fit.json")
    if Path(args.out).is_dir():
        raise K3ScaleError(f"fit: --out {args.out} is a folder; give a file such as fit.json")
    recipe = artifact.load_recipe(args.analysis)
    read, curves, source = _read_tables(args)
    if read.is_empty():
        raise K3ScaleError(f"fit: the run table ({source}) has no rows; nothing to fit")
    if not args.analysis.endswith(".py"):
        check_recipe_matches(args.analysis, read)
    runs, curves, duplicates = collapse_duplicates(read, curves)
    options = study.StudyOptions(
        loss=args.loss,
        num_resamples=args.bootstrap,
        seed=args.seed,
        workers=workers,
    )
    from k3scale.commands.output import heartbeat

    with heartbeat(_fitting(args, workers)):
        results = recipe.run(runs, curves, options)
    opts = {k: v for k, v in options.to_dict().items() if k != "workers"}
    payload = {
        "analysis": args.analysis,
        "provenance": artifact.provenance(read, opts, source.split(" ")[0], duplicates),
        "results": results,
    }
    path = artifact.write_artifact(Path(args.out), payload)
    print(f"wrote {path} ({runs.height} runs, table {payload['provenance']['table_hash'][:12]})")
    return _check_reproduced(path, Path(args.check)) if args.check else 0


def _check_reproduced(refit: Path, committed: Path) -> int:
    import json

    from k3scale.scaling.reproduce import RELATIVE_TOLERANCE, compare_artifacts

    try:
        expected = json.loads(committed.read_text())
    except (OSError, ValueError) as error:
        raise K3ScaleError(
            f"fit --check {committed}: not a readable fit artifact ({error})"
        ) from None
    comparison = compare_artifacts(json.loads(refit.read_text()), expected)
    if comparison.reproduced:
        print(
            f"reproduced {committed}: {comparison.numbers_checked} numbers within "
            f"{RELATIVE_TOLERANCE:g} relative, {len(comparison.verdict_only)} fits the data "
            "cannot identify by their verdicts"
        )
        return 0
    shown = comparison.differences[:MAX_SHOWN_DIFFERENCES]
    print(f"NOT reproduced {committed}: {len(comparison.differences)} difference(s)")
    print("\n".join(f"  {line}" for line in shown))
    return 1


def _read_tables(args):
    """(runs, curves, source description) from a table folder or MLflow."""
    from k3scale.scaling.inputs.tables import build_tables, load_tables

    if args.source != "mlflow":
        runs, curves = load_tables(Path(args.source))
        return runs, curves, f"tables {args.source}"
    from k3scale.scaling.inputs.sources import collect_runs

    if not args.experiment:
        raise K3ScaleError("fit: --from mlflow needs --experiment NAME")
    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    found, source = collect_runs(
        args.experiment, uri, Path(args.replicas) if args.replicas else None
    )
    runs, curves = build_tables(found)
    return runs, curves, source


def _holdings(runs) -> str:
    """'studies k2_vs_k3; archs k2, k3; schedules cosine (108 runs)'."""
    parts = []
    for column, label in (("study", "studies"), ("arch", "archs"), ("schedule", "schedules")):
        values = sorted({str(v) for v in runs[column].drop_nulls().to_list()})
        parts.append(f"{label} {', '.join(values) or 'none'}")
    return f"{'; '.join(parts)} ({runs.height} runs)"


def check_recipe_matches(name: str, runs) -> None:
    """Refuse a recipe that does not fit the table: its study, archs or schedules.

    A table that names its study must name this recipe's; when the project declares the study
    (experiments/<name>.py), every arch and schedule it compares must be in the table.

    Raises:
        K3ScaleError: one line naming what the table holds.
    """
    from k3scale.sweep.declaration import load_study

    studies = set(runs["study"].drop_nulls().to_list())
    if studies and studies != {name}:
        raise K3ScaleError(
            f"fit: recipe {name!r} does not match the table, which holds {_holdings(runs)}"
        )
    declaration = PROJECT_STUDIES / f"{name}.py"
    if not declaration.is_file():
        return
    declared = load_study(declaration)
    # A preset may run the study on another schedule (k2_vs_k3 on WSD): any preset's will do.
    schedule_sets = {declared.schedules_of(p) for p in declared.presets.values()}
    held = {column: set(runs[column].drop_nulls().to_list()) for column in ("arch", "schedule")}
    if not set(declared.archs) <= held["arch"]:
        raise K3ScaleError(
            f"fit: recipe {name!r} compares archs {', '.join(declared.archs)}, but the table "
            f"holds {_holdings(runs)}"
        )
    if not any(set(wanted) <= held["schedule"] for wanted in schedule_sets):
        raise K3ScaleError(
            f"fit: recipe {name!r} compares schedules {', '.join(declared.schedules)}, but the "
            f"table holds {_holdings(runs)}"
        )


def collapse_duplicates(runs, curves):
    """(runs, curves, duplicated run rows dropped): identical rows of each table kept once.

    A run exported twice is one measurement; fitted twice it would narrow every interval. Two
    rows with one run_id that differ are not duplicates but a broken table, and are refused.
    """
    unique = runs.unique(maintain_order=True)
    clash = _repeated_ids(unique)
    if clash:
        raise K3ScaleError(
            f"fit: run_id {', '.join(clash[:3])} appear(s) in several different rows of the run "
            "table; export the tables again"
        )
    dropped = runs.height - unique.height
    if dropped:
        print(
            f"k3scale fit: warning: {dropped} duplicated run row(s) collapsed before fitting "
            f"(run_id {', '.join(_repeated_ids(runs)[:3])})",
            file=sys.stderr,
        )
    return unique, curves.unique(maintain_order=True), dropped


def _repeated_ids(runs) -> list[str]:
    return sorted(set(runs.filter(runs["run_id"].is_duplicated())["run_id"].to_list()))
