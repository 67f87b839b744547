"""One estimator per number (issue 32): what the dashboard draws is what the report prints.

For every committed study (analysis/results/*/ with runs.parquet and fit.json) and the fixture's,
the artifact is read the way `k3scale dashboard` reads it and the figures are built; then, entry
by entry of the artifact's JSON:

- every M(C) of `results.compute_optimal` is drawn at its stored value with its stored interval
  (identified), hollow without one (not identified) or not at all (undefined), and the hover
  text of each is the report's, word for word, wherever the headline prints it;
- for studies with a `results.schedule_comparison`, every cell's difference at own optima and at
  the reference's optimum, and the pooled mean, likewise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from k3scale.scaling.headline import headline_lines
from k3scale.scaling.values.verdict import Verdict
from k3scale.viz.fits import DashboardFits
from k3scale.viz.frontier import multiplier_panel
from k3scale.viz.schedules import schedule_comparison_panel
from k3scale.viz.summaries import cell_label

COMMITTED = Path(__file__).resolve().parents[2] / "analysis" / "results"
STUDIES = sorted(
    p for p in COMMITTED.iterdir() if (p / "runs.parquet").is_file() and (p / "fit.json").is_file()
)
# headline.py: "compute multiplier NEW over BASE (CONV, ROUTE route) at C=1.23e+11: TEXT".
HEADLINE = re.compile(
    r"compute multiplier (\S+) over (\S+) \((\S+), (\S+) route\) at C=(\S+): (.+)$"
)
# The hover text of an M(C) point: "C = 1.23e+11 FLOPs: M = TEXT".
HOVER = re.compile(r"C = (\S+) FLOPs: M = (.+)$")


def identified(stored: str) -> bool:
    return Verdict.from_json(stored).identified


def as_read(doc: dict) -> DashboardFits:
    """The artifact as `k3scale dashboard` reads it (from its JSON text)."""
    return DashboardFits.from_artifact(json.loads(json.dumps(doc)), source="check")


def drawn_at(trace, i: int) -> tuple:
    """(y, lo, hi) of point i of a trace; lo = hi = None without a bar."""
    y, bars = trace.y[i], trace.error_y
    if bars.array is None or bars.array[i] is None:
        return y, None, None
    return y, y - bars.arrayminus[i], y + bars.array[i]


def assert_drawn_as_stored(drawn: tuple, value, ci, identified: bool, key) -> None:
    """A point is drawn at its stored value, with its stored interval only where identified."""
    y, lo, hi = drawn
    assert y == value, key
    if identified:
        assert (lo, hi) == pytest.approx(tuple(ci), rel=1e-12, abs=1e-15), key
    else:
        assert (lo, hi) == (None, None), key


def stored_multipliers(doc: dict) -> dict[tuple, dict]:
    """(conv, route, new, compute) -> the artifact's entry, for every stored M(C)."""
    out = {}
    for conv, result in doc["results"].get("compute_optimal", {}).items():
        for route, part in result.get("routes", {}).items():
            for new, entries in part.get("multiplier", {}).items():
                for compute, entry in zip(result["compute"], entries, strict=True):
                    out[(conv, route, new, compute)] = entry
    return out


def drawn_multipliers(doc: dict) -> dict[tuple, tuple]:
    """The same keys -> ((y, lo, hi) or None where not drawn, hover text) of every M(C) point
    of the page's multiplier figures."""
    fits = as_read(doc)
    out = {}
    for conv, _, new in fits.multipliers():
        figure = multiplier_panel(fits, conv, new).figure
        for route, part in fits.comparisons[conv].routes.items():
            if part.skipped:  # no M(C) stored, none drawn
                continue
            line = next(t for t in figure.data if t.name == f"{route} route")
            hollow = [t for t in figure.data if t.name.startswith(f"{route} route, not")]
            for i, compute in enumerate(line.x):
                point = drawn_at(line, i) if line.y[i] is not None else None
                for t in hollow:
                    if compute in t.x:
                        point = drawn_at(t, list(t.x).index(compute))
                out[(conv, route, new, compute)] = (point, line.text[i])
    return out


