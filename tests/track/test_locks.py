"""The file locks k3scale takes (issue 35): each is listed here, and each gives up after a bounded
wait with one clear message; nothing waits on a lock file's mere existence, which a killed
process leaves behind (torch's extension builder did, and wedged every later process)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3scale.errors import K3ScaleError
from k3scale.track.server import _lock_within

PACKAGE = Path(__file__).resolve().parents[2] / "k3scale"
LOCKING = re.compile(r"\bflock\(|\blockf\(|FileBaton|FileLock|cpp_extension import load\b")
# Every place that takes a lock, with how its wait is bounded.
KNOWN = {"k3scale/track/server.py": "fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)"}


def test_every_lock_the_package_takes_is_known_and_non_blocking():
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        calls = [line.strip() for line in path.read_text().splitlines() if LOCKING.search(line)]
        if calls:
            found[path.relative_to(PACKAGE.parent).as_posix()] = calls
    assert {name: calls for name, calls in found.items()} == {n: [c] for n, c in KNOWN.items()}


def test_a_lock_held_by_a_live_process_is_given_up_with_a_message(tmp_path):
    path = tmp_path / "x.lock"
    path.touch()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time\n"
         f"f = open({str(path)!r}); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with open(path, "w") as handle, pytest.raises(K3ScaleError, match="stayed locked"):
            _lock_within(handle, path, wait_s=0.5)
        assert time.monotonic() - started < 5
    finally:
        holder.kill()
        holder.wait()
    with open(path, "w") as handle:  # the kernel dropped the dead holder's lock
        _lock_within(handle, path, wait_s=5)
