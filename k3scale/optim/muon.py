"""Muon (Moonlight / K2 convention) with Per-Head Muon, and AdamW, in one optimizer object.

Muon (architecture.md 8.1), for each matrix `W [A, B]` of a `muon` group:

    M_t = mu * M_{t-1} + G_t
    N_t = G_t + mu * M_t  (Nesterov)  or  M_t
    W_t = W_{t-1} * (1 - lr * wd) - lr * 0.2 * sqrt(max(A, B)) * NS5(N_t)

A 3-D expert tensor `[E, a, b]` is E separate matrices (one batched NS5). Per-Head Muon
(architecture.md 8.3): a 2-D weight marked with `num_heads = H` has its momentum rows split into H
equal blocks `[H, A/H, B]`, each orthogonalised on its own; the scale is that of the block
(`head_scale="block"`) or of the whole matrix (`"matrix"`).

The `adamw` groups (embeddings, head, 1-D tensors, conv kernels, KDA decay parameters) take plain
AdamW with decoupled weight decay and the same lr. All groups live in one `torch.optim.Optimizer`,
so `state_dict()` / `load_state_dict()` round-trip the whole optimizer and the trainer sets
`group["lr"]` on every group each step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from k3scale.config import OptimConfig
from k3scale.optim.param_groups import build_param_groups

# Quintic Newton-Schulz coefficients (Keller Jordan, Muon, `zeropower_via_newtonschulz5`).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
# Frobenius-norm guard of the NS5 input (same source).
NS_EPS = 1e-7
# RMS matching: update RMS ~0.2 like AdamW, so both groups share lr and wd
# (Liu et al. 2025, "Muon is Scalable for LLM Training" (Moonlight), section 2.2).
MUON_RMS_SCALE = 0.2


def newton_schulz5(x: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """Approximate orthogonalisation `U V^T` of each matrix by the quintic Newton-Schulz iteration.

    Each matrix is divided by its Frobenius norm (+1e-7), transposed when it has more rows than
    columns, iterated `steps` times with `X <- a X + (b Y + c Y^2) X`, `Y = X X^T`, and transposed
    back. Singular values land in a band around 1 (about [0.5, 1.5]; not exactly 1).

    Args:
        x: `[..., A, B]` one matrix or a batch of matrices; computed in fp32.
        steps: Newton-Schulz iterations.

    Returns:
        `[..., A, B]` fp32.
    """
    if x.ndim < 2:
        raise ValueError(f"newton_schulz5: expected a matrix or a batch of them, got {x.shape}")
    a, b, c = NS_COEFFICIENTS
    x = x.float()
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = x.mT
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + NS_EPS)
    shape = x.shape
    x = x.reshape(-1, *shape[-2:])
    for _ in range(steps):
        y = torch.bmm(x, x.mT)
        # The scalars ride in the matmuls (beta, alpha): five elementwise passes fewer per step,
        # 1.03-1.6x faster on the study's matrix shapes (CPU, 2 threads).
        x = torch.baddbmm(x, torch.baddbmm(y, y, y, beta=b, alpha=c), x, beta=a)
    x = x.reshape(shape)
    return x.mT if transposed else x


def muon_scale(rows: int, cols: int) -> float:
    """Moonlight update scale `0.2 * sqrt(max(rows, cols))` of one `[rows, cols]` matrix."""
    return MUON_RMS_SCALE * math.sqrt(max(rows, cols))


def newton_schulz_flops(shape: tuple[int, ...], steps: int = 5) -> int:
    """Matmul FLOPs of `newton_schulz5` on a tensor of `shape` (`[..., A, B]`).

    Per matrix and step, with `m = min(A, B)` and `n = max(A, B)` (the iteration runs on the
    wide side): `X X^T` and `(b Y + c Y^2) X` take `2 m^2 n` each and `Y^2` takes `2 m^3`.
    """
    *batch, rows, cols = shape
    m, n = min(rows, cols), max(rows, cols)
    return math.prod(batch) * steps * (4 * m * m * n + 2 * m**3)


def orthogonalized_update(
    direction: torch.Tensor, num_heads: int | None, head_scale: str, ns_steps: int
) -> torch.Tensor:
    """Scaled NS5 update of one parameter (before the `-lr` factor).

    Args:
        direction: `[A, B]` or `[E, a, b]` momentum direction (Nesterov or plain).
        num_heads: None for full-matrix Muon; H for Per-Head Muon of a 2-D `[H*a, B]` weight.
        head_scale: `"block"` (scale of each `[a, B]` block) or `"matrix"` (of `[H*a, B]`).
        ns_steps: Newton-Schulz iterations.

    Returns:
        fp32 tensor shaped like `direction`.
    """
    if num_heads is None:
        return newton_schulz5(direction, ns_steps) * muon_scale(*direction.shape[-2:])
    rows, cols = direction.shape
    blocks = direction.reshape(num_heads, rows // num_heads, cols)
    ortho = newton_schulz5(blocks, ns_steps).reshape(rows, cols)
    scale = muon_scale(rows // num_heads, cols) if head_scale == "block" else muon_scale(rows, cols)
    return ortho * scale


def _wide_blocks(direction: torch.Tensor, num_heads: int | None) -> tuple[torch.Tensor, bool]:
    """`direction` as a batch of matrices `[n, a, b]` with `a <= b` (NS5 runs on the wide
    side), and whether they were transposed to get there."""
    if num_heads is not None:
        blocks = direction.reshape(num_heads, direction.shape[0] // num_heads, -1)
    else:
        blocks = direction.reshape(-1, *direction.shape[-2:])
    transposed = blocks.shape[-2] > blocks.shape[-1]
    return (blocks.mT if transposed else blocks), transposed


def _update_scale(shape: torch.Size, num_heads: int | None, head_scale: str) -> float:
    if num_heads is not None and head_scale == "block":
        return muon_scale(shape[0] // num_heads, shape[1])
    return muon_scale(*shape[-2:])


def orthogonalized_updates(
    directions: list[torch.Tensor], num_heads: int | None, head_scale: str, ns_steps: int
) -> list[torch.Tensor]:
    """`orthogonalized_update` of many parameters, one NS5 call per matrix shape.

    Each direction becomes a batch of wide matrices (heads, experts, tall ones transposed); the
    matrices of every shape are concatenated and orthogonalised together. Per matrix this is
    the same math as `orthogonalized_update`, the reference it is tested against; a model's
    ~25-60 Muon tensors fall into ~10 shapes, and the study models' matrices are small enough
    that per-call overhead, not arithmetic, set the optimizer's time.
    """
    blocks = [_wide_blocks(d, num_heads) for d in directions]
    by_shape: dict[tuple[int, int], list[int]] = {}
    for index, (wide, _) in enumerate(blocks):
        by_shape.setdefault(tuple(wide.shape[-2:]), []).append(index)
    updates: list[torch.Tensor | None] = [None] * len(directions)
    for indices in by_shape.values():
        batch = torch.cat([blocks[i][0] for i in indices])
        ortho = newton_schulz5(batch, ns_steps)
        parts = ortho.split([blocks[i][0].shape[0] for i in indices])
        for i, part in zip(indices, parts, strict=True):
            shape = directions[i].shape
            oriented = part.mT if blocks[i][1] else part
            updates[i] = oriented.reshape(shape) * _update_scale(shape, num_heads, head_scale)
    return updates


class Muon(torch.optim.Optimizer):
    """Muon for matrix groups and AdamW for the rest, in one optimizer.

    Each param group carries `algorithm` (`"muon"` or `"adamw"`) and `weight_decay`; muon groups
    may carry `num_heads` (None = full matrix, H = Per-Head Muon of 2-D weights) and a `name`.
    Every other setting falls back to the constructor defaults. State per parameter:
    muon `momentum_buffer`; adamw `step` (int), `exp_avg`, `exp_avg_sq`.
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        *,
        lr: float,
        weight_decay: float,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        head_scale: str = "block",
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
    ) -> None:
        if head_scale not in ("block", "matrix"):
            raise ValueError(f"head_scale: {head_scale!r} is not 'block' or 'matrix'")
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "head_scale": head_scale,
            "betas": betas,
            "eps": eps,
            "num_heads": None,
            "name": "",
        }
        super().__init__(list(params), defaults)
        for group in self.param_groups:
            _check_group(group)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One update of every parameter that has a gradient; returns `closure()` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == "muon":
                self._muon_group(group)
            else:
                self._adamw_group(group)
        return loss

    def newton_schulz_flops_per_step(self) -> int:
        """Matmul FLOPs of one `step()` in which every Muon parameter has a gradient.

        The 6ND-style model FLOP count has no term for them: at small steps they are a large
        share of the work (`k3scale bench train` prints it next to MFU).
        """
        total = 0
        for group in self.param_groups:
            if group["algorithm"] != "muon":
                continue
            for p in group["params"]:
                blocks, _ = _wide_blocks(p.detach(), group["num_heads"])
                total += newton_schulz_flops(tuple(blocks.shape), group["ns_steps"])
        return total

    def _muon_group(self, group: dict[str, Any]) -> None:
        # Same elementwise ops as the per-tensor update equations, as foreach calls: at the
        # study sizes the optimizer's time is per-op overhead.
        lr, mu = group["lr"], group["momentum"]
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        grads = [p.grad for p in params]
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            buffers.append(state["momentum_buffer"])
        torch._foreach_mul_(buffers, mu)
        torch._foreach_add_(buffers, grads)
        directions = torch._foreach_add(grads, buffers, alpha=mu) if group["nesterov"] else buffers
        updates = orthogonalized_updates(
            directions, group["num_heads"], group["head_scale"], group["ns_steps"]
        )
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_add_(params, [u.to(p.dtype) for u, p in zip(updates, params)], alpha=-lr)

    def _adamw_group(self, group: dict[str, Any]) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        by_step: dict[int, list[torch.Tensor]] = {}
        for p in params:
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] += 1
            by_step.setdefault(state["step"], []).append(p)
        for step, same_step in by_step.items():
            self._adamw_update(group, same_step, step)

    def _adamw_update(self, group: dict[str, Any], params: list[torch.Tensor], step: int) -> None:
        """AdamW on `params`, which share a step count (so their bias corrections)."""
        lr, eps = group["lr"], group["eps"]
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]
        exp_avgs = [self.state[p]["exp_avg"] for p in params]
        exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in params]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        bias_correction1 = 1 - beta1**step
        bias_correction2_sqrt = math.sqrt(1 - beta2**step)
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denoms, bias_correction2_sqrt)
        torch._foreach_add_(denoms, eps)
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_addcdiv_(params, exp_avgs, denoms, value=-lr / bias_correction1)


