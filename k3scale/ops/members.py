"""vmap rules for the k3scale custom ops, so stacked trials (issue 34) can call one model for M
members at once through `torch.func.vmap` (`train/stacked.py`).

Two rules cover every op:
- `fold_members`: the member dimension is folded into the op's leading batch dimension, one
  kernel call for all members. For ops without weights whose every tensor input and output
  leads with that batch dimension (attention, the KDA recurrence, the GLU activation).
- `loop_members`: one call per member, outputs stacked. For ops whose inputs differ per member
  in other dimensions (weights), where folding would mix members.

Under both, autograd records the physical calls, so each op's own backward runs on them and no
rule is needed for the backward ops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch


def _member_first(arg: Any, dim: int | None, members: int) -> Any:
    """`arg` with its member dimension first (expanded if it had none); non-tensors unchanged."""
    if isinstance(arg, (list, tuple)):
        dims = dim if isinstance(dim, (list, tuple)) else [dim] * len(arg)
        return [_member_first(a, d, members) for a, d in zip(arg, dims, strict=True)]
    if not isinstance(arg, torch.Tensor):
        return arg
    if dim is None:
        return arg.unsqueeze(0).expand(members, *arg.shape)
    return arg.movedim(dim, 0)


def _fold(arg: Any) -> Any:
    if isinstance(arg, list):
        return [_fold(a) for a in arg]
    return arg.flatten(0, 1).contiguous() if isinstance(arg, torch.Tensor) else arg


def _member(arg: Any, index: int) -> Any:
    if isinstance(arg, list):
        return [_member(a, index) for a in arg]
    return arg[index].contiguous() if isinstance(arg, torch.Tensor) else arg


def _out_dims(out: Any) -> Any:
    return tuple(0 for _ in out) if isinstance(out, tuple) else 0


def fold_members(op: Callable) -> Callable:
    """The vmap rule that runs `op` once on inputs whose leading dimension is members x batch."""

    def rule(info, in_dims: Sequence[Any], *args: Any):
        members = info.batch_size
        out = op(*(_fold(_member_first(a, d, members)) for a, d in zip(args, in_dims, strict=True)))
        if isinstance(out, tuple):
            out = tuple(o.unflatten(0, (members, -1)) for o in out)
        else:
            out = out.unflatten(0, (members, -1))
        return out, _out_dims(out)

    return rule


def loop_members(op: Callable) -> Callable:
    """The vmap rule that runs `op` once per member and stacks the outputs."""

    def rule(info, in_dims: Sequence[Any], *args: Any):
        members = info.batch_size
        firsts = [_member_first(a, d, members) for a, d in zip(args, in_dims, strict=True)]
        outs = [op(*(_member(a, m) for a in firsts)) for m in range(members)]
        if isinstance(outs[0], tuple):
            out = tuple(torch.stack(parts) for parts in zip(*outs, strict=True))
        else:
            out = torch.stack(outs)
        return out, _out_dims(out)

    return rule
