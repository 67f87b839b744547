"""Kimi Delta Attention layer (architecture.md section 1.2; Kimi Linear report Eq. 1-10).

x -> q, k, v projections -> causal depthwise short convs + SiLU -> per-head L2 norm of q, k;
beta = sigmoid(b_proj x); decay logits from a rank-d_head projection plus dt_bias, activated by
the K3 bounded gate or Kimi Linear's softplus gate; chunked KDA core; per-head RMSNorm; sigmoid
output gate (full rank in K3, rank d_head in Kimi Linear); output projection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from k3scale.models.common import RMSNorm, linear
from k3scale.models.config import KDAConfig
from k3scale.ops.backend import kda_op
from k3scale.ops.cpu import supports
from k3scale.ops.cpu.conv import conv_silu_fused
from k3scale.ops.kda import kda_gate_bounded, kda_gate_softplus
from k3scale.ops.kda.naive import compute_dtype

# fla's in-kernel q/k L2 norm: x / sqrt(sum(x^2) + 1e-6) (architecture.md 1.2 step 3).
L2_NORM_EPS = 1e-6
# dt_bias init (fla `KimiDeltaAttention`, architecture.md 1.2 notes): dt ~ exp(U(ln 1e-3, ln 1e-1)),
# clamped at 1e-4, stored as its inverse softplus.
DT_MIN, DT_MAX, DT_FLOOR = 1e-3, 1e-1, 1e-4
# Kimi Linear softplus-gate init A_log = ln U(1, 16) (architecture.md 1.2 step 6a).
A_INIT_RANGE = (1.0, 16.0)


@dataclass(frozen=True)
class KDAState:
    """What a streaming call carries to the next one.

    Attributes:
        conv_tails: pre-conv q, k, v projections of the last `conv_size - 1` tokens, each
            `[B, P, conv_size - 1]` (zeros before the first token).
        recurrent: KDA state `[B, H, d_head, d_head]` key-major, fp32.
    """

    conv_tails: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    recurrent: torch.Tensor


def inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y, for y > 0: `y + log(-expm1(-y))`."""
    return y + torch.log(-torch.expm1(-y))


def l2_normalize_heads(x: torch.Tensor) -> torch.Tensor:
    """`x / sqrt(sum(x^2) + 1e-6)` over the last dim, returned in fp32 (fp64 for fp64).

    Not cast back: the KDA core computes in fp32 anyway (fla normalises inside its kernel).
    """
    wide = x.to(compute_dtype(x.dtype))
    return wide * torch.rsqrt(wide.pow(2).sum(-1, keepdim=True) + L2_NORM_EPS)


class KimiDeltaAttention(nn.Module):
    """KDA token mixer `[B, T, d_model] -> [B, T, d_model]` (child names per INTERFACES.md 1)."""

    def __init__(
        self,
        d_model: int,
        cfg: KDAConfig,
        rms_eps: float,
        init_std: float,
        backend: str = "torch",
    ) -> None:
        super().__init__()
        self.cfg = cfg
        # torch WY/UT chunked path, or the Triton kernels (same signature; ops/backend.py).
        self._chunk_kda = kda_op(backend)
        num_heads, d_head = cfg.num_heads, cfg.d_head
        width = num_heads * d_head
        self.q_proj = linear(d_model, width, init_std)
        self.k_proj = linear(d_model, width, init_std)
        self.v_proj = linear(d_model, width, init_std)
        self.q_conv, self.k_conv, self.v_conv = (
            _depthwise_conv(width, cfg.conv_size, init_std) for _ in range(3)
        )
        self.f_proj_down = linear(d_model, d_head, init_std)
        self.f_proj_up = linear(d_head, width, init_std)
        self.dt_bias = nn.Parameter(init_dt_bias(width))
        self.A_log = nn.Parameter(init_A_log(num_heads, cfg.gate))
        self.b_proj = linear(d_model, num_heads, init_std)
        if cfg.output_gate == "full":
            self.g_proj = linear(d_model, width, init_std)
        else:
            self.g_proj_down = linear(d_model, d_head, init_std)
            self.g_proj_up = linear(d_head, width, init_std, bias=cfg.output_gate_bias)
        self.o_norm = RMSNorm(d_head, rms_eps)
        self.o_proj = linear(width, d_model, init_std)
        self.per_head_projections = {"q_proj": num_heads, "k_proj": num_heads, "v_proj": num_heads}

    def forward(
        self, x: torch.Tensor, state: KDAState | None = None, return_state: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, KDAState]:
        """Mix tokens causally.

        Args:
            x: mixer input `[B, T, d_model]`.
            state: carried state from a previous call on the same sequences, or None (start).
            return_state: also return the state after the last token.

        Returns:
            `y [B, T, d_model]`, or `(y, KDAState)` when `return_state`.
        """
        batch, seq_len, _ = x.shape
        heads = (batch, seq_len, self.cfg.num_heads, self.cfg.d_head)
        tails = (None, None, None) if state is None else state.conv_tails
        q, q_tail = _causal_conv_silu(self.q_conv, self.q_proj(x), tails[0])
        k, k_tail = _causal_conv_silu(self.k_conv, self.k_proj(x), tails[1])
        v, v_tail = _causal_conv_silu(self.v_conv, self.v_proj(x), tails[2])
        o, recurrent = self._chunk_kda(
            l2_normalize_heads(q.view(heads)),
            l2_normalize_heads(k.view(heads)),
            v.view(heads),
            self._log_decay(x).view(heads),
            torch.sigmoid(self.b_proj(x).to(compute_dtype(x.dtype))),
            scale=self.cfg.d_head**-0.5,
            initial_state=None if state is None else state.recurrent,
            output_final_state=return_state,
            chunk_size=self.cfg.chunk_size,
        )
        gated = self.o_norm(o) * torch.sigmoid(self._output_gate_logits(x)).view(heads)
        y = self.o_proj(gated.reshape(batch, seq_len, -1))
        if not return_state:
            return y
        return y, KDAState(conv_tails=(q_tail, k_tail, v_tail), recurrent=recurrent)

    def _log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """Per-channel log decay g `[B, T, H, d_head]` (fp32; fp64 for fp64 x) from the logits."""
        z = self.f_proj_up(self.f_proj_down(x))
        z = z.view(*z.shape[:-1], self.cfg.num_heads, self.cfg.d_head)
        if self.cfg.gate == "bounded":
            return kda_gate_bounded(z, self.A_log, self.dt_bias, self.cfg.gate_lower_bound)
        return kda_gate_softplus(z, self.A_log, self.dt_bias)

    def _output_gate_logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.cfg.output_gate == "full":
            return self.g_proj(x)
        return self.g_proj_up(self.g_proj_down(x))


