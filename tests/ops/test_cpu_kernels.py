"""The fused C++ CPU kernels (ops/*/*.cpp) against their torch references: routed experts
(naive.py, dispatch.py), the router and aux loss (models/router.py), QB margin counts
(ops/qb/histogram.py), the GLU activations (ops/situ/naive.py), the output head's
cross-entropy chunk (ops/head_ce/chunked.py) and KDA's short conv (models/kda.py): outputs and
every gradient, fp64 gradient checks, and the fallback when the kernels are off or fail to
build."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest
import torch

from k3scale.models import kda
from k3scale.models.router import route, sequence_aux_loss
from k3scale.ops.cpu import SITU, SWIGLU, KernelActivation
from k3scale.ops.head_ce.chunked import _nll_into_gradient_torch
from k3scale.ops.moe import routed_experts, routed_experts_naive
from k3scale.ops.qb.histogram import margin_counts
from k3scale.ops.situ import situ_glu, swiglu
from k3scale.ops.situ.cpu import glu_cpu
from tests.conftest import require_fused_kernels
from tests.ops.test_moe_dispatch import DIFFERENTIABLE, outputs_and_grads, random_problem, rel_rms

# (reference activation, the kernel's description of it)
ACTIVATIONS = {
    "swiglu": (swiglu, KernelActivation(SWIGLU)),
    "situ": (
        functools.partial(situ_glu, beta=4.0, linear_beta=25.0),
        KernelActivation(SITU, 4.0, 25.0),
    ),
    "situ_uncapped_up": (
        functools.partial(situ_glu, beta=4.0, linear_beta=None),
        KernelActivation(SITU, 4.0, 0.0),
    ),
}


@pytest.fixture(scope="module", autouse=True)
def kernels():
    return require_fused_kernels()


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize(
    ("num_tokens", "num_experts", "top_k", "width", "d_ff"),
    [
        (300, 6, 2, 16, 4),  # K2 t1-like: hidden narrower than one vector
        (700, 5, 3, 37, 13),  # widths off the vector size; > 128 tokens per expert (tiles)
        (9, 8, 1, 8, 24),  # most experts get one token or none
    ],
)
def test_experts_match_dense_reference(activation, num_tokens, num_experts, top_k, width, d_ff):
    problem = random_problem(num_tokens, num_experts, top_k, width=width, d_ff=d_ff)
    reference, kernel_activation = ACTIVATIONS[activation]
    ref, ref_grads = outputs_and_grads(routed_experts_naive, problem, reference)
    out, grads = outputs_and_grads(
        routed_experts,
        problem,
        reference,
        method="fused",
        kernel_activation=kernel_activation,
    )
    # fp32 sums in another order than the reference's: a few ulp, relative.
    assert rel_rms(out, ref) < 1e-5
    for name in DIFFERENTIABLE:
        assert rel_rms(grads[name], ref_grads[name]) < 1e-5, name


def test_experts_with_empty_experts_give_zero_gradients():
    problem = random_problem(63, 8, 2, avoid=(0, 5))
    reference, kernel_activation = ACTIVATIONS["situ"]
    ref, ref_grads = outputs_and_grads(routed_experts_naive, problem, reference)
    out, grads = outputs_and_grads(
        routed_experts, problem, reference, method="fused", kernel_activation=kernel_activation
    )
    assert rel_rms(out, ref) < 1e-5
    for name in ("w_gate", "w_up", "w_down"):
        assert torch.count_nonzero(grads[name][[0, 5]]) == 0
        assert rel_rms(grads[name], ref_grads[name]) < 1e-5, name


@pytest.mark.parametrize("activation", ["swiglu", "situ"])
def test_experts_gradcheck_fp64(activation):
    problem = random_problem(20, 4, 2, width=10, d_ff=5, seed=3)
    _, kernel_activation = ACTIVATIONS[activation]
    expert_idx = problem["expert_idx"]
    inputs = tuple(
        problem[name].double().requires_grad_()
        for name in ("x", "weights", "w_gate", "w_up", "w_down")
    )

    def fused(x, weights, w_gate, w_up, w_down):
        return routed_experts(
            x,
            expert_idx,
            weights,
            w_gate,
            w_up,
            w_down,
            activation=None,
            method="fused",
            kernel_activation=kernel_activation,
        )

    assert torch.autograd.gradcheck(fused, inputs)


def test_fused_method_needs_the_kernel_activation():
    with pytest.raises(ValueError, match="kernel_activation"):
        routed_experts(**random_problem(10, 4, 2), activation=swiglu, method="fused")


def test_plan_dispatch_is_a_stable_sort_by_expert(kernels):
    expert_idx = torch.randint(0, 7, (50, 3))
    order, token_of, position, offsets = kernels.plan_dispatch(expert_idx, 9)
    flat = expert_idx.reshape(-1)
    assert torch.equal(order, torch.argsort(flat, stable=True))
    assert torch.equal(token_of, order // 3)
    assert torch.equal(position[order], torch.arange(len(flat)))
    counts = torch.bincount(flat, minlength=9)
    assert torch.equal(offsets, torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]))


def test_plan_dispatch_rejects_an_expert_out_of_range(kernels):
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.plan_dispatch(torch.tensor([[0, 4]]), 4)


# Counts up to 9 run a compile-time slot network, larger ones the general one (28, 12).
@pytest.mark.parametrize(("num_experts", "count"), [(12, 3), (28, 5), (5, 5), (64, 9), (28, 12)])
def test_select_top_matches_topk(kernels, num_experts, count):
    gen = torch.Generator().manual_seed(num_experts)
    scores = torch.rand(1001, num_experts, generator=gen)  # continuous: no ties
    bias = torch.randn(num_experts, generator=gen) * 0.1
    values, index = kernels.select_top(scores, bias, count)
    expected_values, expected_index = torch.topk(scores + bias, count, dim=-1)
    assert torch.equal(values, expected_values)
    assert torch.equal(index, expected_index)


# 18 rows: one full block of vector lanes (read by gathers) and a partial one (scalar reads).
def test_select_top_breaks_ties_toward_the_lower_expert(kernels):
    scores = torch.tensor([[0.5, 0.7, 0.5, 0.7, 0.1], [0.3, 0.3, 0.3, 0.3, 0.3]]).repeat(9, 1)
    _, index = kernels.select_top(scores, torch.zeros(5), 3)
    assert index.tolist() == [[1, 3, 0], [0, 1, 2]] * 9


def test_select_top_rows_with_nan_get_valid_distinct_experts(kernels):
    nan = float("nan")
    rows = [[nan, 0.2, 0.3, 0.4], [nan, nan, nan, nan], [0.1, nan, nan, nan]]
    _, index = kernels.select_top(torch.tensor(rows).repeat(6, 1), torch.zeros(4), 3)
    for row in index.tolist():
        assert len(set(row)) == 3 and all(0 <= e < 4 for e in row)
    assert index[::3].tolist() == [[3, 2, 1]] * 6


def router_problem(num_tokens=96, num_experts=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=gen)
    bias = torch.randn(num_experts, generator=gen) * 0.05
    return logits, bias


@pytest.mark.parametrize("with_cutoff", [False, True])
def test_route_fused_matches_reference(with_cutoff):
    logits, bias = router_problem()
    results = []
    for fused in (True, False):
        leaf = logits.clone().requires_grad_()
        routing = route(leaf, bias, 3, 2.5, with_cutoff, fused=fused)
        gen = torch.Generator().manual_seed(1)
        objective = (routing.weights * torch.randn(routing.weights.shape, generator=gen)).sum()
        objective = (
            objective + (routing.scores * torch.randn(routing.scores.shape, generator=gen)).sum()
        )
        objective.backward()
        results.append((routing, leaf.grad))
    (fused, fused_grad), (ref, ref_grad) = results
    assert torch.equal(fused.expert_idx, ref.expert_idx)
    assert torch.equal(fused.scores, ref.scores)
    assert rel_rms(fused.weights, ref.weights) < 1e-6
    assert rel_rms(fused_grad, ref_grad) < 1e-6
    if with_cutoff:
        assert torch.equal(fused.cutoff, ref.cutoff)
        assert torch.equal(fused.cutoff_expert, ref.cutoff_expert)
    else:
        assert fused.cutoff is None


def test_sequence_aux_loss_fused_matches_reference():
    logits, bias = router_problem(num_tokens=4 * 24)
    scores = torch.sigmoid(logits)
    expert_idx = torch.topk(scores + bias, 3, dim=-1).indices
    results = []
    for fused in (True, False):
        leaf = scores.clone().requires_grad_()
        loss = sequence_aux_loss(leaf, expert_idx, 4, 1e-2, fused=fused)
        (loss * 3.0).backward()
        results.append((loss, leaf.grad))
    (loss, grad), (ref_loss, ref_grad) = results
    assert loss.shape == ref_loss.shape == ()
    assert abs(loss.item() - ref_loss.item()) < 1e-6 * abs(ref_loss.item())
    assert rel_rms(grad, ref_grad) < 1e-5


@pytest.mark.parametrize("bias_scale", [0.05, 2.0])
@pytest.mark.parametrize("num_experts", [10, 28])  # whole vectors of experts and a scalar tail
def test_margin_counts_fused_equal_torch(bias_scale, num_experts):
    # bias_scale 2 pushes margins far outside the typical range (exercises the clamping).
    logits, _ = router_problem(num_tokens=513, num_experts=num_experts, seed=2)
    bias = torch.randn(num_experts, generator=torch.Generator().manual_seed(5)) * bias_scale
    routing = route(logits, bias, 3, 1.0, with_cutoff=True, fused=False)
    args = (routing.scores, routing.cutoff, routing.cutoff_expert, bias, 64)
    assert torch.equal(margin_counts(*args), margin_counts(*args, fused=False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("width", [37, 112])  # 37: a partial vector per row
@pytest.mark.parametrize("with_tail", [False, True])
def test_kda_conv_silu_kernel_matches_the_torch_path(kernels, dtype, width, with_tail):
    # models/kda: the fused short conv + SiLU against conv1d in torch: output, the tail for the
    # next call, and the gradients of x, the tail and the weight.
    gen = torch.Generator().manual_seed(width)
    conv = kda._depthwise_conv(width, 4, 0.5).to(dtype)
    x = torch.randn(3, 11, width, generator=gen, dtype=dtype)
    tail = torch.randn(3, width, 3, generator=gen, dtype=dtype) if with_tail else None
    grad_y = torch.randn(3, 11, width, generator=gen, dtype=dtype)
    results = []
    for fn in (kda._causal_conv_silu, kda._causal_conv_silu_torch):
        conv.zero_grad(set_to_none=True)
        xs = x.clone().requires_grad_()
        ts = tail.clone().requires_grad_() if with_tail else None
        y, new_tail = fn(conv, xs, ts)
        y.backward(grad_y)
        grads = (xs.grad, conv.weight.grad) + ((ts.grad,) if with_tail else ())
        results.append((y, new_tail, *grads))
    tolerance = 1e-6 if dtype == torch.float32 else 1e-13
    for got, expected in zip(*results, strict=True):
        assert rel_rms(got, expected) < tolerance


@pytest.mark.parametrize(("width_in", "width_out"), [(16, 12), (8, 16), (64, 28), (33, 7)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_linear_rows_matches_matmul(kernels, width_in, width_out, accumulate):
    # The layers' narrow linear maps (router, latent projections) on the register-blocked GEMM:
    # y = x W^T, and the backward's grad_x (+)= grad_y W and grad_W = grad_y^T x.
    gen = torch.Generator().manual_seed(width_in)
    x = torch.randn(301, width_in, generator=gen)
    weight = torch.randn(width_out, width_in, generator=gen)
    grad_y = torch.randn(301, width_out, generator=gen)
    assert rel_rms(kernels.linear_rows(x, weight), x @ weight.T) < 1e-6
    start = torch.randn(301, width_in, generator=gen)
    grad_x = start.clone()
    grad_weight = kernels.linear_rows_backward(grad_y, x, weight, grad_x, accumulate)
    expected_x = grad_y @ weight + (start if accumulate else 0)
    assert rel_rms(grad_x, expected_x) < 1e-6
    assert rel_rms(grad_weight, grad_y.T @ x) < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("vocab", [300, 8192])
# 37 columns: one block of column vectors, the last partial; 150: blocks of 4 vectors over
# threads, then a partial block.
@pytest.mark.parametrize("columns", [37, 150])
def test_head_chunk_kernel_matches_the_torch_ops(kernels, dtype, vocab, columns):
    # ops/head_ce: the kernel against the torch ops beside it, on the summed NLL and on the
    # gradient both leave in the transposed logits; targets include both ends of the vocabulary.
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(vocab, columns, generator=gen, dtype=dtype) * 4
    targets = torch.randint(0, vocab, (columns,), generator=gen)
    targets[:2] = torch.tensor([0, vocab - 1])
    expected = logits.clone()
    expected_nll = _nll_into_gradient_torch(expected, targets, 100)
    nll = kernels.softmax_xent_grad(logits, targets, 1.0 / 100)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-13
    assert abs(nll.item() - expected_nll.item()) <= tolerance * abs(expected_nll.item())
    assert rel_rms(logits, expected) < tolerance
    assert nll.dtype == dtype


def test_head_chunk_kernel_rejects_a_target_out_of_range(kernels):
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.softmax_xent_grad(torch.zeros(5, 2), torch.tensor([1, 5]), 0.5)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_glu_matches_reference_fp32(activation):
    reference, kernel_activation = ACTIVATIONS[activation]
    gen = torch.Generator().manual_seed(0)
    # 1000 elements: not a whole number of vectors; scale 6 reaches both tanh regimes.
    gate = (torch.randn(10, 100, generator=gen) * 6).requires_grad_()
    up = (torch.randn(10, 100, generator=gen) * 6).requires_grad_()
    cotangent = torch.randn(10, 100, generator=gen)
    results = []
    for fn in (lambda g, u: glu_cpu(g, u, kernel_activation), reference):
        out = fn(gate, up)
        results.append((out, *torch.autograd.grad(out, (gate, up), cotangent)))
    for fused, ref in zip(*results):
        assert rel_rms(fused, ref) < 2e-6


@pytest.mark.parametrize("activation", ["swiglu", "situ"])
def test_glu_gradcheck_fp64(activation):
    _, kernel_activation = ACTIVATIONS[activation]
    gen = torch.Generator().manual_seed(1)
    gate = (torch.randn(3, 11, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    up = (torch.randn(3, 11, generator=gen, dtype=torch.float64) * 3).requires_grad_()
    assert torch.autograd.gradcheck(lambda g, u: glu_cpu(g, u, kernel_activation), (gate, up))


def test_fp32_tanh_is_accurate_in_both_regimes():
    # SiTU with an uncapped up branch and up = 1 exposes beta * tanh(g / beta) * sigmoid(g);
    # near 0 the kernel's tanh takes its Taylor branch, above |g / beta| = 0.1 the exp form.
    g = torch.cat([torch.logspace(-8, 1, 400), -torch.logspace(-8, 1, 400)])
    out = glu_cpu(g, torch.ones_like(g), KernelActivation(SITU, 4.0, 0.0)).double()
    g64 = g.double()
    expected = 4.0 * torch.tanh(g64 / 4.0) * torch.sigmoid(g64)
    assert ((out - expected).abs() / expected.abs()).max() < 2e-6


def test_glu_bounded_and_finite_for_huge_inputs():
    big = torch.tensor([-1e4, -1e3, -100.0, 100.0, 1e3, 1e4]).repeat_interleave(6)
    out = glu_cpu(big, big.flip(0), KernelActivation(SITU, 4.0, 25.0))
    # |h| < beta * linear_beta = 100, reached exactly after fp32 rounding (as in the reference).
    assert torch.isfinite(out).all() and out.abs().max() <= 100


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


FALLBACK_CHECK = """
import torch
from k3scale.ops.cpu import load, unavailable_reason
from k3scale.models.moe import MoE
from k3scale.models.presets import get_preset
assert load() is None
print("reason:", unavailable_reason())
cfg = get_preset("k3-t1")
moe = MoE(cfg.d_model, cfg.moe, cfg.activation, cfg.situ_beta, cfg.situ_linear_beta,
          cfg.init_std, cfg.rms_eps)
moe(torch.randn(2, 8, cfg.d_model)).sum().backward()
print("torch path ok")
"""


def test_switched_off_kernels_leave_the_torch_paths():
    result = _run_python(FALLBACK_CHECK, K3SCALE_CPU_KERNELS="0")
    assert result.returncode == 0, result.stderr
    assert "K3SCALE_CPU_KERNELS=0" in result.stdout and "torch path ok" in result.stdout


def test_a_failed_build_falls_back_with_its_reason(tmp_path):
    # A compiler that always fails, in an empty extension cache: the process boundary is the
    # build tool, so nothing of ours is patched.
    result = _run_python(FALLBACK_CHECK, CXX="false", TORCH_EXTENSIONS_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "building the fused CPU kernels failed" in result.stdout
    assert "torch path ok" in result.stdout
