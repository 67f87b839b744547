"""Reference output-head cross-entropy: full logits, then `F.cross_entropy` in fp32."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def head_cross_entropy_naive(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of `hidden [N, d] @ weight[V, d]^T` against `targets [N]`, in fp32
    (fp64 for fp64 inputs)."""
    logits = hidden @ weight.T
    return F.cross_entropy(logits.to(torch.promote_types(logits.dtype, torch.float32)), targets)
