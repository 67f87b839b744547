"""One self-contained HTML page per study: the answers with the design's power, then each figure
with its caption; the provenance and every number with its verdict are folded under the answers,
so the first figure sits on the first screen (issue 51).

plotly.js comes from the installed plotly package, inline (one `<script id="plotly-js">`) or as
a `plotly.min.js` file next to the page; never from a CDN, so the page opens from file:// with
no network (platform.md section 9).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import plotly.io as pio
import plotly.offline

from k3scale.viz.panel import Panel

PLOTLY_JS_FILE = "plotly.min.js"
PLOTLY_JS_ID = "plotly-js"
# MathJax stays out (to_html would fetch it from a CDN); no plotly logo in the mode bar.
FIGURE_CONFIG = {"displaylogo": False, "responsive": True}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 1280px; padding: 0 24px;
       color: #222; }
header { border-bottom: 1px solid #ddd; margin-bottom: 16px; }
table.provenance td { padding: 2px 12px 2px 0; font-size: 13px; vertical-align: top; }
table.provenance td:first-child { color: #666; }
nav a { margin-right: 12px; font-size: 13px; }
section { margin: 24px 0 32px; }
p.caption { font-size: 14px; margin: 4px 8px; color: #333; }
p.note { font-size: 13px; margin: 2px 8px; color: #555; font-style: italic; }
code { font-size: 12px; }
ul.answers { margin: 8px 0; padding-left: 20px; }
ul.answers li { font-weight: 600; margin: 4px 0; font-size: 15px; }
p.power { font-size: 13px; margin: 4px 0 8px; color: #444; }
details.numbers { margin: 4px 0 8px; font-size: 13px; }
details.numbers summary { cursor: pointer; color: #1f4e8c; }
"""


@dataclass(frozen=True, kw_only=True)
class Provenance:
    study: str
    """Study name (the runs' `study` column)."""
    tables: str
    """Where the run tables came from."""
    run_table_hash: str
    """Hash of the run table (k3scale.scaling.inputs.tables.table_hash when available)."""
    num_runs: int
    code_version: str
    """k3scale version and the git SHA(s) the runs were trained with."""
    fits: str
    """Fit file and its hash, or 'none'."""
    rendered_at: str
    """UTC date and time the page was rendered (ISO 8601)."""


def _header(
    title: str,
    provenance: Provenance,
    panels: list[Panel],
    skipped: list[str],
    headline: list[str],
    answers: list[str],
    power: str | None,
) -> str:
    rows = [
        ("study", provenance.study),
        ("run tables", provenance.tables),
        ("run-table hash", f"<code>{html.escape(provenance.run_table_hash)}</code>"),
        ("runs", str(provenance.num_runs)),
        ("code version", f"<code>{html.escape(provenance.code_version)}</code>"),
        ("fits", provenance.fits),
        ("rendered", provenance.rendered_at),
    ]
    table = "".join(
        f"<tr><td>{name}</td><td>{value if value.startswith('<code>') else html.escape(value)}"
        "</td></tr>"
        for name, value in rows
    )
    nav = "".join(f'<a href="#{p.key}">{html.escape(p.key)}</a>' for p in panels)
    notes = "".join(f"<li>{html.escape(note)}</li>" for note in skipped)
    notes = (
        f'<p>Figures the data could not support:</p><ul class="skipped">{notes}</ul>'
        if notes
        else ""
    )
    lines = "".join(f"<li>{html.escape(line.strip())}</li>" for line in headline)
    numbers = (
        f'<p>Every number of the fit file with its verdict:</p><ul class="headline">{lines}</ul>'
        if lines
        else ""
    )
    claims = "".join(f"<li>{html.escape(line.strip())}</li>" for line in answers)
    claims = f'<ul class="answers">{claims}</ul>' if claims else ""
    power_text = f'<p class="power">{html.escape(power)}</p>' if power else ""
    folded = (
        '<details class="numbers"><summary>Provenance, every number with its verdict, and the '
        f'figures the data could not support</summary><table class="provenance">{table}</table>'
        f"{numbers}{notes}</details>"
    )
    return (
        f"<header><h1>{html.escape(title)}</h1>{claims}{power_text}{folded}<nav>{nav}</nav>"
        "</header>"
    )


def _section(panel: Panel) -> str:
    body = pio.to_html(
        panel.figure,
        full_html=False,
        include_plotlyjs=False,
        include_mathjax=False,
        div_id=f"fig-{panel.key}",
        config=FIGURE_CONFIG,
    )
    note = f'<p class="note">{html.escape(panel.note)}</p>' if panel.note else ""
    return (
        f'<section id="{panel.key}" class="panel">{body}'
        f'<p class="caption">{html.escape(panel.caption)}</p>{note}</section>'
    )


def plotly_js_source() -> str:
    """The plotly.js bundle shipped with the installed plotly package (no network)."""
    return plotly.offline.get_plotlyjs()


def render_page(
    title: str,
    provenance: Provenance,
    panels: list[Panel],
    skipped: list[str] = (),
    *,
    inline_js: bool = True,
    headline: list[str] = (),
    answers: list[str] = (),
    power: str | None = None,
) -> str:
    """The whole page as a string.

    Args:
        title: page heading.
        provenance: header contents.
        panels: figures in page order.
        skipped: one line per figure the layout wanted but the data could not support.
        headline: every number of the fit with its verdict (folded under the answers).
        answers: one line per claim, the first thing on the page.
        power: the design's power line from its committed calibration, under the answers.
        inline_js: embed plotly.js (about 4.8 MB); False references `plotly.min.js` next to
            the page, which the caller must write (see `plotly_js_source`).
    """
    if inline_js:
        script = f'<script id="{PLOTLY_JS_ID}">{plotly_js_source()}</script>'
    else:
        script = f'<script id="{PLOTLY_JS_ID}" src="{PLOTLY_JS_FILE}"></script>'
    sections = "\n".join(_section(p) for p in panels)
    header = _header(title, provenance, panels, list(skipped), list(headline), list(answers), power)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style>{script}</head>"
        f"<body>{header}\n"
        f"{sections}\n</body></html>\n"
    )
