"""Records of an ablation study (issue 38): each component's effect on the full model, as a loss
difference and as an effective-compute multiplier, its published anchor, and the sum check.

Written by k3scale/scaling/estimates/arm_effects.py into a fit artifact's `component_effects`;
read back here by the report, the README tables and the dashboard's forest plot.
"""

from __future__ import annotations

import dataclasses

from k3scale.scaling.values.fitdoc import CellDifference, PooledDifference
from k3scale.scaling.values.uncertainty import Estimate


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A published effect of the same change at scale, to read a tiny-model number against.

    Attributes:
        multiplier: the published compute multiplier (None: none was published).
        text: what was published, in a few words (sizes, other readings).
        source: the citation.
    """

    multiplier: float | None
    text: str
    source: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> Anchor:
        return cls(doc["multiplier"], doc["text"], doc["source"])


@dataclasses.dataclass(frozen=True)
class Ablation:
    """What a recipe declares about its arms.

    Attributes:
        full: the full model every arm is compared with (k3).
        against: the model whose gap to the full one the components should explain (k2).
        sum_arms: the arms that switch a difference between `full` and `against` back (the
            positive control and sub-ablations are not among them).
        positive_control: the arm whose effect the literature establishes (Muon -> AdamW).
        notes: arm -> what it switches back.
        anchors: arm -> its published anchor.
    """

    full: str
    against: str
    sum_arms: tuple[str, ...]
    positive_control: str
    notes: dict[str, str]
    anchors: dict[str, Anchor]


@dataclasses.dataclass(frozen=True)
class CellEffect:
    """One design cell: the arm's optimum minus the full model's (`difference`, reference = the
    arm) and the multiplier it is worth through the full model's frontier."""

    difference: CellDifference
    multiplier: Estimate

    def to_json(self) -> dict:
        return {
            "cell": self.difference.cell,
            "difference": self.difference.to_json(),
            "multiplier": self.multiplier.to_json(),
        }

    @classmethod
    def from_json(cls, doc: dict, arm: str, full: str) -> CellEffect:
        return cls(
            difference=CellDifference.from_json(doc["cell"], arm, full, doc["difference"]),
            multiplier=Estimate.from_json(doc["multiplier"]),
        )


@dataclasses.dataclass(frozen=True)
class ComponentEffect:
    """One arm against the full model, cell by cell and pooled.

    Attributes:
        arm: the arm's name; note: what it switches back.
        cells: per design cell, the difference and multiplier.
        loss: the mean over cells of arm minus full (positive: the component lowers the loss).
        multiplier: the geometric mean over cells of the multiplier (> 1: the component is
            worth that factor of compute to the full model).
        anchor: the published effect of the same change, if any.
        power: the chance that this design's 95% interval excludes 1 when the true multiplier is
            the anchor's (None without an anchor multiplier or an interval).
    """

    arm: str
    note: str
    cells: list[CellEffect]
    loss: PooledDifference
    multiplier: Estimate
    anchor: Anchor | None = None
    power: float | None = None

    def to_json(self, full: str) -> dict:
        return {
            "note": self.note,
            "cells": [c.to_json() for c in self.cells],
            "loss": self.loss.to_json(self.arm, full),
            "multiplier": self.multiplier.to_json(),
            "anchor": self.anchor.to_json() if self.anchor else None,
            "power_at_anchor": self.power,
        }

    @classmethod
    def from_json(cls, arm: str, full: str, doc: dict) -> ComponentEffect:
        return cls(
            arm=arm,
            note=doc["note"],
            cells=[CellEffect.from_json(c, arm, full) for c in doc["cells"]],
            loss=PooledDifference.from_json(doc["loss"]),
            multiplier=Estimate.from_json(doc["multiplier"]),
            anchor=Anchor.from_json(doc["anchor"]) if doc.get("anchor") else None,
            power=doc.get("power_at_anchor"),
        )


@dataclasses.dataclass(frozen=True)
class SumCheck:
    """The leave-one-out components against the whole gap between the full model and `against`.

    Attributes:
        against: the other model (k2); arms: the components summed.
        gap: the full model's multiplier over `against`, read like an arm's.
        explained: the product of the arms' multipliers.
        left_over: gap / explained: interactions between components and whatever differs
            between the two models that no arm switches back.
        share: log explained / log gap, the share of the gap the components account for
            (not identified unless the gap's interval excludes 1).
    """

    against: str
    arms: tuple[str, ...]
    gap: Estimate
    explained: Estimate
    left_over: Estimate
    share: Estimate

    def to_json(self) -> dict:
        return {
            "against": self.against,
            "arms": list(self.arms),
            **{
                name: getattr(self, name).to_json()
                for name in ("gap", "explained", "left_over", "share")
            },
        }

    @classmethod
    def from_json(cls, doc: dict) -> SumCheck:
        return cls(
            against=doc["against"],
            arms=tuple(doc["arms"]),
            **{
                name: Estimate.from_json(doc[name])
                for name in ("gap", "explained", "left_over", "share")
            },
        )


@dataclasses.dataclass(frozen=True)
class ComponentEffects:
    """Every arm's effect on the full model under one FLOP convention, and the sum check."""

    full: str
    convention: str
    positive_control: str
    effects: dict[str, ComponentEffect]
    sum_check: SumCheck | None
    skipped: str | None = None
    method: str = (
        "arm minus full at each design cell (rung, budget rank), paired by seed; multiplier "
        "C_arm / C* with L*(C*) = L*(C_full) + diff on the full model's frontier law (envelope "
        "route); pooled: mean difference and geometric-mean multiplier over cells; percentile "
        "intervals over the shared draws"
    )

    def to_json(self) -> dict:
        if self.skipped:
            return {"full": self.full, "convention": self.convention, "skipped": self.skipped}
        return {
            "full": self.full,
            "convention": self.convention,
            "positive_control": self.positive_control,
            "method": self.method,
            "arms": {name: e.to_json(self.full) for name, e in self.effects.items()},
            "sum_check": self.sum_check.to_json() if self.sum_check else None,
        }

    @classmethod
    def from_json(cls, doc: dict) -> ComponentEffects:
        if doc.get("skipped"):
            return cls(doc["full"], doc["convention"], "", {}, None, skipped=doc["skipped"])
        return cls(
            full=doc["full"],
            convention=doc["convention"],
            positive_control=doc["positive_control"],
            effects={
                arm: ComponentEffect.from_json(arm, doc["full"], e)
                for arm, e in doc["arms"].items()
            },
            sum_check=SumCheck.from_json(doc["sum_check"]) if doc.get("sum_check") else None,
            method=doc["method"],
        )
