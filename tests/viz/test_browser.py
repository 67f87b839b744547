"""The dashboard in a real headless Chromium: every figure draws, has data, and nothing leaves.

Installs nothing: needs `/usr/bin/chromium` (`apt-get install chromium`; `.ci/run` installs it
when missing) and Playwright for Python (no browser download). Slow: a browser start plus a
5 MB page.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k3scale.commands.dashboard import render

DATA = Path(__file__).parent / "data"
CHROMIUM = Path("/usr/bin/chromium")
# platform.md section 9: the flags a sandbox-less CI container needs, and no background fetches.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")
DRAW_TIMEOUT_MS = 60_000

pytestmark = pytest.mark.slow


# Traces that carry data in plotly's SVG: scatter points/lines, bars, contour fills.
COUNT_TRACE_NODES = """
(id) => {
  const div = document.getElementById(id);
  const traces = div.querySelectorAll(
    'g.scatterlayer g.trace path.js-line, g.scatterlayer g.trace path.point, '
    + 'g.barlayer g.trace path, g.contourlayer g.contour path');
  let drawn = 0;
  for (const t of traces) {
    const d = t.getAttribute('d');
    if (d && d !== 'M0,0Z' && d.length > 4) drawn += 1;
  }
  return {svg: div.querySelectorAll('svg.main-svg').length, drawn: drawn,
          data: (div.data || []).length};
}
"""


@pytest.mark.parametrize("layout", ["k2_vs_k3", "cosine_vs_wsd"])
def test_dashboard_draws_offline_in_chromium(tmp_path, layout):
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    from playwright.sync_api import sync_playwright

    html, panels, _ = render(DATA, DATA / "fit.json", layout, "final_val_ood_loss", "inline")
    page_path = tmp_path / f"{layout}.html"
    page_path.write_text(html, encoding="utf-8")
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            context.route("**/*", lambda route: _allow_local_only(route, requests))
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(page_path.as_uri(), wait_until="load")
            counts = {}
            for panel in panels:
                div_id = f"fig-{panel.key}"
                page.wait_for_selector(f"#{div_id} svg.main-svg", timeout=DRAW_TIMEOUT_MS)
                counts[panel.key] = page.evaluate(COUNT_TRACE_NODES, div_id)
            shot = tmp_path / f"{layout}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"screenshot: {shot}")
        finally:
            browser.close()
    assert not errors, errors
    outside = [u for u in requests if not u.startswith(LOCAL_SCHEMES)]
    assert not outside, f"requests left the page: {outside}"
    empty = {k: c for k, c in counts.items() if c["svg"] == 0 or c["drawn"] == 0}
    assert not empty, f"figures without drawn traces: {empty}"
    assert len(counts) == len(panels) >= 10


def _allow_local_only(route, seen: list[str]) -> None:
    url = route.request.url
    seen.append(url)
    if url.startswith(LOCAL_SCHEMES):
        route.continue_()
    else:
        route.abort()


def test_png_export_uses_the_system_chromium(tmp_path, runs, fits):
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: install it with `apt-get install -y chromium`")
    from k3scale.viz.export_png import export_pngs
    from k3scale.viz.frontier import frontier_panel
    from k3scale.viz.landscape import lr_batch_landscape_panel

    panels = [frontier_panel(runs, fits), lr_batch_landscape_panel(runs, "k3", "wsd")]
    paths = export_pngs(panels, tmp_path / "png")
    for path in paths:
        print(f"png: {path}")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 20_000
