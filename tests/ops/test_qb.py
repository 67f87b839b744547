"""Quantile Balancing ops (architecture.md 7.5): exact step, histogram accuracy, sharding
invariance, centring, fixed-batch convergence, and QB vs the loss-free sign rule on a stream."""

from __future__ import annotations

import math

import pytest
import torch

from k3scale.models.balancing import sign_rule_bias
from k3scale.ops.qb import (
    centre,
    margin_counts,
    margin_range,
    qb_bias_exact,
    qb_bias_histogram,
    qb_margins,
    qb_threshold_exact,
    qb_threshold_histogram,
    route_with_cutoff,
)


def skewed_scores(num_tokens, num_experts, seed, skew=1.5):
    """Sigmoid scores whose per-expert logit offsets span [-skew, skew]: unbalanced at b = 0."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    return torch.sigmoid(logits + torch.linspace(-skew, skew, num_experts))


def cutoff_counts(scores, bias, top_k, num_bins=256):
    values, index = torch.topk(scores + bias, top_k + 1, dim=-1)
    return margin_counts(scores, values[:, top_k], index[:, top_k], bias, num_bins)


def max_violation(scores, bias, top_k):
    num_tokens, num_experts = scores.shape
    selection, _ = route_with_cutoff(scores, bias, top_k)
    loads = torch.bincount(selection.reshape(-1), minlength=num_experts).double()
    return float((loads / (top_k * num_tokens / num_experts) - 1).abs().max())


def assert_exact_quantile(margins, theta, q):
    """(q+1)-th largest: at most q margins above theta, at least q+1 at or above it, and exactly
    q above wherever theta is not tied. Ties are real: the token's (k+1)-th expert j has margin
    exactly -b_j (ops/qb/histogram.py), so theta can sit on that point mass."""
    margins = margins.double()
    above = (margins > theta).sum(dim=0)
    at = (margins == theta).sum(dim=0)
    assert (above <= q).all()
    assert (above + at >= q + 1).all()
    untied = at == 1
    assert int(untied.sum()) >= margins.shape[1] // 2  # the equality check below is not vacuous
    assert torch.equal(above[untied], torch.full((int(untied.sum()),), q))


def test_exact_threshold_has_exactly_q_margins_above():
    scores = skewed_scores(1024, 16, seed=0)
    bias = torch.randn(16, generator=torch.Generator().manual_seed(1)) * 0.05
    margins = qb_margins(scores, bias, top_k=4)
    theta = qb_threshold_exact(margins, top_k=4)
    assert_exact_quantile(margins, theta, q=4 * 1024 // 16)
    # The new bias is -theta, centred.
    b_hat = qb_bias_exact(scores, bias, top_k=4)
    assert torch.allclose(b_hat.double(), centre(-theta).double())


def test_exact_floor_for_fractional_target():
    margins = qb_margins(skewed_scores(1000, 16, seed=2), torch.zeros(16), top_k=3)
    theta = qb_threshold_exact(margins, top_k=3)
    assert_exact_quantile(margins, theta, q=math.floor(3 * 1000 / 16))


@pytest.mark.parametrize("seed", [0, 1])
def test_histogram_within_one_bin_of_exact(seed):
    scores = skewed_scores(4096, 32, seed=seed)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(seed + 10)) * 0.1
    top_k, num_bins = 4, 256
    margins = qb_margins(scores, bias, top_k).double()
    counts = cutoff_counts(scores, bias, top_k, num_bins)
    lo, hi = margin_range(bias)
    width = float((hi - lo) / num_bins)
    exact = qb_threshold_exact(margins, top_k)
    q = top_k * 4096 / 32
    edge = qb_threshold_histogram(counts, bias, top_k, interpolate=False)
    assert ((margins >= edge).sum(0) <= q).all()
    assert ((margins >= edge - width).sum(0) > q).all()
    assert (edge - exact).abs().max() <= width
    interpolated = qb_threshold_histogram(counts, bias, top_k)
    assert (interpolated - exact).abs().max() <= width
    # Interpolation is the more accurate estimate (that is why it is the default).
    assert (interpolated - exact).abs().mean() < (edge - exact).abs().mean()


def test_counts_hold_every_margin_once():
    scores = skewed_scores(500, 8, seed=3)
    counts = cutoff_counts(scores, torch.zeros(8), top_k=2, num_bins=64)
    assert counts.shape == (8, 65)
    assert torch.equal(counts.sum(dim=1), torch.full((8,), 500))
    # Column 0: tokens whose 3rd-best expert is j; together exactly one per token.
    assert int(counts[:, 0].sum()) == 500


@pytest.mark.parametrize("num_shards", [2, 8])
def test_histogram_bias_bitwise_identical_across_shards(num_shards):
    scores = skewed_scores(4096, 32, seed=4)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(5)) * 0.1
    whole = qb_bias_histogram(cutoff_counts(scores, bias, 4), bias, 4)
    # Uneven shards, as micro-batches or ranks with different token counts would be.
    sizes = torch.linspace(0, 4096, num_shards + 1).round().long().diff().tolist()
    summed = sum(cutoff_counts(shard, bias, 4) for shard in torch.split(scores, sizes))
    assert torch.equal(qb_bias_histogram(summed, bias, 4), whole)


def test_centring_sums_to_zero_and_keeps_selections():
    scores = skewed_scores(4096, 32, seed=6)
    theta = qb_threshold_exact(qb_margins(scores, torch.zeros(32), 4), 4)
    raw = (-theta).float()
    centred = centre(-theta)
    assert abs(float(centred.double().sum())) < 1e-5
    assert abs(float(raw.double().mean())) > 1e-3  # centring did something
    select_raw = torch.topk(scores.double() + raw.double(), 4).indices.sort(-1).values
    select_centred = torch.topk(scores.double() + centred.double(), 4).indices.sort(-1).values
    assert torch.equal(select_raw, select_centred)


@pytest.mark.parametrize("method", ["exact", "histogram"])
def test_fixed_batch_converges_within_8_steps(method):
    # architecture.md 7.5 setting: m = 32768, n = 64, k = 4, skewed scores.
    scores = skewed_scores(32768, 64, seed=7)
    bias = torch.zeros(64)
    violations = [max_violation(scores, bias, 4)]
    for _ in range(8):
        if method == "exact":
            bias = qb_bias_exact(scores, bias, 4)
        else:
            bias = qb_bias_histogram(cutoff_counts(scores, bias, 4), bias, 4)
        violations.append(max_violation(scores, bias, 4))
    assert violations[0] > 1.0  # the batch starts badly unbalanced
    assert violations[-1] < 0.1
    assert max(violations[-3:]) < 0.1  # and stays there


def test_no_op_when_every_expert_is_selected():
    scores = skewed_scores(64, 4, seed=8)
    bias = torch.tensor([0.1, -0.1, 0.0, 0.0])
    assert torch.equal(qb_bias_exact(scores, bias, 4), bias)


def steps_to_balance(rule, max_steps=40, tokens=8192, num_experts=16, top_k=2):
    """Fresh batches from one skewed distribution; steps until the routed loads are within 10%."""
    bias = torch.zeros(num_experts)
    for step in range(max_steps):
        scores = skewed_scores(tokens, num_experts, seed=100 + step, skew=1.0)
        selection, _ = route_with_cutoff(scores, bias, top_k)
        loads = torch.bincount(selection.reshape(-1), minlength=num_experts)
        if max_violation(scores, bias, top_k) < 0.1:
            return step
        if rule == "quantile":
            bias = qb_bias_histogram(cutoff_counts(scores, bias, top_k), bias, top_k)
        else:
            # DeepSeek-V3 rate u = 1e-3.
            bias = sign_rule_bias(bias, loads, rate=1e-3)
    return max_steps


def test_quantile_balances_a_stream_faster_than_sign_rule():
    quantile_steps = steps_to_balance("quantile")
    sign_steps = steps_to_balance("sign")
    assert quantile_steps <= 10
    assert quantile_steps < sign_steps
