"""Step-by-step reference of the Kimi Delta Attention recurrence (architecture.md section 1.1).

Per head, with key-major state `S_t [K, V]`, log decay `g_t [K]` (<= 0) and `beta_t` in (0, 1):

    S'  = Diag(exp(g_t)) S_{t-1}                 decay first
    r   = v_t - S'^T k_t                          delta correction against the decayed state
    S_t = S' + beta_t k_t r^T
    o_t = S_t^T (scale * q_t)                     the output reads the updated state

Obviously correct and slow (one tiny step per token); `chunk.py` is the fast path tested against it.
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32/bf16/fp16 inputs, fp64 for fp64 inputs (so fp64 tests stay fp64 inside)."""
    return torch.promote_types(dtype, torch.float32)


def check_kda_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    """Raise ValueError naming the argument whose shape breaks the fla convention."""
    if q.dim() != 4:
        raise ValueError(f"q: expected [B, T, H, K], got shape {tuple(q.shape)}")
    batch, seq_len, num_heads, d_key = q.shape
    d_value = v.shape[-1]
    expected = {
        "k": (k, (batch, seq_len, num_heads, d_key)),
        "v": (v, (batch, seq_len, num_heads, d_value)),
        "g": (g, (batch, seq_len, num_heads, d_key)),
        "beta": (beta, (batch, seq_len, num_heads)),
    }
    if initial_state is not None:
        expected["initial_state"] = (initial_state, (batch, num_heads, d_key, d_value))
    for name, (tensor, shape) in expected.items():
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name}: expected shape {shape}, got {tuple(tensor.shape)}")


def naive_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token KDA in fp32 (fp64 for fp64 inputs).

    Args:
        q: queries `[B, T, H, K]` (the caller L2-normalises q and k).
        k: keys `[B, T, H, K]`.
        v: values `[B, T, H, V]`.
        g: log decay `[B, T, H, K]`, already activated (<= 0).
        beta: write strengths `[B, T, H]` in (0, 1).
        scale: query scale; default `K ** -0.5`.
        initial_state: state entering token 0, `[B, H, K, V]` key-major; default zeros.
        output_final_state: also return the state after the last token.

    Returns:
        `(o, S)`: `o [B, T, H, V]` in `v.dtype`; `S [B, H, K, V]` in the compute dtype, or None.
    """
    check_kda_shapes(q, k, v, g, beta, initial_state)
    batch, seq_len, num_heads, d_key = q.shape
    out_dtype, dtype = v.dtype, compute_dtype(v.dtype)
    scale = d_key**-0.5 if scale is None else scale
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    state = q.new_zeros(batch, num_heads, d_key, v.shape[-1])
    if initial_state is not None:
        state = state + initial_state.to(dtype)
    outputs = []
    for t in range(seq_len):
        k_t = k[:, t]  # [B, H, K]
        state = state * g[:, t].exp().unsqueeze(-1)
        residual = v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, state)
        state = state + beta[:, t, :, None, None] * k_t.unsqueeze(-1) * residual.unsqueeze(-2)
        outputs.append(torch.einsum("bhk,bhkv->bhv", scale * q[:, t], state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o.to(out_dtype), (state if output_final_state else None)
