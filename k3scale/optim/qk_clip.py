"""QK-Clip (K2 "MuonClip", architecture.md 8.2): cap each MLA head's max attention logit.

After every optimizer step: `S_h` = the head's max pre-softmax logit since the last reset (the
MLA module records it while `track_max_logits` is on), all-reduced with MAX over ranks;
`gamma_h = min(1, tau / S_h)`; heads with `gamma_h < 1` have their q/k weights rescaled in place
so every logit of head h is multiplied by `gamma_h` (the module's `rescale_qk_heads`). Optimizer
state is untouched. Then every running max is reset.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

METRIC_NUM_CLIPPED = "qk_clip/num_clipped"
METRIC_MAX_LOGIT = "qk_clip/max_logit"


def clip_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Named modules that support QK-Clip (MLA: `max_logits`, `rescale_qk_heads`, reset)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if hasattr(module, "rescale_qk_heads") and hasattr(module, "max_logits")
    ]


@torch.no_grad()
def qk_clip(model: nn.Module, tau: float, group: dist.ProcessGroup | None = None) -> dict:
    """Rescale every MLA head whose max logit since the last reset exceeds `tau`, then reset.

    Args:
        model: Model holding MLA modules (others are ignored).
        tau: Logit cap (K2: 100), > 0.
        group: Process group of the MAX all-reduce (default world) when torch.distributed is
            initialised; one all-reduce for all layers.

    Returns:
        `qk_clip/num_clipped` (heads rescaled this call, int), `qk_clip/max_logit` (largest
        recorded logit before clipping; absent when no head recorded one) and
        `qk_clip/<module>/max_logit` per MLA module with a recorded logit.
    """
    if tau <= 0:
        raise ValueError(f"qk_clip: tau must be > 0, got {tau}")
    modules = clip_modules(model)
    if not modules:
        return {METRIC_NUM_CLIPPED: 0}
    logits = torch.cat([m.max_logits.detach().float().reshape(-1) for _, m in modules])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(logits, op=dist.ReduceOp.MAX, group=group)
    # Heads that saw no forward keep -inf and get gamma = 1.
    gammas = torch.where(logits > tau, tau / logits, torch.ones_like(logits))
    stats: dict[str, float | int] = {METRIC_NUM_CLIPPED: int((gammas < 1).sum())}
    offset = 0
    for name, module in modules:
        num_heads = module.max_logits.numel()
        gamma = gammas[offset : offset + num_heads]
        layer_max = float(logits[offset : offset + num_heads].max())
        offset += num_heads
        if bool((gamma < 1).any()):
            module.rescale_qk_heads(gamma)
        if math.isfinite(layer_max):
            stats[f"qk_clip/{name}/max_logit"] = layer_max
        module.reset_max_logits()
    overall = float(logits.max())
    if math.isfinite(overall):
        stats[METRIC_MAX_LOGIT] = overall
    return stats
