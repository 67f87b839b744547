"""Model configs for the two families: K2-style (MLA + RoPE, SwiGLU MoE) and K3-style (KDA/MLA
hybrid, Attention Residuals, Stable LatentMoE, SiTU-GLU).

Pure dataclasses (no torch), so planners and accounting can read them anywhere. Field defaults
follow `shared/design/architecture.md`; choices it marks [INF] are fields with the stated default.
`build_model` matches on the config type; presets and the size ladder live in `presets.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from k3scale.errors import ConfigError


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


@dataclass(frozen=True, kw_only=True)
class MLAConfig:
    num_heads: int
    """Attention heads H."""
    q_lora_rank: int | None = None
    """Query low-rank width r_q; None projects q directly from the model width."""
    kv_lora_rank: int
    """Compressed KV width r_kv."""
    d_nope: int = 128
    """Per-head q/k width without position (qk_nope_head_dim)."""
    d_rope: int = 64
    """Per-head decoupled q/k tail (qk_rope_head_dim); rotated under RoPE, 0 drops it."""
    d_v: int = 128
    """Per-head value width."""
    rope: bool = True
    """Rotate the tail with RoPE (K2); False is K3's NoPE (tail kept, never rotated)."""
    rope_theta: float = 50_000.0
    """RoPE base (K2 config: 5e4)."""
    output_gate: bool = False
    """K3: input-dependent channel-wise full-rank sigmoid gate on the attention output."""

    def __post_init__(self) -> None:
        _require(self.num_heads >= 1, "mla.num_heads", "must be >= 1")
        _require(self.kv_lora_rank >= 1, "mla.kv_lora_rank", "must be >= 1")
        _require(self.d_nope + self.d_rope >= 1, "mla.d_nope", "d_nope + d_rope must be >= 1")
        _require(self.d_rope % 2 == 0, "mla.d_rope", "must be even (RoPE rotates pairs)")


@dataclass(frozen=True, kw_only=True)
class KDAConfig:
    num_heads: int
    """KDA heads H."""
    d_head: int = 128
    """Key and value width per head (d_k = d_v)."""
    conv_size: int = 4
    """Causal depthwise short-convolution kernel K_c."""
    gate: Literal["bounded", "softplus"] = "bounded"
    """Decay gate: K3 bounded sigmoid gate, or Kimi Linear's -exp(A) * softplus(z)."""
    gate_lower_bound: float = -5.0
    """Lower bound g_min of the bounded gate (K3 config: -5)."""
    output_gate: Literal["full", "low_rank"] = "full"
    """Output gate: K3 full rank, or Kimi Linear's rank-d_head factorisation."""
    output_gate_bias: bool = False
    """Bias on the low-rank output gate's up-projection (fla's layer has one; official code not)."""
    chunk_size: int = 64
    """Chunk length of the chunked WY/UT algorithm (a free parameter; results are invariant)."""
    flops_convention: Literal["dense_chunk", "kimi_linear_eq13"] = "dense_chunk"
    """How KDA core FLOPs are counted (architecture.md section 11); fixed within a study."""

    def __post_init__(self) -> None:
        _require(self.num_heads >= 1, "kda.num_heads", "must be >= 1")
        _require(self.d_head >= 1, "kda.d_head", "must be >= 1")
        _require(self.conv_size >= 1, "kda.conv_size", "must be >= 1")
        _require(self.gate_lower_bound < 0, "kda.gate_lower_bound", "must be < 0")
        _require(self.chunk_size >= 1, "kda.chunk_size", "must be >= 1")


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    num_experts: int
    """Routed experts E."""
    top_k: int
    """Routed experts per token k."""
    num_shared: int = 1
    """Shared experts S_sh (one GLU of width num_shared * d_expert)."""
    d_expert: int
    """Expert FFN width f_e."""
    d_latent: int | None = None
    """LatentMoE width l (K3); None runs routed experts at full model width (K2)."""
    latent_norm: bool = True
    """RMSNorm between expert aggregation and the up-projection (K3 Stable LatentMoE)."""
    routed_scale: float = 1.0
    """Routed scaling factor rho applied to renormalised weights (K2: 2.827, K3: 1.0)."""
    balancing: Literal["loss_free", "quantile", "none"] = "loss_free"
    """Balancing bias update: DeepSeek sign rule (K2) or Quantile Balancing (K3)."""
    bias_update_rate: float = 1e-3
    """Sign-rule step u (DeepSeek-V3: 1e-3)."""
    seq_aux_alpha: float = 0.0
    """Sequence-wise auxiliary loss weight (DeepSeek-V3: 1e-4); 0 disables it."""
    qb_bins: int = 256
    """Quantile Balancing histogram bins per expert."""
    router_init: Literal["normal", "kaiming"] = "normal"
    """Router weight init: N(0, init_std) or kaiming-uniform (HF ports)."""

    def __post_init__(self) -> None:
        _require(self.num_experts >= 1, "moe.num_experts", "must be >= 1")
        _require(1 <= self.top_k <= self.num_experts, "moe.top_k", "must be in [1, num_experts]")
        _require(self.num_shared >= 0, "moe.num_shared", "must be >= 0")
        _require(self.d_expert >= 1, "moe.d_expert", "must be >= 1")
        _require(self.qb_bins >= 2, "moe.qb_bins", "must be >= 2")


