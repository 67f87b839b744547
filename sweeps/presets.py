"""The five preset sizes every study offers (platform.md section 8), as functions of its sizes.

A study picks model presets per architecture; everything else that makes a preset (budgets,
search space, trials, sequence length, evaluation, hardware) is shared here so both flagship
studies run at the same scale.
"""

import dataclasses

from k3scale.sweep.declaration import LRGrid, StudyPreset
from k3scale.sweep.planner import warmup_tokens
from sweeps import spaces


def smoke(sizes: dict[str, tuple[str, ...]], budgets: tuple[int, ...] = (16_384,)) -> StudyPreset:
    """Everything runs, in about two minutes on 2 CPU cores (CI)."""
    return StudyPreset(
        sizes=sizes,
        budgets=budgets,
        search=spaces.TINY_CPU,
        trials_per_cell=2,
        seq_len=64,
        eval_tokens=4_096,
        eval_points=2,
        micro_batch_size=8,
    )


def demo(
    sizes: dict[str, tuple[str, ...]], size_centers: dict[str, float] | None = None
) -> StudyPreset:
    """The README's main job on one 2-core machine (issue 36): the reference design in small, so
    the live studies locate their optima and compare something with a real interval.

    The small-vocabulary build and the smallest rung per arch (`ladders.DEMO`), 5 tokens per
    active parameter (about 80 steps of 7 x 256 tokens), a 4-point LR grid 1.6x apart extended
    until each cell's best is interior, warmup 10%, and 2 seeds at each cell's best point, so a
    comparison between arms is paired. `size_centers`: each rung's grid centre (the v2 pilot's
    optima; a grid that brackets them spends no extension).
    """
    grid = LRGrid(
        center=1.5e-2,
        points=4,
        ratio=1.6,
        max_extensions=2,
        batch_size=7,
        size_centers=size_centers or {},
    )
    return StudyPreset(
        sizes=sizes,
        budgets=(1,),  # unused: budgets_per_param sets each size's budget
        budgets_per_param=(5.0,),
        search=spaces.SMALL_CPU,
        trials_per_cell=grid.points,
        lr_grid=grid,
        seeds=(0, 1),
        dataset="english_mix_v512",
        seq_len=256,
        eval_tokens=8_192,
        eval_points=1,
        micro_batch_size=7,
        warmup_fraction=0.1,
    )


def cpu(sizes: dict[str, tuple[str, ...]], trials_per_cell: int = 5) -> StudyPreset:
    """The reference study on one 2-core machine; a second seed at each cell's optimum.

    Sized from measured single-thread throughput (k3-t4 about 1,500 tokens/s, k3-t1 about
    5,700) to finish in one working session: cosine_vs_wsd took 46.8 min and k2_vs_k3 41.5 min
    (2026-12-02). Budgets of 12-192 steps and short evaluations, since final losses are what
    the fits read and every run shares one fixed evaluation set.
    """
    return StudyPreset(
        sizes=sizes,
        budgets=(49_152, 98_304, 196_608),
        search=spaces.SMALL_CPU,
        trials_per_cell=trials_per_cell,
        seeds=(0, 1),
        seq_len=128,
        eval_tokens=16_384,
        eval_points=1,
    )