def _check_group(group: dict[str, Any]) -> None:
    """Reject groups the update rules cannot handle, naming the group and the parameter."""
    algorithm = group.get("algorithm")
    label = group["name"] or algorithm
    if algorithm not in ("muon", "adamw"):
        raise ValueError(f"param group {label!r}: algorithm must be 'muon' or 'adamw'")
    if algorithm == "adamw":
        return
    heads = group["num_heads"]
    for p in group["params"]:
        if heads is None and p.ndim not in (2, 3):
            raise ValueError(
                f"muon group {label!r}: got a {p.ndim}-D tensor; Muon takes 2-D or 3-D"
            )
        if heads is not None and (p.ndim != 2 or heads < 1 or p.shape[0] % heads):
            raise ValueError(
                f"muon group {label!r}: per-head Muon needs a 2-D weight whose rows divide into "
                f"{heads} heads, got shape {tuple(p.shape)}"
            )


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> Muon:
    """The model's optimizer: Muon and AdamW groups by the rules of `build_param_groups`.

    Args:
        model: Any module; parameter roles come from names, shapes and `per_head_projections`.
        cfg: Optimizer settings (lr, weight decay, momentum, NS steps, Adam betas and eps).

    Returns:
        One `Muon` optimizer stepping every trainable parameter exactly once.
    """
    groups = build_param_groups(model, cfg)
    return Muon(
        groups.optimizer_groups(),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.muon_momentum,
        nesterov=cfg.nesterov,
        ns_steps=cfg.ns_steps,
        head_scale=cfg.per_head_scale,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
    )
