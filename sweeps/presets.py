"""The five preset sizes every study offers (platform.md section 8), as functions of its sizes.

A study picks model presets per architecture; everything else that makes a preset (budgets,
search space, trials, sequence length, evaluation, hardware) is shared here so both flagship
studies run at the same scale.
"""

from k3scale.sweep.declaration import StudyPreset
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


def demo(sizes: dict[str, tuple[str, ...]]) -> StudyPreset:
    """The README's main job on one 2-core machine: 3 sizes x 2 budgets, 3 trials per cell."""
    return StudyPreset(
        sizes=sizes,
        budgets=(24_576, 49_152),
        search=spaces.DEMO,
        trials_per_cell=3,
        seq_len=64,
        eval_tokens=8_192,
        eval_points=2,
        micro_batch_size=16,
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
    )