def check_multipliers(doc: dict) -> set[tuple[str, str, str]]:
    """Assert the page's M(C) is the report's; return the (conv, route, new) the headline
    printed."""
    stored, drawn = stored_multipliers(doc), drawn_multipliers(doc)
    assert drawn.keys() == stored.keys()
    for key, entry in stored.items():
        point, _ = drawn[key]
        if entry["value"] is None:
            assert point is None, key
        else:
            ok = identified(entry["verdict"])
            assert_drawn_as_stored(point, entry["value"], entry["ci"], ok, key)
    hover = {(c, r, n, f"{x:.3g}"): text for (c, r, n, x), (_, text) in drawn.items()}
    printed = set()
    for line in headline_lines(doc):
        found = HEADLINE.search(line)
        if found is None:
            continue
        new, base, conv, route, at, text = found.groups()
        assert base == doc["results"]["compute_optimal"][conv]["baseline"]
        # The report prints C to 3 significant digits; so does the hover, then the same words.
        assert HOVER.fullmatch(hover[(conv, route, new, at)]).groups() == (at, text), line
        printed.add((conv, route, new))
    return printed


def reading_points(figure, name: str) -> dict[str, tuple]:
    """x label -> ((y, lo, hi), hover text) of the traces named `name` (identified or not)."""
    out = {}
    for t in figure.data:
        if t.name in (name, f"{name}, not identified"):
            for i, x in enumerate(t.x):
                out[x] = (drawn_at(t, i), t.text[i])
    return out


def check_schedule_comparison(doc: dict) -> int:
    """Assert the schedule figure draws the report's schedule comparison; return the number of
    differences (cells times readings, and pooled means) checked."""
    stored = doc["results"]["schedule_comparison"]
    ref = stored["reference"]
    panel = schedule_comparison_panel(as_read(doc))
    report = headline_lines(doc)
    checked = 0
    for entry in stored["cells"]:
        label = cell_label(entry["cell"]["size"], entry["cell"]["budget_tokens"])
        for other, part in entry["comparison"].items():
            texts = {}
            for reading, name in (("own", "each schedule's own"), ("shared", f"{ref}'s")):
                points = reading_points(panel.figure, f"{ref} − {other} at {name} optimum")
                value, ci = part[f"diff_{reading}"], part[f"ci_{reading}"]
                ok = identified(part[f"verdict_{reading}"])
                key = (label, other, reading)
                if value is None:
                    assert label not in points, key
                    continue
                point, texts[reading] = points[label]
                assert_drawn_as_stored(point, value, ci, ok, key)
                checked += 1
            # The hover says what the report's line of the cell says, in its words.
            where = f"{entry['cell']['size']} D={entry['cell']['budget_tokens']:,}"
            line = next(line for line in report if line.startswith(f"  {where}: own optima"))
            assert all(text in line for text in texts.values()), (line, texts)
    for other, pooled in stored["pooled"].items():
        traces = [t for t in panel.figure.data if t.x == (f"pooled, {other}",)]
        if not identified(pooled["verdict"]):
            assert not traces and Verdict.from_json(pooled["verdict"]).reason in panel.caption
            continue
        (trace,) = traces
        key = ("pooled", other)
        assert_drawn_as_stored(drawn_at(trace, 0), pooled["mean_diff"], pooled["ci"], True, key)
        mean_text = trace.text[0].split(" (")[0]
        assert any(f"({other}): mean {mean_text} (" in line for line in report), mean_text
        checked += 1
    return checked


@pytest.mark.parametrize("folder", STUDIES, ids=lambda p: p.name)
def test_committed_dashboards_draw_the_reports_numbers(folder):
    doc = json.loads((folder / "fit.json").read_text())
    assert check_multipliers(doc) == {key[:3] for key in stored_multipliers(doc)}
    if folder.name.startswith("cosine_vs_wsd"):
        assert check_schedule_comparison(doc) > 0


def test_fixture_dashboards_draw_the_reports_numbers(fit_document, artifacts):
    for doc in (fit_document, artifacts["cosine_vs_wsd"]):
        assert check_multipliers(doc) == {key[:3] for key in stored_multipliers(doc)} != set()
    assert check_schedule_comparison(artifacts["cosine_vs_wsd"]) > 0
