"""Chunked Kimi Delta Attention in Triton, forward and backward; same contract as `chunk_kda`.

Math: `README.md` next to this file (architecture.md 1.3). Per chunk of C tokens, G = cumsum(g),
`D_ij = exp(G_i - G_j)` for j <= i (never `1/Gamma`), so bounded (K3) and unbounded (Kimi Linear)
gates are both safe (log decays g <= 0):

    A_kk = StrictTril(beta_i sum_c k_i D_ij k_j),  X = (I + A_kk)^-1 (forward substitution)
    W = X (beta Gamma K),  U = X (beta V),  A_qk = Tril(s sum_c q_i D_ij k_j)
    V_e = U - W S,  O = (s Q Gamma) S + A_qk V_e,  S <- Diag(Gamma_C) S + (K exp(G_C - G))^T V_e

Pair scores `sum_c l_i D_ij r_j` run on tensor cores per sub-chunk of BC = 16 rows: columns
before the sub-chunk factor around `G_{s-1}` (its entering log decay), `exp(G_i - G_{s-1})` and
`exp(G_{s-1} - G_j)`, both <= 1; only the BC x BC diagonal block is formed column by column from
exact differences. Channel tiles are 16-32 wide (state kernels: K/2 halves above K = 64), so no
kernel holds a whole [C, K] chunk and none spills registers on sm_90 (compile-only check).

Kernels (fp32 inside, fp32 matmuls as TF32 on tensor cores, bf16/fp16/fp32 inputs):
1. `_cumsum_kernel`, per (chunk, batch*head): G, stored once so every tile reads the same values.
2. `_pair_fwd_kernel`, per (sub-chunk, batch*head): rows of KK (A_kk without beta) and A_qk.
3. `_solve_fwd_kernel`, per chunk: X by forward substitution; W, U, Q_g = s Q Gamma and
   K_d = K exp(G_C - G), so the state kernels load operands instead of recomputing them.
4. `_state_fwd_kernel`, per (value block, batch*head): the sequential recurrence over chunks;
   writes O, V_e, the state entering each chunk, and the final state.
5. `_state_bwd_kernel`: the same recurrence in reverse; writes dS (gradient of the state leaving
   each chunk), dV_e (= dU) and the initial state's gradient. Nothing else is sequential.
6. `_local_bwd_kernel`, per chunk: the state products (dA_qk, dQ_g, dK_d, dW, dGamma_C from the
   saved states, V_e and dS, summed over all values), then back through X (dA_kk = -X^T dX X^T),
   W, U, Q_g, K_d, Gamma_C to dv, dbeta and the per-token parts of dq, dk, dG.
7. `_pair_bwd_kernel`, per (chunk, batch*head, channel tile): back through the pair scores, then
   dg as the reverse cumulative sum of dG (sub-chunks last to first).
The backward runs in these kernels. Saved by the forward (fp32): G, W, Q_g, K_d, KK, X, A_qk, V_e
(4 K + 3 C + V values per token and head) and the state entering each chunk (K V per chunk and
head); the backward adds dS per chunk and 3 K + 2 C + V per token of scratch. Per chunk, with
incoming dS (state leaving the chunk):

    dV_e = A_qk^T dO + K_d dS,  dU = dV_e,  dW = -dV_e S^T,  dA_qk = Tril(dO V_e^T)
    dQ_g = dO S^T,  dK_d = V_e dS^T,  dGamma_C = rowsum(dS * S)
    dS_entering = Q_g^T dO + Diag(Gamma_C) dS - W^T dV_e
    dX = dW (beta Gamma K)^T + dU (beta V)^T,  dA_kk = StrictTril(-X^T dX X^T)
    pair scores P_ij = sum_c l_i D_ij r_j: dl_i = sum_j dP_ij D_ij r_j, dr_j = sum_i dP_ij D_ij l_i
    dG_i += l_i dl_i,  dG_j -= r_j dr_j;  dg = reverse cumsum of dG over the chunk

`G` is cumulated in fp32 (the torch path uses fp64 bookkeeping). Import this module only with
Triton present; set `TRITON_INTERPRET=1` before importing it to run on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3scale.ops.kda.naive import check_kda_shapes

# Rows per sub-chunk of the pair scores: 16 is the smallest tl.dot operand size, and the exact
# (CUDA-core) diagonal blocks cost C * BC * K exps per chunk.
SUB_CHUNK = 16
# Tile sizes, chosen with the launch settings below from ahead-of-time compiles for sm_90
# (`benchmarks/gpu_check.py --compile-only`: C=64, K=V=64 and 128, bf16 and fp32 inputs): the
# largest with no register spills and shared memory under the 227 KiB per block of H100/H200.
# Not yet timed on a GPU. Channel and value tiles of the per-chunk kernels:
KEY_TILE = 32
VALUE_TILE = 32
# `_local_bwd_kernel` holds X, dX and three [C, tile] state-product accumulators at once: 16-wide
# tiles keep it at ~150 registers (32-wide: 255 with a spill for K = 128 fp32).
LOCAL_TILE = 16
# Values per program of the state kernels (each holds [K, VALUE_BLOCK] fp32 of state, as two key
# halves above K = 64); 32 spills in the backward recurrence.
VALUE_BLOCK = 16
# (num_warps, num_stages) per kernel. One stage: software pipelining of the per-chunk loads
# multiplies their shared-memory buffers and registers for no gain in the sequential kernels.
LAUNCH = {
    "_cumsum_kernel": (4, 1),
    "_pair_fwd_kernel": (4, 1),
    "_solve_fwd_kernel": (8, 1),
    "_state_fwd_kernel": (8, 1),
    "_state_bwd_kernel": (8, 1),
    "_local_bwd_kernel": (8, 1),
    "_pair_bwd_kernel": (8, 1),
}
# fp32 matmuls on tensor cores as TF32 (10-bit mantissa operands, fp32 accumulation; Triton's
# default for fp32 dots): ~1e-3 relative error on fp32 inputs, invisible under the bf16 rounding
# of bf16 outputs. "tf32x3" (hi*hi + hi*lo + lo*hi, ~fp32 accuracy) triples the tensor-core work
# and, holding three register copies of each operand, spilled 16-1300 bytes per thread in the
# state and backward kernels at every tiling tried (4 or 8 warps, 16- or 32-wide tiles).
# The interpreter ignores the setting (tests compare in full fp32).
DOT_PRECISION: tl.constexpr = tl.constexpr("tf32")


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
def _rows_tile(chunk, row0, col0, num_cols, R: tl.constexpr, W: tl.constexpr, C: tl.constexpr):
    """Offsets and mask of an `[R, W]` tile (rows row0.., channels col0..) of a chunk-major
    buffer `[..., C, num_cols]`."""
    rows = row0 + tl.arange(0, R)
    cols = col0 + tl.arange(0, W)
    offsets = chunk * C * num_cols + rows[:, None] * num_cols + cols[None, :]
    return offsets, (cols < num_cols)[None, :] & (rows < C)[:, None]


@triton.jit
def _cumsum_kernel(
    g_ptr, G_ptr, seq_len, num_heads, num_chunks,
    K: tl.constexpr, C: tl.constexpr, KT: tl.constexpr,
):  # fmt: skip
    """G = cumsum(g) within each chunk, stored once so every later tile reads identical values."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    chunk = bh.to(tl.int64) * num_chunks + n
    for c0 in range(0, K, KT):
        g = _load_tile(g_ptr, key_base, n * C, seq_len, num_heads * K, c0, K, C, KT)
        offsets, mask = _rows_tile(chunk, 0, c0, K, C, KT, C)
        tl.store(G_ptr + offsets, tl.cumsum(g, 0), mask=mask)


