"""Kills what is left of a study's local Ray once its driver is gone.

Ray ties its GCS and raylet to the driver (PR_SET_PDEATHSIG), but after a SIGKILL of the driver
the raylet's dashboard and runtime-env agents stay alive, still listening, for over a minute while
they try to tell the dead GCS about the dead raylet (issue 23). So `k3scale.sweep.run` starts
`python -m k3scale.sweep.reaper OWNER` in its own session with a pipe on its stdin, and marks
every Ray process it starts with `K3SCALE_RAY_OWNER=OWNER` in their environment. End of file on
the pipe means the driver exited or died; every process of this user still carrying the mark, or
seen as a descendant of a marked one while the driver lived, is then killed.

The mark alone is not enough: Ray's Python agents rename themselves (setproctitle), which can
overwrite part of the environment block that /proc/PID/environ shows, mark included. Their
parent, the raylet, keeps its mark, so the reaper also remembers the descendants of marked
processes while it waits; once the raylet is dead the agents are orphans and the tree is gone.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from pathlib import Path

MARK = "K3SCALE_RAY_OWNER"
# Passes over /proc, 0.5 s apart: a worker the raylet was starting as it died shows up late.
PASSES = 10
WATCH_EVERY_S = 1.0


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


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time in clock ticks) for every live process."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), fields[19])
    return table


def owned(owner: str, table: dict[int, tuple[int, str]]) -> dict[int, str]:
    """Marked processes and all their descendants: pid -> start time (to spot a reused pid)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, str] = {}
    stack = [pid for pid in marked_pids(owner) if pid in table]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found[pid] = table[pid][1]
            stack.extend(children.get(pid, ()))
    return found


def reap(owner: str, remembered: dict[int, str] | None = None) -> int:
    """SIGKILL every process marked for `owner`, its descendants, and the remembered processes
    that are still the same processes; returns how many were killed."""
    remembered = dict(remembered or {})
    killed: set[int] = set()
    for _ in range(PASSES):
        table = process_table()
        targets = owned(owner, table)
        targets.update(
            {pid: start for pid, start in remembered.items() if table.get(pid, (0, ""))[1] == start}
        )
        targets = {pid: start for pid, start in targets.items() if pid not in killed}
        if not targets:
            break
        for pid in targets:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed.update(targets)
        remembered.update(targets)
        time.sleep(0.5)
    return len(killed)


def watch(owner: str) -> dict[int, str]:
    """Until end of file on stdin, remember every process owned by `owner` (see `owned`)."""
    remembered: dict[int, str] = {}
    stdin = sys.stdin.buffer.raw
    while True:
        ready, _, _ = select.select([stdin], [], [], WATCH_EVERY_S)
        if ready and not stdin.read(4096):
            return remembered
        remembered.update(owned(owner, process_table()))


def main() -> None:
    owner = sys.argv[1]
    reap(owner, watch(owner))


if __name__ == "__main__":
    main()
