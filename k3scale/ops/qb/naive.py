"""Exact Quantile Balancing step (architecture.md 7.2; J. Su, kexue.fm/archives/11619; K3 Eq. 14).

Balanced top-k routing is an assignment LP whose expert duals beta_j are the (1 - k/n) quantiles
of the margins; the balancing bias is b = -beta. One exact step on the global batch:
1. route with the current bias: top-(k+1) of `s + b`; the (k+1)-th value is the token cutoff alpha;
2. margins `mu = s - alpha`; target load `q = k * m / n`;
3. `theta_j` = the (q+1)-th largest margin of expert j, so exactly q tokens have `mu > theta_j`;
4. `b = -theta`, centred to mean 0 (a common shift changes no top-k).
Sort-based, O(m n log m): the reference for the histogram estimator.
"""

from __future__ import annotations

import math

import torch


def route_with_cutoff(
    scores: torch.Tensor, bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k selection on `scores + bias` and each token's cutoff (the (k+1)-th biased score).

    Args:
        scores: unbiased router scores `[m, n]` (fp32).
        bias: balancing bias `[n]`.
        top_k: experts per token k (< n).

    Returns:
        `(selection [m, k] int64, cutoff [m])`.
    """
    values, index = torch.topk(scores + bias, top_k + 1, dim=-1)
    return index[:, :top_k], values[:, top_k]


def qb_margins(scores: torch.Tensor, bias: torch.Tensor, top_k: int) -> torch.Tensor:
    """Margins `mu = s - alpha` `[m, n]`: expert j is selected iff `mu_ij > -b_j`."""
    _, cutoff = route_with_cutoff(scores, bias, top_k)
    return scores - cutoff[:, None]


def target_load(num_tokens: int, top_k: int, num_experts: int) -> float:
    """Balanced tokens per expert `q = k * m / n`."""
    return top_k * num_tokens / num_experts


def qb_threshold_exact(margins: torch.Tensor, top_k: int) -> torch.Tensor:
    """Per-expert threshold `[n]` (float64) with exactly `floor(q)` margins above it.

    Upper-quantile convention (architecture.md 7.2 step 4): the (q+1)-th largest margin.
    """
    num_tokens, num_experts = margins.shape
    q = math.floor(target_load(num_tokens, top_k, num_experts))
    order_stats = torch.topk(margins.double(), q + 1, dim=0).values
    return order_stats[q]


def centre(bias: torch.Tensor) -> torch.Tensor:
    """Shift to mean 0 (Eq. 14's centring), returned as fp32."""
    bias64 = bias.double()
    return (bias64 - bias64.mean()).float()


def qb_bias_exact(scores: torch.Tensor, bias: torch.Tensor, top_k: int) -> torch.Tensor:
    """Next step's bias `[n]` fp32 from one exact QB step on all scores `[m, n]` of this step.

    `top_k >= n` routes every token to every expert: the bias is returned unchanged.
    """
    if top_k >= scores.shape[1]:
        return bias.clone()
    theta = qb_threshold_exact(qb_margins(scores.float(), bias.float(), top_k), top_k)
    return centre(-theta)
