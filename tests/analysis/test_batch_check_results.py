"""The committed batch sensitivity check (issue 20): one code version, the design it declares, and
a batch-7 cell that reproduces the study it checks."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from k3scale.sweep.declaration import load_study
from k3scale.sweep.grid import grid_lrs

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "analysis" / "results" / "batch_check"
STUDY = ROOT / "analysis" / "results" / "k2_vs_k3-cpu_v2"
BATCHES = (4, 7, 12)


def check_runs() -> pl.DataFrame:
    return pl.concat(
        [pl.read_parquet(p) for p in sorted(CHECK.glob("*/runs.parquet"))], how="diagonal_relaxed"
    )


def test_each_batch_is_one_study_of_its_preset_from_one_commit():
    records = [json.loads(p.read_text()) for p in sorted(CHECK.glob("*/study.json"))]
    assert sorted(r["preset"] for r in records) == sorted(f"cpu_v2_b{b}" for b in BATCHES)
    assert all(r["state"] == "complete" and r["trials"]["failed"] == 0 for r in records)
    runs = check_runs()
    assert runs["git_sha"].n_unique() == 1
    assert {r["identity"]["git_sha"] for r in records} == set(runs["git_sha"])


def test_every_batch_ran_the_declared_grid_with_three_seeds_at_its_best_point():
    study = load_study(ROOT / "experiments" / "k2_vs_k3.py")
    runs = check_runs().filter(pl.col("status") == "finished")
    for batch in BATCHES:
        preset = study.preset(f"cpu_v2_b{batch}")
        at_batch = runs.filter(pl.col("batch_size") == batch)
        tuned = at_batch.filter(pl.col("arm") == "tuned")
        grid = grid_lrs(preset.lr_grid.for_size("k3-s1"))
        assert all(any(abs(lr / g - 1) < 1e-9 for lr in tuned["lr"]) for g in grid), batch
        best_lr = tuned.sort("final_val_ood_loss")["lr"][0]
        assert at_batch.filter(pl.col("lr") == best_lr)["seed"].sort().to_list() == [0, 1, 2]
        steps = at_batch["budget_tokens"] // at_batch["batch_tokens"]
        assert steps.min() >= 150, (batch, steps.min())


def test_the_batch_7_cell_reproduces_the_study_it_checks():
    # Same size, budget, warmup tokens, LR and seed as cpu_v2's k3-s1 at 20 tokens per parameter
    # (there a WSD trunk that also carried the 10-token branch): the same losses, to the bit.
    mine = check_runs().filter(pl.col("batch_size") == 7)
    theirs = pl.read_parquet(STUDY / "runs.parquet").filter(
        (pl.col("size") == "k3-s1") & (pl.col("budget_tokens") == mine["budget_tokens"][0])
    )
    key = ["lr", "seed"]
    joined = mine.select(*key, "final_val_ood_loss").join(
        theirs.select(*key, "final_val_ood_loss"), on=key, suffix="_study"
    )
    assert joined.height == mine.height
    assert (joined["final_val_ood_loss"] == joined["final_val_ood_loss_study"]).all()


def test_what_the_readme_says_of_the_check_holds():
    # analysis/README.md, "The fixed batch, checked at one cell": the fitted optimum LR is highest
    # at the largest batch, and every batch's re-runs sit above the seed-0 trial they repeat.
    from k3scale.scaling.batch_check import compare_batches
    from k3scale.scaling.study import StudyOptions

    result = compare_batches(check_runs(), 7, StudyOptions(num_resamples=200))
    rows = {row["batch_size"]: row for row in result["batches"]}
    assert max(rows, key=lambda b: rows[b]["optimum_lr"]) == max(BATCHES)
    for row in rows.values():
        assert len(row["reruns"]) == 2 and min(row["reruns"]) > row["best_trial"]["loss"]
