"""The committed fixture study (tests/viz/data, made by make_fixture.py) and its fit artifacts,
made from the tables by the project's recipes (fit_fixture.py) once per test session."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from k3scale.viz.fits import DashboardFits
from tests.viz.fit_fixture import fit_artifact

DATA = Path(__file__).parent / "data"
RECIPES = ("k2_vs_k3", "cosine_vs_wsd")


@pytest.fixture(scope="session")
def runs() -> pl.DataFrame:
    return pl.read_parquet(DATA / "runs.parquet")


@pytest.fixture(scope="session")
def curves() -> pl.DataFrame:
    return pl.read_parquet(DATA / "curves.parquet")


@pytest.fixture(scope="session")
def artifacts(runs, curves) -> dict[str, dict]:
    """Recipe name -> the artifact `k3scale fit RECIPE` writes for the fixture tables."""
    return {recipe: fit_artifact(recipe, runs, curves) for recipe in RECIPES}


@pytest.fixture(scope="session")
def fit_document(artifacts) -> dict:
    return artifacts["k2_vs_k3"]


@pytest.fixture(scope="session")
def fits(fit_document):
    return DashboardFits.from_artifact(fit_document, source="fixture")


@pytest.fixture(scope="session")
def wsd_fits(artifacts):
    return DashboardFits.from_artifact(artifacts["cosine_vs_wsd"], source="fixture")


@pytest.fixture(scope="session")
def fit_files(artifacts, tmp_path_factory) -> dict[str, Path]:
    """Recipe name -> the fixture's artifact written as `k3scale fit` writes it."""
    folder = tmp_path_factory.mktemp("fits")
    paths = {}
    for recipe, document in artifacts.items():
        paths[recipe] = folder / f"{recipe}.json"
        paths[recipe].write_text(json.dumps(document, sort_keys=True, indent=1))
    return paths
