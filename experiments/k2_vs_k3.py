"""K3-style vs K2-style scaling efficiency at matched compute (the K3 report's ~2.5x claim).

Both architectures, each tuned per cell under one schedule to the same absolute floor (cosine; the
v2 preset runs WSD trunks with a branch per budget, to afford 10 and 20 tokens per parameter at
every size on 2 cores); fits read the held-out out-of-distribution validation loss, as the report
did, and the compute multiplier is reported under 6*N_active*D and under the attention-inclusive
FLOP count.
"""

from k3scale.sweep.declaration import Study
from sweeps import ladders, presets


def sizes(rungs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {"k2": ladders.rungs("k2", rungs), "k3": ladders.rungs("k3", rungs)}


STUDY = Study(
    name="k2_vs_k3",
    archs=("k2", "k3"),
    schedules=("cosine",),
    description="K3-style over K2-style compute multiplier, each arch tuned per cell (cosine; "
    "cpu_v2 on WSD trunks)",
    analysis="k2_vs_k3",
    dashboard="k2_vs_k3",
    presets={
        "smoke": presets.smoke(sizes(ladders.SMOKE)),
        "demo": presets.demo(sizes(ladders.DEMO)),
        "cpu": presets.cpu(sizes(ladders.CPU)),
        "cpu_v2": presets.cpu_v2(sizes(ladders.SMALL_VOCAB), schedules=("wsd",), grid_points=4),
        "gpu": presets.gpu(sizes(ladders.GPU)),
        "cluster": presets.cluster(sizes(ladders.CLUSTER)),
    },
)
