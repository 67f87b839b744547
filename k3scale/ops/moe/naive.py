"""Dense masked reference for routed experts: every expert runs on every token, and a token's
output keeps expert e's result times its routing weight when e is among its selections.

O(N * E) expert evaluations, computed in fp32 and cast back; only for tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

GluActivation = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def routed_experts_naive(
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: GluActivation,
) -> torch.Tensor:
    """Weighted sum of the selected GLU experts, by a loop over experts with a dense mask.

    Args:
        x: tokens `[N, a]`.
        expert_idx: selected experts `[N, k]` (int64, distinct within a row).
        weights: routing weights `[N, k]` of those selections.
        w_gate, w_up: expert input projections `[E, f, a]`.
        w_down: expert output projections `[E, a, f]`.
        activation: GLU nonlinearity `h = act(gate, up)`, both `[..., f]`.

    Returns:
        `[N, a]` in `x.dtype`: `sum_j weights[t, j] * FFN_{expert_idx[t, j]}(x_t)`.
    """
    x32 = x.float()
    out = torch.zeros_like(x32)
    for e in range(w_gate.shape[0]):
        # [N]: the routing weight of expert e per token, 0 where e is not selected.
        token_weight = (weights.float() * (expert_idx == e)).sum(dim=-1)
        gate = x32 @ w_gate[e].float().T
        up = x32 @ w_up[e].float().T
        expert_out = activation(gate, up) @ w_down[e].float().T
        out = out + token_weight[:, None] * expert_out
    return out.to(x.dtype)
