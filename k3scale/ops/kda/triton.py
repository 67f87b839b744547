"""Chunked Kimi Delta Attention in Triton, forward and backward; same contract as `chunk_kda`.

Math: `README.md` next to this file (architecture.md 1.3). Per chunk of C tokens, G = cumsum(g),
`D_ij = exp(G_i - G_j)` (masked to 0 for j > i before the exp, never `1/Gamma`), so bounded (K3)
and unbounded (Kimi Linear) gates are both safe:

    A_kk = StrictTril(beta_i sum_c k_i D_ij k_j),  X = (I + A_kk)^-1 (forward substitution)
    W = X (beta Gamma K),  U = X (beta V),  A_qk = Tril(s sum_c q_i D_ij k_j)
    V_e = U - W S,  O = (s Q Gamma) S + A_qk V_e,  S <- Diag(Gamma_C) S + (K exp(G_C - G))^T V_e

Kernels (fp32 inside, fp32 matmuls as 3xTF32 on tensor cores, bf16/fp16/fp32 inputs):
1. `_intra_fwd_kernel`, one program per (chunk, batch*head), all chunks in parallel: G, A_kk,
   its inverse X by forward substitution, W, U, A_qk (stored fp32).
2. `_state_fwd_kernel`, one program per (value block, batch*head): the sequential recurrence over
   chunks; writes O, the state entering each chunk, and the final state.
3. `_state_bwd_kernel`: the same recurrence in reverse; gradients of U, W, A_qk, the q/k decay
   factors and the initial state (per value block; partial sums over value blocks are added in
   torch).
4. `_intra_bwd_kernel`, per chunk in parallel: back through X (dA_kk = -X^T dX X^T), the pair
   scores, the decays and the cumulative sum to dq, dk, dv, dg, dbeta.
The whole backward runs in these Triton kernels (no torch recomputation of the forward; the
forward's G, X, W, U, A_qk and entering states are saved). Per chunk, with incoming dS (state
leaving the chunk), Q_g = s Q Gamma and K_d = K exp(G_C - G):

    dV_e = A_qk^T dO + K_d dS,  dU = dV_e,  dW = -dV_e S^T,  dA_qk = Tril(dO V_e^T)
    dQ_g = dO S^T,  dK_d = V_e dS^T,  dGamma_C = rowsum(dS * S)
    dS_entering = Q_g^T dO + Diag(Gamma_C) dS - W^T dV_e
    dX = dW (beta Gamma K)^T + dU (beta V)^T,  dA_kk = StrictTril(-X^T dX X^T)
    pair scores P_ij = sum_c l_i D_ij r_j: dl_i = sum_j dP_ij D_ij r_j, dr_j = sum_i dP_ij D_ij l_i
    dG_i += sum_j dP_ij l_i D_ij r_j,  dG_j -= the same;  dg = reverse cumsum of dG over the chunk

Pairwise decays are formed as `[C, C, 16-channel]` blocks: readable, exact for any gate, but not
tensor-core tiled; `G` is cumulated in fp32 (the torch path uses fp64 bookkeeping).
Import this module only with Triton present; set `TRITON_INTERPRET=1` before importing it to run
on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3scale.ops.kda.naive import check_kda_shapes

# Channels per pairwise block [C, C, PAIR_BLOCK]; 16 is the smallest tl.dot operand size.
PAIR_BLOCK = 16
# Value channels per program in the state kernels (the state tile is [K, VALUE_BLOCK] fp32).
VALUE_BLOCK = 32
# Launch settings from ahead-of-time compiles for sm_90 (C=64, K=V=128; not timed on a GPU):
# 8 warps spread the register-heavy tiles; one stage, because software pipelining of the per-chunk
# loads multiplies their shared-memory buffers past the 227 KiB per block of H100/H200
# (state kernels: ~270 KiB with the default stages, ~100 KiB with one).
NUM_WARPS = 8
NUM_STAGES = 1
# fp32 matmuls on tensor cores as three TF32 products (hi*hi + hi*lo + lo*hi): close to fp32
# accuracy; "ieee" falls back to FMA loops that spill heavily, plain TF32 costs ~1e-3 relative.
DOT_PRECISION: tl.constexpr = tl.constexpr("tf32x3")


@triton.jit
def _load_tile(
    ptr, base, t0, seq_len, row_stride, col0, num_cols, C: tl.constexpr, W: tl.constexpr
):
    """fp32 `[C, W]` tile of a `[B, T, H, F]` tensor (tokens t0.., channels col0..), zero-padded."""
    rows = t0 + tl.arange(0, C)
    cols = col0 + tl.arange(0, W)
    mask = (rows < seq_len)[:, None] & (cols < num_cols)[None, :]
    offsets = base + rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    return tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _store_tile(
    ptr, value, base, t0, seq_len, row_stride, col0, num_cols, C: tl.constexpr, W: tl.constexpr
):
    rows = t0 + tl.arange(0, C)
    cols = col0 + tl.arange(0, W)
    mask = (rows < seq_len)[:, None] & (cols < num_cols)[None, :]
    offsets = base + rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    tl.store(ptr + offsets, value.to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _chunk_tile(chunk_base, col0, num_cols, C: tl.constexpr, W: tl.constexpr):
    """Offsets and mask of a `[C, W]` tile of a chunk-major buffer `[..., C, num_cols]`."""
    rows = tl.arange(0, C)
    cols = col0 + tl.arange(0, W)
    offsets = chunk_base + rows[:, None] * num_cols + cols[None, :]
    return offsets, (cols < num_cols)[None, :] & (rows >= 0)[:, None]


@triton.jit
def _decay(G, C: tl.constexpr):
    """`D[i, j, c] = exp(G_i[c] - G_j[c])` for j <= i, else 0 (masked before the exp)."""
    i = tl.arange(0, C)[:, None, None]
    j = tl.arange(0, C)[None, :, None]
    diff = G[:, None, :] - G[None, :, :]
    return tl.exp(tl.where(j <= i, diff, float("-inf")))


@triton.jit
def _row(matrix, index, C: tl.constexpr):
    """Row `index` of a `[C, W]` register tile as a `[W]` vector."""
    return tl.sum(tl.where(tl.arange(0, C)[:, None] == index, matrix, 0.0), axis=0)


@triton.jit
def _unit_lower_inverse(A, C: tl.constexpr):
    """`(I + A)^-1` of a strictly lower `[C, C]` A, by forward substitution row by row."""
    rows = tl.arange(0, C)[:, None]
    X = tl.zeros((C, C), dtype=tl.float32)
    for i in range(C):
        a_i = _row(A, i, C)  # [C] over j; zero for j >= i, so unfinished rows of X do not count
        x_i = tl.where(tl.arange(0, C) == i, 1.0, 0.0) - tl.sum(a_i[:, None] * X, axis=0)
        X = tl.where(rows == i, x_i[None, :], X)
    return X


@triton.jit
def _intra_fwd_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, G_ptr, X_ptr, Aqk_ptr, W_ptr, U_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    P: tl.constexpr,
):  # fmt: skip
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    chunk = bh.to(tl.int64) * num_chunks + n  # index into [B*H, N, ...] buffers
    tokens = t0 + tl.arange(0, C)
    beta_offsets = b.to(tl.int64) * seq_len * num_heads + tokens * num_heads + h
    beta = tl.load(beta_ptr + beta_offsets, mask=tokens < seq_len, other=0.0).to(tl.float32)
    A_kk = tl.zeros((C, C), dtype=tl.float32)
    A_qk = tl.zeros((C, C), dtype=tl.float32)
    for c0 in range(0, BK, P):
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        q = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        G = tl.cumsum(_load_tile(g_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P), 0)
        tile, tile_mask = _chunk_tile(chunk * C * K, c0, K, C, P)
        tl.store(G_ptr + tile, G, mask=tile_mask)
        D = _decay(G, C)
        A_kk += tl.sum(k[:, None, :] * D * k[None, :, :], axis=2)
        A_qk += tl.sum(q[:, None, :] * D * k[None, :, :], axis=2)
    strict = tl.arange(0, C)[:, None] > tl.arange(0, C)[None, :]
    X = _unit_lower_inverse(tl.where(strict, beta[:, None] * A_kk, 0.0), C)
    square, square_mask = _chunk_tile(chunk * C * C, 0, C, C, C)
    tl.store(X_ptr + square, X, mask=square_mask)
    tl.store(Aqk_ptr + square, scale * A_qk, mask=square_mask)
    for c0 in range(0, BK, P):
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        G = tl.cumsum(_load_tile(g_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P), 0)
        W = tl.dot(X, beta[:, None] * tl.exp(G) * k, input_precision=DOT_PRECISION)
        tile, tile_mask = _chunk_tile(chunk * C * K, c0, K, C, P)
        tl.store(W_ptr + tile, W, mask=tile_mask)
    v = _load_tile(v_ptr, val_base, t0, seq_len, num_heads * V, 0, V, C, BV)
    U = tl.dot(X, beta[:, None] * v, input_precision=DOT_PRECISION)
    values, values_mask = _chunk_tile(chunk * C * V, 0, V, C, BV)
    tl.store(U_ptr + values, U, mask=values_mask)


@triton.jit
def _load_chunk_operands(
    q_ptr, k_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, key_base, chunk, t0, v0, seq_len, num_heads,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    """q, k (raw), G, W `[C, BK]`, U `[C, BV]` (value block v0) and A_qk `[C, C]` of one chunk."""
    q = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, 0, K, C, BK)
    k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, 0, K, C, BK)
    offsets, mask = _chunk_tile(chunk * C * K, 0, K, C, BK)
    G = tl.load(G_ptr + offsets, mask=mask, other=0.0)
    W = tl.load(W_ptr + offsets, mask=mask, other=0.0)
    offsets, mask = _chunk_tile(chunk * C * V, v0, V, C, BV)
    U = tl.load(U_ptr + offsets, mask=mask, other=0.0)
    offsets, mask = _chunk_tile(chunk * C * C, 0, C, C, C)
    A_qk = tl.load(Aqk_ptr + offsets, mask=mask, other=0.0)
    return q, k, G, W, U, A_qk


@triton.jit
def _state_fwd_kernel(
    q_ptr, k_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, h0_ptr, o_ptr, states_ptr, final_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL: tl.constexpr,
):  # fmt: skip
    vb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    v0 = vb * BV
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    state_offsets, state_mask = _chunk_tile(0, v0, V, BK, BV)
    state_mask = state_mask & (tl.arange(0, BK) < K)[:, None]
    S = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_INITIAL:
        S = tl.load(h0_ptr + bh.to(tl.int64) * K * V + state_offsets, mask=state_mask, other=0.0)
    for n in range(num_chunks):
        chunk = bh.to(tl.int64) * num_chunks + n
        t0 = n * C
        tl.store(states_ptr + chunk * K * V + state_offsets, S, mask=state_mask)
        q, k, G, W, U, A_qk = _load_chunk_operands(
            q_ptr, k_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, key_base, chunk, t0, v0, seq_len,
            num_heads, K, V, C, BK, BV,
        )  # fmt: skip
        V_e = U - tl.dot(W, S, input_precision=DOT_PRECISION)
        o = tl.dot(scale * q * tl.exp(G), S, input_precision=DOT_PRECISION)
        o += tl.dot(A_qk, V_e, input_precision=DOT_PRECISION)
        _store_tile(o_ptr, o, val_base, t0, seq_len, num_heads * V, v0, V, C, BV)
        G_last = _row(G, C - 1, C)
        K_d = k * tl.exp(G_last[None, :] - G)
        S = tl.exp(G_last)[:, None] * S
        S += tl.dot(tl.trans(K_d), V_e, input_precision=DOT_PRECISION)
    tl.store(final_ptr + bh.to(tl.int64) * K * V + state_offsets, S, mask=state_mask)


@triton.jit
def _state_bwd_kernel(
    q_ptr, k_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, states_ptr, do_ptr, dfinal_ptr,
    dA_ptr, dQg_ptr, dKd_ptr, dgam_ptr, dW_ptr, dU_ptr, dh0_ptr,
    seq_len, num_heads, num_chunks, num_programs_bh, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    HAS_FINAL_GRAD: tl.constexpr,
):  # fmt: skip
    """Reverse recurrence. Outputs summing over values are partial per value block `vb`."""
    vb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    v0 = vb * BV
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    state_offsets, state_mask = _chunk_tile(0, v0, V, BK, BV)
    state_mask = state_mask & (tl.arange(0, BK) < K)[:, None]
    dS = tl.zeros((BK, BV), dtype=tl.float32)
    if HAS_FINAL_GRAD:
        dS = tl.load(
            dfinal_ptr + bh.to(tl.int64) * K * V + state_offsets, mask=state_mask, other=0.0
        )
    for i in range(num_chunks):
        n = num_chunks - 1 - i
        chunk = bh.to(tl.int64) * num_chunks + n
        part = vb * num_programs_bh * num_chunks + chunk  # [NV, B*H*N] partial-sum slot
        t0 = n * C
        S = tl.load(states_ptr + chunk * K * V + state_offsets, mask=state_mask, other=0.0)
        q, k, G, W, U, A_qk = _load_chunk_operands(
            q_ptr, k_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, key_base, chunk, t0, v0, seq_len,
            num_heads, K, V, C, BK, BV,
        )  # fmt: skip
        do = _load_tile(do_ptr, val_base, t0, seq_len, num_heads * V, v0, V, C, BV)
        V_e = U - tl.dot(W, S, input_precision=DOT_PRECISION)
        G_last = _row(G, C - 1, C)
        K_d = k * tl.exp(G_last[None, :] - G)
        dV_e = tl.dot(tl.trans(A_qk), do, input_precision=DOT_PRECISION)
        dV_e += tl.dot(K_d, dS, input_precision=DOT_PRECISION)
        offsets, mask = _chunk_tile(part * C * C, 0, C, C, C)
        tl.store(dA_ptr + offsets, tl.dot(do, tl.trans(V_e), input_precision=DOT_PRECISION), mask)
        offsets, mask = _chunk_tile(part * C * K, 0, K, C, BK)
        tl.store(dQg_ptr + offsets, tl.dot(do, tl.trans(S), input_precision=DOT_PRECISION), mask)
        tl.store(dKd_ptr + offsets, tl.dot(V_e, tl.trans(dS), input_precision=DOT_PRECISION), mask)
        dW = -tl.dot(dV_e, tl.trans(S), input_precision=DOT_PRECISION)
        tl.store(dW_ptr + offsets, dW, mask)
        channels = tl.arange(0, BK)
        tl.store(dgam_ptr + part * K + channels, tl.sum(dS * S, axis=1), mask=channels < K)
        offsets, mask = _chunk_tile(chunk * C * V, v0, V, C, BV)
        tl.store(dU_ptr + offsets, dV_e, mask)
        Q_g = scale * q * tl.exp(G)
        dS = tl.exp(G_last)[:, None] * dS + tl.dot(tl.trans(Q_g), do, input_precision=DOT_PRECISION)
        dS -= tl.dot(tl.trans(W), dV_e, input_precision=DOT_PRECISION)
    tl.store(dh0_ptr + bh.to(tl.int64) * K * V + state_offsets, dS, mask=state_mask)


@triton.jit
def _intra_bwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, X_ptr, dA_ptr, dQg_ptr, dKd_ptr, dgam_ptr, dW_ptr,
    dU_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr, dbeta_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    P: tl.constexpr,
):  # fmt: skip
    """Per chunk: from the gradients of A_qk, Q_g, K_d, Gamma_C, W, U to dq, dk, dv, dg, dbeta."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    chunk = bh.to(tl.int64) * num_chunks + n
    tokens = t0 + tl.arange(0, C)
    beta_offsets = b.to(tl.int64) * seq_len * num_heads + tokens * num_heads + h
    beta = tl.load(beta_ptr + beta_offsets, mask=tokens < seq_len, other=0.0).to(tl.float32)
    square, _ = _chunk_tile(chunk * C * C, 0, C, C, C)
    X = tl.load(X_ptr + square)
    i_idx = tl.arange(0, C)[:, None]
    j_idx = tl.arange(0, C)[None, :]
    dA_qk = scale * tl.where(j_idx <= i_idx, tl.load(dA_ptr + square), 0.0)

    # dX from W = X (beta Gamma K) and U = X (beta V); then dv and U's share of dbeta.
    dX = tl.zeros((C, C), dtype=tl.float32)
    for c0 in range(0, BK, P):
        tile, tile_mask = _chunk_tile(chunk * C * K, c0, K, C, P)
        G = tl.load(G_ptr + tile, mask=tile_mask, other=0.0)
        dW = tl.load(dW_ptr + tile, mask=tile_mask, other=0.0)
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        dX += tl.dot(dW, tl.trans(beta[:, None] * tl.exp(G) * k), input_precision=DOT_PRECISION)
    v = _load_tile(v_ptr, val_base, t0, seq_len, num_heads * V, 0, V, C, BV)
    values, values_mask = _chunk_tile(chunk * C * V, 0, V, C, BV)
    dU = tl.load(dU_ptr + values, mask=values_mask, other=0.0)
    dX += tl.dot(dU, tl.trans(beta[:, None] * v), input_precision=DOT_PRECISION)
    dR_U = tl.dot(tl.trans(X), dU, input_precision=DOT_PRECISION)
    _store_tile(dv_ptr, beta[:, None] * dR_U, val_base, t0, seq_len, num_heads * V, 0, V, C, BV)
    dbeta = tl.sum(dR_U * v, axis=1)
    # X = (I + A_kk)^-1  =>  dA_kk = -X^T dX X^T (strictly lower part); A_kk = beta_i KK_ij.
    dA_kk = -tl.dot(tl.trans(X), tl.dot(dX, tl.trans(X), input_precision=DOT_PRECISION),
                    input_precision=DOT_PRECISION)  # fmt: skip
    dA_kk = tl.where(j_idx < i_idx, dA_kk, 0.0)
    dKK = beta[:, None] * dA_kk
    KK = tl.zeros((C, C), dtype=tl.float32)

    for c0 in range(0, BK, P):
        tile, tile_mask = _chunk_tile(chunk * C * K, c0, K, C, P)
        G = tl.load(G_ptr + tile, mask=tile_mask, other=0.0)
        dW = tl.load(dW_ptr + tile, mask=tile_mask, other=0.0)
        dQ_g = tl.load(dQg_ptr + tile, mask=tile_mask, other=0.0)
        dK_d = tl.load(dKd_ptr + tile, mask=tile_mask, other=0.0)
        channels = c0 + tl.arange(0, P)
        dgam = tl.load(dgam_ptr + chunk * K + channels, mask=channels < K, other=0.0)
        q = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        D = _decay(G, C)
        # Pair scores A_qk = s sum_c q_i D_ij k_j and KK = sum_c k_i D_ij k_j (d/dG_i = -d/dG_j).
        P_q = dA_qk[:, :, None] * D
        P_k = dKK[:, :, None] * D
        dq = tl.sum(P_q * k[None, :, :], axis=1)
        dk = tl.sum(P_q * q[:, None, :], axis=0)
        dk += tl.sum(P_k * k[None, :, :], axis=1) + tl.sum(P_k * k[:, None, :], axis=0)
        E = q[:, None, :] * P_q * k[None, :, :] + k[:, None, :] * P_k * k[None, :, :]
        dG = tl.sum(E, axis=1) - tl.sum(E, axis=0)
        KK += tl.sum(k[:, None, :] * D * k[None, :, :], axis=2)
        # Q_g = s q Gamma.
        gamma = tl.exp(G)
        dq += scale * gamma * dQ_g
        dG += scale * q * gamma * dQ_g
        # K_d = k exp(G_C - G) and Gamma_C = exp(G_C).
        G_last = _row(G, C - 1, C)
        decay_to_end = tl.exp(G_last[None, :] - G)
        dk += decay_to_end * dK_d
        to_end = k * decay_to_end * dK_d
        dG -= to_end
        dG_last = tl.sum(to_end, axis=0) + tl.exp(G_last) * dgam
        dG += tl.where(i_idx == C - 1, dG_last[None, :], 0.0)
        # W = X (beta Gamma K).
        dR_W = tl.dot(tl.trans(X), dW, input_precision=DOT_PRECISION)
        dk += beta[:, None] * gamma * dR_W
        dG += beta[:, None] * gamma * k * dR_W
        dbeta += tl.sum(dR_W * gamma * k, axis=1)
        # G = cumsum(g) over the chunk: dg is the reverse cumulative sum.
        dg = tl.cumsum(dG, axis=0, reverse=True)
        _store_tile(dq_ptr, dq, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        _store_tile(dk_ptr, dk, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
        _store_tile(dg_ptr, dg, key_base, t0, seq_len, num_heads * K, c0, K, C, P)
    dbeta += tl.sum(dA_kk * KK, axis=1)
    tl.store(dbeta_ptr + beta_offsets, dbeta, mask=tokens < seq_len)


def _block(size: int) -> int:
    """Power-of-two register width >= size and >= 16 (the smallest tl.dot operand)."""
    return max(16, triton.next_power_of_2(size))


def _chunk_length(seq_len: int, chunk_size: int) -> int:
    """C = chunk_size (a power of two >= 16), or the shortest such length covering short T."""
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: must be a power of two >= 16 for Triton, got {chunk_size}")
    return min(chunk_size, _block(seq_len))


class _ChunkKdaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, chunk):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        batch, seq_len, num_heads, d_key = q.shape
        d_value = v.shape[-1]
        num_chunks = triton.cdiv(seq_len, chunk)
        rows = batch * num_heads * num_chunks
        f32 = dict(dtype=torch.float32, device=q.device)
        G = torch.empty(rows, chunk, d_key, **f32)
        X, A_qk = (torch.empty(rows, chunk, chunk, **f32) for _ in range(2))
        W, U = torch.empty(rows, chunk, d_key, **f32), torch.empty(rows, chunk, d_value, **f32)
        sizes = dict(K=d_key, V=d_value, C=chunk, BK=_block(d_key))
        _intra_fwd_kernel[(num_chunks, batch * num_heads)](
            q, k, v, g, beta, G, X, A_qk, W, U, seq_len, num_heads, num_chunks, scale,
            BV=_block(d_value), P=PAIR_BLOCK, num_warps=NUM_WARPS, num_stages=NUM_STAGES, **sizes,
        )  # fmt: skip
        o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        states = torch.empty(rows, d_key, d_value, **f32)
        final = torch.empty(batch, num_heads, d_key, d_value, **f32)
        h0 = final if initial_state is None else initial_state.float().contiguous()
        value_block = min(VALUE_BLOCK, _block(d_value))
        _state_fwd_kernel[(triton.cdiv(d_value, value_block), batch * num_heads)](
            q, k, G, A_qk, W, U, h0, o, states, final, seq_len, num_heads, num_chunks, scale,
            BV=value_block, HAS_INITIAL=initial_state is not None, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, **sizes,
        )  # fmt: skip
        ctx.save_for_backward(q, k, v, beta, G, X, A_qk, W, U, states)
        ctx.scale, ctx.chunk, ctx.value_block = scale, chunk, value_block
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        ctx.initial_dtype = None if initial_state is None else initial_state.dtype
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        q, k, v, beta, G, X, A_qk, W, U, states = ctx.saved_tensors
        batch, seq_len, num_heads, d_key = q.shape
        d_value, chunk, value_block = v.shape[-1], ctx.chunk, ctx.value_block
        num_chunks = triton.cdiv(seq_len, chunk)
        rows, num_value_blocks = batch * num_heads * num_chunks, triton.cdiv(d_value, value_block)
        f32 = dict(dtype=torch.float32, device=q.device)
        dA = torch.empty(num_value_blocks, rows, chunk, chunk, **f32)
        dQg, dKd, dW = (torch.empty(num_value_blocks, rows, chunk, d_key, **f32) for _ in range(3))
        dgam = torch.empty(num_value_blocks, rows, d_key, **f32)
        dU = torch.empty(rows, chunk, d_value, **f32)
        dh0 = torch.empty(batch, num_heads, d_key, d_value, **f32)
        d_o = torch.zeros_like(v) if d_o is None else d_o.contiguous()
        sizes = dict(K=d_key, V=d_value, C=chunk, BK=_block(d_key))
        _state_bwd_kernel[(num_value_blocks, batch * num_heads)](
            q, k, G, A_qk, W, U, states, d_o, dh0 if d_final is None else d_final.contiguous(),
            dA, dQg, dKd, dgam, dW, dU, dh0, seq_len, num_heads, num_chunks, batch * num_heads,
            ctx.scale, BV=value_block, HAS_FINAL_GRAD=d_final is not None, num_warps=NUM_WARPS,
            num_stages=NUM_STAGES, **sizes,
        )  # fmt: skip
        dA, dQg, dKd, dgam, dW = (x.sum(0) for x in (dA, dQg, dKd, dgam, dW))
        dq, dk, dg = (torch.empty(q.shape, **f32) for _ in range(3))
        dv, dbeta = torch.empty(v.shape, **f32), torch.empty(beta.shape, **f32)
        _intra_bwd_kernel[(num_chunks, batch * num_heads)](
            q, k, v, beta, G, X, dA, dQg, dKd, dgam, dW, dU, dq, dk, dv, dg, dbeta,
            seq_len, num_heads, num_chunks, ctx.scale, BV=_block(d_value), P=PAIR_BLOCK,
            num_warps=NUM_WARPS, num_stages=NUM_STAGES, **sizes,
        )  # fmt: skip
        grads = (x.to(dtype) for x, dtype in zip((dq, dk, dv, dg, dbeta), ctx.dtypes))
        dh0 = None if ctx.initial_dtype is None else dh0.to(ctx.initial_dtype)
        return (*grads, dh0, None, None)


def chunk_kda_triton(
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
    """KDA over chunks in Triton kernels (forward and backward); same contract as `chunk_kda`.

    Inputs in fp32, bf16 or fp16, bounded or unbounded gates; `chunk_size` a power of two >= 16
    (short sequences use less). The final state `S` is fp32.
    """
    check_kda_shapes(q, k, v, g, beta, initial_state)
    if q.shape[1] < 1:
        raise ValueError("q: need at least one token (T >= 1)")
    for name, x in {"q": q, "k": k, "v": v, "g": g, "beta": beta}.items():
        if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"{name}: Triton KDA takes fp32/bf16/fp16, got {x.dtype}")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    chunk = _chunk_length(q.shape[1], chunk_size)
    o, final = _ChunkKdaFunction.apply(q, k, v, g, beta, initial_state, scale, chunk)
    return o, (final if output_final_state else None)
