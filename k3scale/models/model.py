"""Decoder language models of both families and `build_model` (architecture.md 3, 4.2, 9).

Embedding -> L pre-norm decoder layers -> final RMSNorm -> untied head, cross-entropy on the
main head. K2: every mixer is MLA with RoPE, plain residuals. K3: the hybrid layout
(`is_mla_layer`: 3 KDA : 1 gated NoPE MLA, last layer MLA), Block AttnRes when `cfg.attnres`
(two sites per layer and one output site; the dataflow lives in `BlockAttnResState`), else plain
residuals. FFN slot: dense GLU in the first `num_dense_layers` layers, MoE after (if `cfg.moe`).

Training loss = main CE + the MoE layers' auxiliary losses + `mtp_lambda` * MTP CE; `ce_loss` (the
main head alone) is what is reported as the train loss.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from k3scale.models.accounting import mixer_kinds
from k3scale.models.attnres import AttnResSite, BlockAttnResState
from k3scale.models.blocks import DecoderLayer
from k3scale.models.common import RMSNorm, linear
from k3scale.models.config import K2Config, K3Config, ModelConfig
from k3scale.models.mla import MultiHeadLatentAttention
from k3scale.models.moe import MoE
from k3scale.models.mtp import MultiTokenPrediction, token_cross_entropy
from k3scale.ops.head_ce import head_cross_entropy


@dataclass(frozen=True)
class ModelOutput:
    """What a forward returns; losses are None when no targets were given."""

    logits: torch.Tensor | None
    """`[B, T, V]` main-head logits; None when the caller asked for the losses only."""
    loss: torch.Tensor | None
    """Scalar training loss: main CE + MoE aux losses + mtp_lambda * MTP CE."""
    ce_loss: torch.Tensor | None
    """Scalar main-head cross-entropy (nats per token), the reported train loss."""
    mtp_loss: torch.Tensor | None
    """Scalar mean MTP cross-entropy over depths, None when MTP is off."""


class DecoderLM(nn.Module):
    """A K2- or K3-style decoder. Children: `embed`, `layers`, `final_norm`, `head`, and
    `output_site` (Block AttnRes) / `mtp` (MTP) when on."""

    def __init__(self, cfg: ModelConfig, attnres: bool) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d)
        nn.init.normal_(self.embed.weight, mean=0.0, std=cfg.init_std)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, kind, moe_slot=i >= cfg.num_dense_layers, attnres=attnres)
            for i, kind in enumerate(mixer_kinds(cfg))
        )
        self.output_site = (
            AttnResSite(d, cfg.rms_eps, fused=cfg.backend == "cpu") if attnres else None
        )
        self.final_norm = RMSNorm(d, cfg.rms_eps)
        self.head = linear(d, cfg.vocab_size, cfg.init_std)
        self.mtp = MultiTokenPrediction(cfg) if cfg.mtp_depth > 0 else None

    def hidden_states(self, tokens: torch.Tensor) -> torch.Tensor:
        """Last hidden state before the final norm: `tokens [B, T]` -> `[B, T, d]`."""
        h = self.embed(tokens)
        if self.output_site is None:
            for layer in self.layers:
                h = layer(h)
            return h
        state = BlockAttnResState(h, self.cfg.attnres_block_size)
        for i, layer in enumerate(self.layers):
            state.add_mixer_output(i, layer.mix(state.mixer_input(i, layer.mixer_site)))
            state.add_ffn_output(layer.feed_forward(state.ffn_input(i, layer.ffn_site)))
        return state.output(self.output_site)

    def forward(
        self, tokens: torch.Tensor, targets: torch.Tensor | None = None, with_logits: bool = True
    ) -> ModelOutput:
        """Logits and, with targets, the losses.

        Args:
            tokens: `[B, T]` int64 input tokens.
            targets: `[B, T]` int64 next tokens (`targets[:, i] = tokens[:, i+1]` in the window).
            with_logits: False (with targets) skips the full logits where the chunked head
                cross-entropy applies (fp32/fp64 without autocast): the training and eval path.

        Returns:
            ModelOutput with `logits [B, T, V]` (or None, see `with_logits`).
        """
        hidden = self.hidden_states(tokens)
        normed = self.final_norm(hidden)
        chunked = (
            targets is not None
            and not with_logits
            and normed.dtype == self.head.weight.dtype
            and normed.dtype in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled(normed.device.type)
        )
        logits = None if chunked else self.head(normed)
        if targets is None:
            return ModelOutput(logits=logits, loss=None, ce_loss=None, mtp_loss=None)
        if chunked:
            ce_loss = head_cross_entropy(normed.flatten(0, 1), self.head.weight, targets.flatten())
        else:
            ce_loss = token_cross_entropy(logits, targets)
        mtp_loss = None
        if self.mtp is not None:
            mtp_loss = self.mtp(hidden, targets, self.embed, self.final_norm, self.head)
        # Read after the MTP ran: its MoE (if any) has a fresh aux loss too.
        loss = ce_loss + sum((m.aux_loss for m in moe_modules(self)), ce_loss.new_zeros(()))
        if mtp_loss is not None:
            loss = loss + self.cfg.mtp_lambda * mtp_loss
        return ModelOutput(logits=logits, loss=loss, ce_loss=ce_loss, mtp_loss=mtp_loss)


def build_model(cfg: ModelConfig) -> DecoderLM:
    """The model of a config, freshly initialised (seed torch first for reproducibility)."""
    match cfg:
        case K2Config():
            return DecoderLM(cfg, attnres=False)
        case K3Config():
            return DecoderLM(cfg, attnres=cfg.attnres)
    raise TypeError(f"build_model: not a model config: {type(cfg).__name__}")


def mla_modules(model: nn.Module) -> Iterator[MultiHeadLatentAttention]:
    """Every MLA mixer (backbone and MTP), in module order; works through wrappers like DDP."""
    return (m for m in model.modules() if isinstance(m, MultiHeadLatentAttention))


def moe_modules(model: nn.Module) -> Iterator[MoE]:
    """Every MoE layer (backbone and MTP), in module order."""
    return (m for m in model.modules() if isinstance(m, MoE))
