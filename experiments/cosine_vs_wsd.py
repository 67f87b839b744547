"""Cosine vs WSD with peak LR and batch size tuned separately per schedule (K3 report, seed note).

One architecture (K3-style). Both schedules decay to the same absolute floor, warm up alike and
search the same space; WSD decays over the last 20% with the 1-sqrt shape (fixed, not searched).
The shared arm re-runs WSD at cosine's tuned optimum: the single-setting comparison the K3 report
calls unfair, kept to show how much it moves the answer.
"""

from k3scale.sweep.declaration import Study, StudyPreset
from sweeps import ladders, spaces

STUDY = Study(
    name="cosine_vs_wsd",
    archs=("k3",),
    schedules=("cosine", "wsd"),
    shared_arm=True,
    description="cosine vs WSD at per-schedule tuned (peak LR, batch), fixed lr_min",
    analysis="cosine_vs_wsd",
    dashboard="cosine_vs_wsd",
    presets={
        "smoke": StudyPreset(
            sizes={"k3": ladders.rungs("k3", ladders.SMOKE)},
            budgets=(16_384, 32_768),
            search=spaces.TINY_CPU,
            trials_per_cell=2,
            seq_len=64,
            eval_tokens=4_096,
            eval_points=2,
            micro_batch_size=8,
        ),
        "demo": StudyPreset(
            sizes={"k3": ladders.rungs("k3", ladders.DEMO)},
            budgets=(24_576, 49_152),
            search=spaces.DEMO,
            trials_per_cell=3,
            seq_len=64,
            eval_tokens=8_192,
            eval_points=2,
            micro_batch_size=16,
        ),
        "cpu": StudyPreset(
            sizes={"k3": ladders.rungs("k3", ladders.CPU)},
            budgets=(524_288, 1_048_576, 2_097_152),
            search=spaces.SMALL_CPU,
            trials_per_cell=16,
            seeds=(0, 1, 2),
            seq_len=256,
            eval_tokens=65_536,
        ),
        "gpu": StudyPreset(
            sizes={"k3": ladders.rungs("k3", ladders.GPU)},
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
            sizes={"k3": ladders.rungs("k3", ladders.CLUSTER)},
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
