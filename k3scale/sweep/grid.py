"""The LR grid of a grid-tuned preset: its points, and where to extend it (issue 20, point 3).

The grid is a geometric lattice of peak LRs around `center`: point k is
`center * ratio ** (k - (points - 1) / 2)`, and an extension is the lattice point one step beyond
an end (k = -1, or k = points), so every LR a cell can run is a lattice point and two LRs are
compared by their lattice index, never as raw floats.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from k3scale.sweep.declaration import LRGrid

# Lattice indices closer than this are the same point (LRs stored as JSON round-trip exactly;
# this absorbs the last bits of a log).
INDEX_TOLERANCE = 1e-6


def grid_lr(grid: LRGrid, index: float) -> float:
    """The LR at lattice `index` (0 .. points-1 on the grid; beyond it for extensions)."""
    return grid.center * grid.ratio ** (index - (grid.points - 1) / 2)


def grid_lrs(grid: LRGrid) -> tuple[float, ...]:
    """The grid's LRs, ascending."""
    return tuple(grid_lr(grid, k) for k in range(grid.points))


def lr_extent(grid: LRGrid) -> tuple[float, float]:
    """The lowest and highest LR a cell can run: the grid's ends, each extended `max_extensions`
    times (a cell's extensions may all go one way)."""
    return grid_lr(grid, -grid.max_extensions), grid_lr(grid, grid.points - 1 + grid.max_extensions)


def lattice_index(lr: float, grid: LRGrid) -> float:
    """The lattice index of `lr`, snapped to the nearest integer when within the tolerance."""
    index = math.log(lr / grid.center) / math.log(grid.ratio) + (grid.points - 1) / 2
    nearest = round(index)
    return float(nearest) if abs(index - nearest) < INDEX_TOLERANCE else index


def same_lr(a: float, b: float, grid: LRGrid) -> bool:
    return abs(lattice_index(a, grid) - lattice_index(b, grid)) < INDEX_TOLERANCE


def count_extensions(tried_lrs: Iterable[float], grid: LRGrid) -> int:
    """Distinct tried LRs beyond the grid's ends."""
    indices = {lattice_index(lr, grid) for lr in tried_lrs}
    return sum(not -INDEX_TOLERANCE < k < grid.points - 1 + INDEX_TOLERANCE for k in indices)


def next_extension(
    tried_lrs: Iterable[float], best_lr: float, grid: LRGrid, extensions_done: int
) -> float | None:
    """The LR one ratio beyond the end of `tried_lrs` that `best_lr` sits at, or None when the
    best is interior, `max_extensions` are done, or a single LR was tried (no end to extend).

    Args:
        tried_lrs: every LR the cell ran (failed and diverged ones included: a failed extension
            leaves the best interior, which stops further extensions that way).
        best_lr: the LR of the cell's best result, one of `tried_lrs`.
        grid: the cell's grid.
        extensions_done: extensions the cell has run or queued.
    """
    indices = [lattice_index(lr, grid) for lr in tried_lrs]
    if extensions_done >= grid.max_extensions or not indices:
        return None
    low, high, best = min(indices), max(indices), lattice_index(best_lr, grid)
    if high - low < INDEX_TOLERANCE:
        return None
    if best - low < INDEX_TOLERANCE:
        return grid_lr(grid, low - 1)
    if high - best < INDEX_TOLERANCE:
        return grid_lr(grid, high + 1)
    return None
