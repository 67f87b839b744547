"""What a local study exposes on the network, and what is left of it after a driver SIGKILL.

The slow test runs `k3scale study run experiments/cosine_vs_wsd.py --preset smoke` as its own
session, lists every listening TCP socket of that session's processes (driver, GCS, raylet,
agents, workers) and of the MLflow server while a trial trains, and requires loopback for all of
them; Ray must refuse a caller without the study's token. Then it SIGKILLs the driver alone and
requires every process of the session to be gone within 10 s (issue 23). Sockets are read from
/proc (the venv has no psutil, and `ss` is not on every machine).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k3scale.data.sample import prepare_sample
from k3scale.sweep import reaper
from tests.sweep.test_study_runs import COSINE_VS_WSD, start, wait_for

RAY = Path(sys.executable).parent / "ray"
# What the issue allows a killed driver's processes before they must be gone (seconds).
REAP_WITHIN_S = 10.0
# Listeners that may stay beyond loopback, by process name: none in Ray 2.60 with a 127.0.0.1 node.
EXPOSED_ALLOWED: set[str] = set()
TCP_LISTEN = "0A"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return root


def session_pids(sid: int) -> set[int]:
    """Live (not zombie) processes whose session id is `sid`."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised name: state, ppid, pgrp, session, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            pids.add(int(entry.name))
    return pids


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return "?"


def reaper_owner(driver_pid: int) -> str:
    """The mark a study's driver gave its Ray processes: its reaper's argument."""
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == driver_pid and b"k3scale.sweep.reaper" in args:
            return args[args.index(b"k3scale.sweep.reaper") + 1].decode()
    raise AssertionError(f"no reaper child of the driver {driver_pid}")


def decode_address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":  # /proc/net/tcp* print each 32-bit word in host order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def listeners(pids: set[int]) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket held by `pids`."""
    holder = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        holder[link[len("socket:[") : -1]] = pid
    found = []
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == TCP_LISTEN and inode in holder:
                address, port = local.split(":")
                found.append(
                    (process_name(holder[inode]), str(decode_address(address)), int(port, 16))
                )
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # [::ffff:127.0.0.1] on a dual-stack socket
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def ray_status(gcs: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # Otherwise the CLI rewrites 127.0.0.1 to the machine's address, where nothing listens.
    base["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return subprocess.run(
        [str(RAY), "status", "--address", gcs],
        capture_output=True,
        text=True,
        timeout=180,
        env={**base, **env},
    )


def test_reaper_kills_marked_processes_when_its_pipe_closes(tmp_path):
    owner = "test-reaper"
    env = {**os.environ, reaper.MARK: owner}
    lock = tmp_path / "lock"
    # An unmarked bystander holds a lock; a marked process waits on it, blocked in the kernel
    # (issue 35: processes of a killed study survived, waiting): both stay where they are
    # until the reaper acts.
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, time\n"
         f"f = open({str(lock)!r}, 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True)\n"
         "time.sleep(300)"],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    assert bystander.stdout.readline().strip() == "held"
    waiter = [
        sys.executable,
        "-c",
        f"import fcntl; fcntl.flock(open({str(lock)!r}, 'w'), fcntl.LOCK_EX)",
    ]
    # Own sessions, like agents orphaned by a dead raylet: nothing else would stop them.
    marked = [
        subprocess.Popen(["sleep", "300"], env=env, start_new_session=True),
        subprocess.Popen(waiter, env=env, start_new_session=True),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "k3scale.sweep.reaper", owner], stdin=subprocess.PIPE
    )
    try:
        # A child shows its environment (and so the mark) only once it has exec'd `sleep`: on a
        # loaded machine that can take a moment after Popen returns.
        expected = sorted(p.pid for p in marked)
        deadline = time.monotonic() + 10
        while sorted(reaper.marked_pids(owner)) != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(reaper.marked_pids(owner)) == expected
        process.stdin.close()
        assert process.wait(timeout=30) == 0
        assert all(p.wait(timeout=REAP_WITHIN_S) == -signal.SIGKILL for p in marked)
        assert bystander.poll() is None
    finally:
        for p in [*marked, bystander, process]:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=30)


