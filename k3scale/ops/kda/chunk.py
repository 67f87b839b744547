"""Chunk-parallel (WY/UT) Kimi Delta Attention in plain torch (architecture.md section 1.3).

Everything that does not depend on the state entering a chunk (pair scores, the triangular
solve, W, U, the chunk transition) is computed for all chunks of all heads in batched ops; only
the state recurrence `S <- A_n S + B_n` runs sequentially over chunks. The derivation is in
`README.md` next to this file. Autograd through these ops is the backward pass.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from k3scale.ops.kda.naive import check_kda_shapes, compute_dtype

# Pair scores are factorised per tile around the tile's first position s:
# exp(G_i - G_j) = exp(G_i - G_s) * exp(G_s - G_j). Off-diagonal tiles (j < s <= i) give two
# factors <= 1; on the diagonal tile exp(G_s - G_j) <= exp(MAX_TILE_LOG_RANGE). The tile starts
# as the whole chunk and is halved while its log-decay range is larger (K3's bounded gate makes
# 16-token tiles always safe, architecture.md 1.3; unbounded gates may need shorter ones).
# e^60 ~ 1e26 leaves ~1e12 of fp32 headroom (max ~3.4e38) for values and gradients.
MAX_TILE_LOG_RANGE = 60.0
# Short sequences run one chunk of T rounded up to this many tokens (keeps tiles halvable).
SHORT_CHUNK_MULTIPLE = 16


def _to_chunks(x: torch.Tensor, num_chunks: int, chunk: int) -> torch.Tensor:
    """`[B, T, H, *F]` -> `[B, H, N, C, *F]`, zero-padding the tail (identity steps)."""
    x = x.transpose(1, 2)
    pad = num_chunks * chunk - x.shape[2]
    if pad:
        tail_dims = [0, 0] * (x.dim() - 3)
        x = F.pad(x, [*tail_dims, 0, pad])
    return x.reshape(*x.shape[:2], num_chunks, chunk, *x.shape[3:])


def _tile_length(G: torch.Tensor) -> int:
    """Longest tile (C, C/2, ... while even, then 1) whose log-decay range is safe.

    Range of a tile = max over channels of G at its first position minus G at its last; a
    1-token tile has range 0, so the search always ends.
    """
    chunk = tile = G.shape[-2]
    with torch.no_grad():
        while tile > 1:
            G_tiles = G.unflatten(-2, (chunk // tile, tile))
            if (G_tiles[..., 0, :] - G_tiles[..., -1, :]).max() <= MAX_TILE_LOG_RANGE:
                break
            tile = tile // 2 if tile % 2 == 0 else 1
    return tile


def _decayed_pair_scores(
    lefts: list[torch.Tensor], right: torch.Tensor, G: torch.Tensor
) -> list[torch.Tensor]:
    """`P[i, j] = sum_c left_i[c] exp(G_i[c] - G_j[c]) right_j[c]`, valid for `j <= i`.

    Entries above the diagonal are finite but meaningless; the caller masks them (`tril`).

    Args:
        lefts: tensors `[..., C, K]` sharing `right` and `G` (keys and scaled queries).
        right: `[..., C, K]`.
        G: cumulative log decay inside each chunk `[..., C, K]` (fp64), non-increasing along C.

    Returns:
        One `[..., C, C]` score matrix per entry of `lefts`, in `right.dtype`.
    """
    chunk = G.shape[-2]
    tile = _tile_length(G)
    num_tiles = chunk // tile
    G_tiles = G.unflatten(-2, (num_tiles, tile))  # [..., n, c, K]
    G_ref = G_tiles[..., :1, :]  # [..., n, 1, K], first position of each tile
    # Column side for tile a: right_j exp(G_s - G_j) for j up to the end of tile a, else 0.
    col_log = G_ref - G.unsqueeze(-3)  # [..., n, C, K]
    if num_tiles > 1:
        position = torch.arange(chunk, device=G.device)
        tile_end = position[tile - 1 :: tile].view(num_tiles, 1, 1)
        col_log = col_log.masked_fill(position.view(1, chunk, 1) > tile_end, -math.inf)
    col_decay = torch.exp(col_log.to(right.dtype))
    cols_t = (right.unsqueeze(-3) * col_decay).transpose(-1, -2)  # [..., n, K, C]
    # Row side: left_i exp(G_i - G_s) <= 1 for i in tile a.
    row_decay = torch.exp((G_tiles - G_ref).to(right.dtype))
    return [
        ((left.unflatten(-2, (num_tiles, tile)) * row_decay) @ cols_t).flatten(-3, -2)
        for left in lefts
    ]


def _chunk_length(seq_len: int, chunk_size: int) -> int:
    """C = chunk_size, or T rounded up to SHORT_CHUNK_MULTIPLE when that is shorter."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    return min(chunk_size, -(-seq_len // SHORT_CHUNK_MULTIPLE) * SHORT_CHUNK_MULTIPLE)


