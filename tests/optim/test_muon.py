"""Muon (architecture.md 8.1), Per-Head Muon (8.3) and the AdamW groups of `k3scale.optim.muon`."""

from __future__ import annotations

import io
import math

import pytest
import torch

from k3scale.config import OptimConfig
from k3scale.optim.muon import (
    NS_COEFFICIENTS,
    Muon,
    build_optimizer,
    newton_schulz5,
    newton_schulz_flops,
    orthogonalized_update,
    orthogonalized_updates,
)
from tests.flops import profiled_matmul_flops

# Measured (numpy, 2e5-point grid): for normalised input singular values s >= 2e-3 the quintic's
# five-step map sends s into [0.6818, 1.2024]; below ~1.07e-3 it drops under 0.5. Random
# Gaussian rectangular matrices (aspect >= 1.5) stay far above 2e-3, so all their output
# singular values fall in this band; square ones have tiny singular values that NS5 cannot lift.
NS5_BAND = (0.6818, 1.2024)
# fp32 NS5 against its fp64 SVD-polynomial reference: measured rel-RMS <= 1.4e-6 on these sizes
# (small singular directions amplify rounding by up to a^5 ~ 490, a = 3.4445).
NS5_FP32_TOL = 1e-5
# Two fp32 computations of the same math in a different order (batched vs looped matmuls).
REORDER_TOL = 1e-6


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS of the difference over RMS of the reference."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).pow(2).mean() / expected.pow(2).mean()).sqrt().item()


def scalar_ns5(s: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The NS5 iteration acting on one singular value: `s <- a s + b s^3 + c s^5`."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def ns5_by_svd(x: torch.Tensor) -> torch.Tensor:
    """fp64 reference: `U diag(p(s / (||X||_F + 1e-7))) V^T` for the NS5 polynomial p."""
    x = x.double()
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    # Same normalisation as `newton_schulz5` (Keller Jordan's eps).
    s = s / (torch.linalg.matrix_norm(x) + 1e-7)
    return u @ torch.diag(scalar_ns5(s)) @ vh


def muon_optimizer(params, num_heads=None, **overrides) -> Muon:
    settings = {"lr": 0.02, "weight_decay": 0.1} | overrides
    group = {"params": list(params), "algorithm": "muon", "num_heads": num_heads}
    return Muon([group], **settings)


def run_steps(param: torch.nn.Parameter, optimizer: Muon, grads: list[torch.Tensor]) -> None:
    for grad in grads:
        param.grad = grad.clone()
        optimizer.step()


def random_grads(shape, count: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=gen) for _ in range(count)]


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (17, 5), (5, 17), (64, 200), (150, 100)])
def test_ns5_singular_values_within_band(shape):
    torch.manual_seed(0)
    singular_values = torch.linalg.svdvals(newton_schulz5(torch.randn(*shape)))
    assert singular_values.min() >= NS5_BAND[0] - 1e-4
    assert singular_values.max() <= NS5_BAND[1] + 1e-4


@pytest.mark.parametrize("shape", [(64, 64), (17, 5), (5, 17), (63, 100), (100, 63)])
def test_ns5_equals_polynomial_of_singular_values(shape):
    torch.manual_seed(1)
    x = torch.randn(*shape)
    assert rel_rms(newton_schulz5(x), ns5_by_svd(x)) < NS5_FP32_TOL


def test_ns5_band_holds_for_large_singular_values_of_square_matrices():
    torch.manual_seed(2)
    x = torch.randn(128, 128)
    s_in = torch.linalg.svdvals(x) / torch.linalg.matrix_norm(x)
    s_out = torch.linalg.svdvals(newton_schulz5(x))  # both sorted descending, same order
    kept = s_in >= 2e-3
    assert kept.sum() > 100
    assert s_out[kept].min() >= NS5_BAND[0] - 1e-4
    assert s_out.max() <= NS5_BAND[1] + 1e-4


