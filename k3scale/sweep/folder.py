"""A study folder's fixed names: its record and its exported tables. Apart from run.py so that
the commands that only read a folder (`study status`, `study report`) import no training code."""

from __future__ import annotations

from pathlib import Path

STUDY_JSON = "study.json"
TABLES = "tables"
# What the record's `utilization` is, wherever it is printed.
UTILIZATION_MEANS = "(busy trial time / (sweep wall x cores))"


def default_study_dir(study_name: str, preset: str) -> Path:
    return Path("studies") / f"{study_name}-{preset}"
