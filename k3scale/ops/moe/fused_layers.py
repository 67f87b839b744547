"""Whole MoE layers as one node each (layer.cpp): `moe_layer_fused` (K2) and
`latent_moe_layer_fused` (K3 Stable LatentMoE), whose forward and backward are one C++ call each;
the torch reference for them is the composed layer in `models/moe.py` (tests/models/test_moe.py).

Like the kernels of `fused.py`, each is a pair of `torch.library` custom ops (`k3scale::`) with
fake kernels, so `torch.compile` traces each as a single graph node (issue 34). A forward op also
returns what its backward takes, all of sizes fixed by the inputs' shapes.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import KernelActivation, load
from k3scale.ops.members import loop_members
from k3scale.ops.moe.fused import fake_plan

# Outputs of the layer ops: the six public ones, then what the backward takes (layer.cpp).
_MoELayerOutputs = tuple[(torch.Tensor,) * 17]
_LatentMoELayerOutputs = tuple[(torch.Tensor,) * 24]
# Gradients of the layer ops' differentiable inputs (layer.cpp's backward ops).
_MoELayerGrads = tuple[(torch.Tensor,) * 8]
_LatentMoELayerGrads = tuple[(torch.Tensor,) * 11]


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
        *fake_plan(x, slots, stacked),
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


@torch.library.custom_op("k3scale::moe_layer_backward", mutates_args=())
def moe_layer_backward(
    grad_out: torch.Tensor,
    grad_aux: torch.Tensor,
    saved: list[torch.Tensor],
    routed_scale: float,
    kind: int,
    beta: float,
    linear_beta: float,
) -> _MoELayerGrads:
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
        *fake_plan(x, slots, num_experts),
        x.new_empty(slots * 2 * hidden),  # pre-activations
        x.new_empty(num_tokens, width),  # m
        x.new_empty(num_tokens, width) if norm_on else x.new_empty(0),  # normed
        x.new_empty(num_tokens if norm_on else 0),  # 1 / rms
        x.new_empty(num_tokens),  # shared slot weights
        *fake_plan(x, num_tokens, 1),
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
) -> _LatentMoELayerGrads:
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

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(moe_layer_forward, loop_members(moe_layer_forward))
torch.library.register_vmap(latent_moe_layer_forward, loop_members(latent_moe_layer_forward))
