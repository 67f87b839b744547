"""The MoE layer's fused C++ kernels (experts.cpp, router.cpp): routed experts, the router after
its linear map, and the sequence-wise aux loss. Each has the same contract as its torch reference
(`dispatch.py` and `naive.py` for the experts, `models/router.py` for the rest), and the tests
compare outputs and every gradient. Whole layers in one node each are in `fused_layers.py`.

Experts: one kernel call runs every expert forward (gather, projections, activation, routing
weight, scatter, per-token sum), one more the whole backward; eager torch needed about 60 ops.

Every kernel is a pair of `torch.library` custom ops (`k3scale::`, one per direction) with fake
kernels giving each output's shape and dtype, so `torch.compile` traces each as a single graph
node instead of breaking the graph at the extension call (issue 34). A forward op also returns
what its backward takes (the tensors an autograd.Function would save), all of sizes fixed by
the inputs' shapes: the dispatch plan is made inside the op. The public wrappers return only
the documented outputs.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import KernelActivation, load
from k3scale.ops.members import loop_members


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
    return experts_forward(
        x.contiguous(),
        weights.reshape(-1).to(x.dtype).contiguous(),
        expert_idx.contiguous(),
        w_gate.contiguous(),
        w_up.contiguous(),
        w_down.contiguous(),
        *activation.args(),
    )[0]


@torch.library.custom_op("k3scale::moe_experts_forward", mutates_args=())
def experts_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_idx: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    kind: int,
    beta: float,
    linear_beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out `[N, a]`, then for the backward: the gate and up pre-activations `[N k 2f]` and the
    dispatch plan, int64: order, token_of, position `[N k]`, offsets `[E + 1]`)."""
    kernels = load()
    # The plan (a counting sort by expert) is made here, not passed in: a graph then holds one
    # node per direction, and the plan's sizes follow from expert_idx's shape alone.
    plan = kernels.plan_dispatch(expert_idx, w_gate.shape[0])
    out, pre = kernels.experts_forward(
        x, weight, *plan, w_gate, w_up, w_down, kind, beta, linear_beta
    )
    return out, pre, *plan


@experts_forward.register_fake
def _(x, weight, expert_idx, w_gate, w_up, w_down, kind, beta, linear_beta):
    num_experts, hidden, _ = w_gate.shape
    slots = expert_idx.numel()  # N k
    return x.new_empty(x.shape), x.new_empty(slots * 2 * hidden), *fake_plan(x, slots, num_experts)


@torch.library.custom_op("k3scale::moe_experts_backward", mutates_args=())
def experts_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    order: torch.Tensor,
    token_of: torch.Tensor,
    position: torch.Tensor,
    offsets: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    pre: torch.Tensor,
    kind: int,
    beta: float,
    linear_beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(grad_x, grad_weight `[N k]`, grad_w_gate, grad_w_up, grad_w_down)."""
    grads = load().experts_backward(
        grad_out, x, weight, order, token_of, position, offsets, w_gate, w_up, w_down, pre, kind,
        beta, linear_beta,
    )  # fmt: skip
    return tuple(grads)


@experts_backward.register_fake
def _(grad_out, x, weight, order, token_of, position, offsets, w_gate, w_up, w_down, *_):
    return tuple(t.new_empty(t.shape) for t in (x, weight, w_gate, w_up, w_down))


def _experts_save(ctx, inputs, output):
    x, weight, _, w_gate, w_up, w_down, *activation = inputs
    _, pre, *plan = output
    ctx.mark_non_differentiable(pre, *plan)
    # No zero gradients made for the outputs that carry none.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, *plan, w_gate, w_up, w_down, pre)
    ctx.activation = activation


def _experts_backward(ctx, grad_out, *_no_grads):
    saved = ctx.saved_tensors
    grad_out = torch.zeros_like(saved[0]) if grad_out is None else grad_out.contiguous()
    grad_x, grad_weight, grad_gate, grad_up, grad_down = experts_backward(
        grad_out, *saved, *ctx.activation
    )
    return grad_x, grad_weight, None, grad_gate, grad_up, grad_down, None, None, None


experts_forward.register_autograd(_experts_backward, setup_context=_experts_save)


def route_fused(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, count: int, routed_scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(scores, values, index, weights)` of `router.route` from fp32 logits `[N, E]`: sigmoid,
    top-`count` of scores + bias (the lower expert first on ties), weights over the first
    `top_k`. Scores and weights are differentiable."""
    return route_forward(logits.contiguous(), bias.float().contiguous(), top_k, count, routed_scale)


