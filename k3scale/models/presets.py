"""Model presets: the published full-scale configs and one size ladder per family.

Full scale (architecture.md section 10.1): `kimi-k2`, `kimi-k3`. Accounting only; never built.

Ladders `k2-t0 < k2-t1 < ...` and `k3-t0 < ...` (section 10.3, [INF]): a rung is a (d_model,
num_layers) pair per family (the tables below, data); everything else follows from the width by
the family's published ratios, all exact sevenths of the full configs (d = 7168):

* head width `d_head = clamp(largest power of 2 <= d/4, 4, 128)` (128 from d = 512 up; narrower
  heads keep a handful of heads at tiny widths); MLA `d_nope = d_v = d_head`, `d_rope = d_head/2`
  (K2/K3: 128/64/128); KDA `d_k = d_v = d_head`.
* heads: K2 `round(8/7 * d / d_head)` (64 * 128 / 7168), K3 `round(12/7 * d / d_head)`
  (96 * 128 / 7168) for both KDA and MLA.
* `kv_lora_rank = min(512, d/2)`; `q_lora_rank = None` below d = 2048, else 1536.
* dense FFN (layer 0): K2 SwiGLU `18/7 d` (18432), K3 SiTU-GLU `33/7 d` (33792).
* MoE in layers >= 1: K2 `E = 12`, top-2, 1 shared, `f_e = 2/7 d` (2048), loss-free sign rule with
  the 1e-4 sequence aux loss; K3 `E = 7/3 * 12 = 28` (896/384), top-4 (16/8 = 2x), 2 shared,
  latent `l = d/2` (3584), `f_e = 6/7 l` (3072/3584), Quantile Balancing. E and k are the same on
  every rung so sparsity does not change along a ladder.
* K3 Block AttnRes with `ceil(L/8)` layers per block (about 8 blocks, the paper's sweet spot).
* widths rounded to a multiple of `clamp(d/8, 4, 64)`; vocab 8192 (the built-in corpus tokenizer).

K2 and K3 rungs are paired: `k2-tN` and `k3-tN` have N_active within 25% (tested), so the study
compares the families at matched compute. At tiny widths the untied head (8192 * d) dominates
N_active; the K3 rung compensates its 2-3x heavier layers with fewer layers or a smaller width.
"""

from __future__ import annotations

import math
from fractions import Fraction

from k3scale.config import apply_overrides
from k3scale.errors import K3ScaleError
from k3scale.models.config import K2Config, K3Config, KDAConfig, MLAConfig, ModelConfig, MoEConfig

LADDER_VOCAB = 8192
"""Vocabulary of the built-in corpus tokenizer (the ladders' default)."""

# Size tables (d_model, num_layers); N_active at vocab 8192 is in `k3scale model list`.
K2_LADDER = {
    "t0": (8, 2),
    "t1": (16, 2),
    "t2": (32, 3),
    "t3": (64, 4),
    "t4": (128, 6),
    "t5": (256, 8),
    "t6": (512, 10),
    "t7": (768, 14),
    "t8": (1024, 18),
    "t9": (1536, 24),
    "t10": (2048, 32),
}
K3_LADDER = {
    "t0": (8, 2),
    "t1": (16, 2),
    "t2": (32, 3),
    "t3": (64, 4),
    "t4": (128, 4),
    "t5": (256, 4),
    "t6": (512, 6),
    "t7": (768, 8),
    "t8": (1024, 8),
    "t9": (1536, 12),
    "t10": (2048, 14),
}