def test_ns5_batched_equals_one_matrix_at_a_time():
    torch.manual_seed(3)
    x = torch.randn(5, 24, 40)
    looped = torch.stack([newton_schulz5(m) for m in x])
    assert rel_rms(newton_schulz5(x), looped) < REORDER_TOL


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_steps_match_the_update_equations(nesterov):
    lr, wd, mu, shape = 0.03, 0.1, 0.95, (24, 40)
    torch.manual_seed(4)
    w0 = torch.randn(*shape)
    grads = random_grads(shape, 3, seed=5)
    param = torch.nn.Parameter(w0.clone())
    run_steps(param, muon_optimizer([param], lr=lr, weight_decay=wd, nesterov=nesterov), grads)

    w, m = w0.clone(), torch.zeros(shape)
    for g in grads:
        m = mu * m + g
        direction = g + mu * m if nesterov else m
        w = w * (1 - lr * wd) - lr * 0.2 * math.sqrt(max(shape)) * newton_schulz5(direction)
    assert rel_rms(param.detach(), w) < REORDER_TOL


def test_per_head_muon_with_one_head_equals_full_matrix_muon():
    torch.manual_seed(6)
    w0 = torch.randn(30, 20)
    grads = random_grads((30, 20), 3, seed=7)
    full, per_head = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    run_steps(full, muon_optimizer([full]), grads)
    run_steps(per_head, muon_optimizer([per_head], num_heads=1), grads)
    assert rel_rms(per_head.detach(), full.detach()) < REORDER_TOL
    assert not torch.equal(per_head.detach(), w0)


def one_step_update(grad: torch.Tensor, num_heads: int | None, head_scale="block") -> torch.Tensor:
    """`W_after - W_before` of one step from W = 0 without weight decay (lr = 1)."""
    param = torch.nn.Parameter(torch.zeros_like(grad))
    optimizer = muon_optimizer([param], num_heads, lr=1.0, weight_decay=0.0, head_scale=head_scale)
    run_steps(param, optimizer, [grad])
    return param.detach().clone()


def test_per_head_muon_isolates_heads_and_full_matrix_does_not():
    heads, rows, cols = 4, 6, 20
    grad = random_grads((heads * rows, cols), 1, seed=8)[0]
    loud = grad.clone()
    loud[rows : 2 * rows] *= 1e3  # head 1 only
    others = torch.cat([torch.arange(0, rows), torch.arange(2 * rows, heads * rows)])

    per_head_before = one_step_update(grad, heads)[others]
    per_head_after = one_step_update(loud, heads)[others]
    assert rel_rms(per_head_after, per_head_before) < REORDER_TOL

    full_before = one_step_update(grad, None)[others]
    full_after = one_step_update(loud, None)[others]
    assert rel_rms(full_after, full_before) > 0.5


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (64, 256), (17, 5)])
def test_update_rms_is_about_point_two(shape):
    # RMS = 0.2 * RMS(singular values) with singular values in NS5's band; measured 0.16-0.20.
    rms = one_step_update(random_grads(shape, 1, seed=9)[0], None).pow(2).mean().sqrt().item()
    assert 0.15 < rms < 0.21


def test_per_head_block_scale_and_matrix_scale():
    heads, rows, cols = 4, 48, 16
    grad = random_grads((heads * rows, cols), 1, seed=10)[0]
    block = one_step_update(grad, heads, "block")
    matrix = one_step_update(grad, heads, "matrix")
    # block: 0.2 sqrt(max(48, 16)); matrix: 0.2 sqrt(max(192, 16)); ratio sqrt(192 / 48) = 2.
    assert rel_rms(matrix, 2.0 * block) < REORDER_TOL
    for h in range(heads):
        block_rms = block[h * rows : (h + 1) * rows].pow(2).mean().sqrt().item()
        assert 0.15 < block_rms < 0.21


@pytest.mark.parametrize("algorithm", ["muon", "adamw"])
def test_decoupled_weight_decay_is_exact(algorithm):
    lr, wd = 0.05, 0.3
    torch.manual_seed(11)
    w0 = torch.randn(12, 20)
    param = torch.nn.Parameter(w0.clone())
    group = {"params": [param], "algorithm": algorithm}
    optimizer = Muon([group], lr=lr, weight_decay=wd)
    run_steps(param, optimizer, [torch.zeros(12, 20)])  # zero gradient: zero update direction
    assert torch.equal(param.detach(), w0 * (1 - lr * wd))


