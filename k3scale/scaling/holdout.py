"""Laws tested where they were not fitted (issue 47 item 4; methods.md 4.11 (c)).

Leave the top rung out: refit a committed study without its largest size (per arm), predict
each left-out cell's optimum loss (log-linear response surface, separable surface) and the
frontier at its compute (each frontier law), and score every prediction against the cell
optimum the full study measured: error in nats, and whether the prediction's 95% interval for a
new run holds it. A prediction the route's checks refused is scored too, and marked: how
refused laws fare is part of the evidence for refusing them.

The frontier laws predict the frontier L*(C); a left-out cell sits on it only if no other cell
reaches lower at no more compute, so a frontier prediction is scored only at left-out cells
that are Pareto points of the full study's optima.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import polars as pl

from k3scale.scaling import artifact, predict, study
from k3scale.scaling.estimates.compute_optimal import distinct_computes
from k3scale.scaling.inputs import tables
from k3scale.scaling.laws.frontier import record_lows
from k3scale.scaling.values.fitdoc import CellOptimumRecord, read_cell_optima
from k3scale.scaling.values.verdict import Verdict

CONV = "c_6n"


@dataclasses.dataclass(frozen=True)
class Score:
    """One prediction of one left-out cell against what the full study measured there."""

    study: str
    arm: str
    cell: str
    predictor: str
    observed: float
    predicted: float | None
    interval: list[float] | None
    verdict: Verdict
    extrapolation: float | None

    @property
    def error(self) -> float | None:
        return None if self.predicted is None else self.predicted - self.observed

    @property
    def covered(self) -> bool | None:
        if self.interval is None:
            return None
        return self.interval[0] <= self.observed <= self.interval[1]

    def to_json(self) -> dict:
        return {
            **{k: v for k, v in dataclasses.asdict(self).items() if k != "verdict"},
            "verdict": self.verdict.to_json(),
            "error": self.error,
            "covered": self.covered,
        }

    @classmethod
    def from_json(cls, doc: dict) -> Score:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(
            **{k: v for k, v in doc.items() if k in fields and k != "verdict"},
            verdict=Verdict.from_json(doc["verdict"]),
        )


def score(study_name, arm, cell, predictor, observed, p: predict.Prediction) -> Score:
    return Score(
        study_name, arm, cell, predictor, observed, p.value, p.interval, p.verdict, p.extrapolation
    )


def _top_sizes(runs: pl.DataFrame, key: str) -> dict[str, str]:
    """Each arm's largest size by N: the rung left out."""
    tops = runs.group_by(key, "size").agg(pl.col("n_active").max()).sort("n_active")
    return {arm: size for arm, size, _ in tops.rows()}


def pareto_cells(optima: list[CellOptimumRecord]) -> set[tuple]:
    """(size, budget) of the identified optima that are Pareto points of their arm's set."""
    ok = [o for o in optima if o.loss.identified]
    compute = np.array([o.compute[CONV] for o in ok])
    loss = np.array([o.loss.value for o in ok])
    order, starts, _ = distinct_computes(compute)
    best = np.minimum.reduceat(loss[order], starts)
    keep = record_lows(best)
    out = set()
    for i, start in enumerate(starts):
        if keep[i]:
            end = starts[i + 1] if i + 1 < len(starts) else len(order)
            group = order[start:end]
            j = group[int(np.argmin(loss[group]))]
            out.add((ok[j].cell["size"], ok[j].cell["budget_tokens"]))
    return out


