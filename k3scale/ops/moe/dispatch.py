"""Sorted expert dispatch: group the N*k (token, expert) assignments by expert with one argsort,
run each expert only on its own tokens, and scatter-add the weighted outputs back.

Two ways to run the groups, equal up to float rounding (tests bind both to `naive.py`):
* "padded": copy the groups into an `[E, C, a]` block (C = largest group) and run three `bmm`s;
  one kernel per projection, best when loads are roughly balanced (the normal case).
* "loop": one matmul per non-empty contiguous slice; no padding, best when one expert holds
  most tokens (padding would multiply the work).
* "fused": the C++ kernel of `fused.py` (CPU, fp32/fp64, no autocast): gather, projections,
  activation and scatter in one call per direction; the fastest at the study widths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from k3scale.ops.cpu import KernelActivation, supports, unavailable_reason
from k3scale.ops.moe.fused import routed_experts_fused
from k3scale.ops.moe.naive import GluActivation

DispatchMethod = Literal["auto", "padded", "loop", "fused"]

# "auto" pads while the padded block is at most this many times the real assignments; above it
# the per-expert loop does less work. [INF] At balanced loads the two ran within ~15% of each
# other on CPU (E = 12-28, d = 32-256, one thread), so the switch only guards against skew.
MAX_PADDING_FACTOR = 2.0


@dataclass(frozen=True)
class DispatchPlan:
    """Assignments sorted by expert. `Nk = N * k` assignments, flat index `t * k + j`."""

    order: torch.Tensor
    """`[Nk]` flat assignment indices sorted by expert (stable: token order within an expert)."""
    token_of: torch.Tensor
    """`[Nk]` token index of each sorted assignment."""
    sorted_expert: torch.Tensor
    """`[Nk]` expert of each sorted assignment (non-decreasing)."""
    counts: torch.Tensor
    """`[E]` tokens per expert (int64)."""


def plan_dispatch(expert_idx: torch.Tensor, num_experts: int) -> DispatchPlan:
    """Sort the `[N, k]` selections by expert."""
    flat = expert_idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    return DispatchPlan(
        order=order,
        token_of=torch.div(order, expert_idx.shape[1], rounding_mode="floor"),
        sorted_expert=flat[order],
        counts=torch.bincount(flat, minlength=num_experts),
    )


def routed_experts(
    x: torch.Tensor,
    expert_idx: torch.Tensor,
    weights: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: GluActivation,
    method: DispatchMethod = "auto",
    kernel_activation: KernelActivation | None = None,
) -> torch.Tensor:
    """Weighted sum of the selected GLU experts; same contract as `routed_experts_naive`.

    Args:
        x: tokens `[N, a]`.
        expert_idx: selected experts `[N, k]` (int64, distinct within a row).
        weights: routing weights `[N, k]`.
        w_gate, w_up: `[E, f, a]`; w_down: `[E, a, f]`.
        activation: GLU nonlinearity `h = act(gate, up)`.
        method: "padded", "loop", "fused", or "auto": fused when `kernel_activation` is given and
            the kernel supports the tensors, else padded unless padding exceeds MAX_PADDING_FACTOR.
        kernel_activation: `activation` as the fused kernel names it (required by "fused").

    Returns:
        `[N, a]` in `x.dtype`; weights multiply the hidden rows in fp32 and the k expert
        outputs of a token are summed in fp32.
    """
    if expert_idx.numel() == 0:
        return torch.zeros_like(x)
    can_fuse = kernel_activation is not None and supports(x, w_gate, w_up, w_down)
    if method == "auto" and can_fuse:
        method = "fused"
    if method == "fused":
        if not can_fuse:
            raise ValueError(
                "method 'fused' needs kernel_activation and the built C++ kernels on CPU "
                f"fp32/fp64 tensors without autocast ({unavailable_reason() or 'kernels built'})"
            )
        return routed_experts_fused(x, expert_idx, weights, w_gate, w_up, w_down, kernel_activation)
    num_experts = w_gate.shape[0]
    plan = plan_dispatch(expert_idx, num_experts)
    sorted_weights = weights.reshape(-1)[plan.order].float()
    counts = plan.counts.tolist()
    if method == "auto":
        padded_rows = num_experts * max(counts)
        method = "padded" if padded_rows <= MAX_PADDING_FACTOR * len(plan.order) else "loop"
    if method == "padded":
        return _run_padded(x, plan, sorted_weights, max(counts), w_gate, w_up, w_down, activation)
    if method == "loop":
        return _run_loop(x, plan, sorted_weights, counts, w_gate, w_up, w_down, activation)
    raise ValueError(f"method: expected 'auto', 'padded' or 'loop', got {method!r}")


def _run_padded(
    x: torch.Tensor,
    plan: DispatchPlan,
    sorted_weights: torch.Tensor,
    capacity: int,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: GluActivation,
) -> torch.Tensor:
    num_experts, _, width = w_gate.shape
    num_tokens, num_slots = x.shape[0], num_experts * capacity
    starts = plan.counts.cumsum(0) - plan.counts
    rank_in_expert = torch.arange(len(plan.order), device=x.device) - starts[plan.sorted_expert]
    slot = plan.sorted_expert * capacity + rank_in_expert
    # Slot -> source token; padding slots read an appended zero row and carry weight 0, so one
    # gather fills the [E, C, a] block and one scatter-add brings the weighted outputs back.
    source = torch.full((num_slots,), num_tokens, device=x.device).index_put_(
        (slot,), plan.token_of
    )
    slot_weight = sorted_weights.new_zeros(num_slots).index_put((slot,), sorted_weights)
    padded_x = torch.cat([x, x.new_zeros(1, width)])
    block = padded_x.index_select(0, source).view(num_experts, capacity, width)
    gate = torch.bmm(block, w_gate.transpose(1, 2))
    up = torch.bmm(block, w_up.transpose(1, 2))
    # Weight the hidden rows before W_down (w * W_d h = W_d (w h)): f_e < a in both families,
    # so this multiply touches fewer elements than weighting the outputs.
    hidden = _weighted(activation(gate, up), slot_weight.view(num_experts, capacity, 1))
    out = torch.bmm(hidden, w_down.transpose(1, 2)).reshape(num_slots, width)
    summed = out.new_zeros(num_tokens + 1, width, dtype=torch.float32)
    summed = summed.index_add(0, source, out.float())
    return summed[:num_tokens].to(x.dtype)


def _weighted(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # The product in fp32 (weights are fp32 router outputs), back in the experts' dtype.
    return (hidden.float() * weight).to(hidden.dtype)


def _run_loop(
    x: torch.Tensor,
    plan: DispatchPlan,
    sorted_weights: torch.Tensor,
    counts: list[int],
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    activation: GluActivation,
) -> torch.Tensor:
    tokens = x[plan.token_of]
    segment_weights = torch.split(sorted_weights, counts)
    pieces = []
    for expert, segment in enumerate(torch.split(tokens, counts)):
        if segment.shape[0] == 0:
            continue
        hidden = activation(segment @ w_gate[expert].T, segment @ w_up[expert].T)
        pieces.append(_weighted(hidden, segment_weights[expert][:, None]) @ w_down[expert].T)
    summed = x.new_zeros(x.shape, dtype=torch.float32)
    return summed.index_add(0, plan.token_of, torch.cat(pieces).float()).to(x.dtype)