def test_reaper_kills_an_unmarked_orphan_it_saw_as_a_marked_process_child(tmp_path):
    """Ray's agents can lose the mark when they rename themselves (it lives in the environment
    block their new title may overwrite); the reaper still knows them as the raylet's children,
    even after the raylet died first and left them orphans."""
    owner = "test-reaper-tree"
    child_pid_file = tmp_path / "child.pid"
    # The marked "raylet" starts an unmarked "agent" in a session of its own, then waits.
    raylet = subprocess.Popen(
        ["sh", "-c", f"env -u {reaper.MARK} setsid sleep 300 & echo $! > {child_pid_file}; wait"],
        env={**os.environ, reaper.MARK: owner},
    )  # fmt: skip
    process = subprocess.Popen(
        [sys.executable, "-m", "k3scale.sweep.reaper", owner], stdin=subprocess.PIPE
    )
    agent = None
    try:
        deadline = time.monotonic() + 10
        while not child_pid_file.read_text().strip() if child_pid_file.exists() else True:
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        agent = int(child_pid_file.read_text())
        while agent in reaper.marked_pids(owner):  # until the child has exec'd `env -u`
            assert time.monotonic() < deadline, "the child kept the mark"
            time.sleep(0.05)
        time.sleep(3 * reaper.WATCH_EVERY_S)  # the reaper sees the tree while the driver lives
        raylet.kill()
        raylet.wait(timeout=30)
        os.kill(agent, 0)  # the orphan lives on
        process.stdin.close()
        assert process.wait(timeout=30) == 0
        deadline = time.monotonic() + REAP_WITHIN_S
        while Path(f"/proc/{agent}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (
            not Path(f"/proc/{agent}").exists() or " Z " in Path(f"/proc/{agent}/stat").read_text()
        )
    finally:
        for p in (raylet, process):
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait(timeout=30)
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.ray
def test_local_study_listens_on_loopback_with_a_token_and_dies_with_its_driver(data_root, tmp_path):
    study_dir = tmp_path / "cosine_vs_wsd"
    proc = start(COSINE_VS_WSD, study_dir, data_root)
    server_record = study_dir / "mlflow" / "server.json"

    def project_pids() -> set[int]:
        pids = session_pids(proc.pid)
        if server_record.exists():  # the MLflow server runs in a session of its own
            pids |= session_pids(json.loads(server_record.read_text())["pid"])
        return pids

    def training() -> bool:
        names = map(process_name, session_pids(proc.pid))
        return any(name.startswith("ray::_run_payload_entry") for name in names)

    try:
        wait_for(training, 600, "a trial training in a Ray worker")
        seen: set[tuple[str, str, int]] = set()
        for _ in range(5):  # workers and agents come and go: sample a few times
            seen |= set(listeners(project_pids()))
            time.sleep(1.0)
        kinds = {Path(name).name for name, _, _ in seen}
        assert {"gcs_server", "raylet"} <= kinds, f"Ray's listeners not found: {seen}"
        exposed = sorted(s for s in seen if not is_loopback(s[1]) and s[0] not in EXPOSED_ALLOWED)
        assert not exposed, f"listening beyond loopback: {exposed}"

        token = study_dir / "ray_token"
        assert stat.S_IMODE(token.stat().st_mode) == 0o600
        gcs = next(f"127.0.0.1:{port}" for name, _, port in seen if name.endswith("gcs_server"))
        refused = ray_status(gcs, {"RAY_AUTH_MODE": "disabled"})
        assert refused.returncode != 0, refused.stdout[-2000:]
        assert "auth" in (refused.stdout + refused.stderr).lower()
        allowed = ray_status(gcs, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
        assert allowed.returncode == 0, allowed.stdout[-2000:] + allowed.stderr[-2000:]

        owner = reaper_owner(proc.pid)

        def survivors() -> set[int]:
            # The driver's session, and every process carrying its Ray mark wherever it runs
            # (an agent in a session of its own; a worker blocked in a wait).
            return session_pids(proc.pid) | set(reaper.marked_pids(owner))

        assert reaper.marked_pids(owner), f"no process carries the study's Ray mark {owner}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = time.time()
        while survivors() and time.time() - killed_at < REAP_WITHIN_S:
            time.sleep(0.5)
        left = {pid: process_name(pid) for pid in survivors()}
        assert not left, f"alive {REAP_WITHIN_S:.0f} s after the driver's SIGKILL: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        for pid in session_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if server_record.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(json.loads(server_record.read_text())["pid"], signal.SIGKILL)