def cpu_v2(
    sizes: dict[str, tuple[str, ...]],
    schedules: tuple[str, ...] = (),
    grid_points: int = 5,
    rung_lr_ratio: float = 1.0,
    size_centers: dict[str, float] | None = None,
) -> StudyPreset:
    """The v2 reference design on one 2-core machine (issue 20): models where the body matters
    (the small-vocabulary ladders, vocab 512, on the english_mix_v512 build), runs long enough for
    a schedule's decay to matter, and tuning on one LR grid that is extended until each cell's
    optimum is interior.

    - Budgets of 10 and 20 tokens per active parameter at every size (a WSD trunk carries both;
      cosine runs each), batch 7 x 256 tokens: from 166 steps (k3-s1 at 10) to 1,527 (k2-s3
      at 20).
    - 256-token sequences: KDA's state and NoPE MLA have context to use (v1 had 128).
    - LR grid: 5 points 1.6x apart around 1.5e-2 (v1's tuned optima at these widths were
      1e-2 to 5e-2), up to 2 extensions each way; batch fixed at 7 sequences (the rule: the
      largest batch giving >= 150 steps at the smallest budget of the smallest rung; 8 gives 146).
    - Warmup: 10% of each size's smallest budget, the same tokens for both schedules.
    - Seeds 0, 1, 2 at each cell's optimum.
    - `schedules`: a study whose schedule is a setting, not its question, may run on WSD trunks
      (k2_vs_k3: one trunk to 20 tokens per parameter with a branch at 10 costs 22 of cosine's
      30); `grid_points` fewer LRs when the budget forces a choice (issue 20 keeps tokens per
      parameter and seeds first); `rung_lr_ratio` centres each rung's grid that much below the
      previous rung's, on the same lattice (1.6: one grid step per rung, as the v2 k2_vs_k3
      study's K3 optima fell: 1.2-1.9e-2 at s1, 7.4e-3 at s2, 4.6-7.4e-3 at s3);
      `size_centers` gives sizes their own centres instead (a pilot's optima, on the lattice
      1.5e-2 x 1.6^k so that every grid shares its LRs).
    `k3scale study plan --measure` trains each rung a few steps and prints the wall-clock.
    """
    centers = size_centers or {
        size: 1.5e-2 / rung_lr_ratio**rung
        for ladder in sizes.values()
        for rung, size in enumerate(ladder)
        if rung_lr_ratio != 1.0
    }
    grid = LRGrid(
        center=1.5e-2,
        points=grid_points,
        ratio=1.6,
        max_extensions=2,
        batch_size=7,
        size_centers=centers,
    )
    return StudyPreset(
        sizes=sizes,
        budgets=(1,),  # unused: budgets_per_param sets each size's budgets
        budgets_per_param=(10.0, 20.0),
        search=spaces.SMALL_CPU,
        trials_per_cell=grid.points,
        lr_grid=grid,
        seeds=(0, 1, 2),
        dataset="english_mix_v512",
        seq_len=256,
        eval_tokens=16_384,
        eval_points=2,
        micro_batch_size=7,
        warmup_fraction=0.1,
        schedules=schedules,
    )


# The v3 designs' seeds: new ones, so that v3 replicates v2 rather than retrains its runs (v2 ran
# seeds 0-2, and seed 0 of every v2 tuning trial sat about 0.02 nats low: issue 33).
V3_SEEDS = (3, 4, 5)


def cpu_v3(
    v2: StudyPreset,
    budgets_per_param: tuple[float, ...] | None = None,
    seeds: tuple[int, ...] = V3_SEEDS,
) -> StudyPreset:
    """The v3 design of a study (issue 33): its v2 layout on fresh seeds, every compared arm on
    the same seeds (the tuning trials on the first, each arm's best point re-run on the others),
    and optionally other tokens-per-parameter ratios. Sized by `k3scale bench calibrate` with the
    seed effects measured in the v2 runs, at a fixed CPU budget of at most 90 minutes
    (analysis/README.md gives the power of each design that was considered)."""
    return dataclasses.replace(
        v2,
        seeds=seeds,
        budgets_per_param=budgets_per_param or v2.budgets_per_param,
    )


def held_out(
    v3: StudyPreset,
    sizes: dict[str, tuple[str, ...]],
    budgets_per_param: tuple[float, ...],
    size_centers: dict[str, float],
    grid_points: int = 3,
    max_extensions: int | None = None,
    seeds: tuple[int, ...] = (),
) -> StudyPreset:
    """A held-out check of a v3 design (issue 47): its data, batch, schedule, evaluation and seeds
    at rungs and budgets its fits never saw, on a `grid_points` LR grid 1.6x apart centred per
    size on the LR the fits predict (`size_centers`), extended as v3's grid unless
    `max_extensions` says otherwise. Warmup is v3's in tokens per active parameter (its fraction
    of v3's smallest budget), so a run with no budget below 20 tokens per parameter warms up as
    v3's runs at 20 did. `seeds`: v3's unless given (the first tunes, the others re-run)."""
    grid = dataclasses.replace(
        v3.lr_grid,
        points=grid_points,
        max_extensions=v3.lr_grid.max_extensions if max_extensions is None else max_extensions,
        size_centers=size_centers,
    )
    warmup_per_param = v3.warmup_fraction * min(v3.budgets_per_param)
    return dataclasses.replace(
        v3,
        sizes=sizes,
        budgets_per_param=budgets_per_param,
        trials_per_cell=grid.points,
        lr_grid=grid,
        seeds=seeds or v3.seeds,
        warmup_fraction=warmup_per_param / min(budgets_per_param),
    )


