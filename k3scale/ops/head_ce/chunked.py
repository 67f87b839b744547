"""Output-head cross-entropy over row chunks, with the gradients formed in the forward pass.

On CPU, the `[N, V]` logits of a small model (V = 8192, d = 16-256) are far larger than the
caches, and the plain path streams them through memory about ten times (matmul out, fp32
softmax, loss, its backward, two matmuls in). Here each chunk of rows is small enough to stay
in cache: its logits become `softmax - onehot` in place, which feeds both gradient matmuls
right away, so the full logits never exist. A chunk's logits are formed transposed, `[V, R]`
(`weight @ rows^T`): the three GEMMs then run 1.2-1.4x faster at d 16-64 than with `[R, V]`
(1024 rows in chunks of 32 or 128, V 8192, interleaved medians, 1 and 2 threads; even at
d 256). Because the loss is a mean over rows, the
gradients w.r.t. the inputs are final after the forward pass; the backward only scales them by
the incoming gradient. Without autograd (evaluation) only the loss is formed.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from k3scale.ops.cpu import load, supports
from k3scale.ops.members import loop_members

# Rows per chunk by hidden width (width limit, rows): the GEMMs want tall chunks, the softmax
# pass wants its logits in cache. Measured with the transposed chunks and the column kernel, V
# 8192, whole-model fwd+bwd (16 x 64 tokens), interleaved medians. At d 16-64, 32 rows beat
# 128 by 1.17-1.55x on 1 thread, the studies' setting (k2-t1, k2-t2, dense-t3); on 2 threads
# they win at d 64 (dense-t3 1.14x) and lose at d 16 (k2-t1 0.86x); 64 rows never beat 32
# beyond the noise. At d 128 (k2-t4, 2 threads) 64 and 128 tie and 256 is 1.1x slower; at d 256
# (the 5M dense model) 128-512 tie.
CHUNK_ROWS_BY_WIDTH = ((64, 32), (128, 128))
WIDE_CHUNK_ROWS = 256


def chunk_rows_for(width: int) -> int:
    """Rows per chunk for hidden width `width` (see the measurements above)."""
    for limit, rows in CHUNK_ROWS_BY_WIDTH:
        if width <= limit:
            return rows
    return WIDE_CHUNK_ROWS


def _chunk_step(hidden: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]:
    """The per-chunk step for these inputs, chosen once per call: `step(logits_t, targets,
    num_rows)` takes a chunk's logits transposed, `[V, R]`, returns the chunk's summed NLL and
    turns `logits_t` in place into d(mean NLL)/d(logits_t), that is `(softmax - onehot) /
    num_rows` down each column. The fused C++ kernel when built (three passes, no temporaries,
    column blocks across threads), else the torch ops below; tests compare them."""
    if not supports(hidden):
        return _nll_into_gradient_torch
    kernels = load()
    return lambda logits_t, targets, num_rows: kernels.softmax_xent_grad(
        logits_t, targets, 1.0 / num_rows
    )


def _nll_into_gradient_torch(
    logits_t: torch.Tensor, targets: torch.Tensor, num_rows: int
) -> torch.Tensor:
    """The torch reference of the chunk step on `[V, R]` logits, with one exp pass (logsumexp
    would add a second)."""
    column_max = logits_t.max(dim=0, keepdim=True).values
    columns = torch.arange(logits_t.shape[1], device=logits_t.device)
    picked = logits_t[targets, columns]
    sums = logits_t.sub_(column_max).exp_().sum(dim=0, keepdim=True)
    nll = (sums.log() + column_max - picked).sum()
    logits_t.div_(sums * num_rows)
    logits_t[targets, columns] -= 1.0 / num_rows
    return nll


# The training path as one custom op: torch.compile traces it as one node, where the chunk loop
# would unroll and break its graph at each kernel call (issue 34).
@torch.library.custom_op("k3scale::head_cross_entropy_with_grads", mutates_args=())
def head_cross_entropy_with_grads(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_rows: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean NLL, its gradient w.r.t. hidden, w.r.t. weight), all from one pass over chunks."""
    num_rows = hidden.shape[0]
    grad_hidden = torch.empty_like(hidden)
    grad_weight = torch.zeros_like(weight)
    total = hidden.new_zeros(())
    step = _chunk_step(hidden)
    for start in range(0, num_rows, chunk_rows):
        rows = hidden[start : start + chunk_rows]
        chunk_targets = targets[start : start + chunk_rows]
        # torch.mm, not `@`: the same GEMM, and one bench gemm_bound's recorder sees in an op's
        # body (there, below autograd, `@` reaches it as matmul, not yet decomposed to mm).
        logits_t = torch.mm(weight, rows.T)
        total += step(logits_t, chunk_targets, num_rows)
        torch.mm(logits_t.T, weight, out=grad_hidden[start : start + chunk_rows])
        grad_weight.addmm_(logits_t, rows)
    return total / num_rows, grad_hidden, grad_weight


@head_cross_entropy_with_grads.register_fake
def _(hidden, weight, targets, chunk_rows):
    return hidden.new_empty(()), hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


def _save(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])


def _backward(ctx, grad_loss, _grad_hidden, _grad_weight):
    # The loss is a mean over rows, so the forward's gradients are final up to this scale.
    grad_hidden, grad_weight = ctx.saved_tensors
    return grad_hidden * grad_loss, grad_weight * grad_loss, None, None


head_cross_entropy_with_grads.register_autograd(_backward, setup_context=_save)


def head_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Mean cross-entropy of `hidden [N, d] @ weight [V, d]^T` against `targets [N]`.

    Equals `head_cross_entropy_naive` for fp32 (or fp64, for tests) inputs; other dtypes and
    autocast use the plain path. Gradients reach `hidden` and `weight` only. `chunk_rows`
    defaults to `chunk_rows_for(d)`.
    """
    if hidden.dtype != weight.dtype or hidden.dtype not in (torch.float32, torch.float64):
        raise ValueError(
            f"head_cross_entropy: needs fp32 (or fp64) inputs, got {hidden.dtype}/{weight.dtype}"
        )
    if chunk_rows is None:
        chunk_rows = chunk_rows_for(hidden.shape[1])
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows: must be >= 1, got {chunk_rows}")
    if torch.is_grad_enabled():
        # Not gated on `requires_grad`: under vmap (stacked trials) a tracked input reads False.
        return head_cross_entropy_with_grads(hidden, weight, targets, chunk_rows)[0]
    num_rows = hidden.shape[0]
    total = hidden.new_zeros(())
    step = _chunk_step(hidden)
    for start in range(0, num_rows, chunk_rows):
        logits_t = weight @ hidden[start : start + chunk_rows].T
        total += step(logits_t, targets[start : start + chunk_rows], num_rows)
    return total / num_rows


# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(
    head_cross_entropy_with_grads, loop_members(head_cross_entropy_with_grads)
)
