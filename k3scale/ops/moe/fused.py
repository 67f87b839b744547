"""The MoE layer's fused C++ kernels (ops/cpu/kernels.cpp): routed experts, the router after its
linear map, and the sequence-wise aux loss. Each has the same contract as its torch reference
(`dispatch.py` and `naive.py` for the experts, `models/router.py` for the rest), and the tests
compare outputs and every gradient.

Experts: one kernel call runs every expert forward (gather, projections, activation, routing
weight, scatter, per-token sum), one more the whole backward; eager torch needed about 60 ops.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import KernelActivation, load


def routed_experts_fused(
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: KernelActivation,
) -> torch.Tensor:
    """`routed_experts` in one kernel per direction; needs `ops.cpu.supports(x, w_gate, ...)`.

    Sums run in x's dtype (fp32 for the model, as in the torch path; fp64 in gradient checks).
    """
    plan = load().plan_dispatch(expert_idx.contiguous(), w_gate.shape[0])
    return _Experts.apply(
        x.contiguous(),
        weights.reshape(-1).to(x.dtype).contiguous(),
        tuple(plan),
        w_gate.contiguous(),
        w_up.contiguous(),
        w_down.contiguous(),
        activation,
    )


class _Experts(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, plan, w_gate, w_up, w_down, activation):
        out, pre_activations = load().experts_forward(
            x, weight, *plan, w_gate, w_up, w_down, *activation.args()
        )
        ctx.save_for_backward(x, weight, *plan, w_gate, w_up, w_down, pre_activations)
        ctx.activation = activation
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grads = load().experts_backward(
            grad_out.contiguous(), *ctx.saved_tensors, *ctx.activation.args()
        )
        grad_x, grad_weight, grad_gate, grad_up, grad_down = grads
        return grad_x, grad_weight, None, grad_gate, grad_up, grad_down, None


def route_fused(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, count: int, routed_scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(scores, values, index, weights)` of `router.route` from fp32 logits `[N, E]`: sigmoid,
    top-`count` of scores + bias (the lower expert first on ties), weights over the first
    `top_k`. Scores and weights are differentiable."""
    return _Route.apply(logits.contiguous(), bias.float().contiguous(), top_k, count, routed_scale)


class _Route(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, bias, top_k, count, routed_scale):
        scores, values, index, weights = load().route_forward(
            logits, bias, top_k, count, routed_scale
        )
        ctx.mark_non_differentiable(values, index)
        ctx.save_for_backward(scores, index, weights)
        ctx.routed_scale = routed_scale
        return scores, values, index, weights

    @staticmethod
    def backward(ctx, grad_scores, _grad_values, _grad_index, grad_weights):
        scores, index, weights = ctx.saved_tensors
        if grad_weights is None:
            grad_weights = torch.zeros_like(weights)
        if grad_scores is None:
            grad_scores = scores.new_empty(0)
        grad_logits = load().route_backward(
            grad_scores, grad_weights, scores, index, weights, ctx.routed_scale
        )
        return grad_logits, None, None, None, None


def sequence_aux_loss_fused(
    scores: torch.Tensor, expert_idx: torch.Tensor, num_sequences: int, alpha: float
) -> torch.Tensor:
    """`router.sequence_aux_loss` in one kernel per direction (fp32 scores)."""
    return _SequenceAux.apply(scores.contiguous(), expert_idx.contiguous(), num_sequences, alpha)


class _SequenceAux(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, expert_idx, num_sequences, alpha):
        loss, coefficient = load().sequence_aux_forward(
            scores, expert_idx, expert_idx.shape[1], num_sequences, alpha
        )
        ctx.save_for_backward(scores, coefficient)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        scores, coefficient = ctx.saved_tensors
        return load().sequence_aux_backward(grad_loss, scores, coefficient), None, None, None
