"""Histogram Quantile Balancing (architecture.md 7.3): integer margin counts per expert, summed
over micro-batches and ranks with one all-reduce, then a threshold from the tail counts.

Bin edges come from the replicated bias, so every rank bins identically without a collective:
scores are sigmoids in (0, 1) and the cutoff alpha lies in (min b, 1 + max b), hence
`mu in (lo, hi)` with `lo = -1 - max(b)`, `hi = 1 - min(b)`. Counts are additive integers, so the
result is bitwise identical for any sharding or micro-batching, and the threshold is within one
bin width of the exact quantile.

Point mass: a token's (k+1)-th expert j defines the cutoff itself, so its margin is exactly
`s_j - (s_j + b_j) = -b_j`, the current threshold. About m/n margins per expert (q/k of them) sit
on that one point, right where the new threshold is sought; spreading them uniformly over a bin
mis-places the threshold by a large fraction of a bin (at R = 256 the fixed-batch load violation
then stalls near 0.1-0.2). They are therefore counted in their own column at the known position
`-b_j`, and the threshold is interpolated linearly inside its bin around that point.

The fused counting kernel is a `torch.library` custom op (`k3scale::margin_counts`), so
`torch.compile` traces it as a single graph node.
"""

from __future__ import annotations

import torch

from k3scale.ops.cpu import load, supports
from k3scale.ops.members import loop_members
from k3scale.ops.qb.naive import centre, target_load


