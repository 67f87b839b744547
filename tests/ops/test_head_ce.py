"""The chunked output-head cross-entropy equals the plain one: loss and both gradients."""

from __future__ import annotations

import pytest
import torch

from k3scale.ops.head_ce import head_cross_entropy, head_cross_entropy_naive


def rel_rms(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x - ref).norm() / ref.norm()).item()


def inputs(num_rows: int, dtype: torch.dtype, d: int = 24, vocab: int = 300, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(num_rows, d, generator=gen, dtype=dtype)
    weight = torch.randn(vocab, d, generator=gen, dtype=dtype) * 0.3
    targets = torch.randint(0, vocab, (num_rows,), generator=gen)
    return hidden, weight, targets


def loss_and_grads(fn, hidden, weight, targets, grad_scale: float = 1.0, **kwargs):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = fn(hidden, weight, targets, **kwargs)
    (grad_scale * loss).backward()
    return loss.detach(), hidden.grad, weight.grad


@pytest.mark.parametrize("num_rows", [1, 63, 128, 300])
@pytest.mark.parametrize("chunk_rows", [1, 7, 128, 512])
def test_matches_the_plain_path_in_fp64(num_rows, chunk_rows):
    data = inputs(num_rows, torch.float64, seed=num_rows)
    ref = loss_and_grads(head_cross_entropy_naive, *data)
    got = loss_and_grads(head_cross_entropy, *data, chunk_rows=chunk_rows)
    for x, r in zip(got, ref):
        assert rel_rms(x, r) < 1e-12


def test_matches_the_plain_path_in_fp32_with_a_scaled_loss():
    """fp32 at a model's head shape; the incoming gradient (here 3.5) scales both gradients."""
    data = inputs(257, torch.float32, d=64, vocab=8192)
    ref = loss_and_grads(head_cross_entropy_naive, *data, grad_scale=3.5)
    got = loss_and_grads(head_cross_entropy, *data, grad_scale=3.5)
    for x, r in zip(got, ref):
        assert rel_rms(x, r) < 1e-5


def test_without_autograd_only_the_loss_is_formed():
    hidden, weight, targets = inputs(100, torch.float64)
    with torch.no_grad():
        loss = head_cross_entropy(hidden, weight, targets, chunk_rows=16)
    assert loss.grad_fn is None
    assert rel_rms(loss, head_cross_entropy_naive(hidden, weight, targets)) < 1e-12


def test_rejects_low_precision_inputs():
    hidden, weight, targets = inputs(4, torch.bfloat16)
    with pytest.raises(ValueError, match="fp32"):
        head_cross_entropy(hidden, weight, targets)