# The small-vocabulary ladders of the v2 reference studies (issue 20): vocab 512 (the
# english_mix_v512 build), so the untied head is at most 36% of N_active, and one depth rule per
# family over widths 24-48 (K2: L = d/12 + 2) and 16-32 (K3: L = d/8 + 2; its layers are heavier,
# so the rungs pair with K2's within 15% of N_active). N_active: K2 33.7k / 75.3k / 136.8k, K3
# 29.9k / 66.8k / 124.9k (0.61-0.62 decades; tests/models/test_presets.py holds the rules).
# s4 and s5 are held out of the v3 fits (issue 47): about 2x and 4x s3's N_active, K2 269.5k
# (1.97x) / 521.3k (3.81x), K3 236.4k (1.89x) / 485.6k (3.89x). s5 keeps the rule exactly; no
# width that does is near 2x (K2 d = 60 / 72: 1.68x / 2.58x, K3 d = 40 / 48: 1.73x / 2.61x), so
# s4 takes the nearest whole layer: K2 d = 64, L = 7 (rule 7.33), K3 d = 44, L = 7 (rule 7.5).
SMALL_VOCAB = 512
K2_SMALL_LADDER = {"s1": (24, 4), "s2": (36, 5), "s3": (48, 6), "s4": (64, 7), "s5": (84, 9)}
K3_SMALL_LADDER = {"s1": (16, 4), "s2": (24, 5), "s3": (32, 6), "s4": (44, 7), "s5": (56, 9)}

# Ladder MoE sizes (architecture.md 10.3: keep E modest at small scale; K3 E = 7/3 x, k = 2 x).
K2_EXPERTS, K2_TOP_K = 12, 2
K3_EXPERTS, K3_TOP_K = 28, 4