def test_weight_decay_scales_old_weights_before_the_update():
    lr, wd = 0.05, 0.3
    torch.manual_seed(12)
    w0 = torch.randn(12, 20)
    grads = random_grads((12, 20), 1, seed=13)
    decayed, plain = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    run_steps(decayed, muon_optimizer([decayed], lr=lr, weight_decay=wd), grads)
    run_steps(plain, muon_optimizer([plain], lr=lr, weight_decay=0.0), grads)
    assert rel_rms(decayed.detach() - plain.detach(), -lr * wd * w0) < 1e-5


def test_expert_tensor_equals_per_expert_muon():
    num_experts, shape = 3, (10, 24)
    torch.manual_seed(14)
    w0 = torch.randn(num_experts, *shape)
    grads = random_grads((num_experts, *shape), 3, seed=15)
    stacked = torch.nn.Parameter(w0.clone())
    run_steps(stacked, muon_optimizer([stacked]), grads)
    for e in range(num_experts):
        single = torch.nn.Parameter(w0[e].clone())
        run_steps(single, muon_optimizer([single]), [g[e] for g in grads])
        assert rel_rms(stacked.detach()[e], single.detach()) < REORDER_TOL


@pytest.mark.parametrize(
    ("num_heads", "head_scale", "shapes"),
    [
        # wide, tall (both join one batch after the turn), experts, a lone shape
        (None, "block", [(24, 40), (40, 24), (3, 24, 40), (40, 24), (7, 9)]),
        # heads of 12 x 20 (wide) and 30 x 20 (tall) blocks; both scales
        (2, "block", [(24, 20), (60, 20), (24, 20)]),
        (2, "matrix", [(24, 20), (60, 20)]),
    ],
)
def test_batched_updates_equal_one_parameter_at_a_time(num_heads, head_scale, shapes):
    gen = torch.Generator().manual_seed(21)
    directions = [torch.randn(shape, generator=gen) for shape in shapes]
    batched = orthogonalized_updates(directions, num_heads, head_scale, ns_steps=5)
    for direction, update in zip(directions, batched, strict=True):
        reference = orthogonalized_update(direction, num_heads, head_scale, ns_steps=5)
        assert update.shape == direction.shape
        # Not REORDER_TOL: tall matrices enter the batch as transposed contiguous copies, so
        # MKL sums in another order on another layout, and NS5 amplifies that rounding like
        # fp32's own (1.03-1.06e-6 measured here; see NS5_FP32_TOL).
        assert rel_rms(update, reference) < NS5_FP32_TOL


def test_newton_schulz_flops_match_the_counted_matmuls(make_stack, make_tokens):
    """The formula against the profiler's FLOP count over one real step of every Muon group kind
    (full matrices both ways round, per-head blocks, 3-D expert tensors)."""
    model = make_stack()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-3, per_head_muon=True))
    kinds = {
        ("heads" if g["num_heads"] else f"{p.ndim}-D")
        for g in optimizer.param_groups
        if g["algorithm"] == "muon"
        for p in g["params"]
    }
    assert kinds == {"heads", "2-D", "3-D"}
    model(make_tokens(0)).backward()
    assert optimizer.newton_schulz_flops_per_step() == profiled_matmul_flops(optimizer.step) > 0


def test_newton_schulz_flops_of_one_matrix():
    x = torch.randn(3, 5, 12)
    counted = profiled_matmul_flops(lambda: newton_schulz5(x, steps=2))
    assert newton_schulz_flops((3, 5, 12), steps=2) == counted
    assert newton_schulz_flops((12, 5), steps=2) == newton_schulz_flops((5, 12), steps=2)