def leave_top_rung_out(folder: Path, recipe: str, num_resamples: int = 1000) -> list[Score]:
    """Every left-out cell's predictions from the study refitted without its top rung.

    Raises K3ScaleError when the reduced study has no compute-optimal comparison to predict
    from (the caller records why)."""
    runs, curves = tables.load_tables(folder)
    key = "schedule" if recipe == "cosine_vs_wsd" else "arch"
    options = study.StudyOptions(num_resamples=num_resamples)
    module = artifact.load_recipe(recipe)
    full = read_cell_optima(module.run(runs, curves, options))
    tops = _top_sizes(runs, key)
    kept = runs.filter(
        ~pl.struct(key, "size").is_in([{key: a, "size": s} for a, s in tops.items()])
    )
    kept_ids = kept["run_id"]
    reduced = {
        "results": module.run(kept, curves.filter(pl.col("run_id").is_in(kept_ids)), options)
    }
    _, laws = predict.arm_laws(reduced, CONV)  # K3ScaleError: the reduced study compares nothing
    sd = predict.new_run_sd(reduced["results"])
    out = []
    for arm, top in sorted(tops.items()):
        mine = [o for o in full if o.cell[key] == arm]
        on_frontier = pareto_cells(mine)
        arm_laws = laws.get(arm)
        for o in mine:
            if o.cell["size"] != top or not o.loss.identified:
                continue
            cell = f"{o.cell['size']} D={o.tokens:,.0f}"
            if arm_laws is None:
                continue
            n_max = max(r.n for r in arm_laws.optima)
            reach = max(o.n / n_max, o.tokens / max(r.tokens for r in arm_laws.optima))
            observed = o.loss.value
            p = predict.loglinear_loss(arm_laws.optima, o.n, o.tokens, sd, reach)
            out.append(score(folder.name, arm, cell, "loglinear", observed, p))
            if arm_laws.surface is not None and arm_laws.surface.draws is not None:
                p = predict.surface_loss(arm_laws.surface, o.n, o.tokens, sd)
                out.append(score(folder.name, arm, cell, "surface", observed, p))
            if (o.cell["size"], o.cell["budget_tokens"]) in on_frontier:
                for route, law in sorted(arm_laws.laws.items()):
                    p = predict.law_loss(law, o.compute[CONV], sd)
                    out.append(score(folder.name, arm, cell, f"frontier {route}", observed, p))
    return out


def summary(scores: list[Score]) -> dict[str, dict]:
    """Per (study, predictor): predictions scored, mean absolute error, coverage; for all of
    them and for those whose route passed its checks."""
    out: dict[str, dict] = {}
    for s in scores:
        if s.predicted is None:
            continue
        entry = out.setdefault(f"{s.study} | {s.predictor}", {"all": [], "passing": []})
        entry["all"].append(s)
        if s.verdict.identified:
            entry["passing"].append(s)
    return {
        k: {part: _stats(v[part]) for part in ("all", "passing")} for k, v in sorted(out.items())
    }


def _stats(scores: list[Score]) -> dict:
    if not scores:
        return {"n": 0}
    errors = np.array([s.error for s in scores])
    covered = [s.covered for s in scores if s.covered is not None]
    return {
        "n": len(scores),
        "mean_abs_error": float(np.mean(np.abs(errors))),
        "max_abs_error": float(np.max(np.abs(errors))),
        "covered": int(sum(covered)),
        "coverage": float(np.mean(covered)) if covered else None,
    }


def markdown(result: dict) -> str:
    """The leave-one-rung-out tables: a summary per study and predictor, then every score."""
    rows = [
        "| study | predictor | scored | mean abs error (nats) | max abs error | inside its 95% "
        "interval | passing its checks | their mean abs error | their interval holds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, part in result["summary"].items():
        name, predictor = key.split(" | ")
        a, p = part["all"], part["passing"]
        passing = (
            f"{p['n']} | {p['mean_abs_error']:.3f} | {p['covered']} of {p['n']}"
            if p["n"]
            else "0 | - | -"
        )
        rows.append(
            f"| {name} | {predictor} | {a['n']} | {a['mean_abs_error']:.3f} | "
            f"{a['max_abs_error']:.3f} | {a['covered']} of {a['n']} | {passing} |"
        )
    rows += [
        "",
        "| study | arm | left-out cell | predictor | observed | predicted [95%] | "
        "error | inside | route |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- | --- |",
    ]
    for doc in result["scores"]:
        s = Score.from_json(doc)
        if s.predicted is None:
            why = s.verdict.reason or "no prediction"
            rows.append(
                f"| {s.study} | {s.arm} | {s.cell} | {s.predictor} | - | - | - | - | {why} |"
            )
            continue
        ci = f"[{s.interval[0]:.3f}, {s.interval[1]:.3f}]" if s.interval else "[no interval]"
        route = "passes" if s.verdict.identified else f"refused: {s.verdict.reason}"
        rows.append(
            f"| {s.study} | {s.arm} | {s.cell} | {s.predictor} | {s.observed:.3f} | "
            f"{s.predicted:.3f} {ci} | {s.error:+.3f} | {'yes' if s.covered else 'no'} | {route} |"
        )
    notes = [f"- {name}: {why}" for name, why in result.get("not_scored", {}).items()]
    return "\n".join(rows + (["", *notes] if notes else [])) + "\n"
