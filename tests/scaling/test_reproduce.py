"""The rule a refit is held to against a committed fit artifact (k3scale/scaling/reproduce.py):
within tolerance where the estimate is well-conditioned, by verdict where the data cannot
identify it, and never blind to a change a report would print."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from k3scale.scaling.reproduce import RELATIVE_TOLERANCE, compare_artifacts

COMMITTED = Path(__file__).resolve().parents[2] / "analysis" / "results" / "k2_vs_k3-cpu_v2"


@pytest.fixture(scope="module")
def artifact() -> dict:
    return json.loads((COMMITTED / "fit.json").read_text())


def _first_identified_optimum(doc: dict) -> dict:
    return next(c for c in doc["results"]["cell_optima"] if c.get("verdict") == "identified")


def test_an_artifact_reproduces_itself(artifact):
    comparison = compare_artifacts(artifact, copy.deepcopy(artifact))
    assert comparison.reproduced and comparison.numbers_checked > 500


def test_rounding_passes_and_a_printed_digit_does_not(artifact):
    refit = copy.deepcopy(artifact)
    cell = _first_identified_optimum(refit)
    cell["loss"] *= 1 + RELATIVE_TOLERANCE / 10
    assert compare_artifacts(refit, artifact).reproduced
    cell["loss"] *= 1 + 1e-4
    differences = compare_artifacts(refit, artifact).differences
    assert len(differences) == 1 and "loss" in differences[0]


def _first_unidentified_optimum(doc: dict) -> dict:
    """The first M(C) the data cannot identify (every cell optimum of this study is)."""
    routes = doc["results"]["compute_optimal"]["c_6n"]["routes"]
    points = [
        p for route in routes.values() for m in route.get("multiplier", {}).values() for p in m
    ]
    return next(p for p in points if p["verdict"] != "identified" and p["value"] is not None)


def test_a_fit_the_data_cannot_identify_is_held_to_its_verdict(artifact):
    assert _first_unidentified_optimum(artifact)["verdict"].startswith("not identified")
    refit = copy.deepcopy(artifact)
    _first_unidentified_optimum(refit)["value"] *= 2
    assert compare_artifacts(refit, artifact).reproduced
    _first_unidentified_optimum(refit)["verdict"] = "identified"
    assert not compare_artifacts(refit, artifact).reproduced


def test_structure_and_reasons_are_compared(artifact):
    refit = copy.deepcopy(artifact)
    refit["results"]["cell_optima"].pop()
    assert "items became" in compare_artifacts(refit, artifact).differences[0]
    refit = copy.deepcopy(artifact)
    refit["results"]["excluded"] = {**refit["results"]["excluded"], "extra": 1}
    assert not compare_artifacts(refit, artifact).reproduced


def test_the_code_version_is_not_part_of_the_findings(artifact):
    refit = copy.deepcopy(artifact)
    refit["provenance"]["code"] = {"git_sha": "0" * 40, "git_dirty": True}
    assert compare_artifacts(refit, artifact).reproduced