def test_adamw_group_matches_torch_adamw():
    lr, wd, betas, eps = 0.01, 0.1, (0.9, 0.95), 1e-8
    torch.manual_seed(16)
    w0 = torch.randn(7, 9)
    grads = random_grads((7, 9), 4, seed=17)
    ours, theirs = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    group = {"params": [ours], "algorithm": "adamw"}
    run_steps(ours, Muon([group], lr=lr, weight_decay=wd, betas=betas, eps=eps), grads)
    reference = torch.optim.AdamW(
        [theirs], lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False
    )
    for grad in grads:
        theirs.grad = grad.clone()
        reference.step()
    assert rel_rms(ours.detach(), theirs.detach()) < REORDER_TOL


def test_adamw_params_that_missed_steps_keep_their_own_bias_correction():
    """One group, two tensors; the second gets no gradient at the first step, so their step
    counts differ ever after. Each must match AdamW run on it alone."""
    settings = {"lr": 0.01, "weight_decay": 0.1}
    torch.manual_seed(18)
    w0 = [torch.randn(5, 3), torch.randn(4)]
    grads = [random_grads(w.shape, 4, seed=19 + i) for i, w in enumerate(w0)]
    together = [torch.nn.Parameter(w.clone()) for w in w0]
    optimizer = Muon([{"params": together, "algorithm": "adamw"}], **settings)
    for step in range(4):
        together[0].grad = grads[0][step].clone()
        together[1].grad = grads[1][step].clone() if step > 0 else None
        optimizer.step()
    for i, w in enumerate(w0):
        alone = torch.nn.Parameter(w.clone())
        single = Muon([{"params": [alone], "algorithm": "adamw"}], **settings)
        run_steps(alone, single, grads[i][1:] if i else grads[i])
        assert torch.equal(alone.detach(), together[i].detach())


def test_bad_groups_are_rejected():
    with pytest.raises(ValueError, match="algorithm"):
        Muon([{"params": [torch.nn.Parameter(torch.ones(3, 3))]}], lr=0.1, weight_decay=0.0)
    with pytest.raises(ValueError, match="1-D tensor"):
        muon_optimizer([torch.nn.Parameter(torch.ones(3))])
    with pytest.raises(ValueError, match="3 heads"):
        muon_optimizer([torch.nn.Parameter(torch.ones(8, 4))], num_heads=3)


def train_steps(model, optimizer, make_tokens, seeds) -> None:
    for seed in seeds:
        optimizer.zero_grad()
        model(make_tokens(seed)).backward()
        optimizer.step()


def test_state_dict_round_trip_gives_identical_next_steps(make_stack, make_tokens):
    cfg = OptimConfig(lr=0.01, per_head_muon=True)
    model = make_stack(seed=0)
    optimizer = build_optimizer(model, cfg)
    train_steps(model, optimizer, make_tokens, seeds=[1, 2])

    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, saved)
    saved.seek(0)
    checkpoint = torch.load(saved)
    restored = make_stack(seed=99)
    restored.load_state_dict(checkpoint["model"])
    restored_optimizer = build_optimizer(restored, cfg)
    restored_optimizer.load_state_dict(checkpoint["optim"])

    train_steps(model, optimizer, make_tokens, seeds=[3, 4])
    train_steps(restored, restored_optimizer, make_tokens, seeds=[3, 4])
    for (name, a), (_, b) in zip(model.named_parameters(), restored.named_parameters()):
        assert torch.equal(a, b), name
    # A fresh optimizer (state lost) must give different steps, or this test could not fail.
    fresh = make_stack(seed=99)
    fresh.load_state_dict(checkpoint["model"])
    train_steps(fresh, build_optimizer(fresh, cfg), make_tokens, seeds=[3, 4])
    assert not torch.equal(fresh.head.weight, model.head.weight)


def test_trainer_sets_lr_on_every_group(make_stack, make_tokens):
    model = make_stack(seed=0)
    optimizer = build_optimizer(model, OptimConfig(lr=0.01))
    before = [p.detach().clone() for p in model.parameters()]
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    train_steps(model, optimizer, make_tokens, seeds=[1])
    # lr = 0 means no update and no decay in every group.
    for p, p0 in zip(model.parameters(), before):
        assert torch.equal(p.detach(), p0)
