"""Cosine vs WSD with peak LR and batch size tuned separately per schedule (K3 report, seed note).

One architecture (K3-style). Both schedules decay to the same absolute floor, warm up alike and
search the same space; WSD decays over the last 20% with the 1-sqrt shape (fixed, not searched).
The shared arm re-runs WSD at cosine's tuned optimum: the single-setting comparison the K3 report
calls unfair, kept to show how much it moves the answer.
"""

from k3scale.sweep.declaration import Study
from sweeps import ladders, presets


def sizes(rungs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {"k3": ladders.rungs("k3", rungs)}


# Four LRs per rung, one grid step lower per rung, to fit 90 minutes (issue 20).
CPU_V2 = presets.cpu_v2(sizes(ladders.SMALL_VOCAB), grid_points=4, rung_lr_ratio=1.6)

# The demo's grid centre: one 1.6x step above v2's at s1, as 5 tokens per parameter is shorter
# training (the v3 cosine cell at 10 chose 3.0e-2, the top of its grid).
DEMO_CENTER = 1.5e-2 * 1.6

STUDY = Study(
    name="cosine_vs_wsd",
    archs=("k3",),
    schedules=("cosine", "wsd"),
    shared_arm=True,
    description="cosine vs WSD at per-schedule tuned peak LR (and batch where a preset searches "
    "it), fixed lr_min",
    analysis="cosine_vs_wsd",
    dashboard="cosine_vs_wsd",
    presets={
        # Two budgets so WSD trunks and branches run even in the smoke preset.
        "smoke": presets.smoke(sizes(ladders.SMOKE), budgets=(16_384, 32_768)),
        "demo": presets.demo(sizes(ladders.DEMO), size_centers={"k3-s1": DEMO_CENTER}),
        "cpu": presets.cpu(sizes(ladders.CPU_SCHEDULES), trials_per_cell=6),
        "cpu_v2": CPU_V2,
        # v2's layout on fresh seeds (issue 33), 3 seeds: chosen by the paired pooled
        # difference's simulated power at its planned minutes against 2 and 4 seeds
        # (analysis/README.md, "The v3 designs", holds the table).
        "cpu_v3": presets.cpu_v3(CPU_V2),
        "gpu": presets.gpu(sizes(ladders.GPU)),
        "cluster": presets.cluster(sizes(ladders.CLUSTER)),
    },
)
