"""`train.compile`: a run trained through torch.compile follows the eager run's losses to float
rounding (inductor fuses the small ops between the kernels and reorders their sums), and a
compiled run stopped and resumed ends where the uninterrupted one does."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from k3scale.config import config_hash
from k3scale.train import train
from tests.conftest import require_fused_kernels
from tests.train.conftest import tiny_run

# Relative gap allowed between the compiled and eager per-step losses over the tiny run's 12
# steps. Observed 0 on this machine (AVX-512): inductor kept every sum's order here. Its code
# may vectorise a reduction differently on another CPU; fp32 rounding then carries through 12
# Muon steps, a few 1e-7 per step.
LOSS_RTOL = 1e-4


def _compiled(cfg):
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=True))


@pytest.mark.parametrize("family", ["k2", "k3"])
def test_a_compiled_run_follows_the_eager_run(family, sample_root, tmp_path):
    require_fused_kernels()
    eager_cfg = tiny_run(family, sample_root, tmp_path / "eager")
    compiled_cfg = _compiled(tiny_run(family, sample_root, tmp_path / "compiled"))
    assert config_hash(compiled_cfg) != config_hash(eager_cfg)
    eager, compiled = train(eager_cfg), train(compiled_cfg)
    assert compiled.steps == eager.steps
    # The first step compiles: timed apart, out of the rate.
    assert compiled.time_s["compile"] > 0 and "compile" not in eager.time_s
    np.testing.assert_allclose(compiled.losses, eager.losses, rtol=LOSS_RTOL)
    assert compiled.final_val_ood_loss == pytest.approx(eager.final_val_ood_loss, rel=LOSS_RTOL)


def test_a_compiled_run_resumes_where_it_stopped(sample_root, tmp_path):
    require_fused_kernels()
    whole = train(_compiled(tiny_run("k3", sample_root, tmp_path / "whole")))
    split_cfg = _compiled(tiny_run("k3", sample_root, tmp_path / "split"))
    train(split_cfg, stop_after_steps=5)
    resumed = train(split_cfg)
    assert resumed.losses == whole.losses
