"""Stacked members (`train/stacked.py`): each member's losses, gradients and recorded statistics
equal its own forward's, and a member gone to NaN leaves the others bitwise as they were.

Tolerances: a stacked call batches each member's matmuls (bmm) where its own forward runs one
GEMM, which may sum in another order, so gradients are held to fp32 rounding (observed: losses
equal to the bit, gradients within 2e-6 of their largest element at k3-s1).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from k3scale.models import build_model
from k3scale.models.model import mla_modules
from k3scale.models.presets import get_preset
from k3scale.train.stacked import StackedForward
from tests.conftest import require_fused_kernels

MEMBERS = 3


@pytest.fixture(autouse=True)
def kernels():
    return require_fused_kernels()


def _members(name: str) -> list[torch.nn.Module]:
    cfg = dataclasses.replace(get_preset(name), backend="cpu")
    members = []
    for seed in range(MEMBERS):
        torch.manual_seed(seed)
        model = build_model(cfg).train()
        for module in mla_modules(model):
            module.track_max_logits = True
        members.append(model)
    return members


def _tokens(vocab: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, vocab, (MEMBERS, 2, 65), generator=generator)


@pytest.mark.parametrize("name", ["k2-s1", "k3-s1"])
def test_each_member_gets_its_own_forward_s_losses_gradients_and_statistics(name):
    stacked_members, own_members = _members(name), _members(name)
    tokens = _tokens(stacked_members[0].cfg.vocab_size)
    losses = StackedForward(stacked_members)(tokens)
    losses.loss.sum().backward()
    for index, (stacked, own) in enumerate(zip(stacked_members, own_members, strict=True)):
        rows = tokens[index]
        out = own(rows[:, :-1], targets=rows[:, 1:], with_logits=False)
        out.loss.backward()
        torch.testing.assert_close(losses.loss[index], out.loss, rtol=1e-6, atol=0)
        torch.testing.assert_close(losses.ce_loss[index], out.ce_loss, rtol=1e-6, atol=0)
        for (param_name, mine), theirs in zip(
            stacked.named_parameters(), own.parameters(), strict=True
        ):
            assert (mine.grad is None) == (theirs.grad is None), param_name
            if theirs.grad is not None:
                scale = theirs.grad.abs().max().item() or 1.0
                torch.testing.assert_close(
                    mine.grad, theirs.grad, rtol=0, atol=1e-5 * scale, msg=param_name
                )
        for (buffer_name, mine), theirs in zip(stacked.named_buffers(), own.buffers(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=0, msg=buffer_name)


def test_a_member_gone_to_nan_leaves_the_others_bitwise_unaffected():
    healthy, poisoned = _members("k3-s1"), _members("k3-s1")
    with torch.no_grad():
        for param in poisoned[1].parameters():
            param.fill_(float("nan"))
    tokens = _tokens(healthy[0].cfg.vocab_size)
    results = []
    for members in (healthy, poisoned):
        losses = StackedForward(members)(tokens)
        losses.loss.sum().backward()
        results.append(losses)
    assert torch.isnan(results[1].loss[1])
    for index in (0, 2):
        assert torch.equal(results[0].loss[index], results[1].loss[index])
        for mine, theirs in zip(
            healthy[index].parameters(), poisoned[index].parameters(), strict=True
        ):
            if mine.grad is not None:
                assert torch.equal(mine.grad, theirs.grad)


def test_members_of_different_shapes_are_refused():
    small, other = _members("k3-s1")[0], build_model(get_preset("k3-s2"))
    with pytest.raises(ValueError, match="differ"):
        StackedForward([small, other])
