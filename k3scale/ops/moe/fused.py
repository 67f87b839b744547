"""The MoE layer's fused C++ kernels (experts.cpp, router.cpp, layer.cpp): routed experts, the
router after its linear map, and the sequence-wise aux loss. Each has the same contract as its torch reference
(`dispatch.py` and `naive.py` for the experts, `models/router.py` for the rest), and the tests
compare outputs and every gradient.

Experts: one kernel call runs every expert forward (gather, projections, activation, routing
weight, scatter, per-token sum), one more the whole backward; eager torch needed about 60 ops.
Whole layers go further: `moe_layer_fused` (K2) and `latent_moe_layer_fused` (K3 Stable
LatentMoE) are one autograd node each, whose forward and backward are one C++ call each; the
torch reference for them is the composed layer in `models/moe.py` (tests/models/test_moe.py).

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

# Outputs of the layer ops: the six public ones, then what the backward takes (layer.cpp).
_MoELayerOutputs = tuple[(torch.Tensor,) * 17]
_LatentMoELayerOutputs = tuple[(torch.Tensor,) * 24]


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
    return x.new_empty(x.shape), x.new_empty(slots * 2 * hidden), *_fake_plan(x, slots, num_experts)


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
    results = moe_layer_forward(
        x, router_weight, bias, *experts, *shared, *routing, *aux, *activation.args()
    )
    return results[:6]


@torch.library.custom_op("k3scale::moe_layer_forward", mutates_args=())
def moe_layer_forward(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    s_gate: torch.Tensor,
    s_up: torch.Tensor,
    s_down: torch.Tensor,
    top_k: int,
    count: int,
    routed_scale: float,
    num_sequences: int,
    alpha: float,
    kind: int,
    beta: float,
    linear_beta: float,
) -> _MoELayerOutputs:
    """`moe_layer_fused`'s six outputs, then what the backward takes: routing weights, slot
    weights, the aux loss's coefficient, pre-activations, the dispatch plan, and the routed and
    shared weights stacked per projection (`moe_layer_forward_op` in layer.cpp)."""
    results = load().moe_layer_forward(
        x, router_weight, bias, w_gate, w_up, w_down, s_gate, s_up, s_down, top_k, count,
        routed_scale, num_sequences, alpha, kind, beta, linear_beta,
    )  # fmt: skip
    return tuple(results)


@moe_layer_forward.register_fake
def _(x, router_weight, bias, w_gate, w_up, w_down, s_gate, s_up, s_down, top_k, count, *rest):
    _, num_sequences, alpha, *_ = rest
    num_tokens, d = x.shape
    num_experts, hidden, _ = w_gate.shape
    # The shared GLU [S f, d] runs as S experts of width f; every token takes them all.
    num_shared = s_gate.shape[0] // hidden
    stacked = num_experts + num_shared
    slots = num_tokens * (top_k + num_shared)
    routing = _fake_routing(x, num_tokens, num_experts, top_k, count, num_sequences, alpha)
    return (
        *routing[:7],
        x.new_empty(slots),  # slot weights
        routing[7],  # coefficient
        x.new_empty(slots * 2 * hidden),  # pre-activations
        *_fake_plan(x, slots, stacked),
        w_gate.new_empty(stacked, hidden, d),
        w_up.new_empty(stacked, hidden, d),
        w_down.new_empty(stacked, d, hidden),
    )


def _fake_routing(x, num_tokens, num_experts, top_k, count, num_sequences, alpha):
    """(out, aux_loss, scores, index, values, loads, weights, coefficient) of a layer op."""
    return (
        x.new_empty(num_tokens, x.shape[1]),
        x.new_empty(()),
        x.new_empty(num_tokens, num_experts),
        x.new_empty(num_tokens, count, dtype=torch.int64),
        x.new_empty(num_tokens, count),
        x.new_empty(num_experts, dtype=torch.int64),
        x.new_empty(num_tokens, top_k),
        x.new_empty(num_sequences, num_experts) if alpha > 0 else x.new_empty(0),
    )


def _fake_plan(x, slots, num_experts):
    """order, token_of, position `[slots]` and offsets `[E + 1]`, int64 (`plan_dispatch_op`)."""
    index = [x.new_empty(slots, dtype=torch.int64) for _ in range(3)]
    return (*index, x.new_empty(num_experts + 1, dtype=torch.int64))


@torch.library.custom_op("k3scale::moe_layer_backward", mutates_args=())
def moe_layer_backward(
    grad_out: torch.Tensor,
    grad_aux: torch.Tensor,
    saved: list[torch.Tensor],
    routed_scale: float,
    kind: int,
    beta: float,
    linear_beta: float,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """(grad_x, grad_router, grads of the routed gate, up, down, grads of the shared gate, up,
    down); `saved` is x, router_weight, scores, index, then the forward's extra outputs. An
    empty grad_aux: the aux loss is off or unused."""
    grads = load().moe_layer_backward(
        grad_out, grad_aux, saved, routed_scale, kind, beta, linear_beta
    )
    # The routed and shared gradients of a projection are slices of one tensor; a custom op's
    # outputs may not alias each other, so the (smaller) shared ones are copied.
    return (*grads[:5], *(grad.clone() for grad in grads[5:]))


@moe_layer_backward.register_fake
def _(grad_out, grad_aux, saved, routed_scale, kind, beta, linear_beta):
    x, router_weight, scores = saved[:3]
    gate, down = saved[12], saved[14]
    num_experts = scores.shape[1]
    stacked, hidden, d = gate.shape
    shared_width = (stacked - num_experts) * hidden
    return (
        x.new_empty(x.shape),
        router_weight.new_empty(router_weight.shape),
        gate.new_empty(num_experts, hidden, d),
        gate.new_empty(num_experts, hidden, d),
        down.new_empty(num_experts, d, hidden),
        gate.new_empty(shared_width, d),
        gate.new_empty(shared_width, d),
        down.new_empty(d, shared_width),
    )


def _save_layer(ctx, output, inputs: tuple, routed_scale: float, alpha: float, activation):
    """Saves what a layer op's backward takes: `inputs`, scores and index, the extra outputs."""
    _, aux_loss, scores, index, values, loads, *saved = output
    no_grad = (scores, index, values, loads, *saved, *(() if alpha > 0 else (aux_loss,)))
    ctx.mark_non_differentiable(*no_grad)
    # Unused outputs' gradients stay None: no zero tensors for the statistics and saved outputs.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(*inputs, scores, index, *saved)
    ctx.settings = (routed_scale, tuple(activation))


