"""Provenance tags: which code, versions and machine produced a run (platform.md section 4)."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
import sys
from pathlib import Path

from k3scale.track.schema import (
    TAG_DEVICE,
    TAG_GIT_DIRTY,
    TAG_GIT_SHA,
    TAG_HOSTNAME,
    TAG_VERSION_CUDA,
    TAG_VERSION_PYTHON,
    TAG_VERSION_TORCH,
    TAG_VERSION_TRITON,
)

UNKNOWN = "unknown"
GIT_TIMEOUT_S = 10.0


def provenance() -> dict[str, str]:
    """Tags naming the code (git sha, dirty flag), library versions, device and host.

    The git fields describe the k3scale source checkout when k3scale is imported from one, and
    are "unknown" for an installed package. torch is imported here (lazily) when present.
    """
    sha, dirty = git_state()
    tags = {
        TAG_GIT_SHA: sha,
        TAG_GIT_DIRTY: dirty,
        TAG_VERSION_PYTHON: platform.python_version(),
        TAG_VERSION_TRITON: _package_version("triton"),
        TAG_HOSTNAME: socket.gethostname(),
    }
    tags.update(_torch_tags())
    return tags


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def _torch_tags() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {TAG_VERSION_TORCH: "absent", TAG_VERSION_CUDA: "absent", TAG_DEVICE: _cpu_name()}
    cuda = torch.version.cuda or "absent"
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else _cpu_name()
    return {TAG_VERSION_TORCH: torch.__version__, TAG_VERSION_CUDA: cuda, TAG_DEVICE: device}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"cpu: {platform.machine()}"


def git_state() -> tuple[str, str]:
    """(commit sha, "true"/"false" dirty flag) of the k3scale checkout, or ("unknown", "unknown")."""
    package_dir = Path(sys.modules["k3scale"].__file__).resolve().parent
    checkout = package_dir.parent
    top = _git(checkout, "rev-parse", "--show-toplevel")
    # An installed k3scale can sit inside some other repository (a venv in a checkout).
    if top is None or Path(top).resolve() != checkout:
        return UNKNOWN, UNKNOWN
    sha = _git(checkout, "rev-parse", "HEAD")
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no")
    if sha is None or status is None:
        return UNKNOWN, UNKNOWN
    return sha, "true" if status else "false"


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
