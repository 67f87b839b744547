"""`torch.library.opcheck` on the MoE kernels' custom ops (ops/moe/fused.py and
fused_layers.py): routed experts, the router, the sequence-wise aux loss and the whole K2 and K3
layers, forward and backward. It checks each op's schema, autograd registration, fake kernel (the
output shapes, dtypes and strides torch.compile traces with) and AOT dispatch with dynamic shapes
against the kernel; their numbers against the torch references are tested in
test_cpu_kernels.py and tests/models/test_moe.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from k3scale.models.moe import MoE
from k3scale.models.presets import get_preset
from k3scale.ops.cpu import SITU, SWIGLU
from k3scale.ops.moe.fused import (
    experts_backward,
    experts_forward,
    route_backward,
    route_forward,
    sequence_aux_backward,
    sequence_aux_forward,
)
from k3scale.ops.moe.fused_layers import (
    latent_layer_saved,
    latent_moe_layer_backward,
    latent_moe_layer_forward,
    moe_layer_backward,
    moe_layer_forward,
)
from tests.conftest import require_fused_kernels
from tests.ops.test_cpu_kernels import router_problem
from tests.ops.test_moe_dispatch import random_problem

ACTIVATIONS = {"swiglu": (SWIGLU, 0.0, 0.0), "situ": (SITU, 4.0, 25.0)}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


def _randn(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def experts_inputs(activation, grad=False):
    """`experts_forward`'s arguments as `routed_experts_fused` passes them, in fp64; 9 tokens
    over 8 experts leave some experts empty."""
    problem = random_problem(9, 8, 2, width=6, d_ff=5, seed=4)
    x, w_gate, w_up, w_down = (
        problem[name].double().requires_grad_(grad) for name in ("x", "w_gate", "w_up", "w_down")
    )
    weight = problem["weights"].reshape(-1).double().requires_grad_(grad)
    expert_idx = problem["expert_idx"].contiguous()
    return (x, weight, expert_idx, w_gate, w_up, w_down, *ACTIVATIONS[activation])


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_experts_forward_op(activation):
    torch.library.opcheck(experts_forward, experts_inputs(activation, grad=True))


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_experts_backward_op(activation):
    x, weight, _, w_gate, w_up, w_down, *act = inputs = experts_inputs(activation)
    out, pre, *plan = experts_forward(*inputs)
    args = (_randn(out.shape, 1, out.dtype), x, weight, *plan, w_gate, w_up, w_down, pre, *act)
    torch.library.opcheck(experts_backward, args)


# count = top_k + 1: the cutoff column too.
@pytest.mark.parametrize("count", [3, 4])
def test_route_forward_op(count):
    logits, bias = router_problem(num_tokens=20)
    torch.library.opcheck(route_forward, (logits.requires_grad_(), bias, 3, count, 2.5))


# An empty grad_scores stands for zeros (scores unused downstream).
@pytest.mark.parametrize("scores_used", [True, False])
def test_route_backward_op(scores_used):
    logits, bias = router_problem(num_tokens=20)
    scores, _, index, weights = route_forward(logits, bias, 3, 4, 2.5)
    grad_scores = _randn(scores.shape, 2) if scores_used else scores.new_empty(0)
    args = (grad_scores, _randn(weights.shape, 3), scores, index, weights, 2.5)
    torch.library.opcheck(route_backward, args)


def sequence_aux_inputs():
    logits, bias = router_problem(num_tokens=4 * 6)
    scores = torch.sigmoid(logits)
    return scores, torch.topk(scores + bias, 3, dim=-1).indices, 4, 1e-2


def test_sequence_aux_forward_op():
    scores, expert_idx, num_sequences, alpha = sequence_aux_inputs()
    torch.library.opcheck(
        sequence_aux_forward, (scores.requires_grad_(), expert_idx, num_sequences, alpha)
    )


def test_sequence_aux_backward_op():
    scores, *rest = sequence_aux_inputs()
    _, coefficient = sequence_aux_forward(scores, *rest)
    torch.library.opcheck(sequence_aux_backward, (torch.tensor(3.0), scores, coefficient))


def layer_inputs(preset, grad=False, **fields):
    """A fused layer op's arguments as `MoE._fused_layer` passes them in training (fp32, as the
    layer kernels take), for 2 sequences of 5 tokens; fields change the preset's MoE config."""
    cfg = get_preset(preset)
    moe_cfg = dataclasses.replace(cfg.moe, **fields)
    torch.manual_seed(0)
    layer = MoE(
        cfg.d_model, moe_cfg, cfg.activation, cfg.situ_beta, cfg.situ_linear_beta, 0.3, 1e-5
    )
    assert layer._fuses_layer(torch.zeros(1, cfg.d_model))
    shared, norm = layer.shared, layer.latent_norm
    weights = [layer.w_gate, layer.w_up, layer.w_down]
    weights += [shared.w_gate.weight, shared.w_up.weight, shared.w_down.weight]
    latent, eps = [], []
    if layer.latent_down is not None:  # K3; an empty norm weight: norm off
        latent = [layer.latent_down.weight, layer.latent_up.weight]
        latent.append(torch.empty(0) if norm is None else norm.weight)
        eps = [0.0 if norm is None else norm.eps]

    def leaf(t):
        return t.detach().clone().requires_grad_(grad and t.numel() > 0)

    x = leaf(_randn((10, cfg.d_model), 5))
    top_k = moe_cfg.top_k
    routing = (top_k, top_k + 1, moe_cfg.routed_scale, 2, moe_cfg.seq_aux_alpha)
    tensors = map(leaf, [*latent, *weights])
    return (x, leaf(layer.router.weight), layer.bias, *tensors, *routing, *eps,
            *layer.kernel_activation.args())  # fmt: skip


