"""Synthetic but realistic run tables for the dashboard tests (INTERFACES.md section 9 columns).

Two archs x two schedules x three sizes x three budgets; each cell has tuned trials over (peak LR,
batch), two extra seeds at the cell's best point, and every WSD cell a shared-arm run at the
cosine cell's optimum. Losses follow a Chinchilla surface L(N, D) = E + A/N^alpha + B/D^beta
with K3 given a constant compute multiplier, a quadratic penalty in log LR and log batch around
schedule-dependent optima, and seeded noise; LRs far above the optimum diverge and a few runs fail.

Regenerate the committed tables with `.venv/bin/python -m tests.viz.make_fixture`; their fit
artifacts are made from them by the project's recipes when the tests run (fit_fixture.py).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import polars as pl

DATA_DIR = Path(__file__).parent / "data"
STUDY = "fixture"
SEQ_LEN = 128
ARCHS = ("k2", "k3")
SCHEDULES = ("cosine", "wsd")
# Three budgets: the surface route of `k3scale fit` needs three distinct D per arm.
BUDGETS = (65_536, 131_072, 262_144)
BATCH_SIZES = (8, 16, 32)
# (n_active, n_total, n_layer, d_model) per rung; the same ladder for both archs, as in presets.py.
SIZES = {
    "t1": (30_000, 90_000, 2, 16),
    "t2": (120_000, 400_000, 3, 32),
    "t3": (480_000, 1_700_000, 4, 64),
}
# Chinchilla-like surface (Hoffmann et al. 2022 form); values chosen so losses land in 3-6 nats
# at these tiny sizes, as the demo preset's runs do.
SURFACE = {"E": 2.2, "A": 30.0, "alpha": 0.30, "B": 40.0, "beta": 0.28}
# K3 trains like K2 with 2.5x the compute (the K3 report's claim), applied to N and D alike.
K3_MULTIPLIER = 2.5
# Quadratic penalty of log LR / log batch off their optima (methods.md 3.2: "roughly quadratic");
# the batch term is steep enough against NOISE for most cells' fitted optimum to sit inside the
# batch sizes tried, so `k3scale fit` identifies them (and not all: some fixture cells stay not
# identified, as real ones do).
KAPPA_LR, KAPPA_BATCH = 0.06, 0.1
OOD_OFFSET = 0.35
NOISE = 0.01
# Loss after the first 1/24 of a run (uniform over a 16K vocabulary would be ln 16384 = 9.7).
START_LOSS = 7.5


def lr_optimum(n_active: int, schedule: str) -> float:
    """Peak-LR optimum: shrinks with width (about N^-0.3); WSD's sits lower than cosine's."""
    base = 2.5e-2 * (n_active / 30_000) ** -0.3
    return base * (0.7 if schedule == "wsd" else 1.0)


def batch_optimum(budget: int) -> float:
    """Batch optimum (sequences): grows slowly with the budget, inside BATCH_SIZES at BUDGETS."""
    return 16.0 * (budget / 131_072) ** 0.25


def true_loss(arch: str, size: str, budget: int, schedule: str, lr: float, batch: int) -> float:
    n_active = SIZES[size][0]
    k = K3_MULTIPLIER**0.5 if arch == "k3" else 1.0
    s = SURFACE
    base = s["E"] + s["A"] / (k * n_active) ** s["alpha"] + s["B"] / (k * budget) ** s["beta"]
    # Cosine ends slightly lower than WSD at tuned settings (the K3 report's finding).
    base *= 1.004 if schedule == "wsd" else 1.0
    lr_term = KAPPA_LR * math.log(lr / lr_optimum(n_active, schedule)) ** 2
    batch_term = KAPPA_BATCH * math.log(batch / batch_optimum(budget)) ** 2
    return base + lr_term + batch_term


def _curve(final: float, frac: np.ndarray, schedule: str) -> np.ndarray:
    """Loss at fractions `frac` of training: power-law fall to `final` (START_LOSS at 1/24 of
    the run); WSD sits higher during the stable phase and drops in its last 20% (decay)."""
    wsd_gap = 0.04 * final if schedule == "wsd" else 0.0
    gap = (START_LOSS - final - wsd_gap) / (24.0**0.6 - 1.0)
    plain = final + wsd_gap + gap * (frac**-0.6 - 1.0)
    decay = np.clip((frac - 0.8) / 0.2, 0.0, 1.0) if schedule == "wsd" else 0.0
    return plain - wsd_gap * decay


def _run_row(rng, idx: int, cell: dict, trial: str, arm: str, lr, batch, seed) -> dict:
    n_active, n_total, n_layer, d_model = SIZES[cell["size"]]
    fpt_6n = 6 * n_active
    # Attention term as in methods.md 2.8: 6 * n_layer * seq_len * d_attn per token.
    fpt_attn = fpt_6n + 6 * n_layer * SEQ_LEN * d_model
    lr_min = 1e-5
    size_name = f"{cell['arch']}-{cell['size']}"
    key = f"{size_name}|D{cell['budget']}|{cell['schedule']}"
    return {
        "run_id": f"r{idx:05d}",
        "experiment": STUDY,
        "run_name": f"{key}|lr{lr:.3g}|b{batch}|s{seed}",
        "status": "finished",
        "study": STUDY,
        "cell": key,
        "trial": f"{key}#{trial}",
        "arm": arm,
        "arch": cell["arch"],
        "schedule": cell["schedule"],
        "size": size_name,
        "budget_tokens": cell["budget"],
        "seed": seed,
        "config_hash": f"{rng.integers(0, 2**48):012x}",
        "data_fingerprint": "fixture-english_mix-0001",
        "git_sha": "0123456789abcdef0123456789abcdef01234567",
        "trunk_run_id": None,
        "fork_step": None,
        "lr": lr,
        "lr_min": lr_min,
        "batch_size": batch,
        "seq_len": SEQ_LEN,
        "batch_tokens": batch * SEQ_LEN,
        "n_total": n_total,
        "n_active": n_active,
        "flops_per_token_6n": fpt_6n,
        "flops_per_token_attn": fpt_attn,
        "tokens": cell["budget"],
        "c_6n": float(fpt_6n * cell["budget"]),
        "c_attn": float(fpt_attn * cell["budget"]),
        "param.optim.lr": repr(lr),
        "param.train.batch_size": str(batch),
        "param.schedule.kind": cell["schedule"],
        "param.model.d_model": str(d_model),
    }


def _finish(rng, row: dict, fate: str) -> tuple[dict, list[dict]]:
    """Final losses and curves of one run; `fate` is finished, diverged or failed."""
    steps_total = row["tokens"] // row["batch_tokens"]
    final = true_loss(
        row["arch"],
        row["size"].split("-")[1],
        row["budget_tokens"],
        row["schedule"],
        row["lr"],
        row["batch_size"],
    ) + rng.normal(0.0, NOISE)
    num_train, num_eval = 24, 4
    train_frac = np.arange(1, num_train + 1) / num_train
    eval_frac = np.arange(1, num_eval + 1) / num_eval
    train = _curve(final + 0.05, train_frac, row["schedule"])
    val_id = _curve(final, eval_frac, row["schedule"])
    steps = np.linspace(steps_total / num_train, steps_total, num_train).round().astype(int)
    eval_steps = np.linspace(steps_total / num_eval, steps_total, num_eval).round().astype(int)
    keep_train, keep_eval = num_train, num_eval
    if fate == "diverged":
        keep_train, keep_eval = num_train // 3, 1
        train[keep_train - 2 : keep_train] = [9.5, 11.8]
    elif fate == "failed":
        keep_train, keep_eval = num_train // 2, 2
    series = [
        ("train/loss", steps[:keep_train], train[:keep_train]),
        ("val/id_loss", eval_steps[:keep_eval], val_id[:keep_eval]),
        ("val/ood_loss", eval_steps[:keep_eval], val_id[:keep_eval] + OOD_OFFSET),
    ]
    curves = [
        {
            "run_id": row["run_id"],
            "step": int(s),
            "tokens": int(s) * row["batch_tokens"],
            "metric": metric,
            "value": float(v),
        }
        for metric, xs, ys in series
        for s, v in zip(xs, ys)
    ]
    done = fate == "finished"
    row |= {
        "status": fate,
        "tokens": row["tokens"] if done else int(steps[keep_train - 1]) * row["batch_tokens"],
        "final_train_loss": float(train[-1]) if done else None,
        "final_val_id_loss": float(val_id[-1]) if done else None,
        "final_val_ood_loss": float(val_id[-1] + OOD_OFFSET) if done else None,
    }
    row["c_6n"] = float(row["flops_per_token_6n"] * row["tokens"])
    row["c_attn"] = float(row["flops_per_token_attn"] * row["tokens"])
    return row, curves


def _fate(rng, lr: float, n_active: int, schedule: str, fail_rate: float) -> str:
    # LR more than 6x above the optimum diverges (the edge of stability at these widths).
    if lr > 6.0 * lr_optimum(n_active, schedule):
        return "diverged"
    return "failed" if rng.random() < fail_rate else "finished"


def make_tables(
    *, trials_per_cell: int = 12, seed: int = 0, fail_rate: float = 0.03, lr_range=(2e-3, 1.5e-1)
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(runs, curves) of a synthetic study; deterministic for a given seed.

    Args:
        trials_per_cell: tuned trials per cell (2 seed re-runs and the shared arm come on top).
        seed: seed of every draw.
        fail_rate: probability that a non-diverging run fails.
        lr_range: log-uniform peak-LR search range.
    """
    rng = np.random.default_rng(seed)
    rows, curves = [], []
    cosine_best: dict[tuple, tuple[float, int]] = {}
    for arch in ARCHS:
        for size in SIZES:
            for budget in BUDGETS:
                for schedule in SCHEDULES:
                    cell = {"arch": arch, "size": size, "budget": budget, "schedule": schedule}
                    best = None
                    for t in range(trials_per_cell):
                        lr = float(np.exp(rng.uniform(*np.log(lr_range))))
                        batch = int(rng.choice(BATCH_SIZES))
                        row = _run_row(rng, len(rows), cell, f"t{t:03d}", "tuned", lr, batch, 0)
                        fate = _fate(rng, lr, SIZES[size][0], schedule, fail_rate)
                        row, c = _finish(rng, row, fate)
                        rows.append(row)
                        curves += c
                        loss = row["final_val_ood_loss"]
                        if loss is not None and (best is None or loss < best[0]):
                            best = (loss, lr, batch)
                    if best is None:
                        continue
                    for s in (1, 2):
                        row = _run_row(rng, len(rows), cell, f"e{s:03d}", "seed", *best[1:], s)
                        row, c = _finish(rng, row, "finished")
                        rows.append(row)
                        curves += c
                    if schedule == "cosine":
                        cosine_best[(arch, size, budget)] = best[1:]
                    else:
                        lr, batch = cosine_best[(arch, size, budget)]
                        row = _run_row(rng, len(rows), cell, "e003", "shared", lr, batch, 0)
                        row, c = _finish(rng, row, "finished")
                        rows.append(row)
                        curves += c
    runs = pl.DataFrame(rows, infer_schema_length=None).with_columns(
        pl.col("trunk_run_id").cast(pl.String), pl.col("fork_step").cast(pl.Int64)
    )
    return runs, pl.DataFrame(curves)