def _layer_backward(ctx, grad_out, grad_aux, backward_op, saved: list):
    """A layer op's backward op on its saved tensors (x first)."""
    routed_scale, activation = ctx.settings
    x = saved[0]
    if grad_out is None:  # only the aux loss reached the loss
        grad_out = torch.zeros_like(x)
    if grad_aux is None:  # aux loss off or unused: the C++ skips its backward on an empty one
        grad_aux = x.new_empty(0)
    return backward_op(grad_out, grad_aux, saved, routed_scale, *activation)


def _moe_layer_save(ctx, inputs, output):
    x, router_weight, *_ = inputs
    _save_layer(ctx, output, (x, router_weight), inputs[11], inputs[13], inputs[14:])


def _moe_layer_backward(ctx, grad_out, grad_aux, *_no_grads):
    saved = list(ctx.saved_tensors)
    grads = _layer_backward(ctx, grad_out, grad_aux, moe_layer_backward, saved)
    return (*grads[:2], None, *grads[2:], *(None,) * 8)


moe_layer_forward.register_autograd(_moe_layer_backward, setup_context=_moe_layer_save)


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
    results = latent_moe_layer_forward(
        x,
        router_weight,
        bias,
        latent_down,
        latent_up,
        norm_weight,
        *experts,
        *shared,
        *routing,
        *aux,
        eps,
        *activation.args(),
    )
    return results[:6]


@torch.library.custom_op("k3scale::latent_moe_layer_forward", mutates_args=())
def latent_moe_layer_forward(
    x: torch.Tensor,
    router_weight: torch.Tensor,
    bias: torch.Tensor,
    latent_down: torch.Tensor,
    latent_up: torch.Tensor,
    norm_weight: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    s_gate: torch.Tensor,
    s_up: torch.Tensor,
    s_down: torch.Tensor,
    top_k: int,
    count: int,
    routed_scale: float,
    num_sequences: int,
    alpha: float,
    eps: float,
    kind: int,
    beta: float,
    linear_beta: float,
) -> _LatentMoELayerOutputs:
    """`latent_moe_layer_fused`'s six outputs, then what the backward takes: routing weights,
    the aux loss's coefficient, z, the routed experts' slot weights, plan and pre-activations,
    m, normed and 1 / rms (both empty when the norm is off), the shared GLU's slot weights, plan
    and pre-activations (`latent_moe_layer_forward_op` in layer.cpp)."""
    results = load().latent_moe_layer_forward(
        x, router_weight, bias, latent_down, latent_up, norm_weight, w_gate, w_up, w_down, s_gate,
        s_up, s_down, top_k, count, routed_scale, num_sequences, alpha, eps, kind, beta,
        linear_beta,
    )  # fmt: skip
    # Left out: the C++ list's weights (15-17) and shared views (27-29), which are the inputs
    # or views of them, and, with the norm off, normed (19), which is m itself. A custom op's
    # outputs may not alias its inputs or each other; the backward takes these from its inputs.
    m = results[18]
    normed = results[19] if norm_weight.numel() else m.new_empty(0)
    return (*results[:15], m, normed, *results[20:27])