# alpha 0: the aux loss off (no coefficient); two shared experts: the shared GLU as two experts.
K2_CASES = {"aux": {"seq_aux_alpha": 1e-2}, "no_aux": {"seq_aux_alpha": 0.0, "num_shared": 2}}
K3_CASES = {
    "aux_norm": {"seq_aux_alpha": 1e-2, "latent_norm": True},
    "no_aux_no_norm": {"seq_aux_alpha": 0.0, "latent_norm": False},
}


@pytest.mark.parametrize("case", sorted(K2_CASES))
def test_moe_layer_forward_op(case):
    torch.library.opcheck(moe_layer_forward, layer_inputs("k2-t1", grad=True, **K2_CASES[case]))


@pytest.mark.parametrize("case", sorted(K2_CASES))
@pytest.mark.parametrize("aux_used", [True, False])
def test_moe_layer_backward_op(case, aux_used):
    inputs = layer_inputs("k2-t1", **K2_CASES[case])
    outputs = moe_layer_forward(*inputs)
    saved = [inputs[0], inputs[1], outputs[2], outputs[3], *outputs[6:]]
    grad_aux = torch.tensor(2.0) if aux_used else torch.empty(0)
    args = (_randn(outputs[0].shape, 6), grad_aux, saved, inputs[11], *inputs[14:])
    torch.library.opcheck(moe_layer_backward, args)


@pytest.mark.parametrize("case", sorted(K3_CASES))
def test_latent_moe_layer_forward_op(case):
    inputs = layer_inputs("k3-t1", grad=True, **K3_CASES[case])
    torch.library.opcheck(latent_moe_layer_forward, inputs)


@pytest.mark.parametrize("case", sorted(K3_CASES))
@pytest.mark.parametrize("aux_used", [True, False])
def test_latent_moe_layer_backward_op(case, aux_used):
    inputs = layer_inputs("k3-t1", **K3_CASES[case])
    outputs = latent_moe_layer_forward(*inputs)
    tensors = (*inputs[:2], *inputs[3:12])  # all but the bias
    saved = latent_layer_saved(tensors, outputs[2], outputs[3], outputs[6:])
    grad_aux = torch.tensor(2.0) if aux_used else torch.empty(0)
    args = (_randn(outputs[0].shape, 7), grad_aux, saved, inputs[14], *inputs[18:])
    torch.library.opcheck(latent_moe_layer_backward, args)


@pytest.mark.parametrize("terms", [("out",), ("out", "aux")])
@pytest.mark.parametrize("preset", ["k2-t1", "k3-t1"])
def test_compiled_layer_is_one_graph_and_matches_eager(preset, terms):
    # The layer ops under torch.compile (fullgraph: a graph break raises) give eager's outputs
    # and gradients, also when the aux loss's gradient is absent (only the output reaches the
    # loss); aot_eager runs the traced graphs without Inductor's codegen.
    cfg = get_preset(preset)
    moe_cfg = dataclasses.replace(cfg.moe, seq_aux_alpha=1e-2)
    torch.manual_seed(0)
    layer = MoE(
        cfg.d_model, moe_cfg, cfg.activation, cfg.situ_beta, cfg.situ_linear_beta, 0.3, 1e-5
    ).train()
    x = _randn((2, 8, cfg.d_model), 8)

    def step(x):
        out = layer(x)
        return out, sum({"out": out.square().mean(), "aux": layer.aux_loss}[t] for t in terms)

    results = []
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        layer.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        out, loss = fn(leaf)
        loss.backward()
        results.append([out, leaf.grad, *(p.grad for p in layer.parameters())])
    for eager, compiled in zip(*results, strict=True):
        assert (eager is None) == (compiled is None)
        if eager is not None:
            assert torch.equal(eager, compiled)