def cpu_v2_batch_check(v2: StudyPreset, arch: str, size: str, batch_size: int) -> StudyPreset:
    """One cell of a cpu_v2 design at another fixed batch: the sensitivity check of its batch
    rule (issue 20). The cell is `size` at 20 tokens per active parameter, the larger budget (a
    batch of 12 gives 97 steps at 10 at k3-s1, under the 150-step floor); warmup is `v2`'s, in
    tokens, and the LR grid, seeds and data are `v2`'s. Budgets round to whole steps of each
    batch (k3-s1: 598,016 tokens at batch 4, 598,528 at 7, 599,040 at 12; 0.09% apart).
    """
    check = dataclasses.replace(
        v2,
        sizes={name: (size,) if name == arch else () for name in v2.sizes},
        budgets_per_param=(20.0,),
        lr_grid=dataclasses.replace(v2.lr_grid, batch_size=batch_size),
        micro_batch_size=batch_size,
    )
    (budget,) = check.budgets_for(size)
    return dataclasses.replace(check, warmup_fraction=warmup_tokens(v2, size) / budget)


def gpu(sizes: dict[str, tuple[str, ...]]) -> StudyPreset:
    """One H100/H200-class GPU for a few hours: one trial at a time on the GPU, bf16.

    Sized, not measured (no GPU was lent while building it): 3.7-4.4e18 tuning FLOPs per study,
    5-6 hours at an assumed 2e14 FLOP/s (about 20% of an H200's dense bf16 peak, a guess for
    models of 10^6-10^8 active parameters). `k3scale study plan` prints the FLOPs.
    """
    return StudyPreset(
        sizes=sizes,
        budgets=(40_000_000, 80_000_000, 160_000_000),
        search=spaces.GPU,
        trials_per_cell=10,
        seeds=(0, 1),
        seq_len=1024,
        eval_tokens=1_048_576,
        micro_batch_size=64,
        threads_per_trial=4,
        gpus_per_trial=1.0,
        precision="bf16",
        device="auto",
    )


def gpu_grid(
    sizes: dict[str, tuple[str, ...]],
    budgets_per_param: tuple[float, ...] = (10.0,),
    grid_points: int = 3,
    first_center: float = 6e-3,
    rung_lr_ratio: float = 1.6,
) -> StudyPreset:
    """`gpu`'s hardware with the v2 grid design: every cell on one LR grid at one batch size
    (32 x 1024 tokens: 248 steps at the smallest cell of the t3 rung at 10 tokens per parameter),
    extended until each optimum is interior, each rung's centre `rung_lr_ratio` below the
    previous one's (the cpu studies' optima fell about one 1.6x step per rung), and each cell's
    best point re-run on two more seeds shared by every arm. Sized by FLOPs, not measured (no
    GPU was lent while building it), at `gpu`'s assumed 2e14 FLOP/s."""
    centers = {
        size: first_center / rung_lr_ratio**rung
        for ladder in sizes.values()
        for rung, size in enumerate(ladder)
    }
    grid = LRGrid(
        center=first_center,
        points=grid_points,
        ratio=1.6,
        max_extensions=2,
        batch_size=32,
        size_centers=centers,
    )
    return dataclasses.replace(
        gpu(sizes),
        budgets=(1,),  # unused: budgets_per_param sets each size's budgets
        budgets_per_param=budgets_per_param,
        trials_per_cell=grid.points,
        lr_grid=grid,
        seeds=(0, 1, 2),
        micro_batch_size=32,
    )


def cluster(sizes: dict[str, tuple[str, ...]]) -> StudyPreset:
    """A Ray cluster of GPU nodes: larger ladders and budgets, one GPU per trial.

    Sized for 32 such GPUs over about two days (0.9-1.2e21 tuning FLOPs per study at the same
    assumed 2e14 FLOP/s per GPU).
    """
    return StudyPreset(
        sizes=sizes,
        budgets=(500_000_000, 1_000_000_000, 2_000_000_000, 4_000_000_000),
        search=spaces.GPU,
        trials_per_cell=16,
        seeds=(0, 1, 2),
        seq_len=2048,
        eval_tokens=4_194_304,
        micro_batch_size=32,
        threads_per_trial=8,
        gpus_per_trial=1.0,
        precision="bf16",
        device="auto",
    )
