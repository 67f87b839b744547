"""Parameter and FLOP accounting from a model config alone (no torch, nothing built).

Conventions (architecture.md sections 10.2 and 11):

* Parameters are trainable tensors only; the MoE balancing-bias buffers are not parameters.
  Every count equals `sum(p.numel() for p in build_model(cfg).parameters())` exactly (tested).
* `num_params_total`: embedding + untied LM head + every layer (mixer, its two pre-norms, FFN slot,
  four AttnRes vectors per layer when on) + final norm (+ two output AttnRes vectors) + the MTP
  blocks when `mtp_depth > 0` (their `W_eh`, two input norms and one decoder block each; the MTP
  shares the embedding, the final norm and the head with the main model).
* `num_params_active`: the K3 Table-1 convention, "N_active": the total with every MoE layer's
  routed experts cut from E to top-k, counted WITHOUT the input embedding (a lookup, no matmul)
  and WITH the LM head. Router, shared experts, latent projections and norms are all active.
* `flops_per_token_6n = 6 * N_active` (forward 2, backward 4 FLOPs per weight per token).
* `flops_per_token(cfg, seq_len)`, training FLOPs per token with the attention cores:
  `6 * N_active + 6 * mtp_depth * V * d + 3 * (sum over MLA layers of H * F_att(T)
  + sum over KDA layers of H * F_kda(T))`. The middle term is the MTP's second pass through the
  shared head (parameters counted once, matmul run again). Forward core FLOPs per head per token:
  - MLA, exact causal mask: query t attends to t keys, 2 * (d_qk + d_v) FLOPs per key, averaged
    over t = 1..T: `F_att = 2 * (d_qk + d_v) * (T + 1) / 2 = (d_qk + d_v) * (T + 1)`, an integer.
  - KDA, per chunk of c tokens (the sequence is split into chunks of `kda.chunk_size` with a
    shorter last chunk), with h = d_head:
    `dense_chunk`: `6 c h^2 + 10 c^2 h + c^3 / 3` (section 11: 5 pairwise C x C x h matmuls, the
    triangular solve, 3 state matmuls), i.e. `6h^2 + 2C(3h + 2h) + C^2/3` per token;
    `kimi_linear_eq13`: `6 c h^2 + 3 c^2 h + c^3` (Kimi Linear Eq. 13, `6h^2 + 3Ch + C^2` per token).
    `F_kda(T)` is the sum over the sequence's chunks divided by T.
  Every term is an exact `Fraction`; the total is rounded ONCE to the nearest integer (half to
  even). When `T` is a multiple of the chunk size the total is already an integer (3 * c^3 / 3).
  Ignored, as in section 11: norms' and gates' elementwise work, softmax, activations, AttnRes
  mixing (about 6 * sources * d per site), routing sorts and balancing statistics.
"""

from __future__ import annotations

from fractions import Fraction

from k3scale.config import apply_overrides
from k3scale.errors import K3ScaleError
from k3scale.models.config import (
    K2Config,
    K3Config,
    KDAConfig,
    MLAConfig,
    ModelConfig,
    MoEConfig,
    is_mla_layer,
)


def glu_params(d_in: int, d_ff: int) -> int:
    """Gate, up and down matrices of a GLU FFN: 3 * d_in * d_ff."""
    return 3 * d_in * d_ff


def mla_params(d_model: int, mla: MLAConfig) -> int:
    """MLA layer parameters (architecture.md section 2.1), output gate included when on."""
    h, d_qk = mla.num_heads, mla.d_nope + mla.d_rope
    if mla.q_lora_rank is None:
        q = d_model * h * d_qk
    else:
        r_q = mla.q_lora_rank
        q = d_model * r_q + r_q + r_q * h * d_qk
    kv = d_model * (mla.kv_lora_rank + mla.d_rope) + mla.kv_lora_rank
    kv += mla.kv_lora_rank * h * (mla.d_nope + mla.d_v)
    out = h * mla.d_v * d_model
    gate = d_model * h * mla.d_v if mla.output_gate else 0
    return q + kv + out + gate


