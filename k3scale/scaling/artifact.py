"""Fit artifacts: the JSON a recipe writes, with provenance, byte-identical on rerun.

Provenance: the run table's hash (`tables.table_hash`), the code version (package version and
git sha + dirty flag of the checkout the package runs from, when there is one) and every fit
option. No timestamps or host names: the same table, code and options give the same bytes
(floats rounded to 10 significant digits, keys sorted; see `result.dumps`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
from importlib import metadata
from pathlib import Path
from types import ModuleType

import polars as pl

from k3scale.errors import K3ScaleError
from k3scale.scaling.inputs.tables import table_hash
from k3scale.scaling.values.fitdoc import SCHEMA_VERSION
from k3scale.scaling.values.result import dumps

# Recipes are code: only the project's own folder is searched (issue 23).
PROJECT_RECIPES = Path(__file__).resolve().parents[2] / "analysis"


# What the analysis writes into the repository: changes there do not make its code dirty.
GENERATED_OUTPUTS = ("analysis/results", "analysis/README.md")


@functools.cache
def code_version() -> dict:
    """{"package": version, "git_sha": sha or None, "git_dirty": bool or None}: dirty when the
    checkout's code differs from the commit (its generated outputs aside)."""
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
        # Outputs are not code: a fit rewritten over its committed self is not a dirty tree.
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "."]
            + [f":(exclude){output}" for output in GENERATED_OUTPUTS],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        dirty = bool(status.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"package": version, "git_sha": sha, "git_dirty": dirty}


def provenance(runs: pl.DataFrame, options: dict, source: str, duplicates: int = 0) -> dict:
    """Provenance block of a fit artifact.

    Args:
        runs: the run table as read (before duplicate rows were collapsed), so its hash is the
            one `k3scale dashboard` computes from the same file.
        duplicates: duplicated run rows collapsed before fitting (recorded only when non-zero).
    """
    block = {
        "artifact_version": SCHEMA_VERSION,
        "table_hash": table_hash(runs),
        "num_runs": runs.height,
        "source": source,
        "code": code_version(),
        "options": options,
    }
    if duplicates:
        block["duplicate_rows_collapsed"] = duplicates
    return block


def write_artifact(path: Path, payload: dict) -> Path:
    """Write deterministic JSON to `path` (parent folders created).

    The text goes to a temporary file next to `path` that replaces it only once complete, so a
    failed write never leaves a truncated artifact or destroys an earlier one.

    Raises:
        K3ScaleError: `path` cannot be written (a folder, a read-only place).
    """
    path = Path(path)
    text = dumps(payload)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        if tmp.exists():
            tmp.unlink()
        raise K3ScaleError(f"fit: cannot write {path}: {exc.strerror or exc}") from None
    return path


def known_recipes() -> list[str]:
    return sorted(p.stem for p in PROJECT_RECIPES.glob("*.py") if not p.stem.startswith("_"))


def recipe_path(name: str) -> Path:
    """The file of recipe `name`: a .py path as given, else the project's analysis/<name>.py.

    Recipes are code, so a bare name is looked up only in the project's own analysis/ folder,
    never in the current directory, and must be a plain identifier (no `..`, no slashes).

    Raises:
        K3ScaleError: the name is not an identifier, or no such file exists.
    """
    if name.endswith(".py"):
        if not Path(name).is_file():
            raise K3ScaleError(f"fit: recipe file {name} does not exist")
        return Path(name)
    if not name.isascii() or not name.isidentifier():
        raise K3ScaleError(
            f"fit: recipe name {name!r} must be a plain identifier (a file in "
            f"{PROJECT_RECIPES}), or give the path of a .py file"
        )
    path = PROJECT_RECIPES / f"{name}.py"
    if not path.is_file():
        raise K3ScaleError(
            f"fit: no analysis recipe {name!r} in {PROJECT_RECIPES}; known: {known_recipes()}"
        )
    return path


def load_recipe(name: str) -> ModuleType:
    """Import the recipe `recipe_path(name)` as a module with `run(...)`.

    Raises:
        K3ScaleError: no such recipe, it cannot be imported, or it defines no `run`.
    """
    path = recipe_path(name)
    spec = importlib.util.spec_from_file_location(f"k3scale_recipe_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise K3ScaleError(
            f"fit: recipe {path} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from None
    if not callable(getattr(module, "run", None)):
        raise K3ScaleError(f"fit: recipe {path} defines no run(runs, curves, options)")
    return module
