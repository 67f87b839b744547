"""Multi-Head Latent Attention (architecture.md sections 2.1, 2.2) with QK-Clip support (8.2).

K2 variant (`cfg.rope=True`): DeepSeek-V3 MLA with a decoupled RoPE tail (adjacent-pair layout,
see `rope.py`). K3 variant (`cfg.rope=False`, `cfg.output_gate=True`): the same projections, the
tail kept but never rotated (no position anywhere), and an input-dependent channel-wise sigmoid
gate on the attention output: `y = W_o (sigmoid(W_g x) * o)`.

Training uses the naive expanded form: per-head keys `[k_nope^h | k_tail]` (the tail is one vector
shared by all heads) and causal `scaled_dot_product_attention` with scale `(d_nope + d_rope)^-1/2`.
With `fast_attention` (the "cpu" backend) narrow heads go to the fused C++ kernel of
ops/attention (CPU, fp32/fp64, no autocast); otherwise q, k and v are zero-padded to one width, a
multiple of `PAD_MULTIPLE`, for torch's CPU flash kernel, which needs equal q/k and v widths (MLA
has d_v < d_nope + d_rope) and otherwise falls back to the math path that forms every `[T, T]`
score matrix, mask and softmax in memory. Zero columns change no dot product, and the padded
output columns are dropped. Measured fwd+bwd at B 16, H 7, T 256, one thread: math path (q/k 12,
v 8) 120 ms, flash at width 12 57 ms, at width 16 46 ms.

Weight row layouts (relied on by QK-Clip and Per-Head Muon):
    q weight (`q_b_proj` or `q_proj`): head h owns rows `[h*(dn+dr), (h+1)*(dn+dr))`, nope first.
    `kv_a_proj`: rows `[0, r_kv)` give c_kv, rows `[r_kv, r_kv+dr)` the shared key tail.
    `kv_b_proj`: head h owns rows `[h*(dn+dv), (h+1)*(dn+dv))`, k-nope first, then v.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from k3scale.models.common import RMSNorm, linear
from k3scale.models.config import MLAConfig
from k3scale.models.rope import apply_rope, rope_cos_sin
from k3scale.ops.attention.causal import causal_attention, fused_supported

# Elements of one fp32 logits chunk in the max-logit pass (2^24 floats = 64 MiB): bounds the
# extra memory of QK-Clip's logit pass at long sequence lengths.
DEFAULT_MAX_LOGIT_CHUNK_ELEMENTS = 2**24
# Head width multiple of the padded attention (one AVX2 vector of fp32).
PAD_MULTIPLE = 8


class MultiHeadLatentAttention(nn.Module):
    """MLA mixer: `[B, T, d_model] -> [B, T, d_model]`, causal.

    Attributes:
        track_max_logits: When True, each training-mode forward folds the per-head max
            pre-softmax logit into the buffer `max_logits` `[H]` (running max since
            `reset_max_logits`, detached). Eval-mode forwards (validation) never fold: QK-Clip
            caps the logits of the steps that trained the weights, not of held-out windows.
        max_logit_chunk_elements: Logits computed per chunk of that pass (memory bound).
        per_head_projections: Rows of these weights split into H equal per-head blocks.
    """

    def __init__(
        self,
        d_model: int,
        cfg: MLAConfig,
        rms_eps: float,
        init_std: float,
        fast_attention: bool = False,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        heads, d_qk = cfg.num_heads, cfg.d_nope + cfg.d_rope
        widest = max(d_qk, cfg.d_v)
        self.fused_attention = fast_attention
        self.padded_width = -(-widest // PAD_MULTIPLE) * PAD_MULTIPLE if fast_attention else None
        self.softmax_scale = d_qk**-0.5
        if cfg.q_lora_rank is None:
            self.q_proj = linear(d_model, heads * d_qk, init_std)
            q_name = "q_proj"
        else:
            self.q_a_proj = linear(d_model, cfg.q_lora_rank, init_std)
            self.q_a_norm = RMSNorm(cfg.q_lora_rank, rms_eps)
            self.q_b_proj = linear(cfg.q_lora_rank, heads * d_qk, init_std)
            q_name = "q_b_proj"
        self.kv_a_proj = linear(d_model, cfg.kv_lora_rank + cfg.d_rope, init_std)
        self.kv_a_norm = RMSNorm(cfg.kv_lora_rank, rms_eps)
        self.kv_b_proj = linear(cfg.kv_lora_rank, heads * (cfg.d_nope + cfg.d_v), init_std)
        self.o_proj = linear(heads * cfg.d_v, d_model, init_std)
        self.g_proj = linear(d_model, heads * cfg.d_v, init_std) if cfg.output_gate else None
        self.per_head_projections = {q_name: heads, "kv_b_proj": heads}
        self.track_max_logits = False
        self.max_logit_chunk_elements = DEFAULT_MAX_LOGIT_CHUNK_ELEMENTS
        self.register_buffer("max_logits", torch.full((heads,), -torch.inf), persistent=False)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Causal attention over the sequence.

        Args:
            x: `[B, T, d_model]` pre-normed mixer input.
            positions: Optional `[T]` token positions for RoPE (default `0..T-1`); ignored by NoPE.

        Returns:
            `[B, T, d_model]`.
        """
        batch, seq_len, _ = x.shape
        q, k, v = self.project_qkv(x, positions)
        o, head_max = self._attend(q, k, v)
        if self.track_max_logits and self.training:
            self._fold_max_logits(q, k, head_max)
        o = o.transpose(1, 2).reshape(batch, seq_len, -1)
        if self.g_proj is not None:
            o = torch.sigmoid(self.g_proj(x)) * o
        return self.o_proj(o)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Causal attention `[B, H, T, d_v]`: the fused kernel when on and supported (with its
        largest logit per sequence and head, `[B, H]`), else SDPA on heads zero-padded to
        `padded_width` when set (and None)."""
        if self.fused_attention and fused_supported(q, v):
            q, k, v = (x.transpose(1, 2) for x in (q, k, v))
            o, head_max = causal_attention(q, k, v, self.softmax_scale)
            return o.transpose(1, 2), head_max
        width = self.padded_width
        if width is None or width == q.shape[-1] == v.shape[-1]:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return o, None
        q, k, v = (F.pad(x, (0, width - x.shape[-1])) for x in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        return o[..., : self.cfg.d_v], None

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Expanded per-head queries, keys and values.

        Args:
            x: `[B, T, d_model]`.
            positions: Optional `[T]` positions for RoPE (default `0..T-1`).

        Returns:
            `q [B, H, T, dn+dr]`, `k [B, H, T, dn+dr]` (tail shared by all heads),
            `v [B, H, T, dv]`; tails rotated when `cfg.rope`.
        """
        cfg = self.cfg
        batch, seq_len, _ = x.shape
        q = self._queries(x).view(batch, seq_len, cfg.num_heads, cfg.d_nope + cfg.d_rope)
        c_kv, k_tail = self.kv_a_proj(x).split([cfg.kv_lora_rank, cfg.d_rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(c_kv))
        k_nope, v = kv.view(batch, seq_len, cfg.num_heads, -1).split([cfg.d_nope, cfg.d_v], -1)
        k_tail = k_tail[:, :, None, :]  # [B, T, 1, dr], one key tail for every head
        if cfg.rope and cfg.d_rope > 0:
            q_nope, q_tail = q.split([cfg.d_nope, cfg.d_rope], dim=-1)
            if positions is None:
                positions = torch.arange(seq_len, device=x.device)
            angle_dtype = torch.promote_types(x.dtype, torch.float32)
            cos, sin = rope_cos_sin(positions, cfg.d_rope, cfg.rope_theta, angle_dtype)
            q = torch.cat([q_nope, apply_rope(q_tail, cos, sin)], dim=-1)
            k_tail = apply_rope(k_tail, cos, sin)
        k_tail = k_tail.expand(batch, seq_len, cfg.num_heads, cfg.d_rope)
        k = torch.cat([k_nope, k_tail], dim=-1)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.q_lora_rank is None:
            return self.q_proj(x)
        return self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))

    @torch.no_grad()
    def _fold_max_logits(
        self, q: torch.Tensor, k: torch.Tensor, head_max: torch.Tensor | None
    ) -> None:
        """Running per-head max of `scale * q_i . k_j` over `j <= i`: from the fused kernel's
        `head_max [B, H]` when it ran, else `_max_logits` (the reference it is tested against)."""
        best = self._max_logits(q, k) if head_max is None else head_max.amax(dim=0)
        self.max_logits.copy_(torch.maximum(self.max_logits, best.to(self.max_logits.dtype)))

    def _max_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Per-head max of `scale * q_i . k_j` over `j <= i` and the batch, `[H]`, in fp32+,
        chunked over rows."""
        batch, heads, seq_len, _ = q.shape
        compute = torch.promote_types(q.dtype, torch.float32)
        q32, k32 = q.to(compute), k.to(compute)
        rows = max(1, self.max_logit_chunk_elements // (batch * heads * seq_len))
        best = torch.full((heads,), -torch.inf, device=q.device, dtype=compute)
        for start in range(0, seq_len, rows):
            stop = min(start + rows, seq_len)
            # Causal: query rows [start, stop) only see keys [0, stop).
            logits = q32[:, :, start:stop] @ k32[:, :, :stop].transpose(-1, -2)
            query_pos = torch.arange(start, stop, device=q.device)[:, None]
            key_pos = torch.arange(stop, device=q.device)[None, :]
            logits = logits.masked_fill(key_pos > query_pos, -torch.inf)
            best = torch.maximum(best, logits.amax(dim=(0, 2, 3)))
        return best * self.softmax_scale

    def reset_max_logits(self) -> None:
        """Start a new running max (all heads -inf)."""
        self.max_logits.fill_(-torch.inf)

    @torch.no_grad()
    def rescale_qk_heads(self, gamma: torch.Tensor) -> None:
        """QK-Clip rescale in place: every logit of head h is multiplied by `gamma[h]`.

        q-nope rows and k-nope rows of head h scale by `sqrt(gamma_h)`, q tail rows by `gamma_h`;
        the shared key tail (in `kv_a_proj`) and the v rows are untouched (architecture.md 8.2).

        Args:
            gamma: `[H]` positive factors (1 leaves a head bitwise unchanged).
        """
        cfg = self.cfg
        if gamma.shape != (cfg.num_heads,):
            raise ValueError(f"gamma: expected shape ({cfg.num_heads},), got {tuple(gamma.shape)}")
        if not bool((gamma > 0).all()):
            raise ValueError("gamma: every factor must be > 0")
        q_weight = self.q_proj.weight if cfg.q_lora_rank is None else self.q_b_proj.weight
        q_heads = q_weight.view(cfg.num_heads, cfg.d_nope + cfg.d_rope, -1)
        kv_heads = self.kv_b_proj.weight.view(cfg.num_heads, cfg.d_nope + cfg.d_v, -1)
        gamma = gamma.to(device=q_weight.device, dtype=q_weight.dtype)[:, None, None]
        q_heads[:, : cfg.d_nope].mul_(gamma.sqrt())
        q_heads[:, cfg.d_nope :].mul_(gamma)
        kv_heads[:, : cfg.d_nope].mul_(gamma.sqrt())


def attention_logits(
    module: MultiHeadLatentAttention, x: torch.Tensor, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Pre-softmax logits `scale * q_i . k_j` of an MLA module (eager; for tests and checks).

    Args:
        module: The attention layer.
        x: `[B, T, d_model]`.
        positions: Optional `[T]` RoPE positions.

    Returns:
        `[B, H, T, T]`, `-inf` above the diagonal (future keys).
    """
    q, k, _ = module.project_qkv(x, positions)
    logits = module.softmax_scale * (q @ k.transpose(-1, -2))
    seq_len = x.shape[1]
    future = torch.ones(seq_len, seq_len, dtype=torch.bool, device=x.device).triu(1)
    return logits.masked_fill(future, -torch.inf)