def kda_params(d_model: int, kda: KDAConfig) -> int:
    """KDA layer parameters (architecture.md section 1.2)."""
    h, n_heads = kda.d_head, kda.num_heads
    p = n_heads * h
    qkv = 3 * d_model * p + 3 * kda.conv_size * p
    decay = d_model * h + h * p + p + n_heads  # f_proj_down, f_proj_up, dt_bias, A_log
    beta = d_model * n_heads
    if kda.output_gate == "full":
        gate = d_model * p
    else:
        gate = d_model * h + h * p + (p if kda.output_gate_bias else 0)
    out = h + p * d_model  # o_norm weight (shared by heads), o_proj
    return qkv + decay + beta + gate + out


def moe_breakdown(d_model: int, moe: MoEConfig, active: bool) -> dict[str, int]:
    """One MoE layer's parameters by part (section 10.2); `active` keeps top_k routed experts."""
    width = moe.d_latent if moe.d_latent is not None else d_model
    experts = moe.top_k if active else moe.num_experts
    latent = 0
    if moe.d_latent is not None:
        latent = 2 * d_model * moe.d_latent + (moe.d_latent if moe.latent_norm else 0)
    return {
        "moe_experts": experts * glu_params(width, moe.d_expert),
        "moe_shared": glu_params(d_model, moe.num_shared * moe.d_expert),
        "moe_router": moe.num_experts * d_model,
        "moe_latent": latent,
    }


def mixer_kinds(cfg: ModelConfig) -> list[str]:
    """Mixer of each decoder layer: "mla" or "kda" (architecture.md section 3)."""
    match cfg:
        case K2Config():
            return ["mla"] * cfg.num_layers
        case K3Config():
            return ["mla" if is_mla_layer(cfg, i) else "kda" for i in range(cfg.num_layers)]
    raise TypeError(f"not a model config: {type(cfg).__name__}")


def layer_layout(cfg: ModelConfig) -> str:
    """Layer layout, one letter per layer (K = KDA, M = MLA), grouped by 4: "KKKM KKKM KM"."""
    letters = "".join("M" if kind == "mla" else "K" for kind in mixer_kinds(cfg))
    return " ".join(letters[i : i + 4] for i in range(0, len(letters), 4))


def mtp_mixer_kind(cfg: ModelConfig) -> str:
    """Mixer of the MTP block: MLA for K2, `cfg.mtp_mixer` for K3."""
    return cfg.mtp_mixer if isinstance(cfg, K3Config) else "mla"


def _mixer_params(cfg: ModelConfig, kind: str) -> int:
    if kind == "mla":
        return mla_params(cfg.d_model, cfg.mla)
    return kda_params(cfg.d_model, cfg.kda)


def _ffn_breakdown(cfg: ModelConfig, moe_slot: bool, active: bool) -> dict[str, int]:
    if moe_slot and cfg.moe is not None:
        return moe_breakdown(cfg.d_model, cfg.moe, active)
    return {"ffn_dense": glu_params(cfg.d_model, cfg.d_ff_dense)}


def _attnres_on(cfg: ModelConfig) -> bool:
    return isinstance(cfg, K3Config) and cfg.attnres


def _add(total: dict[str, int], part: dict[str, int]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0) + value


def mtp_block_params(cfg: ModelConfig, active: bool = False) -> int:
    """One MTP depth: W_eh (d x 2d), its two input norms, and one decoder block (section 9)."""
    d = cfg.d_model
    block = _mixer_params(cfg, mtp_mixer_kind(cfg)) + 2 * d
    block += sum(_ffn_breakdown(cfg, moe_slot=True, active=active).values())
    return 2 * d * d + 2 * d + block


def param_breakdown(cfg: ModelConfig, active: bool = False) -> dict[str, int]:
    """Parameters by component; values sum to `num_params_total` (or `num_params_active`).

    Args:
        cfg: model config.
        active: count the active set (top-k routed experts, no input embedding).

    Returns:
        Ordered dict: embed, head, final_norm, norms, mla, kda, ffn_dense, moe_experts,
        moe_shared, moe_router, moe_latent, attnres, mtp (absent components are 0).
    """
    d = cfg.d_model
    out = {"embed": 0 if active else cfg.vocab_size * d, "head": cfg.vocab_size * d}
    out |= {"final_norm": d, "norms": 2 * d * cfg.num_layers, "mla": 0, "kda": 0}
    out |= {"ffn_dense": 0, "moe_experts": 0, "moe_shared": 0, "moe_router": 0, "moe_latent": 0}
    for i, kind in enumerate(mixer_kinds(cfg)):
        out[kind] += _mixer_params(cfg, kind)
        _add(out, _ffn_breakdown(cfg, moe_slot=i >= cfg.num_dense_layers, active=active))
    # Two sites per layer (query + key-norm weight each) and one output site (section 4.2).
    out["attnres"] = (4 * d * cfg.num_layers + 2 * d) if _attnres_on(cfg) else 0
    out["mtp"] = cfg.mtp_depth * mtp_block_params(cfg, active)
    return out


