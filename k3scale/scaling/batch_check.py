"""The sensitivity check of a fixed batch size (issue 20): one cell tuned on the same LR grid at
several batch sizes, each batch's optimum set against the reference batch's.

What the fixed-batch rule costs is what another batch would have gained. Per batch:
- its fitted optimum (the study's cell estimator, methods.md 4.7: a quadratic in log LR, draws
  from its sampling distribution under the noise pooled over the check's runs), and the
  difference from the reference batch's with a 95% interval from the two cells' draws;
- the mean of the re-runs at its best grid LR (seeds 1, 2: independent of the selection that
  chose that LR, so without a winner's curse), and its difference from the reference batch's
  with a t interval under the pooled noise: what the runs say without a quadratic.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from scipy.stats import t as t_dist

from k3scale.errors import K3ScaleError
from k3scale.scaling.study import SEED, StudyOptions, cell_estimates, usable_runs
from k3scale.scaling.values import verdict
from k3scale.scaling.values.uncertainty import percentile_interval

LEVEL = 0.95


def compare_batches(runs: pl.DataFrame, reference_batch: int, opts: StudyOptions) -> dict:
    """`{"reference_batch", "loss", "noise", "git_shas", "batches": [...], "largest_gain"}`,
    one entry of `batches` per batch size (sequences per step), ascending."""
    kept, _ = usable_runs(runs, opts)
    if kept["size"].n_unique() != 1 or kept["schedule"].n_unique() != 1:
        raise K3ScaleError(
            "batch check: the runs must hold one model size under one schedule (found sizes "
            f"{sorted(kept['size'].unique().to_list())}, schedules "
            f"{sorted(kept['schedule'].unique().to_list())})"
        )
    batches = sorted(kept["batch_size"].unique().to_list())
    if reference_batch not in batches:
        raise K3ScaleError(f"batch check: no runs at the reference batch {reference_batch}")
    # One cell per batch: the batch takes the schedule's place in the cell key (budgets rounded
    # to whole steps of two batches may coincide).
    cells = kept.with_columns(pl.format("batch {}", "batch_size").alias("schedule"))
    estimates, noise = cell_estimates(cells, opts)
    rows, draws = {}, {}
    for estimate in estimates:
        batch = int(estimate.cell["schedule"].removeprefix("batch "))
        rows[batch] = _batch_row(estimate, cells, batch, opts.loss)
        draws[batch] = estimate.optimum.draws
    reference = rows[reference_batch]
    others = [rows[b] for b in sorted(rows) if b != reference_batch]
    for batch, row in rows.items():
        point = row["optimum_loss"] - reference["optimum_loss"]
        row["optimum_minus_reference"] = _draw_difference(
            point, draws[batch], draws[reference_batch]
        )
        row["rerun_mean_minus_reference"] = _mean_difference(row, reference, noise)
    return {
        "reference_batch": reference_batch,
        "loss": opts.loss,
        "noise": noise.to_dict(),
        "git_shas": sorted(kept["git_sha"].drop_nulls().unique().to_list()),
        "batches": [rows[b] for b in sorted(rows)],
        "largest_gain": {
            kind: _largest_gain(others, kind)
            for kind in ("optimum_minus_reference", "rerun_mean_minus_reference")
        },
    }


def _batch_row(estimate, kept: pl.DataFrame, batch: int, loss: str) -> dict:
    budget = estimate.cell["budget_tokens"]
    cell = kept.filter(pl.col("batch_size") == batch)
    opt = estimate.optimum
    reruns = cell.filter(pl.col("arm") == SEED)[loss].to_list()
    return {
        "batch_size": batch,
        "size": estimate.cell["size"],
        "budget_tokens": budget,
        "steps": budget // int(cell["batch_tokens"][0]),
        "lrs": sorted(cell.filter(pl.col("arm") != SEED)["lr"].unique().to_list()),
        "best_trial": estimate.best_trial,
        "reruns": reruns,
        "rerun_mean": float(np.mean(reruns)) if reruns else None,
        "optimum_lr": opt.lr,
        "optimum_loss": opt.loss,
        "optimum_interval": opt.interval(LEVEL),
        # L = c + b ln(lr) + a ln(lr)^2, for the figure.
        "fit_coef": opt.quad.coef.tolist()
        if opt.quad is not None and opt.quad.mode == "1d"
        else None,
        "verdict": opt.verdict.to_json(),
    }


def _draw_difference(point: float, draws: np.ndarray | None, ref: np.ndarray | None) -> dict:
    if draws is None or ref is None:
        return {"value": point, "interval": None}
    return {"value": point, "interval": percentile_interval(draws - ref, LEVEL, min_draws=1)}


def _mean_difference(row: dict, reference: dict, noise) -> dict:
    """Re-run means of two batches on the same seeds: the seeds' study-wide effects cancel, and
    each run keeps its within-cell seed effect (`cell_sd`, which holds e) where it is measured."""
    n, m = len(row["reruns"]), len(reference["reruns"])
    sd, df = (noise.seeds.cell_sd, noise.seeds.cell_df) if noise.seeds else (noise.sd, noise.df)
    if not n or not m or sd is None:
        return {"value": None, "interval": None}
    value = row["rerun_mean"] - reference["rerun_mean"]
    half = t_dist.ppf(0.5 + LEVEL / 2, df) * sd * np.sqrt(1 / n + 1 / m)
    return {"value": value, "interval": [value - half, value + half]}


def _largest_gain(others: list[dict], kind: str) -> dict:
    """The most another batch could have lowered the loss by one comparison (`kind`), at 95%:
    the largest negative lower end of its difference intervals, 0 when all stay above zero."""
    gain, by = 0.0, None
    for row in others:
        interval = row[kind]["interval"]
        if interval is not None and -interval[0] > gain:
            gain, by = -interval[0], row["batch_size"]
    return {"nats": gain, "batch_size": by}


def markdown(result: dict) -> str:
    """The check as a Markdown table and the sentences that read it (analysis/README.md)."""
    ref = result["reference_batch"]
    lines = [
        f"| batch | steps | LRs tried | best grid LR | its loss | re-run mean (seeds 1, 2) | "
        f"fitted optimum LR | fitted optimum loss [95%] | minus batch {ref} [95%] | "
        f"re-run mean minus batch {ref} [95%] |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for row in result["batches"]:
        why = "" if verdict.is_identified(row["verdict"]) else f" ({row['verdict']})"
        lines.append(
            f"| {row['batch_size']} | {row['steps']} | "
            f"{', '.join(f'{lr:.3g}' for lr in row['lrs'])} | {row['best_trial']['lr']:.3g} | "
            f"{row['best_trial']['loss']:.4f} | {_number(row['rerun_mean'])} | "
            f"{row['optimum_lr']:.3g} | {_with_interval(row['optimum_loss'], row['optimum_interval'])}"
            f"{why} | {_difference(row['optimum_minus_reference'], row['batch_size'] == ref)} | "
            f"{_difference(row['rerun_mean_minus_reference'], row['batch_size'] == ref)} |"
        )
    noise = result["noise"]
    lines += [
        "",
        f"Run noise: sd {_number(noise['sd'])} nats on {noise['df']} degrees of freedom "
        f"({noise['method']}). Loss: `{result['loss']}`. Code: "
        f"{', '.join(sha[:12] for sha in result['git_shas'])}.",
        "",
        verdict_sentence(result),
    ]
    return "\n".join(lines) + "\n"


COMPARISONS = {
    "optimum_minus_reference": "fitted optima",
    "rerun_mean_minus_reference": "re-run means",
}


def verdict_sentence(result: dict) -> str:
    """What the check says about the fixed batch, by each comparison, and the bound by both."""
    ref = result["reference_batch"]
    sentences = []
    for kind, label in COMPARISONS.items():
        better = [
            row
            for row in result["batches"]
            if row[kind]["interval"] is not None and row[kind]["interval"][1] < 0
        ]
        if better:
            row = min(better, key=lambda r: r[kind]["value"])
            sentences.append(
                f"By the {label}, batch {row['batch_size']} beats batch {ref} beyond the noise: "
                f"{-row[kind]['value']:.3f} nats lower ({_interval(row[kind]['interval'])})."
            )
        else:
            sentences.append(f"By the {label}, no batch tried beats batch {ref} beyond the noise.")
    bound = max(gain["nats"] for gain in result["largest_gain"].values())
    sentences.append(
        f"At the 95% level, by either comparison, another batch could have lowered this cell's "
        f"loss by at most {bound:.3f} nats."
    )
    return " ".join(sentences)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _interval(interval: list[float] | None) -> str:
    return "no interval" if interval is None else f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def _with_interval(value: float, interval: list[float] | None) -> str:
    return f"{value:.4f}" + ("" if interval is None else f" [{interval[0]:.4f}, {interval[1]:.4f}]")


def _difference(diff: dict, is_reference: bool) -> str:
    if is_reference:
        return "(reference)"
    if diff["value"] is None:
        return "-"
    return f"{diff['value']:+.4f} {_interval(diff['interval'])}"
