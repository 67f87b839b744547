"""The committed fixture study (tests/viz/data, made by make_fixture.py) and its fits."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from k3scale.viz.fits import fits_from_json

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def runs() -> pl.DataFrame:
    return pl.read_parquet(DATA / "runs.parquet")


@pytest.fixture(scope="session")
def curves() -> pl.DataFrame:
    return pl.read_parquet(DATA / "curves.parquet")


@pytest.fixture(scope="session")
def fit_document() -> dict:
    return json.loads((DATA / "fit.json").read_text())


@pytest.fixture(scope="session")
def fits(fit_document):
    return fits_from_json(fit_document, source="fixture")
