"""Chunk-parallel (WY/UT) Kimi Delta Attention in plain torch (architecture.md section 1.3).

Everything that does not depend on the state entering a chunk (pair scores, the triangular
solve, W, U) is computed for all chunks of all heads in batched ops; only the state recurrence
(two small matmuls per chunk) runs sequentially, and the outputs are again batched. The
derivation is in `README.md` next to this file. Autograd through these ops is the backward.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from k3scale.ops.kda.naive import check_kda_shapes, compute_dtype, naive_recurrent_kda

# Pair scores are factorised per tile around the tile's first position s:
# exp(G_i - G_j) = exp(G_i - G_s) * exp(G_s - G_j). Off-diagonal tiles (j < s <= i) give two
# factors <= 1; on the diagonal tile exp(G_s - G_j) <= exp(MAX_TILE_LOG_RANGE). The tile starts
# as the whole chunk and is halved while its log-decay range is larger: K3's bounded gate
# (g > -5) always allows 8-token tiles (range < 35); unbounded gates may need shorter ones.
# e^60 ~ 1e26 leaves ~1e12 of fp32 headroom (max ~3.4e38) for values and gradients
# (K3's kernels use 16-token tiles with range < 80, architecture.md 1.3).
MAX_TILE_LOG_RANGE = 60.0
# Short sequences run one chunk of T rounded up to this many tokens (keeps tiles halvable).
SHORT_CHUNK_MULTIPLE = 16


def _to_chunks(x: torch.Tensor, num_chunks: int, chunk: int) -> torch.Tensor:
    """`[B, T, H, *F]` -> `[N, B*H, C, *F]`, zero-padding the tail (identity steps).

    Chunk-major, so the sequential scan takes each chunk's `[B*H, ...]` slice without a copy.
    """
    batch, seq_len, num_heads, *features = x.shape
    pad = num_chunks * chunk - seq_len
    if pad:
        x = F.pad(x, [0, 0] * (x.dim() - 2) + [0, pad])
    x = x.view(batch, num_chunks, chunk, num_heads, *features).transpose(2, 3)
    return x.transpose(0, 1).reshape(num_chunks, batch * num_heads, chunk, *features)


def _log_decay_plan(G: torch.Tensor) -> tuple[int, torch.dtype]:
    """Tile length for the pair scores, and the dtype of the log-decay bookkeeping.

    Tile: the longest of C, C/2, ... (while even, then 1) whose range (max over channels of G
    at its first position minus G at its last) is <= MAX_TILE_LOG_RANGE; a 1-token tile has
    range 0, so the search always ends. Bookkeeping: fp32 differences of G are accurate to
    about |G| * 6e-8, as good as the fp32 recurrence while |G| <= MAX_TILE_LOG_RANGE; with
    stronger decay (G reaches -1e3 under unbounded gates) they would lose ~1e-4, so use fp64.

    Args:
        G: cumulative log decay inside each chunk `[..., C, K]` in the compute dtype.
    """
    chunk = tile = G.shape[-2]
    with torch.no_grad():
        while tile > 1:
            G_tiles = G.unflatten(-2, (chunk // tile, tile))
            if (G_tiles[..., 0, :] - G_tiles[..., -1, :]).max() <= MAX_TILE_LOG_RANGE:
                break
            tile = tile // 2 if tile % 2 == 0 else 1
        weak_decay = (-G[..., -1, :]).max() <= MAX_TILE_LOG_RANGE
    return tile, (G.dtype if weak_decay else torch.float64)


def _decayed_pair_scores(
    lefts: list[torch.Tensor], right: torch.Tensor, G: torch.Tensor, tile: int
) -> list[torch.Tensor]:
    """`P[i, j] = sum_c left_i[c] exp(G_i[c] - G_j[c]) right_j[c]`, valid for `j <= i`.

    Entries above the diagonal are finite but meaningless; the caller masks them.

    Args:
        lefts: tensors `[..., C, K]` sharing `right` and `G` (keys and scaled queries).
        right: `[..., C, K]`.
        G: cumulative log decay inside each chunk `[..., C, K]`, non-increasing along C.
        tile: tile length dividing C (see `_log_decay_plan`).

    Returns:
        One `[..., C, C]` score matrix per entry of `lefts`, in `right.dtype`.
    """
    chunk = G.shape[-2]
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


class _UnitLowerInverse(torch.autograd.Function):
    """`(I + A)^-1` for strictly lower-triangular `A` `[..., C, C]`.

    Autograd through `solve_triangular` would run a second solve in the backward; with the
    inverse at hand the adjoint is two matmuls: dL/dA = -M^T (dL/dM) M^T. Entries of the result
    outside the strict lower triangle are meaningless; the caller built `A` through a mask,
    whose backward zeroes them.
    """

    @staticmethod
    def forward(ctx, strictly_lower: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:
        # unitriangular=True reads neither the diagonal nor the upper triangle of the matrix.
        rhs = eye.expand_as(strictly_lower)
        inverse = torch.linalg.solve_triangular(
            strictly_lower, rhs, upper=False, unitriangular=True
        )
        ctx.save_for_backward(inverse)
        return inverse

    @staticmethod
    def backward(ctx, grad_inverse: torch.Tensor) -> tuple[torch.Tensor, None]:
        (inverse,) = ctx.saved_tensors
        inverse_t = inverse.transpose(-1, -2)
        return -(inverse_t @ grad_inverse @ inverse_t), None


class _ChunkTerms(NamedTuple):
    """State-independent terms of every chunk, `[N, B*H, ...]` (README.md next to this file)."""

    q_decayed: torch.Tensor  # s Q * exp(G)                                    [.., C, K]
    A_qk: torch.Tensor  # lower-triangular query-key scores, diagonal kept     [.., C, C]
    W: torch.Tensor  # M (exp(G) * K)                                          [.., C, K]
    U: torch.Tensor  # M V                                                     [.., C, V]
    k_decayed: torch.Tensor  # K * exp(G_C - G), transposed                    [.., K, C]
    decay_last: torch.Tensor  # exp(G_C), the whole chunk's decay              [.., K, 1]


def _chunk_terms(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
) -> _ChunkTerms:
    """Everything independent of the entering state, for all chunks at once.

    Args:
        q: scaled queries `[N, B*H, C, K]`; k: keys `[N, B*H, C, K]`; v: values
            `[N, B*H, C, V]`; g: log decay `[N, B*H, C, K]`; beta: `[N, B*H, C, 1]`.
    """
    chunk = k.shape[-2]
    G = g.cumsum(dim=-2)  # non-increasing along C
    tile, log_dtype = _log_decay_plan(G)
    if log_dtype != G.dtype:
        G = g.to(log_dtype).cumsum(dim=-2)
    if tile == chunk and log_dtype == k.dtype:
        kk, qk, decayed = _single_tile_scores(q, k, G)
    else:
        kk, qk = _decayed_pair_scores([k, q], k, G, tile)  # [N, B*H, C, C] each
        decayed = _decay_terms(q, k, G)
    # Masks as products: torch.tril costs milliseconds even on tiny CPU tensors (torch 2.13).
    position = torch.arange(chunk, device=k.device)
    lower = (position.view(chunk, 1) >= position.view(1, chunk)).to(k.dtype)
    eye = torch.eye(chunk, dtype=k.dtype, device=k.device)
    A_kk = beta * kk * (lower - eye)  # strictly lower

    # UT transform: W = M Diag(beta) (exp(G) * K), U = M Diag(beta) V, M = (I + A_kk)^-1.
    inverse = _UnitLowerInverse.apply(A_kk, eye)
    return _ChunkTerms(
        q_decayed=decayed.q_decayed,
        A_qk=qk * lower,  # diagonal kept: the output reads the updated state
        W=inverse @ (beta * decayed.k_gamma),
        U=inverse @ (beta * v),
        k_decayed=decayed.k_decayed.transpose(-1, -2),
        decay_last=decayed.decay_last.transpose(-1, -2),
    )


class _DecayTerms(NamedTuple):
    """Products of q and k with decays, `[N, B*H, C, K]` (decay_last `[N, B*H, 1, K]`)."""

    q_decayed: torch.Tensor  # s Q * exp(G)
    k_gamma: torch.Tensor  # K * exp(G)
    k_decayed: torch.Tensor  # K * exp(G_C - G)
    decay_last: torch.Tensor  # exp(G_C)


def _decay_terms(q: torch.Tensor, k: torch.Tensor, G: torch.Tensor) -> _DecayTerms:
    """The decayed q and k products, each decay computed on its own (any decay strength)."""
    gamma = torch.exp(G.to(k.dtype))
    return _DecayTerms(
        q_decayed=q * gamma,
        k_gamma=k * gamma,
        k_decayed=k * torch.exp((G[..., -1:, :] - G).to(k.dtype)),
        decay_last=gamma[..., -1:, :],
    )


def _single_tile_scores(
    q: torch.Tensor, k: torch.Tensor, G: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, _DecayTerms]:
    """Pair scores and decay terms when the whole chunk is one tile (the common, mild case).

    Every decay factors around the chunk's first position: with `R = exp(G - G_1)` in
    `[e^-MAX_TILE_LOG_RANGE, 1]`, the scores are `(K * R)(K / R)^T` and `(Q * R)(K / R)^T`, and
    the decay terms reuse the same three products (`exp(G) = exp(G_1) R`,
    `exp(G_C - G) = R_C / R`): ten elementwise ops on chunk-sized tensors instead of the
    general path's thirteen, and as many fewer in the backward.
    """
    first = torch.exp(G[..., :1, :])  # exp(G_1), [..., 1, K]
    log_relative = G - G[..., :1, :]
    relative = torch.exp(log_relative)
    # Not k / relative: its backward squares `relative`, which underflows fp32 below e^-52.
    k_col = k * torch.exp(-log_relative)
    k_row, q_row = k * relative, q * relative
    k_col_t = k_col.transpose(-1, -2)
    decayed = _DecayTerms(
        q_decayed=q_row * first,
        k_gamma=k_row * first,
        k_decayed=k_col * relative[..., -1:, :],
        decay_last=first * relative[..., -1:, :],
    )
    return k_row @ k_col_t, q_row @ k_col_t, decayed


def _scan_states(
    terms: _ChunkTerms, initial: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The only sequential part: per chunk `V_e = U - W S`, `S <- exp(G_C) * S + K_d^T V_e`.

    Args:
        terms: `_chunk_terms` output; initial: state entering the first chunk `[B*H, K, V]`.

    Returns:
        `(entering [N, B*H, K, V], pseudo_values [N, B*H, C, V], final [B*H, K, V])`.
    """
    # unbind keeps the backward linear in N (indexing would copy whole gradients per chunk).
    per_chunk = zip(*(x.unbind(0) for x in (terms.W, terms.U, terms.k_decayed, terms.decay_last)))
    state = initial
    entering, pseudo_values = [], []
    for W, U, k_decayed_t, decay_last in per_chunk:
        entering.append(state)
        pseudo_values.append(torch.baddbmm(U, W, state, alpha=-1))
        state = torch.baddbmm(decay_last * state, k_decayed_t, pseudo_values[-1])
    return torch.stack(entering), torch.stack(pseudo_values), state


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

    Arguments and shapes as `naive_recurrent_kda`, plus `chunk_size`: tokens per chunk C (a free
    parameter of the algorithm; results are invariant). Returns `(o, S)`: `o [B, T, H, V]` in
    `v.dtype`; `S [B, H, K, V]` in the compute dtype (fp32, fp64 for fp64 inputs), or None.
    """
    check_kda_shapes(q, k, v, g, beta, initial_state)
    batch, seq_len, num_heads, d_key = q.shape
    d_value = v.shape[-1]
    out_dtype, dtype = v.dtype, compute_dtype(v.dtype)
    scale = d_key**-0.5 if scale is None else scale
    chunk = _chunk_length(seq_len, chunk_size)
    if seq_len == 0:
        return naive_recurrent_kda(q, k, v, g, beta, scale, initial_state, output_final_state)
    num_chunks = -(-seq_len // chunk)
    q, k, v, g = (_to_chunks(x.to(dtype), num_chunks, chunk) for x in (q, k, v, g))
    q = q * scale
    beta = _to_chunks(beta.to(dtype), num_chunks, chunk).unsqueeze(-1)  # [N, B*H, C, 1]

    terms = _chunk_terms(q, k, v, g, beta)
    initial = q.new_zeros(batch * num_heads, d_key, d_value)
    if initial_state is not None:
        initial = initial + initial_state.to(dtype).flatten(0, 1)
    entering, pseudo_values, final_state = _scan_states(terms, initial)
    # O = (s Q * exp(G)) S_entering + A_qk V_e, all chunks in one batched matmul each.
    o = terms.q_decayed @ entering + terms.A_qk @ pseudo_values  # [N, B*H, C, V]
    o = o.view(num_chunks, batch, num_heads, chunk, d_value).permute(1, 0, 3, 2, 4)
    o = o.reshape(batch, num_chunks * chunk, num_heads, d_value)[:, :seq_len]
    final_state = final_state.unflatten(0, (batch, num_heads))
    return o.to(out_dtype), (final_state if output_final_state else None)
