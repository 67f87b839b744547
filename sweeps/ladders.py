"""Which ladder rungs each preset uses (rung names from k3scale.models.presets)."""

SMOKE = ("t0",)
DEMO = ("s1",)
"""The main job's live studies: the smallest small-vocabulary rung (issue 36)."""
CPU = ("t2", "t3", "t4")
CPU_SCHEDULES = ("t1", "t2", "t3")
"""cosine vs WSD spends its CPU hours on more trials per cell rather than a larger top rung."""
SMALL_VOCAB = ("s1", "s2", "s3")
"""The v2 reference studies' rungs (vocab 512; k3scale.models.presets small ladders)."""
HELD_OUT = ("s4",)
HELD_OUT_TOP = ("s5",)
"""Rungs the v3 fits never saw (issue 47): about 2x and 4x s3's active parameters."""
GPU = ("t4", "t5", "t6", "t7")
ABLATION_GPU = ("t3", "t4", "t5", "t6")
"""The ablation's twelve arms on one GPU: a rung lower than the flagship studies'."""
CLUSTER = ("t5", "t6", "t7", "t8", "t9")


def rungs(family: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """Preset names of `family` ("k2" or "k3") for the given rungs."""
    return tuple(f"{family}-{name}" for name in names)