# IsoFLOP design (Hoffmann et al. 2022, Approach 2): at each compute level five sizes a factor 2
# apart, around the surface's compute-optimal N (an interior minimum), except at 3e12 where all
# sizes are larger than it (a minimum on the edge, which the N_opt(C) law leaves out).
ISOFLOP_LEVELS = {1e11: 15_000, 1e12: 60_000, 3e12: 960_000, 1e13: 240_000}
ISOFLOP_SIZES = 5
ISOFLOP_LR_FACTORS = (0.3, 0.6, 1.2, 2.4)
ISOFLOP_NOISE = 0.003


def make_isoflop_tables(seed: int = 0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(runs, empty curves) of one arch (k2, cosine) on an IsoFLOP grid, every cell tuned over
    4 LRs x 3 batch sizes around its optimum; losses from `SURFACE` plus the LR and batch terms."""
    rng = np.random.default_rng(seed)
    rows = []
    for compute, smallest in ISOFLOP_LEVELS.items():
        for k in range(ISOFLOP_SIZES):
            n = smallest * 2**k
            d = round(compute / (6 * n))
            b_opt = batch_optimum(d)
            s = SURFACE
            base = s["E"] + s["A"] / n ** s["alpha"] + s["B"] / d ** s["beta"]
            for factor in ISOFLOP_LR_FACTORS:
                for batch in (round(b_opt / 2), round(b_opt), round(2 * b_opt)):
                    lr = factor * lr_optimum(n, "cosine")
                    loss = base + KAPPA_LR * math.log(factor) ** 2
                    loss += KAPPA_BATCH * math.log(batch / b_opt) ** 2
                    rows.append(
                        {
                            "run_id": f"i{len(rows):05d}",
                            "study": STUDY,
                            "status": "finished",
                            "arm": "tuned",
                            "cell": f"k2-n{n}|D{d}|cosine",
                            "arch": "k2",
                            "schedule": "cosine",
                            "size": f"k2-n{n}",
                            "budget_tokens": d,
                            "lr": lr,
                            "batch_size": batch,
                            "batch_tokens": batch * SEQ_LEN,
                            "n_active": n,
                            "tokens": d,
                            "c_6n": 6.0 * n * d,
                            "c_attn": 6.6 * n * d,
                            "final_val_ood_loss": loss + rng.normal(0.0, ISOFLOP_NOISE),
                        }
                    )
    return pl.DataFrame(rows), pl.DataFrame(schema={"run_id": pl.String})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    args = parser.parse_args()
    runs, curves = make_tables()
    args.out.mkdir(parents=True, exist_ok=True)
    runs.write_parquet(args.out / "runs.parquet")
    curves.write_parquet(args.out / "curves.parquet")
    print(f"{len(runs)} runs, {len(curves)} curve rows -> {args.out}")


if __name__ == "__main__":
    main()
