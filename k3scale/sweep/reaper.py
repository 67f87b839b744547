"""Kills what is left of a study's local Ray once its driver is gone.

Ray ties its GCS and raylet to the driver (PR_SET_PDEATHSIG), but after a SIGKILL of the driver
the raylet's dashboard and runtime-env agents stay alive, still listening, for over a minute while
they try to tell the dead GCS about the dead raylet (issue 23). So `k3scale.sweep.run` starts
`python -m k3scale.sweep.reaper OWNER` in its own session with a pipe on its stdin, and marks
every Ray process it starts with `K3SCALE_RAY_OWNER=OWNER` in their environment. End of file on
the pipe means the driver exited or died; every process of this user still carrying the mark is
then killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

MARK = "K3SCALE_RAY_OWNER"
# Passes over /proc, 0.5 s apart: a worker the raylet was starting as it died shows up late.
PASSES = 10


def marked_pids(owner: str) -> list[int]:
    """Live processes of this user whose environment carries `MARK=owner` (Linux /proc)."""
    needle = f"{MARK}={owner}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # another user's process, or already gone
            continue
        if needle in environ.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def reap(owner: str) -> int:
    """SIGKILL every process marked for `owner`; returns how many were killed."""
    killed: set[int] = set()
    for _ in range(PASSES):
        pids = marked_pids(owner)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(pids)
        time.sleep(0.5)
    return len(killed)


def main() -> None:
    owner = sys.argv[1]
    sys.stdin.buffer.read()  # returns at end of file: the driver closed the pipe or died
    reap(owner)


if __name__ == "__main__":
    main()
