"""`torch.library.opcheck` on the KDA recurrence, AttnRes and QB margin-count custom ops: schema,
autograd registration, fake kernels (shapes, dtypes, strides) and AOT dispatch with dynamic
shapes, i.e. what `torch.compile` relies on to trace each as a single graph node (issue 34)."""

from __future__ import annotations

import pytest
import torch

from k3scale.ops.attnres.fused import attnres_backward, attnres_forward
from k3scale.ops.kda.recurrent import SEGMENT, recurrence_backward, recurrence_forward
from k3scale.ops.qb.histogram import margin_counts_fused, margin_range
from tests.conftest import require_fused_kernels
from tests.ops.test_kda import make_inputs
from tests.ops.test_qb import skewed_scores


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def kda_inputs(seq_len: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k, v, g, beta, initial as `recurrent_kda` passes them: contiguous, one dtype."""
    inputs = make_inputs(seq_len, "bounded", dtype, seed=seq_len, batch=2, heads=2, d_key=4)
    names = ("q", "k", "v", "g", "beta", "initial_state")
    return [inputs[name].contiguous() for name in names]


# Lengths inside one checkpoint segment and across two with a tail.
@pytest.mark.parametrize("seq_len", [5, SEGMENT + 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kda_recurrent_forward_op(seq_len, dtype):
    inputs = [x.requires_grad_() for x in kda_inputs(seq_len, dtype)]
    torch.library.opcheck(recurrence_forward, (*inputs, 0.7, SEGMENT))


@pytest.mark.parametrize("seq_len", [5, SEGMENT + 3])
def test_kda_recurrent_backward_op(seq_len):
    q, k, v, g, beta, initial = kda_inputs(seq_len, torch.float64)
    _, final, checkpoints = recurrence_forward(q, k, v, g, beta, initial, 0.7, SEGMENT)
    gen = torch.Generator().manual_seed(seq_len)
    grad_o = torch.randn(v.shape, generator=gen, dtype=v.dtype)
    grad_final = torch.randn(final.shape, generator=gen, dtype=final.dtype)
    args = (grad_o, grad_final, q, k, v, g, beta, checkpoints, 0.7, SEGMENT)
    torch.library.opcheck(recurrence_backward, args)


def attnres_inputs(num_sources: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(num_sources)
    sources = [
        (j + 1) * torch.randn(3, 7, 13, generator=gen, dtype=dtype) for j in range(num_sources)
    ]
    return sources, torch.randn(13, generator=gen, dtype=dtype)


@pytest.mark.parametrize("num_sources", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_attnres_forward_op(num_sources, dtype):
    sources, u = attnres_inputs(num_sources, dtype)
    sources = [s.requires_grad_() for s in sources]
    torch.library.opcheck(attnres_forward, (sources, u.requires_grad_(), 1e-5))


@pytest.mark.parametrize("num_sources", [1, 3])
def test_attnres_backward_op(num_sources):
    sources, u = attnres_inputs(num_sources, torch.float64)
    out, weights, rms = attnres_forward(sources, u, 1e-5)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    torch.library.opcheck(attnres_backward, (grad_out, sources, u, weights, rms))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_margin_counts_op(requires_grad):
    # Integer counts carry no gradient; scores that require one (the router's) must still pass.
    scores = skewed_scores(50, 8, seed=1).requires_grad_(requires_grad)
    bias = 0.1 * torch.randn(8, generator=torch.Generator().manual_seed(2))
    values, index = torch.topk(scores.detach() + bias, 3, dim=-1)
    lo, hi = margin_range(bias)
    args = (scores, values[:, 2].contiguous(), index[:, 2].contiguous(), lo, (hi - lo) / 16, 16)
    torch.library.opcheck(margin_counts_fused, args)