def _chunk_operators(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Everything independent of the entering state, for all chunks at once.

    Args:
        q: scaled queries `[B, H, N, C, K]`; k: keys `[B, H, N, C, K]`; v: values
            `[B, H, N, C, V]`; g: log decay `[B, H, N, C, K]`; beta: `[B, H, N, C, 1]`.

    Returns:
        `(q_state [.., C, K], o_intra [.., C, V], transition [.., K, K], state_input [.., K, V])`
        such that `O = o_intra + q_state S` and `S_next = transition S + state_input`.
    """
    d_key, chunk = k.shape[-1], k.shape[-2]
    # Log-decay bookkeeping in fp64: with strong gates G reaches -1e3 within a chunk, and fp32
    # differences G_i - G_j of such values would lose ~1e-4 absolute (relative, after exp).
    G = g.to(torch.float64).cumsum(dim=-2)  # non-increasing along C
    kk, qk = _decayed_pair_scores([k, q], k, G)  # [B, H, N, C, C] each
    # Masks as products: torch.tril costs milliseconds even on tiny CPU tensors (torch 2.13).
    position = torch.arange(chunk, device=k.device)
    lower = (position.view(chunk, 1) >= position.view(1, chunk)).to(k.dtype)
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    A_kk = beta * kk * (lower - eye)  # strictly lower
    A_qk = qk * lower  # diagonal kept: the output reads the updated state

    # UT transform: (I + A_kk) [W U] = Diag(beta) [exp(G) * K, V], all chunks in one solve.
    gamma = torch.exp(G.to(k.dtype))
    rhs = beta * torch.cat([gamma * k, v], dim=-1)
    WU = torch.linalg.solve_triangular(eye + A_kk, rhs, upper=False, unitriangular=True)

    # With V_e = U - W S:  O = (Q * exp(G) - A_qk W) S + A_qk U,
    # S_next = (Diag(exp(G_C)) - K_d^T W) S + K_d^T U,  K_d = K * exp(G_C - G).
    G_last = G[..., -1:, :]
    qk_WU = A_qk @ WU  # [B, H, N, C, K + V]
    kd_WU = (k * torch.exp((G_last - G).to(k.dtype))).transpose(-1, -2) @ WU  # [B, H, N, K, K + V]
    q_state = q * gamma - qk_WU[..., :d_key]
    transition = torch.diag_embed(gamma[..., -1, :]) - kd_WU[..., :d_key]
    return q_state, qk_WU[..., d_key:], transition, kd_WU[..., d_key:]


def _scan_states(
    transition: torch.Tensor, state_input: torch.Tensor, initial: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`S_{n+1} = transition_n S_n + state_input_n` over chunks (the only sequential part).

    Args:
        transition: `[B, H, N, K, K]`; state_input: `[B, H, N, K, V]`; initial: `[B, H, K, V]`.

    Returns:
        `(entering [B, H, N, K, V], final [B, H, K, V])`: the state entering each chunk, and the
        state after the last one.
    """
    batch, num_heads = transition.shape[:2]
    # Chunk-major, contiguous per chunk; unbind (not indexing) keeps the backward linear in N.
    transitions = transition.permute(2, 0, 1, 3, 4).flatten(1, 2).unbind(0)  # N x [BH, K, K]
    state_inputs = state_input.permute(2, 0, 1, 3, 4).flatten(1, 2).unbind(0)  # N x [BH, K, V]
    state = initial.flatten(0, 1)
    entering = []
    for transition_n, input_n in zip(transitions, state_inputs):
        entering.append(state)
        state = torch.baddbmm(input_n, transition_n, state)
    entering = torch.stack(entering, dim=1).unflatten(0, (batch, num_heads))
    return entering, state.unflatten(0, (batch, num_heads))


def chunk_kda(
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
    """KDA over chunks of `chunk_size` tokens; equals `naive_recurrent_kda` for any T.

    Args:
        q: queries `[B, T, H, K]` (the caller L2-normalises q and k).
        k: keys `[B, T, H, K]`.
        v: values `[B, T, H, V]`.
        g: log decay `[B, T, H, K]`, already activated (<= 0).
        beta: write strengths `[B, T, H]` in (0, 1).
        scale: query scale; default `K ** -0.5`.
        initial_state: state entering token 0, `[B, H, K, V]` key-major; default zeros.
        output_final_state: also return the state after the last token.
        chunk_size: tokens per chunk C (a free parameter of the algorithm; results are invariant).

    Returns:
        `(o, S)`: `o [B, T, H, V]` in `v.dtype`; `S [B, H, K, V]` in the compute dtype (fp32,
        fp64 for fp64 inputs), or None.
    """
    check_kda_shapes(q, k, v, g, beta, initial_state)
    batch, seq_len, num_heads, d_key = q.shape
    d_value = v.shape[-1]
    out_dtype, dtype = v.dtype, compute_dtype(v.dtype)
    scale = d_key**-0.5 if scale is None else scale
    chunk = _chunk_length(seq_len, chunk_size)
    num_chunks = -(-seq_len // chunk)
    q, k, v, g = (_to_chunks(x.to(dtype), num_chunks, chunk) for x in (q, k, v, g))
    q = q * scale
    beta = _to_chunks(beta.to(dtype), num_chunks, chunk).unsqueeze(-1)  # [B, H, N, C, 1]

    q_state, o_intra, transition, state_input = _chunk_operators(q, k, v, g, beta)
    initial = q.new_zeros(batch, num_heads, d_key, d_value)
    if initial_state is not None:
        initial = initial + initial_state.to(dtype)
    entering, final_state = _scan_states(transition, state_input, initial)
    o = o_intra + q_state @ entering  # [B, H, N, C, V]
    o = o.reshape(batch, num_heads, num_chunks * chunk, d_value)[:, :, :seq_len].transpose(1, 2)
    return o.to(out_dtype), (final_state if output_final_state else None)
