"""Static PNG export of dashboard panels through kaleido with the system's Chromium.

kaleido 1.x drives a Chromium-based browser it finds on the machine; k3scale never lets it
download one (`kaleido.get_chrome()` fetches Chrome from the internet; platform.md section 9).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.viz.panel import Panel

# Debian/Ubuntu package names first (`apt-get install chromium`), then Google Chrome.
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
PNG_SCALE = 2
# Layout pixels: the page's content width (page.py STYLE max-width minus padding).
PNG_WIDTH = 1230


def find_browser() -> str:
    """Path of a Chromium-based browser: $BROWSER_PATH if set, else the first on PATH.

    Raises:
        K3ScaleError: when none is installed.
    """
    explicit = os.environ.get("BROWSER_PATH")
    if explicit:
        if not Path(explicit).is_file():
            raise K3ScaleError(f"dashboard --png: BROWSER_PATH={explicit} does not exist")
        return explicit
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    raise K3ScaleError(
        "dashboard --png: no Chromium or Chrome found on PATH; install one "
        "(`apt-get install chromium`) or set BROWSER_PATH to its executable"
    )


def export_pngs(panels: list[Panel], out_dir: Path) -> list[Path]:
    """Write `<key>.png` for every panel into `out_dir`; returns the paths in panel order."""
    import plotly.io as pio
    from kaleido.errors import ChromeNotFoundError

    browser = find_browser()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{p.key}.png" for p in panels]
    # choreographer (kaleido's browser driver) reads BROWSER_PATH; pin it to what we found.
    previous = os.environ.get("BROWSER_PATH")
    os.environ["BROWSER_PATH"] = browser
    try:
        pio.write_images(
            [p.figure for p in panels],
            paths,
            format="png",
            scale=PNG_SCALE,
            width=PNG_WIDTH,
            height=[p.figure.layout.height for p in panels],
        )
    except ChromeNotFoundError as exc:
        raise K3ScaleError(f"dashboard --png: kaleido cannot start {browser}: {exc}") from None
    finally:
        if previous is None:
            os.environ.pop("BROWSER_PATH", None)
        else:
            os.environ["BROWSER_PATH"] = previous
    return paths
