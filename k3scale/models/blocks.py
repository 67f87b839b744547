"""One pre-norm decoder layer of either family, and the builders of its two slots.

Layer i: `attn_norm` -> mixer (MLA or KDA) -> residual, `ffn_norm` -> FFN slot (dense GLU in the
first `num_dense_layers` layers, MoE after when `cfg.moe` is set) -> residual. With K3's Block
AttnRes the model drives the two slots itself (`model.py`) and the layer also owns the two AttnRes
sites `mixer_site` and `ffn_site` (architecture.md 4.2).
"""

from __future__ import annotations

import torch
from torch import nn

from k3scale.models.attnres import AttnResSite
from k3scale.models.common import RMSNorm
from k3scale.models.config import K3Config, ModelConfig
from k3scale.models.ffn import GLUFeedForward
from k3scale.models.kda import KimiDeltaAttention
from k3scale.models.mla import MultiHeadLatentAttention
from k3scale.models.moe import MoE


def build_mixer(cfg: ModelConfig, kind: str) -> nn.Module:
    """The token mixer of a layer: `"mla"` (either family) or `"kda"` (K3 only)."""
    if kind == "mla":
        return MultiHeadLatentAttention(
            cfg.d_model, cfg.mla, cfg.rms_eps, cfg.init_std, fast_attention=cfg.backend == "cpu"
        )
    if kind == "kda" and isinstance(cfg, K3Config):
        return KimiDeltaAttention(cfg.d_model, cfg.kda, cfg.rms_eps, cfg.init_std, cfg.backend)
    raise ValueError(f"mixer: {kind!r} is not available for {type(cfg).__name__}")


def build_ffn(cfg: ModelConfig, moe_slot: bool) -> nn.Module:
    """The FFN slot: `MoE` when `moe_slot` and `cfg.moe` is set, else the dense GLU FFN."""
    if moe_slot and cfg.moe is not None:
        return MoE(
            cfg.d_model,
            cfg.moe,
            cfg.activation,
            cfg.situ_beta,
            cfg.situ_linear_beta,
            cfg.init_std,
            cfg.rms_eps,
            cfg.backend,
        )
    return GLUFeedForward(
        cfg.d_model,
        cfg.d_ff_dense,
        cfg.activation,
        cfg.situ_beta,
        cfg.situ_linear_beta,
        cfg.init_std,
        cfg.backend,
    )


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer; `forward` is the plain-residual path `[B, T, d] -> [B, T, d]`."""

    def __init__(self, cfg: ModelConfig, kind: str, moe_slot: bool, attnres: bool) -> None:
        """Args:
        cfg: model config.
        kind: mixer, "mla" or "kda".
        moe_slot: put a MoE in the FFN slot (if `cfg.moe` is set).
        attnres: also own the two AttnRes sites (K3 Block AttnRes).
        """
        super().__init__()
        self.kind = kind
        self.attn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.mixer = build_mixer(cfg, kind)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.rms_eps)
        self.ffn = build_ffn(cfg, moe_slot)
        fused = cfg.backend == "cpu"
        self.mixer_site = AttnResSite(cfg.d_model, cfg.rms_eps, fused) if attnres else None
        self.ffn_site = AttnResSite(cfg.d_model, cfg.rms_eps, fused) if attnres else None

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        """Mixer branch of the residual: `mixer(attn_norm(x))`."""
        return self.mixer(self.attn_norm(x))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """FFN branch of the residual: `ffn(ffn_norm(x))`."""
        return self.ffn(self.ffn_norm(x))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Plain pre-norm residual: `h + mix(h)`, then `+ feed_forward(.)`."""
        h = h + self.mix(h)
        return h + self.feed_forward(h)
