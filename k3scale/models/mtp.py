"""Multi-token prediction (DeepSeek-V3 section 2.2; architecture.md section 9). Off by default.

Depth j = 1..D, position i of the main sequence (hidden h^0 = the main model's last hidden state
BEFORE the final norm; with Block AttnRes, the output site's mixture):

    h'_i  = W_eh [RMSNorm_e(Emb(t_{i+j})) ; RMSNorm_h(h^{j-1}_i)]      W_eh: 2d -> d
    h^j   = Block_j(h')            one plain pre-norm decoder layer (no AttnRes inside)
    logits^j_i = Head(RMSNorm_final(h^j_i))  predicts t_{i+j+1}

Embedding, final norm and head are the main model's. Positions whose target t_{i+j+1} lies past
the window are dropped (depth j runs on the first T - j positions). The block's mixer is MLA for
K2 and `cfg.mtp_mixer` for K3 (default KDA); its FFN is a MoE when `cfg.moe` is set, else dense.
Returned loss: `(1/D) sum_j CE^j`; the model adds `mtp_lambda` times it to the training loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from k3scale.models.accounting import mtp_mixer_kind
from k3scale.models.blocks import DecoderLayer
from k3scale.models.common import RMSNorm, linear
from k3scale.models.config import ModelConfig


class MTPBlock(nn.Module):
    """One MTP depth: children `enorm`, `hnorm`, `eh_proj` (2d -> d) and `block`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.enorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.hnorm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.eh_proj = linear(2 * cfg.d_model, cfg.d_model, cfg.init_std)
        self.block = DecoderLayer(cfg, mtp_mixer_kind(cfg), moe_slot=True, attnres=False)

    def forward(self, hidden: torch.Tensor, next_embeddings: torch.Tensor) -> torch.Tensor:
        """`hidden [B, T', d]` (h^{j-1}) and `next_embeddings [B, T', d]` -> h^j `[B, T', d]`."""
        joined = torch.cat([self.enorm(next_embeddings), self.hnorm(hidden)], dim=-1)
        return self.block(self.eh_proj(joined))


class MultiTokenPrediction(nn.Module):
    """`mtp_depth` chained MTP blocks; child `blocks`."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MTPBlock(cfg) for _ in range(cfg.mtp_depth))

    def forward(
        self,
        hidden: torch.Tensor,
        targets: torch.Tensor,
        embed: nn.Module,
        final_norm: nn.Module,
        head: nn.Module,
    ) -> torch.Tensor:
        """Mean MTP cross-entropy over depths.

        Args:
            hidden: `[B, T, d]` main model's last hidden state (before the final norm).
            targets: `[B, T]` next tokens of the main head (`targets[:, i] = t_{i+1}`).
            embed, final_norm, head: the main model's shared modules.

        Returns:
            Scalar fp32 `(1/D) sum_j CE^j` (a depth with no valid position contributes 0).
        """
        seq_len = targets.shape[1]
        total = hidden.new_zeros((), dtype=torch.float32)
        h = hidden
        for j, block in enumerate(self.blocks, start=1):
            kept = seq_len - j
            if kept < 1:
                break
            h = block(h[:, :kept], embed(targets[:, j - 1 : j - 1 + kept]))
            logits = head(final_norm(h))
            total = total + token_cross_entropy(logits, targets[:, j : j + kept])
        return total / len(self.blocks)


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32 (fp64 for fp64 logits): `logits [B, T, V]`,
    `targets [B, T]` -> scalar."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
