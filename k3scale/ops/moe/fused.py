"""The MoE layer's fused C++ kernels (experts.cpp, router.cpp, layer.cpp): routed experts, the
router after its linear map, and the sequence-wise aux loss. Each has the same contract as its torch reference
(`dispatch.py` and `naive.py` for the experts, `models/router.py` for the rest), and the tests
compare outputs and every gradient.

Experts: one kernel call runs every expert forward (gather, projections, activation, routing
weight, scatter, per-token sum), one more the whole backward; eager torch needed about 60 ops.
Whole layers go further: `moe_layer_fused` (K2) and `latent_moe_layer_fused` (K3 Stable
LatentMoE) are one autograd node each, whose forward and backward are one C++ call each; the
torch reference for them is the composed layer in `models/moe.py` (tests/models/test_moe.py).
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


def moe_layer_fused(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor,
    experts: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    routing: tuple[int, int, float],
    aux: tuple[int, float],
    activation: KernelActivation,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole MoE layer without latent projection (K2) as ONE autograd node: router matmul,
    route, sequence-wise aux loss, routed and shared experts.

    The shared GLU of width S * f runs as S more experts of width f that every token takes with
    weight 1, in the same kernel call as the routed ones. At the ladder's narrow widths the
    separate pieces (each an autograd node, the shared FFN three matmuls of its own, each eager
    op's overhead) cost more than their arithmetic; here the forward and the backward are one
    C++ call each (`moe_layer_forward_op`, `moe_layer_backward_op`).

    Args:
        x: fp32 tokens `[N, d]`; router_weight `[E, d]`; bias `[E]` (selection only).
        experts: routed `w_gate, w_up [E, f, d]`, `w_down [E, d, f]`.
        shared: the shared GLU's `w_gate, w_up [S f, d]` and `w_down [d, S f]`.
        routing: `(top_k, count, routed_scale)`; count = top_k + 1 returns the cutoff column.
        aux: `(num_sequences, alpha)` of the sequence-wise aux loss (alpha 0: off).
    Returns:
        `(out [N, d], aux_loss, scores [N, E], index [N, count], values [N, count], loads [E])`;
        the last four carry no gradient (for the balancing statistics; loads counts the routed
        tokens per expert).
    """
    # Layouts and the bias's dtype are settled in C++ (cheaper than eager calls from Python).
    return _MoELayer.apply(x, router_weight, bias, *experts, *shared, routing, aux, activation)


class _MoELayer(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, x, router_weight, bias, w_gate, w_up, w_down, s_gate, s_up, s_down, routing, aux, act
    ):
        weights = (w_gate, w_up, w_down, s_gate, s_up, s_down)
        results = load().moe_layer_forward(
            x, router_weight, bias, *weights, *routing, *aux, *act.args()
        )
        return _finish_forward(ctx, results, (x, router_weight), routing, aux, act)

    @staticmethod
    def backward(ctx, grad_out, grad_aux, *_no_grads):
        grads = _layer_backward(ctx, grad_out, grad_aux, load().moe_layer_backward)
        return (*grads[:2], None, *grads[2:], None, None, None)


def _finish_forward(ctx, results, inputs: tuple, routing, aux, activation):
    """A layer node's outputs from its C++ forward's results; saves what its backward takes."""
    out, aux_loss, scores, index, values, loads, *saved = results
    alpha = aux[1]
    ctx.mark_non_differentiable(scores, index, values, loads, *(() if alpha > 0 else (aux_loss,)))
    ctx.save_for_backward(*inputs, scores, index, *saved)
    ctx.settings = (routing[2], activation)
    # Unused outputs' gradients stay None: no zero tensors for the four statistics outputs.
    ctx.set_materialize_grads(False)
    return out, aux_loss, scores, index, values, loads


def _layer_backward(ctx, grad_out, grad_aux, backward_op):
    """The C++ backward of a layer node on its saved tensors."""
    routed_scale, activation = ctx.settings
    saved = ctx.saved_tensors
    x = saved[0]
    if grad_out is None:  # only the aux loss reached the loss
        grad_out = torch.zeros_like(x)
    if grad_aux is None:  # aux loss off or unused
        grad_aux = x.new_empty(0)
    return backward_op(grad_out, grad_aux, saved, routed_scale, *activation.args())


def latent_moe_layer_fused(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor,
    latent: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, float],
    experts: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shared: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    routing: tuple[int, int, float],
    aux: tuple[int, float],
    activation: KernelActivation,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A K3 Stable LatentMoE layer as ONE autograd node (`latent_moe_layer_forward_op`): router,
    aux loss, latent down-projection, routed experts at the latent width, RMSNorm, latent
    up-projection, and the shared GLU at full width.

    Args:
        latent: `(w_latent_down [l, d], w_latent_up [d, l], norm weight [l] or None (norm off),
            norm eps)`.
        experts: routed `w_gate, w_up [E, f, l]`, `w_down [E, l, f]`.
        The rest as in `moe_layer_fused`.
    Returns:
        As `moe_layer_fused`.
    """
    latent_down, latent_up, norm_weight, eps = latent
    if norm_weight is None:
        norm_weight = latent_down.new_empty(0)
    return _LatentMoELayer.apply(
        x,
        router_weight,
        bias,
        latent_down,
        latent_up,
        norm_weight,
        *experts,
        *shared,
        routing,
        aux,
        eps,
        activation,
    )


class _LatentMoELayer(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x,
        router_weight,
        bias,
        latent_down,
        latent_up,
        norm_weight,
        w_gate,
        w_up,
        w_down,
        s_gate,
        s_up,
        s_down,
        routing,
        aux,
        eps,
        act,
    ):
        weights = (latent_down, latent_up, norm_weight, w_gate, w_up, w_down, s_gate, s_up, s_down)
        results = load().latent_moe_layer_forward(
            x, router_weight, bias, *weights, *routing, *aux, eps, *act.args()
        )
        inputs = (x, router_weight, latent_down, latent_up, norm_weight)
        return _finish_forward(ctx, results, inputs, routing, aux, act)

    @staticmethod
    def backward(ctx, grad_out, grad_aux, *_no_grads):
        grads = _layer_backward(ctx, grad_out, grad_aux, load().latent_moe_layer_backward)
        grad_norm = grads[4] if grads[4].numel() else None  # None: norm off
        return (*grads[:2], None, *grads[2:4], grad_norm, *grads[5:], None, None, None, None)
