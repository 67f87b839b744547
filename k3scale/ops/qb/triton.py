"""Per-expert margin bin counts for histogram Quantile Balancing in one Triton kernel.

Same contract and bin convention as `histogram.margin_counts` (architecture.md 7.3): column 0 of
expert j counts the point mass (tokens whose (k+1)-th expert is j), columns 1..R the other margins
`mu = s - alpha` binned uniformly on `[lo, hi)` with out-of-range margins clamped into the end bins.
Margins, edges and the bin index are computed in fp64 with a correctly rounded division, exactly as
the torch version does, so the counts are identical (not merely close). Each program bins a tile
of tokens x experts and adds ones into the `[n, 1 + R]` table with atomic adds (int32 in the
kernel, returned as int64 like the torch version).
Import this module only with Triton present; set `TRITON_INTERPRET=1` before importing it to run
on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k3scale.ops.qb.histogram import margin_range

# Tile of the [m, n] score matrix per program: 64 tokens x 32 experts = 2048 margins.
BLOCK_TOKENS = 64
BLOCK_EXPERTS = 32
# int32 atomics: one call may add at most this many margins to one counter.
MAX_TOKENS = 2**31 - 1


@triton.jit
def _margin_counts_kernel(
    scores_ptr, cutoff_ptr, cutoff_expert_ptr, edges_ptr, counts_ptr,
    num_tokens, num_experts, score_row_stride,
    NUM_BINS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    token_ok = tokens < num_tokens
    mask = token_ok[:, None] & (experts < num_experts)[None, :]
    rows = tokens.to(tl.int64)[:, None] * score_row_stride
    scores = tl.load(scores_ptr + rows + experts[None, :], mask=mask, other=0.0)
    cutoff = tl.load(cutoff_ptr + tokens, mask=token_ok, other=0.0).to(tl.float64)
    cutoff_expert = tl.load(cutoff_expert_ptr + tokens, mask=token_ok, other=-1)
    lo = tl.load(edges_ptr)
    width = tl.load(edges_ptr + 1)
    margins = scores.to(tl.float64) - cutoff[:, None]
    # fp64 division rounds to nearest (div.rn.f64), as torch's does: identical bin indices.
    bins = tl.floor((margins - lo) / width)
    bins = tl.minimum(tl.maximum(bins, 0.0), NUM_BINS - 1.0).to(tl.int32) + 1
    is_atom = cutoff_expert[:, None] == experts[None, :].to(cutoff_expert.dtype)
    column = tl.where(is_atom, 0, bins)
    slots = experts[None, :] * (NUM_BINS + 1) + column
    ones = tl.full((BLOCK_T, BLOCK_E), 1, dtype=tl.int32)
    tl.atomic_add(counts_ptr + slots, ones, mask=mask, sem="relaxed")


def margin_counts_triton(
    scores: torch.Tensor,
    cutoff: torch.Tensor,
    cutoff_expert: torch.Tensor,
    bias: torch.Tensor,
    num_bins: int,
) -> torch.Tensor:
    """Counts `[n, 1 + R]` int64 of the margins of `[m, n]` scores; equals `margin_counts`.

    Args:
        scores: unbiased scores `[m, n]` (fp32), last dim contiguous.
        cutoff: each token's (k+1)-th biased score `[m]`.
        cutoff_expert: the expert holding that score `[m]` int64.
        bias: the bias the tokens were routed with `[n]` (gives the bin edges).
        num_bins: R.
    """
    num_tokens, num_experts = scores.shape
    if num_bins < 1:
        raise ValueError(f"num_bins: must be >= 1, got {num_bins}")
    if num_tokens > MAX_TOKENS:
        raise ValueError(f"scores: at most {MAX_TOKENS} tokens per call, got {num_tokens}")
    if scores.stride(-1) != 1:
        scores = scores.contiguous()
    lo, hi = margin_range(bias)
    edges = torch.stack([lo, (hi - lo) / num_bins]).to(scores.device)  # fp64 [lo, width]
    counts = torch.zeros(num_experts, num_bins + 1, dtype=torch.int32, device=scores.device)
    if num_tokens and num_experts:
        grid = (triton.cdiv(num_tokens, BLOCK_TOKENS), triton.cdiv(num_experts, BLOCK_EXPERTS))
        _margin_counts_kernel[grid](
            scores, cutoff.contiguous(), cutoff_expert.contiguous(), edges, counts,
            num_tokens, num_experts, scores.stride(0),
            NUM_BINS=num_bins, BLOCK_T=BLOCK_TOKENS, BLOCK_E=BLOCK_EXPERTS,
        )  # fmt: skip
    return counts.long()
