"""Paths to the shared reference data (skipped with a reason when the folder is absent)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

REFERENCE = Path(__file__).parents[2] / ".." / "shared" / "reference-data"


def reference_file(*parts: str) -> Path:
    path = REFERENCE.joinpath(*parts)
    if not path.is_file():
        pytest.skip(f"reference data {path} not present (needs ../shared/reference-data)")
    return path


def chinchilla_points() -> pl.DataFrame:
    """Epoch's 240 points (excluded_by_epoch == 0)."""
    table = pl.read_csv(reference_file("epoch-chinchilla", "chinchilla_NDL.csv"))
    return table.filter(pl.col("excluded_by_epoch") == 0)
