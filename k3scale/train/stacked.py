"""Stacked members: M models of one architecture called as one through `torch.func.vmap`.

Issue 34 asked for trials stacked into one batched model. Each member stays a model of its own
(its parameters, buffers and optimizer, as a single trial has them); a call stacks their
parameters and buffers along a new leading dimension and runs the first member's module
structure over them under vmap, so every matmul is batched over members and the fused kernels
take all members in one call where they have no weights (`ops/members.py`). Gradients flow
through the stack into each member's own parameters; the statistics the forward records in
buffers in place (MoE loads, QB margin counts, MLA max logits) are copied back to each member.

`k3scale bench stack` measures what this buys on CPU; tests/train/test_stacked.py holds each
member's losses and gradients to its own forward's.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, vmap


@dataclass(frozen=True)
class StackedLosses:
    """Per-member losses of one stacked call, `[M]` each (as `ModelOutput`'s scalars)."""

    loss: torch.Tensor
    ce_loss: torch.Tensor


class StackedForward:
    """Calls `members` (same architecture, same shapes) as one model on `[M, B, T + 1]` tokens."""

    def __init__(self, members: list[nn.Module]) -> None:
        if not members:
            raise ValueError("StackedForward: needs at least one member")
        shapes = {tuple((n, p.shape) for n, p in m.named_parameters()) for m in members}
        if len(shapes) != 1:
            raise ValueError("StackedForward: members differ in their parameters' names or shapes")
        self.members = members
        # The structure the stacked tensors are called through; its own tensors are never used.
        self.template = copy.deepcopy(members[0])

    def __call__(self, tokens: torch.Tensor) -> StackedLosses:
        """Training losses of every member on its own rows `tokens[m]`."""
        if tokens.shape[0] != len(self.members):
            raise ValueError(
                f"StackedForward: {tokens.shape[0]} token blocks for {len(self.members)} members"
            )
        params = _stacked(m.named_parameters() for m in self.members)
        buffers = _stacked(m.named_buffers() for m in self.members)
        loss, ce_loss = vmap(self._member_loss)(params, buffers, tokens)
        with torch.no_grad():
            for index, member in enumerate(self.members):
                for name, buffer in member.named_buffers():
                    buffer.copy_(buffers[name][index])
        return StackedLosses(loss, ce_loss)

    def _member_loss(self, params, buffers, rows: torch.Tensor):
        out = functional_call(
            self.template,
            (params, buffers),
            (rows[:, :-1],),
            {"targets": rows[:, 1:], "with_logits": False},
        )
        return out.loss, out.ce_loss


def _stacked(named_per_member) -> dict[str, torch.Tensor]:
    """name -> the members' tensors stacked on a new first dimension (differentiable)."""
    per_member = [dict(named) for named in named_per_member]
    return {name: torch.stack([m[name] for m in per_member]) for name in per_member[0]}
