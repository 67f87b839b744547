"""`k3scale dashboard`: one self-contained offline HTML page per study.

    k3scale dashboard STUDY [--preset P] --out page.html [--fit fit.json] [--png DIR]
    k3scale dashboard --from TABLES_DIR --out page.html [--fit fit.json] [--png DIR]

STUDY is a study name (e.g. `k2_vs_k3`); its tables are read from
`studies/<STUDY>-<preset>/tables/` (the study folder of k3scale/sweep/run.py plus `tables/`,
where `k3scale export --out` should write them) and its fits from
`studies/<STUDY>-<preset>/fit.json` when that file exists. Without --preset the single study
folder that has tables is used. The layout is the project's `dashboards/<study>.py`, or --layout
(a name in the project's dashboards/, or a .py file path).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from k3scale.errors import K3ScaleError

STUDIES_ROOT = Path("studies")
TABLES_SUBDIR = "tables"
FIT_FILE = "fit.json"


def register(sub) -> None:
    parser = sub.add_parser(
        "dashboard",
        help="render a study's offline HTML dashboard (plotly, no network)",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("study", nargs="?", help="study name, e.g. k2_vs_k3 (or use --from)")
    parser.add_argument("--from", dest="tables", type=Path, help="folder with runs.parquet")
    parser.add_argument("--preset", help="preset of the study folder studies/<study>-<preset>")
    parser.add_argument(
        "--studies-root", type=Path, default=STUDIES_ROOT, help="where study folders live"
    )
    parser.add_argument("--out", type=Path, required=True, help="HTML file to write")
    parser.add_argument("--fit", type=Path, help="fit JSON from `k3scale fit`")
    parser.add_argument("--png", type=Path, help="also export every figure as PNG into DIR")
    parser.add_argument("--layout", help="layout name in dashboards/ or a .py file")
    parser.add_argument(
        "--metric", default="final_val_ood_loss", help="objective column of the run table"
    )
    parser.add_argument(
        "--js",
        choices=("inline", "file"),
        default="inline",
        help="plotly.js inline (one file) or as plotly.min.js next to the page",
    )
    parser.set_defaults(handler=_dashboard)


def resolve_study_dir(study: str, preset: str | None, root: Path) -> Path:
    """`root/<study>-<preset>`; without a preset, the only such folder holding tables."""
    if preset:
        folder = root / f"{study}-{preset}"
        if not (folder / TABLES_SUBDIR / "runs.parquet").is_file():
            raise K3ScaleError(
                f"no run tables in {folder / TABLES_SUBDIR}; run `k3scale export --experiment "
                f"{study} --out {folder / TABLES_SUBDIR}` first"
            )
        return folder
    found = sorted(p.parent.parent for p in root.glob(f"{study}-*/{TABLES_SUBDIR}/runs.parquet"))
    if not found:
        raise K3ScaleError(
            f"no study folder {root}/{study}-<preset>/{TABLES_SUBDIR} with runs.parquet; export "
            "the study's tables there, or pass --from DIR"
        )
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise K3ScaleError(f"several study folders have tables ({names}); pass --preset")
    return found[0]


def _dashboard(args) -> int:
    if (args.study is None) == (args.tables is None):
        raise K3ScaleError("give a STUDY name or --from TABLES_DIR (exactly one)")
    if args.tables is None:
        study_dir = resolve_study_dir(args.study, args.preset, args.studies_root)
        tables = study_dir / TABLES_SUBDIR
        fit_path = args.fit or (study_dir / FIT_FILE if (study_dir / FIT_FILE).is_file() else None)
    else:
        tables, fit_path = args.tables, args.fit
    html, panels, skipped = render(tables, fit_path, args.layout, args.metric, args.js)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(html, encoding="utf-8")
    if args.js == "file":
        from k3scale.viz.page import PLOTLY_JS_FILE, plotly_js_source

        (args.out.parent / PLOTLY_JS_FILE).write_text(plotly_js_source(), encoding="utf-8")
    print(f"dashboard: {len(panels)} figures -> {args.out}")
    for note in skipped:
        print(f"dashboard: skipped: {note}")
    if args.png:
        from k3scale.viz.export_png import export_pngs

        paths = export_pngs(panels, args.png)
        print(f"dashboard: {len(paths)} PNGs -> {args.png}")
    return 0


def render(tables: Path, fit_path: Path | None, layout: str | None, metric: str, js: str):
    """(html, panels, skipped notes) of the dashboard of one table folder."""
    from k3scale.scaling.inputs.tables import load_tables
    from k3scale.viz.dashboard import DashboardInputs, build_panels, load_layout
    from k3scale.viz.page import render_page
    from k3scale.viz.summaries import tuned_text

    runs, curves = load_tables(tables)
    if runs.is_empty():
        raise K3ScaleError(f"the run table in {tables} is empty")
    fits, fit_note = _load_fits(fit_path, runs)
    study = _study_name(runs)
    chosen = load_layout(layout, study)
    placed, unplaced_note = _placed_runs(runs, tables)
    inputs = DashboardInputs(runs=placed, curves=curves, fits=fits, metric=metric)
    page = build_panels(chosen, inputs)
    provenance = _provenance(runs, tables, study, fit_note)
    title = f"{chosen.title.format(tuned=tuned_text(runs))} — {study}"
    notes = [*unplaced_note, *page.skipped, *fits.notes]
    html = render_page(
        title,
        provenance,
        page.panels,
        notes,
        inline_js=js == "inline",
        headline=fits.headline,
        answers=fits.answers or ["no comparison in this fit"],
        power=_design_power(tables, study),
    )
    return html, page.panels, notes


def _design_power(tables: Path, study: str) -> str | None:
    """The power line of the preset the study.json beside the tables names (the study folder
    holds tables/; an exported results folder holds the tables itself)."""
    import json

    from k3scale.bench.power import design_power

    for record in (tables / "study.json", tables.parent / "study.json"):
        if record.is_file():
            preset = json.loads(record.read_text()).get("preset")
            return design_power(study, preset) if preset else None
    return None


# What every figure places a run by: its tags (arch, schedule) and its params (LR, batch, size).
PLACED_BY = ("arch", "schedule", "lr", "batch_size", "n_active")


def _placed_runs(runs, tables: Path):
    """The runs a figure can place, and a note naming the others.

    A run missing any of PLACED_BY is an attempt whose MLflow run was created but whose tags or
    params never arrived (the server went down in between); it stays in the exported table and
    in the run count, and out of the figures.
    """
    import polars as pl

    known = pl.all_horizontal([pl.col(column).is_not_null() for column in PLACED_BY])
    placed, unplaced = runs.filter(known), runs.filter(~known)
    if placed.is_empty():
        raise K3ScaleError(f"no run in {tables} has the {', '.join(PLACED_BY)} to plot it by")
    if unplaced.is_empty():
        return placed, []
    ids = ", ".join(f"{r['run_id']} ({r['status']})" for r in unplaced.iter_rows(named=True))
    note = (
        f"{unplaced.height} run(s) without the {', '.join(PLACED_BY)} the figures place them by "
        f"left out of the figures: {ids}"
    )
    return placed, [note]


def _study_name(runs) -> str:
    names = sorted({s for s in runs["study"].to_list() if s}) if "study" in runs.columns else []
    return "+".join(names) or "unnamed study"


def _load_fits(path: Path | None, runs):
    import json

    from k3scale.scaling.inputs.tables import table_hash
    from k3scale.viz.fits import DashboardFits, table_hash_of

    if path is None:
        return DashboardFits(), "none (run-table figures only: no fitted quantity is drawn)"
    if not path.is_file():
        raise K3ScaleError(f"fit file {path} does not exist (run `k3scale fit` first)")
    raw = path.read_bytes()
    try:
        document = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise K3ScaleError(f"fit file {path} is not JSON: {exc}") from None
    note = f"{path} (sha256 {hashlib.sha256(raw).hexdigest()[:16]})"
    fitted_on = table_hash_of(document) if isinstance(document, dict) else None
    if fitted_on is not None and fitted_on != table_hash(runs):
        note += f"; WARNING: fitted on a different run table (hash {fitted_on[:16]})"
    return DashboardFits.from_artifact(document, source=note), note


def _provenance(runs, tables: Path, study: str, fit_note: str):
    import datetime

    from k3scale.scaling.artifact import code_version
    from k3scale.scaling.inputs.tables import table_hash
    from k3scale.viz.page import Provenance

    code = code_version()
    trained = sorted({s[:12] for s in runs["git_sha"].drop_nulls().to_list()})
    renderer = f"k3scale {code['package']} @ {(code['git_sha'] or 'unknown')[:12]}"
    renderer += " (dirty)" if code["git_dirty"] else ""
    return Provenance(
        study=study,
        tables=str(tables),
        run_table_hash=table_hash(runs),
        num_runs=runs.height,
        code_version=f"runs trained at {', '.join(trained) or 'unknown'}; rendered by {renderer}",
        fits=fit_note,
        rendered_at=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    )
