"""Output-head cross-entropy over row chunks, with the gradients formed in the forward pass.

On CPU, the `[N, V]` logits of a small model (V = 8192, d = 16-256) are far larger than the
caches, and the plain path streams them through memory about ten times (matmul out, fp32
softmax, loss, its backward, two matmuls in). Here each chunk of rows is small enough to stay
in cache: its logits become `softmax - onehot` in place, which feeds both gradient matmuls
right away, so the full logits never exist. Because the loss is a mean over rows, the
gradients w.r.t. the inputs are final after the forward pass; the backward only scales them by
the incoming gradient. Without autograd (evaluation) only the loss is formed.
"""

from __future__ import annotations

import torch

# Rows per chunk: 128 x 8192 fp32 logits = 4 MiB. Against the plain path, fwd+bwd of 2048 rows
# at V 8192 on one thread (min of 7, two runs under load): d 16: 2.4x; d 64: 1.6-1.8x; d 128:
# 1.3-1.4x. 32 and 64 rows were up to 10% better at d 16 and worse above; 256 worse everywhere.
CHUNK_ROWS = 128


def _nll_into_gradient(logits: torch.Tensor, targets: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Summed NLL of one chunk; turns `logits` in place into d(mean NLL)/d(logits), that is
    `(softmax - onehot) / num_rows`, with one exp pass (logsumexp would add a second)."""
    row_max = logits.max(dim=-1, keepdim=True).values
    picked = logits.gather(1, targets[:, None])
    sums = logits.sub_(row_max).exp_().sum(dim=-1, keepdim=True)
    nll = (sums.log() + row_max - picked).sum()
    logits.div_(sums * num_rows)
    logits[torch.arange(len(logits)), targets] -= 1.0 / num_rows
    return nll


class _HeadCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_rows):
        num_rows = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden)
        grad_weight = torch.zeros_like(weight)
        total = hidden.new_zeros(())
        for start in range(0, num_rows, chunk_rows):
            rows = hidden[start : start + chunk_rows]
            chunk_targets = targets[start : start + chunk_rows]
            logits = rows @ weight.T
            total += _nll_into_gradient(logits, chunk_targets, num_rows)
            torch.mm(logits, weight, out=grad_hidden[start : start + chunk_rows])
            grad_weight.addmm_(logits.T, rows)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total / num_rows

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None


def head_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int = CHUNK_ROWS,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden [N, d] @ weight [V, d]^T` against `targets [N]`.

    Equals `head_cross_entropy_naive` for fp32 (or fp64, for tests) inputs; other dtypes and
    autocast use the plain path. Gradients reach `hidden` and `weight` only.
    """
    if hidden.dtype != weight.dtype or hidden.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"head_cross_entropy: needs fp32 (or fp64) inputs, got {hidden.dtype}/{weight.dtype}"
        )
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: must be >= 1, got {chunk_rows}")
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _HeadCrossEntropy.apply(hidden, weight, targets, chunk_rows)
    num_rows = hidden.shape[0]
    total = hidden.new_zeros(())
    for start in range(0, num_rows, chunk_rows):
        logits = hidden[start : start + chunk_rows] @ weight.T
        total += _nll_into_gradient(logits, targets[start : start + chunk_rows], num_rows)
    return total / num_rows