@latent_moe_layer_forward.register_fake
def _(x, router_weight, bias, latent_down, latent_up, norm_weight, w_gate, w_up, w_down, s_gate,
      s_up, s_down, top_k, count, routed_scale, num_sequences, alpha, *_):  # fmt: skip
    num_tokens = x.shape[0]
    num_experts, hidden, width = w_gate.shape
    shared_width = s_gate.shape[0]  # the shared GLU runs as one expert of width S f
    slots = num_tokens * top_k
    routing = _fake_routing(x, num_tokens, num_experts, top_k, count, num_sequences, alpha)
    norm_on = norm_weight.numel() > 0  # normed and 1 / rms are empty with the norm off
    return (
        *routing,
        x.new_empty(num_tokens, width),  # z
        x.new_empty(slots),  # slot weights
        *_fake_plan(x, slots, num_experts),
        x.new_empty(slots * 2 * hidden),  # pre-activations
        x.new_empty(num_tokens, width),  # m
        x.new_empty(num_tokens, width) if norm_on else x.new_empty(0),  # normed
        x.new_empty(num_tokens if norm_on else 0),  # 1 / rms
        x.new_empty(num_tokens),  # shared slot weights
        *_fake_plan(x, num_tokens, 1),
        x.new_empty(num_tokens * 2 * shared_width),  # shared pre-activations
    )


@torch.library.custom_op("k3scale::latent_moe_layer_backward", mutates_args=())
def latent_moe_layer_backward(
    grad_out: torch.Tensor,
    grad_aux: torch.Tensor,
    saved: list[torch.Tensor],
    routed_scale: float,
    kind: int,
    beta: float,
    linear_beta: float,
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
    torch.Tensor,
]:
    """(grad_x, grad_router, grad_latent_down, grad_latent_up, grad_norm_weight (empty when
    off), grads of the routed gate, up, down, grads of the shared gate, up, down); `saved` is
    the 31 tensors `latent_moe_layer_backward_op` takes. An empty grad_aux: the aux loss is off
    or unused."""
    return tuple(
        load().latent_moe_layer_backward(
            grad_out, grad_aux, saved, routed_scale, kind, beta, linear_beta
        )
    )


@latent_moe_layer_backward.register_fake
def _(grad_out, grad_aux, saved, routed_scale, kind, beta, linear_beta):
    like = [saved[i] for i in (0, 1, 2, 3, 4, 16, 17, 18)]
    _, shared_width, d = saved[28].shape
    return (
        *(t.new_empty(t.shape) for t in like),
        grad_out.new_empty(shared_width, d),
        grad_out.new_empty(shared_width, d),
        grad_out.new_empty(d, shared_width),
    )


def _latent_moe_layer_save(ctx, inputs, output):
    kept = (*inputs[:2], *inputs[3:12])  # all tensors but the bias
    _save_layer(ctx, output, kept, inputs[14], inputs[16], inputs[18:])


def _latent_moe_layer_backward(ctx, grad_out, grad_aux, *_no_grads):
    saved = ctx.saved_tensors
    full = latent_layer_saved(saved[:11], saved[11], saved[12], saved[13:])
    grads = _layer_backward(ctx, grad_out, grad_aux, latent_moe_layer_backward, full)
    grad_norm = grads[4] if saved[4].numel() else None  # None: norm off
    return (*grads[:2], None, *grads[2:4], grad_norm, *grads[5:], *(None,) * 9)


def latent_layer_saved(tensors, scores, index, extras) -> list[torch.Tensor]:
    """The 31 tensors `latent_moe_layer_backward_op` takes, from the forward op's tensor inputs
    but the bias (x, router_weight, latent_down, latent_up, norm_weight, routed and shared gate,
    up, down), its scores and index, and its 18 outputs after the public six; what the op left
    out is rebuilt as `latent_moe_layer_forward_op` made it."""
    x, router_weight, latent_down, latent_up, norm_weight, *weights = tensors
    w_gate, w_up, w_down, s_gate, s_up, s_down = (w.contiguous() for w in weights)
    d = x.shape[1]
    m = extras[9]
    normed = extras[10] if norm_weight.numel() else m
    return [
        x, router_weight, latent_down, latent_up, norm_weight, scores, index, *extras[:9],
        w_gate, w_up, w_down, m, normed, *extras[11:],
        s_gate.view(1, -1, d), s_up.view(1, -1, d), s_down.view(1, d, -1),
    ]  # fmt: skip


latent_moe_layer_forward.register_autograd(
    _latent_moe_layer_backward, setup_context=_latent_moe_layer_save
)
