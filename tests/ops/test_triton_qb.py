"""Triton QB margin counts (`k3scale/ops/qb/triton.py`) equal `histogram.margin_counts` exactly."""

from __future__ import annotations

import os

# Triton reads TRITON_INTERPRET when it decorates the kernels (at the imports below) and when it
# launches them: set it for both (an explicit setting wins), but only for this module's tests, so
# the rest of the session sees the environment it started with.
SET_INTERPRET = "TRITON_INTERPRET" not in os.environ
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

from k3scale.ops.qb.histogram import margin_counts  # noqa: E402
from k3scale.ops.qb.naive import route_with_cutoff  # noqa: E402
from k3scale.ops.qb.triton import margin_counts_triton  # noqa: E402

if SET_INTERPRET:
    del os.environ["TRITON_INTERPRET"]


pytestmark = pytest.mark.triton


@pytest.fixture(autouse=True)
def interpret_triton(monkeypatch):
    if SET_INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", "1")


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
