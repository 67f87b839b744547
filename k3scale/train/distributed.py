"""Data parallelism without wrappers: each rank takes a contiguous slice of the global batch and
gradients are averaged with one all_reduce per parameter. With gloo on CPU this is what DDP does,
but explicit, so micro-batching, balancing statistics and QK-Clip see the same global step."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def average_gradients(model: nn.Module) -> None:
    """Average every gradient over ranks (no-op on one process)."""
    _, size = world()
    if size == 1:
        return
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad.div_(size)


def mean_over_ranks(value: float) -> float:
    """Mean of a scalar over ranks (the global batch's loss)."""
    _, size = world()
    if size == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) / size