@triton.jit
def _pair_fwd_kernel(
    q_ptr, k_ptr, G_ptr, KK_ptr, Aqk_ptr, seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, KT: tl.constexpr,
):  # fmt: skip
    """Rows s..s+BC of KK = StrictTril(sum_c k_i D_ij k_j) and A_qk = Tril(s sum_c q_i D_ij k_j).

    Columns before the sub-chunk: one tensor-core product around the reference G_{s-1}, both
    factors exp(G_i - G_{s-1}) and exp(G_{s-1} - G_j) <= 1 (g <= 0). The diagonal BC x BC block
    is formed column by column from exact differences G_i - G_j (any gate strength).
    """
    pid, bh = tl.program_id(0), tl.program_id(1)
    n, s = pid // (C // BC), (pid % (C // BC)) * BC
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    chunk = bh.to(tl.int64) * num_chunks + n
    local = tl.arange(0, BC)
    cols = tl.arange(0, C)
    before = (cols < s)[:, None]
    A_kk = tl.zeros((BC, C), dtype=tl.float32)
    A_qk = tl.zeros((BC, C), dtype=tl.float32)
    for c0 in range(0, K, KT):
        channels = c0 + tl.arange(0, KT)
        offsets, mask = _rows_tile(chunk, s, c0, K, BC, KT, C)
        G_rows = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        ref_offsets = chunk * C * K + tl.maximum(s - 1, 0) * K + channels
        ref = tl.load(
            G_ptr + ref_offsets, mask=(channels < K) & (tl.full((KT,), s, tl.int32) > 0), other=0.0
        )
        q_rows = _load_tile(q_ptr, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        k_rows = _load_tile(k_ptr, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        offsets, mask = _rows_tile(chunk, 0, c0, K, C, KT, C)
        G_all = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        k_all = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, KT)
        k_before = tl.where(
            before, k_all * tl.exp(tl.where(before, ref[None, :] - G_all, 0.0)), 0.0
        )
        to_ref = tl.exp(G_rows - ref[None, :])
        A_kk += tl.dot(k_rows * to_ref, tl.trans(k_before), input_precision=DOT_PRECISION)
        A_qk += tl.dot(q_rows * to_ref, tl.trans(k_before), input_precision=DOT_PRECISION)
        for jj in range(BC):
            k_j = tl.load(
                k_ptr + key_base + (t0 + s + jj).to(tl.int64) * num_heads * K + channels,
                mask=(channels < K) & (channels * 0 + t0 + s + jj < seq_len), other=0.0,
            ).to(tl.float32)  # fmt: skip
            G_j = tl.load(G_ptr + chunk * C * K + (s + jj) * K + channels, mask=channels < K)
            D = tl.exp(tl.where(local[:, None] >= jj, G_rows - G_j[None, :], float("-inf")))
            kD = D * k_j[None, :]
            on_j = cols[None, :] == s + jj
            A_kk = tl.where(on_j, A_kk + tl.sum(k_rows * kD, axis=1)[:, None], A_kk)
            A_qk = tl.where(on_j, A_qk + tl.sum(q_rows * kD, axis=1)[:, None], A_qk)
    offsets, _ = _rows_tile(chunk, s, 0, C, BC, C, C)
    row_index = (s + local)[:, None]
    tl.store(KK_ptr + offsets, tl.where(cols[None, :] < row_index, A_kk, 0.0))
    tl.store(Aqk_ptr + offsets, tl.where(cols[None, :] <= row_index, scale * A_qk, 0.0))


@triton.jit
def _solve_fwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, G_ptr, KK_ptr, X_ptr, W_ptr, U_ptr, Qg_ptr, Kd_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, KT: tl.constexpr, VT: tl.constexpr,
):  # fmt: skip
    """X = (I + beta KK)^-1 by forward substitution; W, U and the state kernels' Q_g, K_d."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    chunk = bh.to(tl.int64) * num_chunks + n
    index = tl.arange(0, C)
    tokens = t0 + index
    beta_offsets = b.to(tl.int64) * seq_len * num_heads + tokens * num_heads + h
    beta = tl.load(beta_ptr + beta_offsets, mask=tokens < seq_len, other=0.0).to(tl.float32)
    X = tl.zeros((C, C), dtype=tl.float32)
    for i in range(C):
        # Row i of beta KK is zero from column i on, so unfinished rows of X do not count.
        a_i = tl.sum(tl.where(index == i, beta, 0.0)) * tl.load(
            KK_ptr + chunk * C * C + i * C + index
        )
        x_i = tl.where(index == i, 1.0, 0.0) - tl.sum(a_i[:, None] * X, axis=0)
        X = tl.where(index[:, None] == i, x_i[None, :], X)
    square, _ = _rows_tile(chunk, 0, 0, C, C, C, C)
    tl.store(X_ptr + square, X)
    for c0 in range(0, K, KT):
        channels = c0 + tl.arange(0, KT)
        offsets, mask = _rows_tile(chunk, 0, c0, K, C, KT, C)
        G = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        G_last = tl.load(G_ptr + chunk * C * K + (C - 1) * K + channels, mask=channels < K)
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, KT)
        gamma = tl.exp(G)
        W = tl.dot(X, beta[:, None] * gamma * k, input_precision=DOT_PRECISION)
        tl.store(W_ptr + offsets, W, mask=mask)
        tl.store(Kd_ptr + offsets, k * tl.exp(G_last[None, :] - G), mask=mask)
        q = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, KT)
        tl.store(Qg_ptr + offsets, scale * q * gamma, mask=mask)
    for v0 in range(0, V, VT):
        v = _load_tile(v_ptr, val_base, t0, seq_len, num_heads * V, v0, V, C, VT)
        offsets, mask = _rows_tile(chunk, 0, v0, V, C, VT, C)
        tl.store(U_ptr + offsets, tl.dot(X, beta[:, None] * v, input_precision=DOT_PRECISION), mask)


@triton.jit
def _state_half(bh, k0, v0, K: tl.constexpr, V: tl.constexpr, KH: tl.constexpr, BV: tl.constexpr):
    """Offsets and mask of rows k0..k0+KH, values v0..v0+BV of a `[..., K, V]` state."""
    rows = k0 + tl.arange(0, KH)
    cols = v0 + tl.arange(0, BV)
    offsets = bh * K * V + rows[:, None] * V + cols[None, :]
    return offsets, (rows < K)[:, None] & (cols < V)[None, :]


@triton.jit
def _key_half(ptr, chunk, k0, K: tl.constexpr, C: tl.constexpr, KH: tl.constexpr):
    """`[C, KH]` tile (channels k0..) of a chunk-major `[..., C, K]` buffer, zero-padded."""
    offsets, mask = _rows_tile(chunk, 0, k0, K, C, KH, C)
    return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _gamma_half(G_ptr, chunk, k0, K: tl.constexpr, C: tl.constexpr, KH: tl.constexpr):
    """Gamma_C = exp(G_C) over channels k0..k0+KH."""
    channels = k0 + tl.arange(0, KH)
    G_last = tl.load(G_ptr + chunk * C * K + (C - 1) * K + channels, mask=channels < K, other=0.0)
    return tl.exp(G_last)


@triton.jit
def _state_fwd_kernel(
    Qg_ptr, Kd_ptr, G_ptr, Aqk_ptr, W_ptr, U_ptr, h0_ptr, o_ptr, states_ptr, Ve_ptr, final_ptr,
    seq_len, num_heads, num_chunks,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, KH: tl.constexpr, BV: tl.constexpr,
    HAS_INITIAL: tl.constexpr,
):  # fmt: skip
    """The state is held as two key halves S0 (channels < KH) and S1 (KH..2 KH; unused when
    K <= KH), so each matmul operand is a [C, KH] tile rather than the whole [C, K]."""
    vb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    v0 = vb * BV
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    TWO: tl.constexpr = K > KH
    half0, mask0 = _state_half(bh.to(tl.int64), 0, v0, K, V, KH, BV)
    half1, mask1 = _state_half(bh.to(tl.int64), KH, v0, K, V, KH, BV)
    S0 = tl.zeros((KH, BV), dtype=tl.float32)
    S1 = tl.zeros((KH, BV), dtype=tl.float32)
    if HAS_INITIAL:
        S0 = tl.load(h0_ptr + half0, mask=mask0, other=0.0)
        if TWO:
            S1 = tl.load(h0_ptr + half1, mask=mask1, other=0.0)
    for n in range(num_chunks):
        chunk = bh.to(tl.int64) * num_chunks + n
        step = chunk * K * V - bh.to(tl.int64) * K * V  # state offsets are relative to bh
        tl.store(states_ptr + step + half0, S0, mask=mask0)
        offsets, mask = _rows_tile(chunk, 0, v0, V, C, BV, C)
        V_e = tl.load(U_ptr + offsets, mask=mask, other=0.0)
        V_e -= tl.dot(_key_half(W_ptr, chunk, 0, K, C, KH), S0, input_precision=DOT_PRECISION)
        o = tl.dot(_key_half(Qg_ptr, chunk, 0, K, C, KH), S0, input_precision=DOT_PRECISION)
        if TWO:
            tl.store(states_ptr + step + half1, S1, mask=mask1)
            V_e -= tl.dot(_key_half(W_ptr, chunk, KH, K, C, KH), S1, input_precision=DOT_PRECISION)
            o += tl.dot(_key_half(Qg_ptr, chunk, KH, K, C, KH), S1, input_precision=DOT_PRECISION)
        square, _ = _rows_tile(chunk, 0, 0, C, C, C, C)
        tl.store(Ve_ptr + offsets, V_e, mask=mask)
        o += tl.dot(tl.load(Aqk_ptr + square), V_e, input_precision=DOT_PRECISION)
        _store_tile(o_ptr, o, val_base, n * C, seq_len, num_heads * V, v0, V, C, BV)
        K_d = _key_half(Kd_ptr, chunk, 0, K, C, KH)
        S0 = _gamma_half(G_ptr, chunk, 0, K, C, KH)[:, None] * S0
        S0 += tl.dot(tl.trans(K_d), V_e, input_precision=DOT_PRECISION)
        if TWO:
            K_d = _key_half(Kd_ptr, chunk, KH, K, C, KH)
            S1 = _gamma_half(G_ptr, chunk, KH, K, C, KH)[:, None] * S1
            S1 += tl.dot(tl.trans(K_d), V_e, input_precision=DOT_PRECISION)
    tl.store(final_ptr + half0, S0, mask=mask0)
    if TWO:
        tl.store(final_ptr + half1, S1, mask=mask1)


@triton.jit
def _state_bwd_kernel(
    Qg_ptr, Kd_ptr, G_ptr, Aqk_ptr, W_ptr, do_ptr, dfinal_ptr, dstates_ptr, dU_ptr, dh0_ptr,
    seq_len, num_heads, num_chunks,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, KH: tl.constexpr, BV: tl.constexpr,
    HAS_FINAL_GRAD: tl.constexpr,
):  # fmt: skip
    """Reverse recurrence, key halves as in the forward: per chunk, stores dS (gradient of the
    state leaving it) and dV_e (= dU); the products of dS and dV_e with the saved states and
    V_e run chunk-parallel in `_local_bwd_kernel`."""
    vb, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    v0 = vb * BV
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    TWO: tl.constexpr = K > KH
    half0, mask0 = _state_half(bh.to(tl.int64), 0, v0, K, V, KH, BV)
    half1, mask1 = _state_half(bh.to(tl.int64), KH, v0, K, V, KH, BV)
    dS0 = tl.zeros((KH, BV), dtype=tl.float32)
    dS1 = tl.zeros((KH, BV), dtype=tl.float32)
    if HAS_FINAL_GRAD:
        dS0 = tl.load(dfinal_ptr + half0, mask=mask0, other=0.0)
        if TWO:
            dS1 = tl.load(dfinal_ptr + half1, mask=mask1, other=0.0)
    for i in range(num_chunks):
        n = num_chunks - 1 - i
        chunk = bh.to(tl.int64) * num_chunks + n
        step = chunk * K * V - bh.to(tl.int64) * K * V
        tl.store(dstates_ptr + step + half0, dS0, mask=mask0)
        do = _load_tile(do_ptr, val_base, n * C, seq_len, num_heads * V, v0, V, C, BV)
        square, _ = _rows_tile(chunk, 0, 0, C, C, C, C)
        dV_e = tl.dot(tl.trans(tl.load(Aqk_ptr + square)), do, input_precision=DOT_PRECISION)
        dV_e += tl.dot(_key_half(Kd_ptr, chunk, 0, K, C, KH), dS0, input_precision=DOT_PRECISION)
        if TWO:
            tl.store(dstates_ptr + step + half1, dS1, mask=mask1)
            K_d1 = _key_half(Kd_ptr, chunk, KH, K, C, KH)
            dV_e += tl.dot(K_d1, dS1, input_precision=DOT_PRECISION)
        offsets, mask = _rows_tile(chunk, 0, v0, V, C, BV, C)
        tl.store(dU_ptr + offsets, dV_e, mask)
        # dS entering = Diag(Gamma_C) dS + Q_g^T dO - W^T dV_e.
        dS0 = _gamma_half(G_ptr, chunk, 0, K, C, KH)[:, None] * dS0
        Q_g = _key_half(Qg_ptr, chunk, 0, K, C, KH)
        dS0 += tl.dot(tl.trans(Q_g), do, input_precision=DOT_PRECISION)
        W = _key_half(W_ptr, chunk, 0, K, C, KH)
        dS0 -= tl.dot(tl.trans(W), dV_e, input_precision=DOT_PRECISION)
        if TWO:
            dS1 = _gamma_half(G_ptr, chunk, KH, K, C, KH)[:, None] * dS1
            Q_g = _key_half(Qg_ptr, chunk, KH, K, C, KH)
            dS1 += tl.dot(tl.trans(Q_g), do, input_precision=DOT_PRECISION)
            W = _key_half(W_ptr, chunk, KH, K, C, KH)
            dS1 -= tl.dot(tl.trans(W), dV_e, input_precision=DOT_PRECISION)
    tl.store(dh0_ptr + half0, dS0, mask=mask0)
    if TWO:
        tl.store(dh0_ptr + half1, dS1, mask=mask1)


@triton.jit
def _local_bwd_kernel(
    q_ptr, k_ptr, v_ptr, beta_ptr, do_ptr, G_ptr, X_ptr, KK_ptr, Ve_ptr, states_ptr,
    dstates_ptr, dU_ptr, dA_ptr, dKK_ptr, dq_ptr, dk_ptr, dG_ptr, dv_ptr, dbeta_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, V: tl.constexpr, C: tl.constexpr, LKT: tl.constexpr, LVT: tl.constexpr,
):  # fmt: skip
    """Per chunk: the state products dA_qk = dO V_e^T, dQ_g = dO S^T, dK_d = V_e dS^T,
    dW = -dV_e S^T, dGamma_C = rowsum(dS * S); then back through X, W, U, Q_g, K_d and Gamma_C.
    Writes dA_qk, dv, dbeta, the pair-score gradient dKK and the per-token parts of dq, dk, dG
    (chunk-major; the pair terms come next)."""
    n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    val_base = b.to(tl.int64) * seq_len * num_heads * V + h * V
    chunk = bh.to(tl.int64) * num_chunks + n
    index = tl.arange(0, C)
    tokens = t0 + index
    beta_offsets = b.to(tl.int64) * seq_len * num_heads + tokens * num_heads + h
    beta = tl.load(beta_ptr + beta_offsets, mask=tokens < seq_len, other=0.0).to(tl.float32)
    square, _ = _rows_tile(chunk, 0, 0, C, C, C, C)
    X = tl.load(X_ptr + square)
    # U = X (beta V): dX's U part, dv and U's share of dbeta; dA_qk over value tiles.
    dX = tl.zeros((C, C), dtype=tl.float32)
    dA = tl.zeros((C, C), dtype=tl.float32)
    dbeta = tl.zeros((C,), dtype=tl.float32)
    for v0 in range(0, V, LVT):
        v = _load_tile(v_ptr, val_base, t0, seq_len, num_heads * V, v0, V, C, LVT)
        do = _load_tile(do_ptr, val_base, t0, seq_len, num_heads * V, v0, V, C, LVT)
        offsets, mask = _rows_tile(chunk, 0, v0, V, C, LVT, C)
        dU = tl.load(dU_ptr + offsets, mask=mask, other=0.0)
        V_e = tl.load(Ve_ptr + offsets, mask=mask, other=0.0)
        dA += tl.dot(do, tl.trans(V_e), input_precision=DOT_PRECISION)
        dX += tl.dot(dU, tl.trans(beta[:, None] * v), input_precision=DOT_PRECISION)
        dR_U = tl.dot(tl.trans(X), dU, input_precision=DOT_PRECISION)
        dv = beta[:, None] * dR_U
        _store_tile(dv_ptr, dv, val_base, t0, seq_len, num_heads * V, v0, V, C, LVT)
        dbeta += tl.sum(dR_U * v, axis=1)
    tl.store(dA_ptr + square, dA)
    for c0 in range(0, K, LKT):
        channels = c0 + tl.arange(0, LKT)
        # State products for this key tile, summed over value tiles.
        dQ_g = tl.zeros((C, LKT), dtype=tl.float32)
        dK_d = tl.zeros((C, LKT), dtype=tl.float32)
        dW = tl.zeros((C, LKT), dtype=tl.float32)
        dgam = tl.zeros((LKT,), dtype=tl.float32)
        for v0 in range(0, V, LVT):
            do = _load_tile(do_ptr, val_base, t0, seq_len, num_heads * V, v0, V, C, LVT)
            offsets, mask = _rows_tile(chunk, 0, v0, V, C, LVT, C)
            dU = tl.load(dU_ptr + offsets, mask=mask, other=0.0)
            V_e = tl.load(Ve_ptr + offsets, mask=mask, other=0.0)
            state = chunk * K * V + channels[:, None] * V + (v0 + tl.arange(0, LVT))[None, :]
            state_mask = (channels < K)[:, None] & (v0 + tl.arange(0, LVT) < V)[None, :]
            S = tl.load(states_ptr + state, mask=state_mask, other=0.0)
            dS = tl.load(dstates_ptr + state, mask=state_mask, other=0.0)
            dQ_g += tl.dot(do, tl.trans(S), input_precision=DOT_PRECISION)
            dK_d += tl.dot(V_e, tl.trans(dS), input_precision=DOT_PRECISION)
            dW -= tl.dot(dU, tl.trans(S), input_precision=DOT_PRECISION)
            dgam += tl.sum(dS * S, axis=1)
        offsets, mask = _rows_tile(chunk, 0, c0, K, C, LKT, C)
        G = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        q = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, LKT)
        k = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, LKT)
        gamma = tl.exp(G)
        # W = X (beta Gamma K): dX's W part and dR_W = X^T dW.
        dX += tl.dot(dW, tl.trans(beta[:, None] * gamma * k), input_precision=DOT_PRECISION)
        dR_W = tl.dot(tl.trans(X), dW, input_precision=DOT_PRECISION) * gamma
        # Q_g = s q Gamma.
        dq = scale * gamma * dQ_g
        dG = q * dq
        # K_d = k exp(G_C - G) and Gamma_C = exp(G_C): G_C's gradient lands on row C - 1.
        G_last = tl.load(G_ptr + chunk * C * K + (C - 1) * K + channels, mask=channels < K)
        dk = tl.exp(G_last[None, :] - G) * dK_d
        to_end = k * dk
        dG -= to_end
        dG_last = tl.sum(to_end, axis=0) + tl.exp(G_last) * dgam
        dG += tl.where(index[:, None] == C - 1, dG_last[None, :], 0.0)
        dk += beta[:, None] * dR_W
        dG += beta[:, None] * k * dR_W
        dbeta += tl.sum(dR_W * k, axis=1)
        tl.store(dq_ptr + offsets, dq, mask=mask)
        tl.store(dk_ptr + offsets, dk, mask=mask)
        tl.store(dG_ptr + offsets, dG, mask=mask)
    # X = (I + A_kk)^-1  =>  dA_kk = -X^T dX X^T (strictly lower part); A_kk = beta_i KK_ij.
    dA_kk = -tl.dot(tl.trans(X), tl.dot(dX, tl.trans(X), input_precision=DOT_PRECISION),
                    input_precision=DOT_PRECISION)  # fmt: skip
    dA_kk = tl.where(index[None, :] < index[:, None], dA_kk, 0.0)
    dbeta += tl.sum(dA_kk * tl.load(KK_ptr + square), axis=1)
    tl.store(dKK_ptr + square, beta[:, None] * dA_kk)
    tl.store(dbeta_ptr + beta_offsets, dbeta, mask=tokens < seq_len)


@triton.jit
def _pair_bwd_kernel(
    q_ptr, k_ptr, G_ptr, dA_ptr, dKK_ptr, dqp_ptr, dkp_ptr, dGp_ptr, dq_ptr, dk_ptr, dg_ptr,
    seq_len, num_heads, num_chunks, scale,
    K: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, KT: tl.constexpr,
):  # fmt: skip
    """Per chunk and channel tile: back through the pair scores P_ij = sum_c l_i D_ij r_j
    (A_qk: l = q; KK: l = k; r = k), dl_i = sum_j dP_ij D_ij r_j, dr_j = sum_i dP_ij D_ij l_i,
    dG += l dl - r dr; then dg = reverse cumsum of dG, sub-chunks last to first with a carry."""
    n, bh, c0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * KT
    b, h = bh // num_heads, bh % num_heads
    t0 = n * C
    key_base = b.to(tl.int64) * seq_len * num_heads * K + h * K
    chunk = bh.to(tl.int64) * num_chunks + n
    channels = c0 + tl.arange(0, KT)
    local = tl.arange(0, BC)
    index = tl.arange(0, C)
    carry = tl.zeros((KT,), dtype=tl.float32)
    for r in range(C // BC):
        s = C - BC - r * BC
        # Whole-chunk tiles are reloaded per sub-chunk (cache hits) rather than held.
        offsets, mask = _rows_tile(chunk, 0, c0, K, C, KT, C)
        G_all = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        q_all = _load_tile(q_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, KT)
        k_all = _load_tile(k_ptr, key_base, t0, seq_len, num_heads * K, c0, K, C, KT)
        offsets, mask = _rows_tile(chunk, s, c0, K, BC, KT, C)
        G_rows = tl.load(G_ptr + offsets, mask=mask, other=0.0)
        q_rows = _load_tile(q_ptr, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        k_rows = _load_tile(k_ptr, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        row_index = (s + local)[:, None]
        square, _ = _rows_tile(chunk, s, 0, C, BC, C, C)
        dP_q = scale * tl.where(index[None, :] <= row_index, tl.load(dA_ptr + square), 0.0)
        dP_k = tl.load(dKK_ptr + square)
        # Rows of this sub-chunk against earlier columns, around G_{s-1} (factors <= 1).
        ref_offsets = chunk * C * K + tl.maximum(s - 1, 0) * K + channels
        ref = tl.load(
            G_ptr + ref_offsets, mask=(channels < K) & (tl.full((KT,), s, tl.int32) > 0), other=0.0
        )
        before = (index < s)[:, None]
        k_before = tl.where(
            before, k_all * tl.exp(tl.where(before, ref[None, :] - G_all, 0.0)), 0.0
        )
        to_ref = tl.exp(G_rows - ref[None, :])
        dl_q = to_ref * tl.dot(dP_q, k_before, input_precision=DOT_PRECISION)
        dl_k = to_ref * tl.dot(dP_k, k_before, input_precision=DOT_PRECISION)
        # Columns of this sub-chunk against later rows, around its last G (factors <= 1).
        end = tl.load(G_ptr + chunk * C * K + (s + BC - 1) * K + channels, mask=channels < K)
        after = (index >= s + BC)[:, None]
        from_end = tl.exp(tl.where(after, G_all - end[None, :], 0.0))
        q_after = tl.where(after, q_all * from_end, 0.0)
        k_after = tl.where(after, k_all * from_end, 0.0)
        columns, _ = _rows_tile(chunk, 0, s, C, C, BC, C)
        dP_q_cols = scale * tl.load(dA_ptr + columns)  # rows after the sub-chunk: all causal
        dP_k_cols = tl.load(dKK_ptr + columns)
        dr = tl.dot(tl.trans(dP_q_cols), q_after, input_precision=DOT_PRECISION)
        dr += tl.dot(tl.trans(dP_k_cols), k_after, input_precision=DOT_PRECISION)
        dr *= tl.exp(end[None, :] - G_rows)
        # The diagonal BC x BC block, column by column from exact differences.
        for jj in range(BC):
            k_j = tl.load(
                k_ptr + key_base + (t0 + s + jj).to(tl.int64) * num_heads * K + channels,
                mask=(channels < K) & (channels * 0 + t0 + s + jj < seq_len), other=0.0,
            ).to(tl.float32)  # fmt: skip
            G_j = tl.load(G_ptr + chunk * C * K + (s + jj) * K + channels, mask=channels < K)
            D = tl.exp(tl.where(local[:, None] >= jj, G_rows - G_j[None, :], float("-inf")))
            column = chunk * C * C + (s + local) * C + s + jj
            dPq_j = scale * tl.where(local >= jj, tl.load(dA_ptr + column), 0.0)
            dPk_j = tl.load(dKK_ptr + column)
            dl_q += dPq_j[:, None] * D * k_j[None, :]
            dl_k += dPk_j[:, None] * D * k_j[None, :]
            dr_j = tl.sum(D * (dPq_j[:, None] * q_rows + dPk_j[:, None] * k_rows), axis=0)
            dr = tl.where(local[:, None] == jj, dr + dr_j[None, :], dr)
        dq = tl.load(dqp_ptr + offsets, mask=mask, other=0.0) + dl_q
        dk = tl.load(dkp_ptr + offsets, mask=mask, other=0.0) + dl_k + dr
        dG = tl.load(dGp_ptr + offsets, mask=mask, other=0.0)
        dG += q_rows * dl_q + k_rows * (dl_k - dr)
        dg = tl.cumsum(dG, axis=0, reverse=True) + carry[None, :]
        carry += tl.sum(dG, axis=0)
        _store_tile(dq_ptr, dq, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        _store_tile(dk_ptr, dk, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)
        _store_tile(dg_ptr, dg, key_base, t0 + s, seq_len, num_heads * K, c0, K, BC, KT)


def _block(size: int) -> int:
    """Power-of-two register width >= size and >= 16 (the smallest tl.dot operand)."""
    return max(16, triton.next_power_of_2(size))


def _chunk_length(seq_len: int, chunk_size: int) -> int:
    """C = chunk_size (a power of two >= 16), or the shortest such length covering short T."""
    if chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size: must be a power of two >= 16 for Triton, got {chunk_size}")
    return min(chunk_size, _block(seq_len))


def tile_sizes(d_key: int, d_value: int, chunk: int) -> dict:
    """Constexpr tile sizes of every kernel for these dimensions (also used by compile checks)."""
    # State kernels: one [K, BV] state tile up to K = 64, two key halves above.
    key_half = _block(d_key) if d_key <= 64 else _block(d_key) // 2
    return dict(
        K=d_key, V=d_value, C=chunk, BC=SUB_CHUNK, KH=key_half,
        KT=min(KEY_TILE, _block(d_key)), VT=min(VALUE_TILE, _block(d_value)),
        BV=min(VALUE_BLOCK, _block(d_value)), LKT=min(LOCAL_TILE, _block(d_key)),
        LVT=min(LOCAL_TILE, _block(d_value)),
    )  # fmt: skip


def _launch(kernel, grid, *args, sizes: dict, **constexprs):
    """Launch with the kernel's own constexprs from `sizes` and its LAUNCH warps/stages."""
    names = set(kernel.arg_names)
    num_warps, num_stages = LAUNCH[kernel.__name__]
    kernel[grid](*args, **{k: v for k, v in sizes.items() if k in names}, **constexprs,
                 num_warps=num_warps, num_stages=num_stages)  # fmt: skip