@dataclass(frozen=True, kw_only=True)
class K2Config:
    family: Literal["k2"] = "k2"
    """Architecture family tag (selects the class when configs are read back from JSON)."""
    vocab_size: int
    """Vocabulary size V."""
    d_model: int
    """Model width d."""
    num_layers: int
    """Decoder layers L (all MLA with RoPE)."""
    mla: MLAConfig
    """Attention."""
    d_ff_dense: int
    """Width of the dense FFN (the first num_dense_layers layers, or every layer without MoE)."""
    moe: MoEConfig | None = None
    """Mixture of experts in layers >= num_dense_layers; None makes every FFN dense."""
    num_dense_layers: int = 1
    """Leading layers with a dense FFN (first_k_dense_replace = 1)."""
    activation: Literal["swiglu", "situ"] = "swiglu"
    """GLU activation of every FFN and expert."""
    situ_beta: float = 4.0
    """SiTU cap of the gate branch (used when activation is situ)."""
    situ_linear_beta: float | None = 25.0
    """SiTU cap of the up branch; None disables it."""
    rms_eps: float = 1e-6
    """RMSNorm epsilon (K2 config: 1e-6)."""
    init_std: float = 0.02
    """Std of the normal init of linear weights."""
    mtp_depth: int = 0
    """Multi-token-prediction blocks (0 = off, the default for scaling runs)."""
    mtp_lambda: float = 0.3
    """MTP loss weight lambda (DeepSeek-V3: 0.3)."""
    backend: Literal["cpu", "torch", "triton"] = "cpu"
    """Kernel backend (ops/backend.py): "cpu" the fast CPU path, "torch" the reference path it is
    tested against, "triton" the GPU kernels."""

    def __post_init__(self) -> None:
        _check_common(self)


@dataclass(frozen=True, kw_only=True)
class K3Config:
    family: Literal["k3"] = "k3"
    """Architecture family tag (selects the class when configs are read back from JSON)."""
    vocab_size: int
    """Vocabulary size V."""
    d_model: int
    """Model width d."""
    num_layers: int
    """Decoder layers L (hybrid KDA/MLA)."""
    kda: KDAConfig
    """Kimi Delta Attention layers."""
    mla: MLAConfig
    """Gated NoPE MLA layers."""
    mla_period: int = 4
    """Layer i (1-based) is MLA when i % mla_period == 0 or i == L: (period-1):1 KDA to MLA."""
    d_ff_dense: int
    """Width of the dense FFN (the first num_dense_layers layers, or every layer without MoE)."""
    moe: MoEConfig | None = None
    """Stable LatentMoE in layers >= num_dense_layers; None makes every FFN dense."""
    num_dense_layers: int = 1
    """Leading layers with a dense FFN (first_k_dense_replace = 1)."""
    attnres: bool = True
    """Block Attention Residuals; False uses plain pre-norm residuals."""
    attnres_block_size: int = 12
    """Decoder layers per AttnRes block (K3: 12)."""
    activation: Literal["swiglu", "situ"] = "situ"
    """GLU activation of every FFN and expert."""
    situ_beta: float = 4.0
    """SiTU cap of the gate branch (K3 config: 4.0)."""
    situ_linear_beta: float | None = 25.0
    """SiTU cap of the up branch (K3 config: 25.0); None disables it."""
    rms_eps: float = 1e-5
    """RMSNorm epsilon (K3 config: 1e-5)."""
    init_std: float = 0.02
    """Std of the normal init of linear weights."""
    mtp_depth: int = 0
    """Multi-token-prediction blocks (0 = off, the default for scaling runs)."""
    mtp_lambda: float = 0.3
    """MTP loss weight lambda (DeepSeek-V3: 0.3)."""
    mtp_mixer: Literal["kda", "mla"] = "kda"
    """Mixer of the MTP block (K3's is unpublished [INF]; KDA is the commonest backbone block)."""
    backend: Literal["cpu", "torch", "triton"] = "cpu"
    """Kernel backend (ops/backend.py): "cpu" the fast CPU path, "torch" the reference path it is
    tested against, "triton" the GPU kernels."""

    def __post_init__(self) -> None:
        _check_common(self)
        _require(self.mla_period >= 1, "model.mla_period", "must be >= 1")
        _require(self.attnres_block_size >= 1, "model.attnres_block_size", "must be >= 1")


def _check_common(cfg: K2Config | K3Config) -> None:
    _require(cfg.vocab_size >= 2, "model.vocab_size", "must be >= 2")
    _require(cfg.d_model >= 1, "model.d_model", "must be >= 1")
    _require(cfg.num_layers >= 1, "model.num_layers", "must be >= 1")
    _require(cfg.d_ff_dense >= 1, "model.d_ff_dense", "must be >= 1")
    _require(
        0 <= cfg.num_dense_layers <= cfg.num_layers, "model.num_dense_layers", "must be in [0, L]"
    )
    _require(cfg.mtp_depth >= 0, "model.mtp_depth", "must be >= 0")


ModelConfig = K2Config | K3Config


def is_mla_layer(cfg: K3Config, index: int) -> bool:
    """Hybrid layout rule (architecture.md section 3) for 0-based layer `index`."""
    one_based = index + 1
    return one_based % cfg.mla_period == 0 or one_based == cfg.num_layers
