"""Backend selection (`k3scale/ops/backend.py`) and the no-GPU path of `benchmarks/gpu_check.sh`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.ops.triton_interpret import interpreted, launch_interpreted

# Triton reads TRITON_INTERPRET at import and when kernels are decorated (in this block) and
# at launch (the fixture below).
with interpreted() as SET_INTERPRET:
    pytest.importorskip("triton")
    from k3scale.errors import K3ScaleError
    from k3scale.ops import backend
    from k3scale.ops.kda.chunk import chunk_kda
    from k3scale.ops.qb.histogram import margin_counts
    from k3scale.ops.situ.naive import situ_glu

pytestmark = pytest.mark.triton
interpret_triton = launch_interpreted(SET_INTERPRET)


REPO = Path(__file__).resolve().parents[2]
NO_GPU = not torch.cuda.is_available()


@pytest.fixture
def fresh_check(monkeypatch):
    """Forget the cached availability check before and after the test."""
    backend.triton_unavailable_reason.cache_clear()
    yield monkeypatch
    backend.triton_unavailable_reason.cache_clear()


def test_torch_backend_returns_reference_paths():
    assert backend.kda_op("torch") is chunk_kda
    assert backend.situ_glu_op("torch") is situ_glu
    assert backend.qb_counts_op("torch") is margin_counts


def test_triton_backend_under_interpreter_returns_kernels(fresh_check):
    fresh_check.setenv("TRITON_INTERPRET", "1")
    from k3scale.ops.kda.triton import chunk_kda_triton
    from k3scale.ops.qb.triton import margin_counts_triton
    from k3scale.ops.situ.triton import situ_glu_triton

    assert backend.kda_op("triton") is chunk_kda_triton
    assert backend.situ_glu_op("triton") is situ_glu_triton
    assert backend.qb_counts_op("triton") is margin_counts_triton
    gate, up = torch.randn(2, 3), torch.randn(2, 3)
    assert torch.allclose(backend.situ_glu_op("triton")(gate, up), situ_glu(gate, up), atol=1e-6)


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(K3ScaleError, match=r"model\.backend: expected one of"):
        backend.kda_op("cuda")


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU message")
def test_triton_without_gpu_or_interpreter_is_a_clear_error(fresh_check):
    fresh_check.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(K3ScaleError, match=r"model\.backend=triton: no NVIDIA GPU"):
        backend.situ_glu_op("triton")


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU exit path")
def test_gpu_check_without_gpu_exits_2_with_message():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHON"] = sys.executable
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    assert "no NVIDIA GPU visible" in result.stderr and "nothing was checked" in result.stderr