class _ChunkKdaFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, initial_state, scale, chunk):
        q, k, v, g, beta = (x.contiguous() for x in (q, k, v, g, beta))
        batch, seq_len, num_heads, d_key = q.shape
        d_value = v.shape[-1]
        num_chunks = triton.cdiv(seq_len, chunk)
        rows, bh = batch * num_heads * num_chunks, batch * num_heads
        f32 = dict(dtype=torch.float32, device=q.device)
        G, W, Q_g, K_d = (torch.empty(rows, chunk, d_key, **f32) for _ in range(4))
        KK, X, A_qk = (torch.empty(rows, chunk, chunk, **f32) for _ in range(3))
        U = torch.empty(rows, chunk, d_value, **f32)
        sizes = tile_sizes(d_key, d_value, chunk)
        common = (seq_len, num_heads, num_chunks)
        _launch(_cumsum_kernel, (num_chunks, bh), g, G, *common, sizes=sizes)
        _launch(_pair_fwd_kernel, (num_chunks * (chunk // SUB_CHUNK), bh), q, k, G, KK, A_qk,
                *common, scale, sizes=sizes)  # fmt: skip
        _launch(_solve_fwd_kernel, (num_chunks, bh), q, k, v, beta, G, KK, X, W, U, Q_g, K_d,
                *common, scale, sizes=sizes)  # fmt: skip
        o = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        states = torch.empty(rows, d_key, d_value, **f32)
        V_e = torch.empty(rows, chunk, d_value, **f32)
        final = torch.empty(batch, num_heads, d_key, d_value, **f32)
        h0 = final if initial_state is None else initial_state.float().contiguous()
        _launch(_state_fwd_kernel, (triton.cdiv(d_value, sizes["BV"]), bh), Q_g, K_d, G, A_qk,
                W, U, h0, o, states, V_e, final, *common, sizes=sizes,
                HAS_INITIAL=initial_state is not None)  # fmt: skip
        ctx.save_for_backward(q, k, v, beta, G, KK, X, A_qk, W, Q_g, K_d, states, V_e)
        ctx.scale, ctx.chunk = scale, chunk
        ctx.dtypes = (q.dtype, k.dtype, v.dtype, g.dtype, beta.dtype)
        ctx.initial_dtype = None if initial_state is None else initial_state.dtype
        return o, final

    @staticmethod
    def backward(ctx, d_o, d_final):
        q, k, v, beta, G, KK, X, A_qk, W, Q_g, K_d, states, V_e = ctx.saved_tensors
        batch, seq_len, num_heads, d_key = q.shape
        d_value, chunk = v.shape[-1], ctx.chunk
        sizes = tile_sizes(d_key, d_value, chunk)
        num_chunks = triton.cdiv(seq_len, chunk)
        rows, bh = batch * num_heads * num_chunks, batch * num_heads
        common = (seq_len, num_heads, num_chunks)
        f32 = dict(dtype=torch.float32, device=q.device)
        dstates = torch.empty(rows, d_key, d_value, **f32)
        dU = torch.empty(rows, chunk, d_value, **f32)
        dh0 = torch.empty(batch, num_heads, d_key, d_value, **f32)
        d_o = torch.zeros_like(v) if d_o is None else d_o.contiguous()
        has_final_grad = d_final is not None
        d_final = dh0 if d_final is None else d_final.contiguous()
        _launch(_state_bwd_kernel, (triton.cdiv(d_value, sizes["BV"]), bh), Q_g, K_d, G, A_qk,
                W, d_o, d_final, dstates, dU, dh0, *common, sizes=sizes,
                HAS_FINAL_GRAD=has_final_grad)  # fmt: skip
        # Per-token parts of dq, dk, dG (chunk-major, padded rows included: G_C's gradient sits
        # on the chunk's last row even past T), then the pair terms and the reverse cumsum.
        dA, dKK = (torch.empty(rows, chunk, chunk, **f32) for _ in range(2))
        dq_part, dk_part, dG_part = (torch.empty(rows, chunk, d_key, **f32) for _ in range(3))
        dv, dbeta = torch.empty(v.shape, **f32), torch.empty(beta.shape, **f32)
        _launch(_local_bwd_kernel, (num_chunks, bh), q, k, v, beta, d_o, G, X, KK, V_e, states,
                dstates, dU, dA, dKK, dq_part, dk_part, dG_part, dv, dbeta, *common, ctx.scale,
                sizes=sizes)  # fmt: skip
        dq, dk, dg = (torch.empty(q.shape, **f32) for _ in range(3))
        _launch(_pair_bwd_kernel, (num_chunks, bh, triton.cdiv(d_key, sizes["KT"])), q, k, G, dA,
                dKK, dq_part, dk_part, dG_part, dq, dk, dg, *common, ctx.scale,
                sizes=sizes)  # fmt: skip
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