@torch.library.custom_op("k3scale::moe_route_forward", mutates_args=())
def route_forward(
    logits: torch.Tensor, bias: torch.Tensor, top_k: int, count: int, routed_scale: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scores `[N, E]`, values `[N, count]`, index `[N, count]` int64, weights `[N, top_k]`)."""
    return tuple(load().route_forward(logits, bias, top_k, count, routed_scale))


@route_forward.register_fake
def _(logits, bias, top_k, count, routed_scale):
    num_rows = logits.shape[0]
    return (
        logits.new_empty(logits.shape),
        logits.new_empty(num_rows, count),
        logits.new_empty(num_rows, count, dtype=torch.int64),
        logits.new_empty(num_rows, top_k),
    )


@torch.library.custom_op("k3scale::moe_route_backward", mutates_args=())
def route_backward(
    grad_scores: torch.Tensor,
    grad_weights: torch.Tensor,
    scores: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    routed_scale: float,
) -> torch.Tensor:
    """Gradient of the logits `[N, E]`; an empty grad_scores stands for zeros."""
    return load().route_backward(grad_scores, grad_weights, scores, index, weights, routed_scale)


@route_backward.register_fake
def _(grad_scores, grad_weights, scores, index, weights, routed_scale):
    return scores.new_empty(scores.shape)


def _route_save(ctx, inputs, output):
    scores, values, index, weights = output
    ctx.mark_non_differentiable(values, index)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(scores, index, weights)
    ctx.routed_scale = inputs[4]


def _route_backward(ctx, grad_scores, _grad_values, _grad_index, grad_weights):
    scores, index, weights = ctx.saved_tensors
    if grad_weights is None:
        grad_weights = torch.zeros_like(weights)
    if grad_scores is None:
        grad_scores = scores.new_empty(0)
    grad_logits = route_backward(
        grad_scores, grad_weights, scores, index, weights, ctx.routed_scale
    )
    return grad_logits, None, None, None, None


route_forward.register_autograd(_route_backward, setup_context=_route_save)


def sequence_aux_loss_fused(
    scores: torch.Tensor, expert_idx: torch.Tensor, num_sequences: int, alpha: float
) -> torch.Tensor:
    """`router.sequence_aux_loss` in one kernel per direction (fp32 scores)."""
    loss, _ = sequence_aux_forward(
        scores.contiguous(), expert_idx.contiguous(), num_sequences, alpha
    )
    return loss


@torch.library.custom_op("k3scale::moe_sequence_aux_forward", mutates_args=())
def sequence_aux_forward(
    scores: torch.Tensor, expert_idx: torch.Tensor, num_sequences: int, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, 0-dim; coefficient `[B, E]`, all the backward needs besides the scores)."""
    top_k = expert_idx.shape[1]
    return tuple(load().sequence_aux_forward(scores, expert_idx, top_k, num_sequences, alpha))


@sequence_aux_forward.register_fake
def _(scores, expert_idx, num_sequences, alpha):
    return scores.new_empty(()), scores.new_empty(num_sequences, scores.shape[1])


@torch.library.custom_op("k3scale::moe_sequence_aux_backward", mutates_args=())
def sequence_aux_backward(
    grad_loss: torch.Tensor, scores: torch.Tensor, coefficient: torch.Tensor
) -> torch.Tensor:
    """Gradient of the scores `[N, E]`."""
    return load().sequence_aux_backward(grad_loss, scores, coefficient)


@sequence_aux_backward.register_fake
def _(grad_loss, scores, coefficient):
    return scores.new_empty(scores.shape)


def _sequence_aux_save(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(inputs[0], output[1])


def _sequence_aux_backward(ctx, grad_loss, _grad_coefficient):
    if grad_loss is None:
        return None, None, None, None
    scores, coefficient = ctx.saved_tensors
    return sequence_aux_backward(grad_loss, scores, coefficient), None, None, None


sequence_aux_forward.register_autograd(_sequence_aux_backward, setup_context=_sequence_aux_save)


def fake_plan(x, slots, num_experts):
    """order, token_of, position `[slots]` and offsets `[E + 1]`, int64 (`plan_dispatch_op`)."""
    index = [x.new_empty(slots, dtype=torch.int64) for _ in range(3)]
    return (*index, x.new_empty(num_experts + 1, dtype=torch.int64))


# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(experts_forward, loop_members(experts_forward))
torch.library.register_vmap(route_forward, loop_members(route_forward))
torch.library.register_vmap(sequence_aux_forward, loop_members(sequence_aux_forward))
