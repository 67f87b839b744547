"""Fit artifacts of fixture tables, made as `k3scale fit RECIPE` makes them: the project's recipe
(analysis/RECIPE.py) run on the tables, wrapped with provenance (k3scale/commands/fit.py)."""

from __future__ import annotations

import json

import polars as pl

from k3scale.scaling.artifact import load_recipe, provenance
from k3scale.scaling.study import StudyOptions
from k3scale.scaling.values.result import dumps

# Enough draws for every 95% interval the recipes report; few enough to keep the tests fast.
NUM_RESAMPLES = 200


def fit_artifact(recipe: str, runs: pl.DataFrame, curves: pl.DataFrame) -> dict:
    """The artifact `k3scale fit RECIPE` would write for these tables, as read back from disk.

    The study check of `k3scale fit` is left out: the fixture's study is neither recipe's.
    """
    options = StudyOptions(num_resamples=NUM_RESAMPLES)
    results = load_recipe(recipe).run(runs, curves, options)
    recorded = {k: v for k, v in options.to_dict().items() if k != "workers"}
    payload = {
        "analysis": recipe,
        "provenance": provenance(runs, recorded, "fixture tables"),
        "results": results,
    }
    return json.loads(dumps(payload))
