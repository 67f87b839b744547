"""Triton QB margin counts (`k3scale/ops/qb/triton.py`) equal `histogram.margin_counts` exactly."""

from __future__ import annotations

import pytest
import torch

from tests.ops.triton_interpret import interpreted, launch_interpreted

# Triton reads TRITON_INTERPRET at import and when kernels are decorated (in this block) and
# at launch (the fixture below).
with interpreted() as SET_INTERPRET:
    pytest.importorskip("triton")
    from k3scale.ops.qb.histogram import margin_counts
    from k3scale.ops.qb.naive import route_with_cutoff
    from k3scale.ops.qb.triton import margin_counts_triton

pytestmark = pytest.mark.triton
interpret_triton = launch_interpreted(SET_INTERPRET)


def routed_batch(num_tokens, num_experts, top_k, bias_scale, seed):
    """Sigmoid scores `[m, n]`, bias `[n]`, each token's cutoff and the expert holding it."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.sigmoid(2.0 * torch.randn(num_tokens, num_experts, generator=gen))
    bias = bias_scale * torch.randn(num_experts, generator=gen)
    values, index = torch.topk(scores + bias, top_k + 1, dim=-1)
    _, cutoff = route_with_cutoff(scores, bias, top_k)
    assert torch.equal(cutoff, values[:, top_k])
    return scores, cutoff, index[:, top_k], bias


@pytest.mark.parametrize(
    "num_tokens, num_experts, top_k, num_bins",
    [(300, 37, 2, 16), (1000, 8, 2, 256), (77, 70, 6, 5), (1, 3, 1, 1)],
)
def test_counts_identical_to_torch(num_tokens, num_experts, top_k, num_bins):
    scores, cutoff, cutoff_expert, bias = routed_batch(num_tokens, num_experts, top_k, 0.2, 0)
    counts = margin_counts_triton(scores, cutoff, cutoff_expert, bias, num_bins)
    expected = margin_counts(scores, cutoff, cutoff_expert, bias, num_bins)
    assert counts.dtype == torch.int64
    assert torch.equal(counts, expected)
    assert counts[:, 0].sum() == num_tokens  # one point-mass margin per token


def test_out_of_range_margins_are_clamped_like_torch():
    scores, cutoff, cutoff_expert, _ = routed_batch(200, 16, 2, 0.2, 1)
    # A bias unrelated to the routing: many margins fall outside [lo, hi).
    bias = torch.linspace(-0.05, 0.05, 16)
    counts = margin_counts_triton(scores, cutoff, cutoff_expert, bias, 32)
    assert torch.equal(counts, margin_counts(scores, cutoff, cutoff_expert, bias, 32))


def test_micro_batches_add_up():
    scores, cutoff, cutoff_expert, bias = routed_batch(257, 12, 2, 0.3, 2)
    whole = margin_counts_triton(scores, cutoff, cutoff_expert, bias, 64)
    parts = sum(
        margin_counts_triton(scores[s], cutoff[s], cutoff_expert[s], bias, 64)
        for s in (slice(0, 100), slice(100, 257))
    )
    assert torch.equal(whole, parts)


def test_rejects_zero_bins():
    scores, cutoff, cutoff_expert, bias = routed_batch(4, 3, 1, 0.1, 3)
    with pytest.raises(ValueError, match="num_bins"):
        margin_counts_triton(scores, cutoff, cutoff_expert, bias, 0)
