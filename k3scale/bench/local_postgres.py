"""A throwaway PostgreSQL server for benchmarks, tests and the cluster rehearsal (issue 22).

Debian's `postgresql` package provides the binaries (`.ci/run` and `scripts/setup.sh` install it
when missing); this starts a fresh cluster in a temporary folder, listening on 127.0.0.1 only,
with password (SCRAM) authentication, and removes it on stop. PostgreSQL refuses to run as root,
so under root the server runs as the `postgres` user the package creates.

    with LocalPostgres() as pg:
        storage = pg.url("optuna")   # postgresql://k3scale:<password>@127.0.0.1:<port>/optuna

`python -m k3scale.bench.local_postgres` starts one, prints its URLs and waits for Ctrl-C.
"""

from __future__ import annotations

import glob
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.track.server import free_port

USER = "k3scale"
DATABASES = ("optuna", "mlflow")
START_TIMEOUT_S = 60.0


def postgres_bin() -> Path | None:
    """The folder of Debian's PostgreSQL binaries (the newest installed), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_major_version)
    return Path(found[-1]).parent if found else None


def _major_version(path: str) -> int:
    return int(Path(path).parts[-3])


class LocalPostgres:
    """A PostgreSQL cluster of our own: started by `start()`, gone after `stop()`.

    Args:
        databases: databases to create (owned by `USER`).
        port: TCP port on 127.0.0.1; 0 picks a free one.
    """

    def __init__(self, databases: tuple[str, ...] = DATABASES, port: int = 0) -> None:
        self.databases = databases
        self.port = port or free_port()
        self.password = secrets.token_urlsafe(16)
        self.folder: Path | None = None
        self._bin = postgres_bin()
        self._as_postgres = os.geteuid() == 0

    def url(self, database: str, driver: str = "postgresql") -> str:
        """SQLAlchemy URL of `database` (`postgresql://` maps to psycopg 3, a dependency)."""
        return f"{driver}://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    @property
    def data_dir(self) -> Path:
        assert self.folder is not None, "start() first"
        return self.folder / "data"

    def start(self) -> LocalPostgres:
        if self._bin is None:
            raise K3ScaleError(
                "PostgreSQL is not installed: `apt-get install postgresql` (Debian), or run "
                "scripts/setup.sh, which installs it when missing"
            )
        self.folder = Path(tempfile.mkdtemp(prefix="k3scale-pg-"))
        password_file = self.folder / "password"
        password_file.write_text(self.password + "\n")
        if self._as_postgres:
            shutil.chown(self.folder, "postgres", "postgres")
            shutil.chown(password_file, "postgres", "postgres")
        self._run(
            "initdb",
            "-D", str(self.data_dir),
            "-U", USER,
            f"--pwfile={password_file}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-instructions",
        )  # fmt: skip
        password_file.unlink()
        self.resume()
        for name in self.databases:
            self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, name)
        return self

    def resume(self) -> None:
        """Start the server on the existing cluster (after `start()`, or after `pause()`)."""
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.folder}"
        log = self.folder / "server.log"
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(log), "-o", options, "-w", "start")
        deadline = time.monotonic() + START_TIMEOUT_S
        while self._run("pg_isready", "-h", "127.0.0.1", "-p", str(self.port), check=False):
            if time.monotonic() > deadline:
                raise K3ScaleError(f"PostgreSQL did not answer on port {self.port}: see {log}")
            time.sleep(0.2)

    def pause(self) -> None:
        """Stop the server, keeping its data (a restart test resumes it)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop", check=False)

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        if self.folder is None:
            return
        if self.data_dir.exists():
            self.pause()
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def _run(self, tool: str, *args: str, check: bool = True) -> int:
        command = [str(self._bin / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        env = {**os.environ, "PGPASSWORD": self.password}
        done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=self.folder)
        if check and done.returncode:
            raise K3ScaleError(f"{tool} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
        return done.returncode

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    with LocalPostgres() as pg:
        for name in pg.databases:
            print(f"{name}: {pg.url(name)}")
        print(f"data in {pg.folder}; Ctrl-C stops the server and removes it")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
