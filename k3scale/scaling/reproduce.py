"""Whether a refit reproduces a committed fit artifact: the rule that means the same on every CPU.

A refit is not bitwise equal across CPUs: numpy's AVX-512 exp and log and OpenBLAS's
per-CPU kernels round differently from their AVX2 counterparts (on one AVX-512 machine the
committed fits were matched bit for bit only with numpy's AVX-512 paths and OpenBLAS's SkylakeX
kernels both turned off). How far the rounding travels depends on the fit:

- Well-conditioned estimates (cell optima, the schedule comparisons, the compute-optimal routes)
  moved at most 1.2e-8 relative between an AVX-512 and an AVX2 machine. `RELATIVE_TOLERANCE`,
  1e-6, leaves 80x headroom and is a thousand times finer than the 3-4 significant digits any
  report prints, so a refit within it tells the same story digit for digit.
- A fit the data cannot identify is flat along some direction, and a last-bit change moves it
  anywhere along it (its parameters and bootstrap SEs moved up to 100%). Such a subtree (a dict
  whose `verdict` says `not identified`) is compared by its verdict alone.

(The first-generation frontier, surface and backtest fits, which moved 0.4-180% between CPUs,
left the study artifacts with issue 32; nothing is exempt from the tolerance any more.)

Strings are compared with their numbers masked, since reasons quote the numbers compared above.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

RELATIVE_TOLERANCE = 1e-6
# Differences below this are zero, whatever the scale (a loss difference of 1e-14 nats).
ABSOLUTE_TOLERANCE = 1e-12
NOT_IDENTIFIED = "not identified"
# The code that produced an artifact is not part of what it found.
IGNORED = (re.compile(r"^provenance/code(/|$)"),)
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass(frozen=True)
class Comparison:
    """What a refit reproduced: the numbers held to the tolerance, the subtrees compared by
    verdict only, and every difference found (empty when reproduced)."""

    numbers_checked: int
    verdict_only: tuple[str, ...]
    differences: tuple[str, ...]

    @property
    def reproduced(self) -> bool:
        return not self.differences


def compare_artifacts(refit: dict, committed: dict) -> Comparison:
    """Compare a refit's fit artifact with the committed one under the rule above."""
    walk = _Walk()
    walk.node(refit, committed, "")
    return Comparison(walk.numbers, tuple(walk.verdict_only), tuple(walk.differences))


def _verdict_class(node) -> str | None:
    verdict = node.get("verdict") if isinstance(node, dict) else None
    if not isinstance(verdict, str):
        return None
    return NOT_IDENTIFIED if verdict.startswith(NOT_IDENTIFIED) else verdict


class _Walk:
    def __init__(self) -> None:
        self.numbers = 0
        self.verdict_only: list[str] = []
        self.differences: list[str] = []

    def node(self, new, old, path: str) -> None:
        if any(p.search(path) for p in IGNORED):
            return
        if type(new) is not type(old) and not _both_numbers(new, old):
            self.differences.append(f"{path}: {_short(old)} became {_short(new)}")
        elif isinstance(new, dict):
            self._dict(new, old, path)
        elif isinstance(new, list):
            self._list(new, old, path)
        elif isinstance(new, str):
            if _NUMBER.sub("#", new) != _NUMBER.sub("#", old):
                self.differences.append(f"{path}: {old!r} became {new!r}")
        elif _both_numbers(new, old):
            self._number(new, old, path)
        elif new != old:
            self.differences.append(f"{path}: {old!r} became {new!r}")

    def _dict(self, new: dict, old: dict, path: str) -> None:
        if new.keys() != old.keys():
            lost, added = sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())
            self.differences.append(f"{path}: keys {lost} lost, {added} added")
            return
        verdicts = _verdict_class(new), _verdict_class(old)
        if verdicts[0] != verdicts[1]:
            self.differences.append(f"{path}: verdict {old['verdict']!r} became {new['verdict']!r}")
            return
        if NOT_IDENTIFIED in verdicts:
            self.verdict_only.append(path)
            return
        for key in new:
            self.node(new[key], old[key], f"{path}/{key}" if path else key)

    def _list(self, new: list, old: list, path: str) -> None:
        if len(new) != len(old):
            self.differences.append(f"{path}: {len(old)} items became {len(new)}")
            return
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            self.node(a, b, f"{path}[{i}]")

    def _number(self, new, old, path: str) -> None:
        self.numbers += 1
        if new == old or (math.isnan(new) and math.isnan(old)):
            return
        tolerance = max(RELATIVE_TOLERANCE * max(abs(new), abs(old)), ABSOLUTE_TOLERANCE)
        if not abs(new - old) <= tolerance:
            self.differences.append(f"{path}: {old!r} became {new!r}")


def _both_numbers(a, b) -> bool:
    kinds = (int, float)
    return all(isinstance(x, kinds) and not isinstance(x, bool) for x in (a, b))


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
