"""Per-step expert balancing: the loss-free sign rule (K2) and Quantile Balancing (K3).

The trainer calls `update_balancing(model)` once per optimizer step, after `optimizer.step()`.
It packs every MoE layer's step statistics (loads and QB margin histograms, integers) into one
vector, sums it over ranks with a single `all_reduce` when a process group is initialised, writes
each layer's next bias, resets the statistics and returns router metrics. Every micro-batch of
step t was routed with the same bias b(t); the new bias takes effect from step t+1.

There is no expert capacity limit, so no token is ever dropped (`router/dropped_tokens` = 0).
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from torch import nn

from k3scale.models.moe import MoE
from k3scale.ops.qb import qb_bias_histogram


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """`(label, layer)` for every MoE module, in module order; label is the decoder layer index
    for a backbone path `layers.<i>...`, else the module path (e.g. MTP's), "moe" for a bare MoE."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            match = re.match(r"layers\.(\d+)\.", name)
            found.append((match.group(1) if match else name or "moe", module))
    return found


def sign_rule_bias(bias: torch.Tensor, loads: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3 loss-free update `b + u * sign(mean_load - load)` `[E]` fp32.

    Args:
        bias: current bias `[E]`.
        loads: tokens routed to each expert this step `[E]` (global, all micro-batches).
        rate: step u (DeepSeek-V3: 1e-3).
    """
    # Every token picks exactly k experts, so the mean load k * m / E is loads.sum() / E.
    mean_load = loads.double().sum() / loads.numel()
    step = rate * torch.sign(mean_load - loads.double())
    return bias.float() + step.float()


def update_balancing(model: nn.Module, group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Reduce this step's statistics, update every MoE bias, reset statistics; once per step.

    Args:
        model: any module containing `MoE` layers (none: returns {}).
        group: process group for the all-reduce (default group when distributed is initialised).

    Returns:
        `router/<layer>/max_load_ratio` (max load / target k*m/E), `router/<layer>/bias_norm`
        (L2 norm of the new bias), and aggregates `router/max_load_ratio`,
        `router/dropped_tokens` (always 0: no capacity limit). Load keys are absent when no
        training tokens were routed since the last update.
    """
    layers = moe_layers(model)
    if not layers:
        return {}
    packed = torch.cat([layer.statistics().reshape(-1) for _, layer in layers])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    metrics: dict[str, float] = {}
    offset = 0
    for label, layer in layers:
        stats = layer.statistics()
        chunk = packed[offset : offset + stats.numel()].view(stats.shape)
        offset += stats.numel()
        metrics.update(_update_layer(label, layer, chunk[:, 0], chunk[:, 1:]))
        layer.reset_statistics()
    ratios = [v for k, v in metrics.items() if k.endswith("/max_load_ratio")]
    if ratios:
        metrics["router/max_load_ratio"] = max(ratios)
    metrics["router/dropped_tokens"] = 0.0
    return metrics


@torch.no_grad()
def _update_layer(
    label: str, layer: MoE, loads: torch.Tensor, margin_counts: torch.Tensor
) -> dict[str, float]:
    cfg = layer.cfg
    metrics = {}
    num_assignments = int(loads.sum())
    if num_assignments > 0:
        target = num_assignments / cfg.num_experts
        metrics[f"router/{label}/max_load_ratio"] = float(loads.max()) / target
        new_bias = _next_bias(layer, loads, margin_counts)
        layer.bias.copy_(new_bias)
    metrics[f"router/{label}/bias_norm"] = float(layer.bias.float().norm())
    return metrics


def _next_bias(layer: MoE, loads: torch.Tensor, margin_counts: torch.Tensor) -> torch.Tensor:
    cfg = layer.cfg
    match cfg.balancing:
        case "loss_free":
            return sign_rule_bias(layer.bias, loads, cfg.bias_update_rate)
        case "quantile" if cfg.top_k < cfg.num_experts:
            # Edges from the same bias the step was routed with (it changes only here).
            return qb_bias_histogram(margin_counts, layer.bias, cfg.top_k)
    return layer.bias.clone()