def num_params_total(cfg: ModelConfig) -> int:
    """All trainable parameters (embedding, head and MTP included)."""
    return sum(param_breakdown(cfg).values())


def num_params_active(cfg: ModelConfig) -> int:
    """Active parameters per token: top-k experts, head included, input embedding excluded."""
    return sum(param_breakdown(cfg, active=True).values())


def with_active_params(cfg: ModelConfig, width: str, target: int) -> ModelConfig:
    """`cfg` with the int field `width` (dotted, e.g. `d_ff_dense`) set to the value >= 1 whose
    active parameter count is nearest `target` (ties to the smaller): an ablation arm matched to
    its base's N where its switch changes it. `width` must enter the count linearly."""

    def at(value: int) -> ModelConfig:
        return apply_overrides(cfg, [f"{width}={value}"])

    base = num_params_active(at(1))
    slope = num_params_active(at(2)) - base
    if slope <= 0:
        raise K3ScaleError(f"model.{width}: does not change the active parameters; cannot match N")
    guess = max(1, 1 + round((target - base) / slope))
    candidates = [at(v) for v in (guess - 1, guess, guess + 1) if v >= 1]
    return min(candidates, key=lambda c: abs(num_params_active(c) - target))


def flops_per_token_6n(cfg: ModelConfig) -> int:
    """The 6N compute convention: 6 * N_active training FLOPs per token."""
    return 6 * num_params_active(cfg)


def mla_core_flops(mla: MLAConfig, seq_len: int) -> Fraction:
    """Forward FLOPs per token of one MLA layer's attention core, all heads, causal mask."""
    return Fraction(mla.num_heads * (mla.d_nope + mla.d_rope + mla.d_v) * (seq_len + 1))


def kda_core_flops(kda: KDAConfig, seq_len: int) -> Fraction:
    """Forward FLOPs per token of one KDA layer's chunked core, all heads (module docstring)."""
    h = kda.d_head
    full, rest = divmod(seq_len, kda.chunk_size)
    chunks = [kda.chunk_size] * full + ([rest] if rest else [])
    total = Fraction(0)
    for c in chunks:
        if kda.flops_convention == "dense_chunk":
            total += 6 * c * h * h + 10 * c * c * h + Fraction(c**3, 3)
        else:
            total += 6 * c * h * h + 3 * c * c * h + c**3
    return kda.num_heads * total / seq_len


def flops_breakdown(cfg: ModelConfig, seq_len: int) -> dict[str, Fraction]:
    """Exact training FLOPs per token by term (module docstring); sum and round once for a total.

    Args:
        cfg: model config.
        seq_len: training sequence length T (tokens).

    Returns:
        {"dense_6n": 6 N_active, "mtp_head": MTP head re-use, "mla_core": 3 x MLA cores,
        "kda_core": 3 x KDA cores} in FLOPs per token (exact rationals).
    """
    if seq_len < 1:
        raise ValueError(f"seq_len: must be >= 1, got {seq_len}")
    kinds = mixer_kinds(cfg) + [mtp_mixer_kind(cfg)] * cfg.mtp_depth
    mla = sum(mla_core_flops(cfg.mla, seq_len) for k in kinds if k == "mla")
    kda = sum(kda_core_flops(cfg.kda, seq_len) for k in kinds if k == "kda")
    return {
        "dense_6n": Fraction(flops_per_token_6n(cfg)),
        "mtp_head": Fraction(6 * cfg.mtp_depth * cfg.vocab_size * cfg.d_model),
        "mla_core": 3 * Fraction(mla),
        "kda_core": 3 * Fraction(kda),
    }


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token, attention cores included, rounded once to an integer."""
    return round(sum(flops_breakdown(cfg, seq_len).values()))