def head_dim(d_model: int) -> int:
    """Per-head width of the ladders: the largest power of 2 <= d/4, clamped to [4, 128]."""
    return min(128, max(4, 2 ** math.floor(math.log2(max(1, d_model // 4)))))


def _round(value: Fraction | float, multiple: int) -> int:
    return max(multiple, round(value / multiple) * multiple)


def _multiple(d_model: int) -> int:
    return min(64, max(4, d_model // 8))


def _mla(d_model: int, num_heads: int, k3: bool) -> MLAConfig:
    dh = head_dim(d_model)
    return MLAConfig(
        num_heads=num_heads,
        q_lora_rank=None if d_model < 2048 else 1536,
        kv_lora_rank=min(512, max(1, d_model // 2)),
        d_nope=dh,
        d_rope=dh // 2,
        d_v=dh,
        rope=not k3,
        output_gate=k3,
    )


def k2_config(d_model: int, num_layers: int, vocab_size: int = LADDER_VOCAB) -> K2Config:
    """A K2-style model of the given width and depth (ratios in the module docstring)."""
    heads = max(1, round(Fraction(8, 7) * d_model / head_dim(d_model)))
    m = _multiple(d_model)
    return K2Config(
        vocab_size=vocab_size,
        d_model=d_model,
        num_layers=num_layers,
        mla=_mla(d_model, heads, k3=False),
        d_ff_dense=_round(Fraction(18, 7) * d_model, m),
        moe=MoEConfig(
            num_experts=K2_EXPERTS,
            top_k=K2_TOP_K,
            num_shared=1,
            d_expert=_round(Fraction(2, 7) * d_model, m),
            # K2 config: routed_scaling_factor 2.827.
            routed_scale=2.827,
            balancing="loss_free",
            # DeepSeek-V3 section 2.1.2 sequence-wise aux loss (architecture.md 5.1 default).
            seq_aux_alpha=1e-4,
        ),
    )


def k3_config(d_model: int, num_layers: int, vocab_size: int = LADDER_VOCAB) -> K3Config:
    """A K3-style model of the given width and depth (ratios in the module docstring)."""
    dh = head_dim(d_model)
    heads = max(1, round(Fraction(12, 7) * d_model / dh))
    m = _multiple(d_model)
    latent = _round(Fraction(d_model, 2), m)
    return K3Config(
        vocab_size=vocab_size,
        d_model=d_model,
        num_layers=num_layers,
        kda=KDAConfig(num_heads=heads, d_head=dh),
        mla=_mla(d_model, heads, k3=True),
        d_ff_dense=_round(Fraction(33, 7) * d_model, m),
        moe=MoEConfig(
            num_experts=K3_EXPERTS,
            top_k=K3_TOP_K,
            num_shared=2,
            d_expert=_round(Fraction(6, 7) * latent, m),
            d_latent=latent,
            routed_scale=1.0,
            balancing="quantile",
        ),
        attnres_block_size=math.ceil(num_layers / 8),
    )


def kimi_k2() -> K2Config:
    """Kimi K2 text backbone (architecture.md 10.1): 1,026,408,209,408 params by our formula."""
    return K2Config(
        vocab_size=163_840,
        d_model=7168,
        num_layers=61,
        mla=MLAConfig(num_heads=64, q_lora_rank=1536, kv_lora_rank=512),
        d_ff_dense=18_432,
        moe=MoEConfig(num_experts=384, top_k=8, num_shared=1, d_expert=2048, routed_scale=2.827),
    )


def kimi_k3() -> K3Config:
    """Kimi K3 text backbone (architecture.md 10.1): 2.78 T total, 104.2 B active."""
    return K3Config(
        vocab_size=163_840,
        d_model=7168,
        num_layers=93,
        kda=KDAConfig(num_heads=96, d_head=128),
        mla=MLAConfig(
            num_heads=96, q_lora_rank=1536, kv_lora_rank=512, rope=False, output_gate=True
        ),
        d_ff_dense=33_792,
        moe=MoEConfig(
            num_experts=896,
            top_k=16,
            num_shared=2,
            d_expert=3072,
            d_latent=3584,
            routed_scale=1.0,
            balancing="quantile",
        ),
        attnres_block_size=12,
    )


FULL_SCALE = {"kimi-k2": kimi_k2, "kimi-k3": kimi_k3}
"""Published configs: count them, do not build them."""


def ladder(family: str) -> list[str]:
    """Preset names of one family's ladder, smallest first (`"k2"` or `"k3"`)."""
    tables = {"k2": K2_LADDER, "k3": K3_LADDER}
    if family not in tables:
        raise K3ScaleError(f"ladder: unknown family {family!r} (use k2 or k3)")
    return [f"{family}-{size}" for size in tables[family]]


def small_ladder(family: str) -> list[str]:
    """Preset names of one family's small-vocabulary ladder (vocab 512), smallest first."""
    tables = {"k2": K2_SMALL_LADDER, "k3": K3_SMALL_LADDER}
    if family not in tables:
        raise K3ScaleError(f"ladder: unknown family {family!r} (use k2 or k3)")
    return [f"{family}-{size}" for size in tables[family]]


def preset_names() -> list[str]:
    """Every preset name: full scale first, then the K2 and K3 ladders, then the small-vocab ones."""
    families = ("k2", "k3")
    return [*FULL_SCALE, *(n for f in families for n in ladder(f) + small_ladder(f))]


def get_preset(name: str, overrides: list[str] | tuple[str, ...] = ()) -> ModelConfig:
    """The config of a named preset, with optional dotted overrides (`"moe.top_k=4"`).

    Raises:
        K3ScaleError: unknown name (the message lists the valid ones) or a bad override.
    """
    if name in FULL_SCALE:
        cfg: ModelConfig = FULL_SCALE[name]()
    else:
        family, _, size = name.partition("-")
        tables = {
            "k2": {**K2_LADDER, **{k: (*v, SMALL_VOCAB) for k, v in K2_SMALL_LADDER.items()}},
            "k3": {**K3_LADDER, **{k: (*v, SMALL_VOCAB) for k, v in K3_SMALL_LADDER.items()}},
        }
        table = tables.get(family, {})
        if size not in table:
            raise K3ScaleError(
                f"unknown model preset {name!r} (valid: {', '.join(preset_names())})"
            )
        build = k2_config if family == "k2" else k3_config
        cfg = build(*table[size])
    if overrides:
        cfg = apply_overrides(cfg, list(overrides))
    return cfg
