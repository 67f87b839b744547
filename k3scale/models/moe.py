"""Mixture-of-experts FFN for both families (architecture.md 5.1-5.3).

K2 (d_latent None): `y = Shared(u) + sum_{e in sel} g_e FFN_e(u)`, SwiGLU experts at width d.
K3 Stable LatentMoE (d_latent = l): `z = W_down u`; `m = sum_{e in sel} p_e FFN_e(z)` in the
latent space; `y = Shared(u) + W_up RMSNorm(m)` (norm when `latent_norm`); SiTU-GLU everywhere.
Shared experts are one GLU of width `num_shared * d_expert` at full width d.

On CPU fp32 with the fused kernels built, a layer with shared experts runs as one autograd node
whose forward and backward are one C++ call each (`ops/moe/fused_layers.moe_layer_fused` for K2, its
shared GLU as S more experts of the routed kernel call; `latent_moe_layer_fused` for K3); bf16
autocast and the Triton backend compose the pieces below. Both give the same results to float
rounding (tests/models/test_moe.py).

Balancing: the bias buffer moves selection only. In training mode every forward adds this
micro-batch's statistics (per-expert loads; margin histograms for Quantile Balancing) to
non-persistent buffers; `k3scale.models.balancing.update_balancing` reduces them once per
optimizer step and writes the next step's bias. Eval forwards record nothing.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from k3scale.models.common import RMSNorm, linear
from k3scale.models.config import MoEConfig
from k3scale.models.ffn import GLUFeedForward, kernel_activation
from k3scale.models.router import Routing, route, sequence_aux_loss
from k3scale.ops.backend import qb_counts_op, situ_glu_op
from k3scale.ops.cpu import supports
from k3scale.ops.moe import routed_experts
from k3scale.ops.moe.fused_layers import latent_moe_layer_fused, moe_layer_fused
from k3scale.ops.moe.naive import GluActivation
from k3scale.ops.situ import swiglu


def glu_activation(
    activation: str, situ_beta: float, situ_linear_beta: float | None, backend: str = "torch"
) -> GluActivation:
    """The GLU nonlinearity `h = act(gate, up)` named by the model's `activation` field."""
    match activation:
        case "swiglu":
            return swiglu
        case "situ":
            return functools.partial(
                situ_glu_op(backend), beta=situ_beta, linear_beta=situ_linear_beta
            )
    raise ValueError(f"activation: expected 'swiglu' or 'situ', got {activation!r}")


