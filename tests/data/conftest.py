"""Fixtures: a tiny dataset prepared from the committed sample (never a registry)."""

from __future__ import annotations

import pytest

from k3scale.data import PreparedDataset
from k3scale.data.sample import prepare_sample


@pytest.fixture(scope="session")
def sample_dataset(tmp_path_factory) -> PreparedDataset:
    """The sample prepared once per session at vocab 512 (read-only: copy it to corrupt it)."""
    return prepare_sample(tmp_path_factory.mktemp("sample_root")).dataset
