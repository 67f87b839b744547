"""K3's gain apportioned by component (issue 38): full K3 against K3 with one component switched
back at a time, each arm tuned on its own LR grid at every cell, all arms on the same seeds.

The K3 report credits its ~2.5x scaling efficiency over K2 to the architectural changes together
with training and data recipes, and gives no component ablation (the source note). Here each
arm is K3's trial config with its switches applied (`Arm.overrides`), K2 runs beside them for
the sum check (the leave-one-out effects against the whole K3-minus-K2 gap), and Muon -> AdamW
on every matrix is the positive control: an effect the literature puts at 1.1-2x compute.

The `cpu` preset was sized by `k3scale study plan --measure` and `k3scale bench calibrate --study
k3_ablations` before it ran (issue 34's stacked trials were measured not to pay on a CPU: `k3scale
bench stack`). Its analysis is `analysis/k3_ablations.py` (per-arm loss differences and compute
multipliers, the anchors' power, the sum check) and its page `dashboards/k3_ablations.py` (a
forest plot).
"""

import dataclasses

from k3scale.sweep.declaration import Arm, Study
from sweeps import ladders, presets

# Arms whose switch changes the active parameters get them back (or give them up) in the first
# layer's dense FFN, so each sits at full K3's N at every rung: a loss difference is then at
# matched (N, D) and its multiplier needs no frontier reading across N (unmatched, the
# calibration's no-effect false-positive rate of mla_only's multiplier was 0.12).
MATCHED_BY = "model.d_ff_dense"

# One arm per component switched back to its K2-side counterpart (or off).
ARMS = (
    Arm(
        name="mla_only",
        base="k3",
        overrides=("model.mla_period=1",),
        note="KDA hybrid -> gated NoPE MLA in every layer",
        matched_by=MATCHED_BY,
    ),
    Arm(
        name="ungated_mla",
        base="k3",
        overrides=("model.mla.output_gate=false",),
        note="gated MLA -> ungated MLA",
        matched_by=MATCHED_BY,
    ),
    Arm(
        name="rope_mla",
        base="k3",
        overrides=("model.mla.rope=true",),
        note="NoPE -> RoPE on the MLA layers",
    ),
    Arm(
        name="no_attnres",
        base="k3",
        overrides=("model.attnres=false",),
        note="Attention Residuals -> the plain residual sum",
        matched_by=MATCHED_BY,
    ),
    Arm(
        name="plain_moe",
        base="k3",
        overrides=("model.moe.d_latent=none",),
        note="Stable LatentMoE -> plain MoE at full width",
        matched_by=MATCHED_BY,
    ),
    Arm(
        name="latent_no_norm",
        base="k3",
        overrides=("model.moe.latent_norm=false",),
        note="the latent MoE path without its RMSNorm",
        matched_by=MATCHED_BY,
    ),
    Arm(
        name="swiglu",
        base="k3",
        overrides=("model.activation=swiglu",),
        note="SiTU-GLU -> SwiGLU",
    ),
    Arm(
        name="loss_free_balancing",
        base="k3",
        overrides=("model.moe.balancing=loss_free",),
        note="Quantile Balancing -> the loss-free fixed-step bias",
    ),
    Arm(
        name="full_matrix_muon",
        base="k3",
        overrides=("optim.per_head_muon=false",),
        note="Per-Head Muon -> full-matrix Muon",
    ),
    Arm(
        name="adamw",
        base="k3",
        overrides=("optim.matrix_optimizer=adamw",),
        note="positive control: Muon -> AdamW on every matrix",
    ),
)
ARCHS = ("k3", "k2", *(arm.name for arm in ARMS))


def sizes(rungs: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """Every arm on its family's rungs."""
    return {
        "k2": ladders.rungs("k2", rungs),
        "k3": ladders.rungs("k3", rungs),
        **{arm.name: ladders.rungs(arm.base, rungs) for arm in ARMS},
    }


STUDY = Study(
    name="k3_ablations",
    archs=ARCHS,
    arms=ARMS,
    schedules=("cosine",),
    description="full K3 against K3 with one component switched back at a time (and K2), each "
    "arm tuned per cell on the same seeds; Muon -> AdamW is the positive control",
    presets={
        "smoke": presets.smoke(sizes(ladders.SMOKE)),
        "demo": presets.demo(sizes(ladders.DEMO)),
        # v2's grid design at the two smaller v3 rungs on the v3 seeds, at 10 and 15 tokens per
        # active parameter (not v2's 20: `study plan --measure` put 10 and 20 at about 130 min
        # with compile and grid extensions, over the 2-hour cap), compiled (bench train: the
        # compiled step 1.2-1.3x the eager one at s1-s2). Power: `bench calibrate`.
        "cpu": dataclasses.replace(
            presets.cpu_v3(
                presets.cpu_v2(sizes(("s1", "s2")), grid_points=4), budgets_per_param=(10.0, 15.0)
            ),
            compile=True,
        ),
        # One H100-class GPU for about 6 hours at the gpu presets' assumed 2e14 FLOP/s: 2.3e18
        # tuning FLOPs (`study plan --preset gpu`), 3.9e18 with each cell's two re-runs; four
        # rungs at 10 tokens per parameter give full K3's frontier four cells. One trial at a
        # time, not stacked (`bench stack`: stacking did not pay on a CPU; on a GPU it is not
        # measured).
        "gpu": presets.gpu_grid(sizes(ladders.ABLATION_GPU)),
        "cluster": presets.cluster(sizes(ladders.CLUSTER)),
    },
)