class MoE(nn.Module):
    """Routed + shared experts in the FFN slot; `forward(x [B, T, d]) -> [B, T, d]`.

    Attributes:
        bias: `[E]` fp32 persistent buffer, selection-only balancing bias (never a Parameter).
        aux_loss: fp32 scalar, the last training forward's sequence-wise aux loss (0 when off).
        step_loads: `[E]` int64 tokens routed per expert since the last balancing update.
        step_margin_counts: `[E, 1 + R]` int64 QB margin counts since the last update (empty
            `[E, 0]` unless `cfg.balancing == "quantile"`).
    """

    def __init__(
        self,
        d_model: int,
        cfg: MoEConfig,
        activation: str,
        situ_beta: float,
        situ_linear_beta: float | None,
        init_std: float,
        rms_eps: float,
        backend: str = "torch",
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.activation = glu_activation(activation, situ_beta, situ_linear_beta, backend)
        self.kernel_activation = kernel_activation(activation, situ_beta, situ_linear_beta, backend)
        self._margin_counts = qb_counts_op(backend)
        num_experts, width = cfg.num_experts, cfg.d_latent or d_model
        self.router = nn.Linear(d_model, num_experts, bias=False)
        _init_router(self.router, cfg, init_std)
        self.register_buffer("bias", torch.zeros(num_experts, dtype=torch.float32))
        self.w_gate = _expert_weight(num_experts, cfg.d_expert, width, init_std)
        self.w_up = _expert_weight(num_experts, cfg.d_expert, width, init_std)
        self.w_down = _expert_weight(num_experts, width, cfg.d_expert, init_std)
        self.shared = None
        if cfg.num_shared > 0:
            # S_sh experts of width f_e summed == one GLU of width S_sh * f_e (concatenated weights).
            d_shared = cfg.num_shared * cfg.d_expert
            self.shared = GLUFeedForward(
                d_model, d_shared, activation, situ_beta, situ_linear_beta, init_std, backend
            )
        self.latent_down = self.latent_up = self.latent_norm = None
        if cfg.d_latent is not None:
            self.latent_down = linear(d_model, cfg.d_latent, init_std)
            self.latent_up = linear(cfg.d_latent, d_model, init_std)
            if cfg.latent_norm:
                self.latent_norm = RMSNorm(cfg.d_latent, rms_eps)
        # QB counts: the cutoff point mass, then R bins (ops/qb/histogram.py).
        num_columns = cfg.qb_bins + 1 if cfg.balancing == "quantile" else 0
        self.register_buffer("step_loads", torch.zeros(num_experts, dtype=torch.int64), False)
        self.register_buffer(
            "step_margin_counts", torch.zeros(num_experts, num_columns, dtype=torch.int64), False
        )
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch_shape, d_model = x.shape[:-1], x.shape[-1]
        tokens = x.reshape(-1, d_model)
        if self._fuses_layer(tokens):
            return self._fused_layer(tokens, batch_shape).reshape(x.shape)
        routing = self.route(tokens)
        if self.training:
            self.record_statistics(routing)
        self.aux_loss = self._aux_loss(routing, batch_shape)
        routed_in = tokens if self.latent_down is None else self.latent_down(tokens)
        routed = routed_experts(
            routed_in,
            routing.expert_idx,
            routing.weights,
            self.w_gate,
            self.w_up,
            self.w_down,
            self.activation,
            kernel_activation=self.kernel_activation,
        )
        if self.latent_up is not None:
            if self.latent_norm is not None:
                routed = self.latent_norm(routed)
            routed = self.latent_up(routed)
        if self.shared is not None:
            routed = routed + self.shared(tokens)
        return routed.reshape(x.shape)

    def _fuses_layer(self, tokens: torch.Tensor) -> bool:
        # The single fused nodes (K2 and K3) take the shared experts as part of the layer.
        if self.shared is None or self.kernel_activation is None:
            return False
        return tokens.dtype == torch.float32 and supports(tokens, self.w_gate, self.router.weight)

    def _fused_layer(self, tokens: torch.Tensor, batch_shape: torch.Size) -> torch.Tensor:
        """Router, aux loss, routed and shared experts as one autograd node (`moe_layer_fused`);
        same results as the composed path below, to float rounding (tests)."""
        top_k, num_experts = self.cfg.top_k, self.cfg.num_experts
        wants_cutoff = self.training and self.cfg.balancing == "quantile" and top_k < num_experts
        alpha = self.cfg.seq_aux_alpha if self.training else 0.0
        num_sequences = batch_shape[0] if len(batch_shape) > 1 else 1
        shared = self.shared
        common = {
            "experts": (self.w_gate, self.w_up, self.w_down),
            "shared": (shared.w_gate.weight, shared.w_up.weight, shared.w_down.weight),
            "routing": (top_k, top_k + 1 if wants_cutoff else top_k, self.cfg.routed_scale),
            "aux": (num_sequences, alpha),
            "activation": self.kernel_activation,
        }
        router_weight = self.router.weight
        if self.latent_down is None:
            results = moe_layer_fused(tokens, router_weight, self.bias, **common)
        else:
            norm = self.latent_norm
            latent = (
                self.latent_down.weight,
                self.latent_up.weight,
                None if norm is None else norm.weight,
                0.0 if norm is None else norm.eps,
            )
            results = latent_moe_layer_fused(tokens, router_weight, self.bias, latent, **common)
        out, self.aux_loss, scores, index, values, loads = results
        if self.training:
            cutoff = (values[:, top_k], index[:, top_k]) if wants_cutoff else (None, None)
            self._record(loads, scores, *cutoff)
        return out

    def route(self, tokens: torch.Tensor) -> Routing:
        """Routing of `tokens [N, d]` with the current bias (fp32 logits)."""
        logits = F.linear(tokens.float(), self.router.weight.float())
        wants_cutoff = self.training and self.cfg.balancing == "quantile"
        return route(
            logits,
            self.bias,
            self.cfg.top_k,
            self.cfg.routed_scale,
            wants_cutoff,
            fused=self.kernel_activation is not None,
        )

    def statistics(self) -> torch.Tensor:
        """This step's statistics `[E, 1 (+ 1 + R)]` int64: loads, then QB margin counts."""
        return torch.cat([self.step_loads[:, None], self.step_margin_counts], dim=1)

    def _apply(self, fn, recurse=True):
        # Module-wide casts (`.to(torch.bfloat16)`) must not round the balancing bias: it is an
        # fp32 buffer (architecture.md 5.1) whose 1e-3 steps bf16 would lose.
        super()._apply(fn, recurse)
        if self.bias.dtype != torch.float32:
            self.bias = self.bias.float()
        return self

    def reset_statistics(self) -> None:
        self.step_loads.zero_()
        self.step_margin_counts.zero_()

    def record_statistics(self, routing: Routing) -> None:
        """Add one micro-batch's loads (and QB margin counts) to this step's statistics."""
        loads = torch.bincount(routing.expert_idx.reshape(-1), minlength=self.cfg.num_experts)
        self._record(loads, routing.scores, routing.cutoff, routing.cutoff_expert)

    def _record(
        self,
        loads: torch.Tensor,
        scores: torch.Tensor,
        cutoff: torch.Tensor | None,
        cutoff_expert: torch.Tensor | None,
    ) -> None:
        # In place: a buffer assignment would go through Module.__setattr__ on every forward.
        self.step_loads.add_(loads)
        if self.step_margin_counts.shape[1] > 0 and cutoff is not None:
            with torch.no_grad():
                counts = self._margin_counts(
                    scores, cutoff, cutoff_expert, self.bias, self.cfg.qb_bins
                )
            self.step_margin_counts.add_(counts)

    def _aux_loss(self, routing: Routing, batch_shape: torch.Size) -> torch.Tensor:
        alpha = self.cfg.seq_aux_alpha
        if alpha == 0.0 or not self.training:
            return routing.scores.new_zeros(())
        num_sequences = batch_shape[0] if len(batch_shape) > 1 else 1
        fused = self.kernel_activation is not None
        return sequence_aux_loss(routing.scores, routing.expert_idx, num_sequences, alpha, fused)


def _expert_weight(num_experts: int, d_out: int, d_in: int, std: float) -> nn.Parameter:
    # architecture.md 5.3 [INF]: N(0, 0.02) like every other linear.
    return nn.Parameter(torch.randn(num_experts, d_out, d_in) * std)


def _init_router(router: nn.Linear, cfg: MoEConfig, init_std: float) -> None:
    if cfg.router_init == "normal":
        nn.init.normal_(router.weight, mean=0.0, std=init_std)
    else:
        # HF ports: nn.Linear's default kaiming_uniform_(a=sqrt(5)), about U(+-1/sqrt(d)).
        nn.init.kaiming_uniform_(router.weight, a=5**0.5)
