"""Fit artifacts: the JSON a recipe writes, with provenance, byte-identical on rerun.

Provenance: the run table's hash (`tables.table_hash`), the code version (package version and
git sha + dirty flag of the checkout the package runs from, when there is one) and every fit
option. No timestamps or host names: the same table, code and options give the same bytes
(floats rounded to 10 significant digits, keys sorted; see `result.dumps`).
"""

from __future__ import annotations

import functools
import importlib.util
import subprocess
from importlib import metadata
from pathlib import Path
from types import ModuleType

import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.result import dumps
from k3scale.scaling.tables import table_hash

ARTIFACT_VERSION = 1


@functools.cache
def code_version() -> dict:
    """{"package": version, "git_sha": sha or None, "git_dirty": bool or None}."""
    try:
        version = metadata.version("k3scale")
    except metadata.PackageNotFoundError:
        version = None
    root = Path(__file__).resolve().parents[2]
    sha = dirty = None
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        dirty = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": version, "git_sha": sha, "git_dirty": dirty}


def provenance(runs: pl.DataFrame, options: dict, source: str) -> dict:
    """Provenance block of a fit artifact."""
    return {
        "artifact_version": ARTIFACT_VERSION,
        "table_hash": table_hash(runs),
        "num_runs": runs.height,
        "source": source,
        "code": code_version(),
        "options": options,
    }


def write_artifact(path: Path, payload: dict) -> Path:
    """Write deterministic JSON to `path` (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(payload), encoding="utf-8")
    return path


def recipe_search_path() -> list[Path]:
    """Where recipes are looked up: ./analysis, then the checkout's analysis/ folder."""
    return [Path.cwd() / "analysis", Path(__file__).resolve().parents[2] / "analysis"]


def load_recipe(name: str) -> ModuleType:
    """Import `analysis/<name>.py` (or a path to a .py file) as a module with `run(...)`.

    Raises:
        K3ScaleError: no such recipe, or it defines no `run`.
    """
    candidates = (
        [Path(name)]
        if name.endswith(".py")
        else [folder / f"{name}.py" for folder in recipe_search_path()]
    )
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        known = sorted(
            {
                p.stem
                for f in recipe_search_path()
                if f.is_dir()
                for p in f.glob("*.py")
                if not p.stem.startswith("_")
            }
        )
        raise K3ScaleError(f"fit: no analysis recipe {name!r}; known: {known}")
    spec = importlib.util.spec_from_file_location(f"k3scale_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "run", None)):
        raise K3ScaleError(f"fit: recipe {path} defines no run(runs, curves, options)")
    return module
