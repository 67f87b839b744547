"""Validation loss on fixed windows: the same tokens for every run of a study."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


@torch.no_grad()
def mean_loss(
    model: nn.Module,
    windows: np.ndarray,
    micro_batch_size: int,
    autocast: bool,
    device: torch.device | str = "cpu",
) -> float:
    """Token-weighted mean main-head cross-entropy (nats) over `windows` [n, seq_len + 1],
    each micro-batch moved to `device` (where the model is)."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for start in range(0, len(windows), micro_batch_size):
            rows = windows[start : start + micro_batch_size].astype(np.int64)
            batch = torch.from_numpy(rows).to(device)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                out = model(batch[:, :-1], targets=batch[:, 1:], with_logits=False)
            tokens = batch[:, 1:].numel()
            total += float(out.ce_loss) * tokens
            count += tokens
    finally:
        model.train(was_training)
    return total / count if count else math.nan
