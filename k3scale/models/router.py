"""Sigmoid top-k router with a selection-only balancing bias (architecture.md 5.1, 5.3).

Scores `s = sigmoid(W_r u)` in fp32; selection `TopK(s + b)`; weights from the unbiased scores
renormalised over the selection, times the routed scale rho. The bias moves selection only: it
never enters the weights, so it gets no gradient and needs none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k3scale.ops.cpu import supports
from k3scale.ops.moe.fused import route_fused, sequence_aux_loss_fused


@dataclass(frozen=True)
class Routing:
    """One forward's routing decisions for N tokens."""

    scores: torch.Tensor
    """`[N, E]` fp32 unbiased sigmoid scores (differentiable)."""
    expert_idx: torch.Tensor
    """`[N, k]` int64 selected experts, best biased score first."""
    weights: torch.Tensor
    """`[N, k]` fp32 routing weights, each row sums to rho (differentiable)."""
    cutoff: torch.Tensor | None
    """`[N]` the (k+1)-th biased score (Quantile Balancing's alpha), or None when not requested."""
    cutoff_expert: torch.Tensor | None
    """`[N]` int64 the expert holding that (k+1)-th score, or None."""


def route(
    logits: torch.Tensor,
    bias: torch.Tensor,
    top_k: int,
    routed_scale: float,
    with_cutoff: bool = False,
    fused: bool = True,
) -> Routing:
    """Select experts by `scores + bias`, weight them by the scores alone.

    Args:
        logits: router logits `[N, E]` (cast to fp32 here).
        bias: balancing bias `[E]` (selection only).
        top_k: experts per token k.
        routed_scale: rho; weights sum to it per token.
        with_cutoff: also return the (k+1)-th biased score and its expert (needs k < E, else
            both None).
        fused: use the C++ kernel when it runs here (CPU); False forces this torch reference.
            The kernel breaks ties toward the lower expert; torch.topk leaves tie order open.
    """
    logits = logits.float()
    num_experts = logits.shape[-1]
    wants_cutoff = with_cutoff and top_k < num_experts
    count = top_k + 1 if wants_cutoff else top_k
    if fused and supports(logits, bias.float()):
        scores, values, index, weights = route_fused(logits, bias, top_k, count, routed_scale)
    else:
        scores = torch.sigmoid(logits)
        values, index = torch.topk(scores.detach() + bias.float(), count, dim=-1)
        chosen = scores.gather(-1, index[:, :top_k])
        weights = routed_scale * chosen / chosen.sum(dim=-1, keepdim=True)
    return Routing(
        scores=scores,
        expert_idx=index[:, :top_k],
        weights=weights,
        cutoff=values[:, top_k] if wants_cutoff else None,
        cutoff_expert=index[:, top_k] if wants_cutoff else None,
    )


def sequence_aux_loss(
    scores: torch.Tensor,
    expert_idx: torch.Tensor,
    num_sequences: int,
    alpha: float,
    fused: bool = True,
) -> torch.Tensor:
    """DeepSeek-V3 sequence-wise balance loss `alpha * sum_e f_e P_e`, averaged over sequences.

    Per sequence of T tokens: `f_e = E / (k T) * #{t : e in sel_t}` (no gradient) and
    `P_e = mean_t s'_{t,e}` with `s'` the scores normalised over all experts.

    Args:
        scores: `[B*T, E]` fp32 unbiased scores.
        expert_idx: `[B*T, k]` selections.
        num_sequences: B.
        alpha: loss weight.
        fused: use the C++ kernel when it runs here (CPU); False forces this torch reference.

    Returns:
        fp32 scalar.
    """
    if fused and scores.dtype == torch.float32 and supports(scores):
        return sequence_aux_loss_fused(scores, expert_idx, num_sequences, alpha)
    num_tokens, num_experts = scores.shape
    top_k = expert_idx.shape[-1]
    seq_len = num_tokens // num_sequences
    selected = torch.zeros_like(scores).scatter_(-1, expert_idx, 1.0)
    fraction = selected.view(num_sequences, seq_len, num_experts).mean(dim=1)
    fraction = fraction * (num_experts / top_k)
    normalised = scores / scores.sum(dim=-1, keepdim=True)
    probability = normalised.view(num_sequences, seq_len, num_experts).mean(dim=1)
    return alpha * (fraction * probability).sum(dim=-1).mean()
