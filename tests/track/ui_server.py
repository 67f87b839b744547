"""Reading the URL `k3scale ui` prints, shared by the UI tests."""

from __future__ import annotations

import re
import subprocess
import time

START_WAIT_S = 120


def read_ui_url(process: subprocess.Popen) -> str:
    """The tracking URI from the process's stdout, within START_WAIT_S seconds."""
    deadline = time.monotonic() + START_WAIT_S
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line and process.poll() is not None:
            break
        seen.append(line)
        found = re.search(r"tracking URI: (http://127\.0\.0\.1:\d+)", line)
        if found:
            return found.group(1)
    raise AssertionError(f"`k3scale ui` printed no URL: {''.join(seen)!r}")


def read_line_with(process: subprocess.Popen, text: str) -> str:
    """The next stdout line that holds `text`, within START_WAIT_S seconds."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"`k3scale ui` printed no line with {text!r}")