def margin_range(bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(lo, hi)` as 0-d float64 tensors: the margin range for sigmoid scores and bias `[n]`."""
    bias64 = bias.double()
    return -1.0 - bias64.max(), 1.0 - bias64.min()


def margin_counts(
    scores: torch.Tensor,
    cutoff: torch.Tensor,
    cutoff_expert: torch.Tensor,
    bias: torch.Tensor,
    num_bins: int,
    fused: bool = True,
) -> torch.Tensor:
    """Counts `[n, 1 + R]` int64 of the margins `mu = s - alpha` of `[m, n]` scores.

    Column 0 counts the point mass (tokens whose (k+1)-th expert is j, margin `-b_j`); columns
    1..R are R uniform bins on `[lo, hi)` of all other margins (out-of-range ones clamped).

    Args:
        scores: unbiased scores `[m, n]` fp32.
        cutoff: each token's (k+1)-th biased score `[m]`.
        cutoff_expert: the expert holding that score `[m]` int64.
        bias: the bias the tokens were routed with `[n]`.
        num_bins: R.
        fused: use the C++ kernel when it runs here (CPU fp32); False forces the torch code.
    """
    num_tokens, num_experts = scores.shape
    lo, hi = margin_range(bias)
    width = (hi - lo) / num_bins
    if (
        fused
        and scores.dtype == torch.float32
        and cutoff.dtype == torch.float32
        and supports(scores)
    ):
        # The same fp64 bin arithmetic in one C++ pass (identical counts; tests compare).
        return margin_counts_fused(scores.contiguous(), cutoff, cutoff_expert, lo, width, num_bins)
    margins = scores.double() - cutoff.double()[:, None]
    bins = torch.floor((margins - lo) / width).long().clamp_(0, num_bins - 1)
    slots = bins + 1 + torch.arange(num_experts, device=scores.device) * (num_bins + 1)
    # Route the point-mass margin of every token to its expert's column 0.
    rows = torch.arange(num_tokens, device=scores.device)
    slots[rows, cutoff_expert] = cutoff_expert * (num_bins + 1)
    counts = torch.bincount(slots.reshape(-1), minlength=num_experts * (num_bins + 1))
    return counts.view(num_experts, num_bins + 1)


# A custom op, not a direct call into the extension: `torch.compile` traces it as a single node
# (the fake kernel gives the shape) instead of breaking the graph at the pybind call, and `lo`
# and `width` enter as 0-d tensors so the traced code needs no `.item()` (issue 34).
@torch.library.custom_op("k3scale::margin_counts", mutates_args=())
def margin_counts_fused(
    scores: torch.Tensor,
    cutoff: torch.Tensor,
    cutoff_expert: torch.Tensor,
    lo: torch.Tensor,
    width: torch.Tensor,
    num_bins: int,
) -> torch.Tensor:
    """`margin_counts` on the C++ kernel: contiguous fp32 scores `[m, n]`, `lo` and `width` 0-d
    fp64 tensors -> counts `[n, 1 + R]` int64 (no gradient)."""
    return load().margin_counts(scores, cutoff, cutoff_expert, lo.item(), width.item(), num_bins)


@margin_counts_fused.register_fake
def _(scores, cutoff, cutoff_expert, lo, width, num_bins):
    return cutoff_expert.new_empty(scores.shape[1], num_bins + 1)


def qb_threshold_histogram(
    counts: torch.Tensor, bias: torch.Tensor, top_k: int, interpolate: bool = True
) -> torch.Tensor:
    """Per-expert threshold `[n]` (float64) with about q = k m / n margins above it.

    With `tail_j(r)` = margins of expert j in bins >= r (point mass included in its bin) and
    `r*_j` the smallest r with `tail_j(r) <= q`, the left edge `lo + r*_j w` satisfies
    `#{mu >= edge} <= q < #{mu >= edge - w}`: the exact quantile lies in bin `r*_j - 1`.
    `interpolate` places the threshold inside that bin: linearly through its spread margins, and
    at the point mass itself when the q-th margin falls into it (as the exact quantile does).

    Args:
        counts: `[n, 1 + R]` from `margin_counts`, summed over the whole step.
        bias: the bias the step was routed with `[n]` (gives the edges and the point mass).
        top_k: experts per token k.
        interpolate: False returns the left edge.
    """
    num_experts, num_bins = counts.shape[0], counts.shape[1] - 1
    lo, hi = margin_range(bias)
    width = (hi - lo) / num_bins
    atoms, spread = counts[:, 0], counts[:, 1:]
    atom_pos = -bias.double()
    atom_bin = torch.floor((atom_pos - lo) / width).long().clamp(0, num_bins - 1)
    full = spread.scatter_add(1, atom_bin[:, None], atoms[:, None])
    q = target_load(int(full[0].sum()), top_k, num_experts)
    tail = full.flip(-1).cumsum(-1).flip(-1)
    # tail is non-increasing in r, so the bins with tail <= q are exactly the last ones.
    first_bin = num_bins - (tail <= q).sum(-1)
    edge = lo + first_bin.double() * width
    if not interpolate:
        return edge
    theta = _inside_bin(first_bin, edge, tail, spread, atoms, atom_bin, atom_pos, width, q)
    return torch.where(first_bin > 0, theta, edge)


def _inside_bin(first_bin, edge, tail, spread, atoms, atom_bin, atom_pos, width, q):
    # Bin r*-1 = [edge - w, edge): take `needed` more margins from its top down.
    num_bins = spread.shape[1]
    straddle = (first_bin - 1).clamp(min=0)
    tail_above = torch.where(
        first_bin < num_bins, _take(tail, first_bin.clamp(max=num_bins - 1)), 0
    ).double()
    needed = q - tail_above
    uniform = _take(spread, straddle).double()
    atom_here = torch.where(atom_bin == straddle, atoms, 0).double()
    above_share = ((edge - atom_pos) / width).clamp(0.0, 1.0)
    uniform_above_atom = torch.where(atom_here > 0, uniform * above_share, uniform)
    per_margin = width / uniform.clamp(min=1.0)
    above_atom = edge - needed * per_margin
    below_atom = edge - (needed - atom_here) * per_margin
    theta = torch.where(needed <= uniform_above_atom + atom_here, atom_pos, below_atom)
    return torch.where(needed <= uniform_above_atom, above_atom, theta)


def _take(table: torch.Tensor, column: torch.Tensor) -> torch.Tensor:
    return table.gather(1, column[:, None])[:, 0]


def qb_bias_histogram(
    counts: torch.Tensor, bias: torch.Tensor, top_k: int, interpolate: bool = True
) -> torch.Tensor:
    """Next step's centred bias `[n]` fp32 from the step's global margin counts `[n, 1 + R]`."""
    return centre(-qb_threshold_histogram(counts, bias, top_k, interpolate))


# Stacked trials call the op under vmap (ops/members.py).
torch.library.register_vmap(margin_counts_fused, loop_members(margin_counts_fused))
