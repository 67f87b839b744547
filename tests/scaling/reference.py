"""Paths to the published reference data the project keeps in `reference-data/`."""

from __future__ import annotations

from pathlib import Path

import polars as pl

REFERENCE = Path(__file__).parents[2] / "reference-data"


def reference_file(*parts: str) -> Path:
    """A committed reference file; missing is a failure, never a skip (the clone must hold it)."""
    path = REFERENCE.joinpath(*parts)
    assert path.is_file(), f"reference data {path} missing from the repository"
    return path


def chinchilla_points() -> pl.DataFrame:
    """Epoch's 240 points (excluded_by_epoch == 0)."""
    table = pl.read_csv(reference_file("epoch-chinchilla", "chinchilla_NDL.csv"))
    return table.filter(pl.col("excluded_by_epoch") == 0)