def _depthwise_conv(width: int, conv_size: int, init_std: float) -> nn.Conv1d:
    """Depthwise conv holding the weight `[P, 1, K_c]` (N(0, init_std), fla `_init_weights`)."""
    conv = nn.Conv1d(width, width, conv_size, groups=width, bias=False)
    nn.init.normal_(conv.weight, mean=0.0, std=init_std)
    return conv


def _causal_conv_silu(
    conv: nn.Conv1d, x: torch.Tensor, tail: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """SiLU of a causal depthwise conv over time, left-padded with `tail` (zeros at the start).

    Args:
        conv: holds the weight `[P, 1, K_c]`.
        x: `[B, T, P]`.
        tail: the previous call's last `K_c - 1` inputs `[B, P, K_c - 1]`, or None.

    Returns:
        `(y [B, T, P], new_tail [B, P, K_c - 1])`. On CPU in fp32/fp64 with the C++ kernels built,
        one fused kernel per direction in x's layout (`ops/cpu/conv.py`); else the torch path
        below, its reference.
    """
    width, _, conv_size = conv.weight.shape
    if not supports(x, conv.weight):
        return _causal_conv_silu_torch(conv, x, tail)
    if tail is None:
        tail = x.new_zeros(x.shape[0], width, conv_size - 1)
    padded = torch.cat([tail.to(x.dtype).transpose(1, 2), x], dim=1)  # [B, K_c - 1 + T, P]
    y = conv_silu_fused(padded, conv.weight.view(width, conv_size))
    return y, padded[:, padded.shape[1] - (conv_size - 1) :].transpose(1, 2)


def _causal_conv_silu_torch(
    conv: nn.Conv1d, x: torch.Tensor, tail: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_causal_conv_silu` in torch ops (conv1d over `[B, P, T]`)."""
    width, _, conv_size = conv.weight.shape
    x_t = x.transpose(1, 2)  # [B, P, T]
    if tail is None:
        tail = x_t.new_zeros(x_t.shape[0], width, conv_size - 1)
    padded = torch.cat([tail.to(x_t.dtype), x_t], dim=-1)
    y = F.silu(F.conv1d(padded, conv.weight.to(x_t.dtype), groups=width))
    return y.transpose(1, 2), padded[..., padded.shape[-1] - (conv_size - 1) :]


def init_dt_bias(width: int) -> torch.Tensor:
    """Inverse-softplus of dt ~ exp(U(ln DT_MIN, ln DT_MAX)) clamped at DT_FLOOR, fp32 `[P]`."""
    log_dt = torch.empty(width).uniform_(math.log(DT_MIN), math.log(DT_MAX))
    return inverse_softplus(log_dt.exp().clamp(min=DT_FLOOR))


def init_A_log(num_heads: int, gate: str) -> torch.Tensor:
    """K3 bounded gate: A = 0 (K3 report); Kimi Linear softplus gate: ln U(1, 16)."""
    if gate == "bounded":
        return torch.zeros(num_heads)
    return torch.empty(num_heads).uniform_(*A_INIT_RANGE).log()
