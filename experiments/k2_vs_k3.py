"""K3-style vs K2-style scaling efficiency at matched compute (the K3 report's ~2.5x claim).

Both architectures, each tuned per cell under cosine to the same absolute floor; fits read the
held-out out-of-distribution validation loss, as the report did, and the compute multiplier is
reported under 6*N_active*D and under the attention-inclusive FLOP count.
"""

from k3scale.sweep.declaration import Study, StudyPreset
from sweeps import ladders, spaces

STUDY = Study(
    name="k2_vs_k3",
    archs=("k2", "k3"),
    schedules=("cosine",),
    description="K3-style over K2-style compute multiplier, each arch tuned per cell (cosine)",
    analysis="k2_vs_k3",
    dashboard="k2_vs_k3",
    presets={
        "smoke": StudyPreset(
            sizes={
                "k2": ladders.rungs("k2", ladders.SMOKE),
                "k3": ladders.rungs("k3", ladders.SMOKE),
            },
            budgets=(16_384,),
            search=spaces.TINY_CPU,
            trials_per_cell=2,
            seq_len=64,
            eval_tokens=4_096,
            eval_points=2,
            micro_batch_size=8,
        ),
        "demo": StudyPreset(
            sizes={
                "k2": ladders.rungs("k2", ladders.DEMO),
                "k3": ladders.rungs("k3", ladders.DEMO),
            },
            budgets=(24_576, 49_152),
            search=spaces.DEMO,
            trials_per_cell=3,
            seq_len=64,
            eval_tokens=8_192,
            eval_points=2,
            micro_batch_size=16,
        ),
        "cpu": StudyPreset(
            sizes={"k2": ladders.rungs("k2", ladders.CPU), "k3": ladders.rungs("k3", ladders.CPU)},
            budgets=(524_288, 1_048_576, 2_097_152),
            search=spaces.SMALL_CPU,
            trials_per_cell=16,
            seeds=(0, 1, 2),
            seq_len=256,
            eval_tokens=65_536,
        ),
        "gpu": StudyPreset(
            sizes={"k2": ladders.rungs("k2", ladders.GPU), "k3": ladders.rungs("k3", ladders.GPU)},
            budgets=(500_000_000, 1_000_000_000, 2_000_000_000),
            search=spaces.GPU,
            trials_per_cell=24,
            seeds=(0, 1, 2),
            seq_len=1024,
            eval_tokens=2_097_152,
            micro_batch_size=64,
            threads_per_trial=4,
            gpus_per_trial=1.0,
            precision="bf16",
        ),
        "cluster": StudyPreset(
            sizes={
                "k2": ladders.rungs("k2", ladders.CLUSTER),
                "k3": ladders.rungs("k3", ladders.CLUSTER),
            },
            budgets=(2_000_000_000, 5_000_000_000, 10_000_000_000, 20_000_000_000),
            search=spaces.GPU,
            trials_per_cell=32,
            seeds=(0, 1, 2),
            seq_len=2048,
            eval_tokens=4_194_304,
            micro_batch_size=32,
            threads_per_trial=8,
            gpus_per_trial=1.0,
            precision="bf16",
        ),
    },
)
