"""Running Triton kernels on CPU in tests: `TRITON_INTERPRET=1` only where the kernels need it.

Triton reads TRITON_INTERPRET when it decorates kernels (at import) and when it launches them.
Test modules import their kernels inside `interpreted()` and declare the autouse fixture from
`launch_interpreted`, so the rest of the session keeps the environment it started with (an
explicit setting by the user wins throughout).
"""

from __future__ import annotations

import contextlib
import os

import pytest


@contextlib.contextmanager
def interpreted():
    """Set TRITON_INTERPRET=1 while the block imports kernels; yields whether it was set here."""
    set_here = "TRITON_INTERPRET" not in os.environ
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        yield set_here
    finally:
        if set_here:
            del os.environ["TRITON_INTERPRET"]


def launch_interpreted(set_here: bool):
    """An autouse fixture that sets TRITON_INTERPRET=1 for each test of the module (launch time)."""

    @pytest.fixture(autouse=True)
    def interpret_triton(monkeypatch):
        if set_here:
            monkeypatch.setenv("TRITON_INTERPRET", "1")

    return interpret_triton
