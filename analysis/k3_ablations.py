"""Recipe: K3's gain apportioned by component (issue 38; experiments/k3_ablations.py).

What the report needs: per arm and design cell, the arm's tuned optimum minus full K3's (paired
by seed) and the effective-compute multiplier it is worth to K3 through K3's frontier slope;
pooled over cells with intervals, verdicts and the power to see each published anchor; the sum
check of the components against the whole K3-over-K2 gap; the positive control (Muon -> AdamW)
with its verdict. Under 6*N_active*D and the attention-inclusive FLOP count.
"""

from __future__ import annotations

from pathlib import Path

from k3scale.scaling import ablation, study
from k3scale.scaling.values.components import Ablation, Anchor
from k3scale.sweep.declaration import load_study

FULL = "k3"
AGAINST = "k2"
POSITIVE_CONTROL = "adamw"
# Arms that switch back a difference between K3 and K2; latent_no_norm is a sub-ablation of
# plain_moe's change and the positive control is not a K3-K2 difference (both use Muon).
SUM_ARMS = (
    "mla_only",
    "ungated_mla",
    "rope_mla",
    "no_attnres",
    "plain_moe",
    "swiglu",
    "loss_free_balancing",
    "full_matrix_muon",
)
# Published effects of the same changes (../shared/design/peers.md, "Component anchors"); the
# tuned Muon-vs-AdamW comparison's small end (0.1B) is the closer regime for these models.
ANCHORS = {
    "k2": Anchor(
        2.5,
        "K3 over K2: about 2.5x scaling efficiency at matched compute, read off fitted curves",
        "Kimi K3 technical report (the source note)",
    ),
    "mla_only": Anchor(
        1.16,
        "KDA 3:1 hybrid vs full MLA: about 1.16x compute (1.17x falling to 1.12x), "
        "0.65-1.7B active MoE",
        "Kimi Linear, arXiv 2510.26692",
    ),
    "ungated_mla": Anchor(
        None, "output gate off costs 0.002-0.004 nats; no multiplier", "arXiv 2510.26692"
    ),
    "rope_mla": Anchor(
        None, "NoPE vs RoPE: similar at short context; no multiplier", "arXiv 2510.26692"
    ),
    "no_attnres": Anchor(1.25, "Attention Residuals: about 1.25x compute", "arXiv 2603.15031"),
    "plain_moe": Anchor(None, "LatentMoE: no multiplier published", "arXiv 2601.18089"),
    "loss_free_balancing": Anchor(
        None, "Quantile Balancing: no multiplier published", "the source note"
    ),
    "full_matrix_muon": Anchor(None, "Per-Head Muon: no ablation published", "the source note"),
    "adamw": Anchor(
        1.4,
        "Muon vs AdamW, each tuned: 1.4x at 0.1B falling to 1.1x at 1.2B (about 2x in "
        "Moonlight, arXiv 2502.16982)",
        "arXiv 2509.02046",
    ),
}
EXPERIMENT = Path(__file__).resolve().parents[1] / "experiments" / "k3_ablations.py"


def declared() -> Ablation:
    """The recipe's declaration, with each arm's note from the study."""
    notes = {arm.name: arm.note for arm in load_study(EXPERIMENT).arms}
    notes[AGAINST] = "the whole K2 model (the gap the components should explain)"
    return Ablation(FULL, AGAINST, SUM_ARMS, POSITIVE_CONTROL, notes, ANCHORS)


def run(runs, curves, options: study.StudyOptions) -> dict:
    """Every fit and comparison of the ablation report, from the run table."""
    usable, excluded = study.usable_runs(runs, options)
    estimates, noise = study.cell_estimates(usable, options)
    design = declared()
    return {
        "excluded": excluded,
        "cell_optima": [r.to_json() for r in study.cell_records(estimates)],
        "run_noise": noise.to_dict(),
        "rerun_check": study.rerun_coverage(estimates, noise, options),
        "component_effects": {
            conv: ablation.component_effects(estimates, design, conv).to_json()
            for conv in options.computes
        },
    }
