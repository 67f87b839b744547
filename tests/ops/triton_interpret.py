"""Running Triton kernels on CPU in tests: `TRITON_INTERPRET=1` only where the kernels need it.

Triton reads TRITON_INTERPRET when it decorates kernels (at import) and when it launches them.
Test modules import their kernels inside `interpreted()` and declare the autouse fixture from
`launch_interpreted`, so the rest of the session keeps the environment it started with (an
explicit setting by the user wins throughout).

Triton's own library functions (`tl.sum`, `tl.cumsum`, ...) are decorated when triton is first
imported, so triton itself must first be imported interpreted: `import_triton_interpreted` does
that at the start of the session (tests/conftest.py). Otherwise a module imported earlier that
pulls triton in (torch.library's custom ops do) leaves them compiled-mode, and every
interpreted kernel calling one fails ("Cannot call @triton.jit'd outside of the scope of a
kernel").
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


def import_triton_interpreted() -> None:
    """Import triton with TRITON_INTERPRET=1, where it is installed and no GPU could run it."""
    import importlib.util

    import torch

    if importlib.util.find_spec("triton") is None or torch.cuda.is_available():
        return
    with interpreted():
        import triton.language  # noqa: F401


def launch_interpreted(set_here: bool):
    """An autouse fixture that sets TRITON_INTERPRET=1 for each test of the module (launch time)."""

    @pytest.fixture(autouse=True)
    def interpret_triton(monkeypatch):
        if set_here:
            monkeypatch.setenv("TRITON_INTERPRET", "1")

    return interpret_triton
