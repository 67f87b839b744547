"""KDA as its token recurrence on the fused C++ kernel (recurrent.cpp): the CPU training path at
the study ladders' head widths.

The chunked form (`chunk.py`) is built for matrix units: per token and head it does about
`C * (K + V)` work on `C x C` score matrices (C = 64) besides the state's `K * V`. At K = V = 8-16
on one CPU thread those matrices are the cost (they stream through memory in some forty
elementwise ops and batched matmuls), while the recurrence itself is a few hundred FLOPs per
token and head with a state that fits in registers. `kda_cpu` runs the recurrence in C++ where the
kernels are built and the head widths are small (`RECURRENT_MAX_STATE`), and falls back to
`chunk_kda` otherwise; results agree to rounding (tests/ops/test_kda_recurrent.py compares
outputs and every gradient with `naive_recurrent_kda` and `chunk_kda`).

Backward, per head, walking tokens in reverse with `dS` = dL/dS_t (seeded by the final state's
gradient), `a = exp(g_t)`, `S' = Diag(a) S_{t-1}`, `r = v_t - S'^T k_t`, `S_t = S' + b k r^T`:

    dS     += s q do^T                 o = S_t^T (s q)
    dq      = s S_t do
    u       = dS r;  db = k . u;  dk = b u
    dr      = b dS^T k;  dv = dr
    dS'     = dS - k dr^T;  dk -= S' dr
    dg      = rowsum(dS' * S')         (d/dg of a = exp(g), times S_{t-1})
    dS_{t-1} = Diag(a) dS'

The forward keeps the state entering every `SEGMENT`-th token; the backward recomputes a segment's
states before walking it, so memory stays `T / SEGMENT` states per head.

Forward and backward are `torch.library` custom ops (`k3scale::kda_recurrent_forward`,
`k3scale::kda_recurrent_backward`), so `torch.compile` traces each as a single graph node.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import load
from k3scale.ops.cpu.activation import kernels_loaded
from k3scale.ops.kda.chunk import chunk_kda
from k3scale.ops.kda.naive import check_kda_shapes, compute_dtype
from k3scale.ops.members import fold_members

# Tokens between saved states (the backward recomputes at most this many).
SEGMENT = 64
# Largest K * V per head run by the recurrence. Measured fwd+bwd at B 16, T 256, 10-14 heads,
# one thread, against chunk_kda at its default C = 64: K = V = 8 30 ms vs 230-250 ms; 16: 70-100
# vs 340-590 ms; 32: 185-250 vs 390-400 ms (a shared, noisy machine; the ladders stop at 16).
RECURRENT_MAX_STATE = 32 * 32


def recurrent_supported(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether `kda_cpu` takes the C++ recurrence for these inputs (else chunk_kda)."""
    return (
        q.device.type == "cpu"
        and v.device.type == "cpu"
        and q.shape[-1] * v.shape[-1] <= RECURRENT_MAX_STATE
        and kernels_loaded()
    )


def kda_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """KDA with `chunk_kda`'s signature and results: the C++ recurrence where it is supported
    (`chunk_size` then has no effect; the result does not depend on it), else `chunk_kda`."""
    if not recurrent_supported(q, v) or q.shape[1] == 0:
        return chunk_kda(q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size)
    return recurrent_kda(q, k, v, g, beta, scale, initial_state, output_final_state)


def recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The C++ recurrence; arguments and returns as `naive_recurrent_kda` (needs the kernels)."""
    check_kda_shapes(q, k, v, g, beta, initial_state)
    batch, _, num_heads, d_key = q.shape
    out_dtype, dtype = v.dtype, compute_dtype(v.dtype)
    scale = d_key**-0.5 if scale is None else scale
    if initial_state is None:
        initial_state = q.new_zeros(batch, num_heads, d_key, v.shape[-1], dtype=dtype)
    inputs = (x.to(dtype).contiguous() for x in (q, k, v, g, beta, initial_state))
    o, final_state, _ = recurrence_forward(*inputs, float(scale), SEGMENT)
    return o.to(out_dtype), (final_state if output_final_state else None)


# Custom ops, not an autograd.Function calling the extension: `torch.compile` traces through
# them as single nodes (their fake kernels give the shapes) instead of breaking the graph at the
# pybind call (issue 34).
@torch.library.custom_op("k3scale::kda_recurrent_forward", mutates_args=())
def recurrence_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial: torch.Tensor,
    scale: float,
    segment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o `[B, T, H, V]`, final state `[B, H, K, V]`, checkpoints `[B, H, ceil(T / segment), K,
    V]`: the state entering every `segment`-th token, which the backward starts from)."""
    return tuple(load().kda_recurrent_forward(q, k, v, g, beta, initial, scale, segment))


@recurrence_forward.register_fake
def _(q, k, v, g, beta, initial, scale, segment):
    batch, steps, heads, d_key = q.shape
    num_segments = (steps + segment - 1) // segment
    return (
        v.new_empty(v.shape),
        initial.new_empty(initial.shape),
        v.new_empty(batch, heads, num_segments, d_key, v.shape[-1]),
    )


@torch.library.custom_op("k3scale::kda_recurrent_backward", mutates_args=())
def recurrence_backward(
    grad_o: torch.Tensor,
    grad_final: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    checkpoints: torch.Tensor,
    scale: float,
    segment: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta, d_initial), each segment's states recomputed from its checkpoint."""
    return tuple(
        load().kda_recurrent_backward(
            grad_o, grad_final, q, k, v, g, beta, checkpoints, scale, segment
        )
    )


@recurrence_backward.register_fake
def _(grad_o, grad_final, q, k, v, g, beta, checkpoints, scale, segment):
    return (
        q.new_empty(q.shape),
        k.new_empty(k.shape),
        v.new_empty(v.shape),
        g.new_empty(g.shape),
        beta.new_empty(beta.shape),
        grad_final.new_empty(grad_final.shape),
    )


def _save(ctx, inputs, output):
    q, k, v, g, beta, _, scale, segment = inputs
    ctx.save_for_backward(q, k, v, g, beta, output[2])
    ctx.scale, ctx.segment = scale, segment


def _backward(ctx, grad_o, grad_final, _grad_checkpoints):
    q, k, v, g, beta, checkpoints = ctx.saved_tensors
    # Unused outputs' gradients may come as None (compiled graphs) rather than zeros.
    grad_o = torch.zeros_like(v) if grad_o is None else grad_o
    grad_final = (
        torch.zeros(checkpoints.shape[:2] + checkpoints.shape[3:], dtype=v.dtype)
        if grad_final is None
        else grad_final.contiguous()
    )
    grads = recurrence_backward(
        grad_o, grad_final, q, k, v, g, beta, checkpoints, ctx.scale, ctx.segment
    )
    return (*grads, None, None)


recurrence_forward.register_autograd(_backward, setup_context=_save)

# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(recurrence_forward, fold_members(recurrence_forward))
