"""Fixtures shared by every test package.

`mlflow_server` is one real lean MLflow server (SQLite in a temp folder) for the whole session:
starting one takes seconds, so tests share it and isolate themselves by experiment name.
"""

from __future__ import annotations

import pytest


def pytest_configure(config) -> None:
    from tests.ops.triton_interpret import import_triton_interpreted

    # Before anything imports the kernels (see tests/ops/triton_interpret.py).
    import_triton_interpreted()
    from k3scale.cli import set_entry_environment

    # The same environment as every entry point: no telemetry (platform.md 9).
    set_entry_environment()


def require_fused_kernels():
    """The built kernels module. Where torch reports a capability the kernels are not built for
    (no AVX2, aarch64) the calling test is skipped; where they are, a failed build fails it."""
    from k3scale.ops.cpu.build import CAPABILITY_FLAGS, kernel_path, load

    path = kernel_path()
    if path.capability not in CAPABILITY_FLAGS:
        pytest.skip(f"no fused kernels for this CPU ({path.reason})")
    module = load()
    assert module is not None, path.reason
    return module


@pytest.fixture(scope="session")
def mlflow_local_server(tmp_path_factory):
    """The session's `LocalServer` (`.url`, `.pid`, `.log_path`); stopped by pid at the end."""
    from k3scale.track.server import start_local_server

    root = tmp_path_factory.mktemp("mlflow")
    # Generous timeout: on a busy 2-core test machine a server can take 20+ s to start.
    server = start_local_server(
        root / "mlflow.db", root / "artifacts", log_path=root / "server.log", timeout_s=120
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(mlflow_local_server) -> str:
    """Tracking URI (http://127.0.0.1:PORT) of the session's real local MLflow server."""
    return mlflow_local_server.url
