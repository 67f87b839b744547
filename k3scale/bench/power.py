"""The one line a report prints beside its answers: how often the preset's design, simulated by
`k3scale bench calibrate` (its committed JSON), resolves the study's headline effect, and plainly
so when it cannot answer or is too weak to settle it. Reads JSON only, so `study report` stays
quick (no numerics imported)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ABLATIONS = "k3_ablations"

# The quantity each study's answer rests on (k3scale/scaling/answers.py; the ablation's: its
# positive control, whose verdict says what the design can see at all), newest first: a calibration made before issue 47 holds only
# the older one, and its power line names which it read.
HEADLINE_QUANTITY = {
    "cosine_vs_wsd": ("pooled_diff_selection_free", "pooled_diff"),
    "k2_vs_k3": ("M_monotone_c_6n", "M_envelope_c_6n"),
    ABLATIONS: ("diff_adamw", "M_adamw"),
}
# What each scenario's effect is, in words.
EFFECTS = {
    "cosine_vs_wsd": {"report_direction": "cosine lower by 0.02 nats"},
    "k2_vs_k3": {"report_direction": "K3 at 2.5x", "modest": "K3 at 1.5x"},
    ABLATIONS: {"anchors": "AdamW 1.4x worse than Muon"},
}


# Below this simulated power an unresolved answer says little about the effect.
WEAK_POWER = 0.5


def power_line(result: dict, name: str) -> str | None:
    """One line: how often the preset's design identifies its headline effect, and a false one,
    and plainly so when the design cannot answer (None when the calibration did not run that
    study)."""
    per = result["scenarios"].get(name)
    if per is None:
        return None
    held = [q for q in HEADLINE_QUANTITY.get(name, ()) if q in per.get("no_effect", {})]
    if not held:
        return None
    quantity = held[0]
    source = (
        f"design power ({quantity}, `bench calibrate --preset {result['preset']}`, "
        f"{result['studies_per_scenario']} simulated studies)"
    )
    if not any(world[quantity]["identified_rate"] for world in per.values() if quantity in world):
        return (
            f"{source}: this design cannot answer it: {quantity} is identified in none of the "
            "simulated studies, in any world; it shows the pipeline, and a reference study "
            "(analysis/README.md) answers the question"
        )
    effects = {e: per[s][quantity]["detect_rate"] for s, e in EFFECTS[name].items() if s in per}
    found = ", ".join(f"{effect} in {rate:.0%}" for effect, rate in effects.items())
    line = f"{source}: detects {found}; a false effect in {per['no_effect'][quantity]['detect_rate']:.0%}"
    if max(effects.values(), default=0.0) < WEAK_POWER:
        line += (
            "; too weak to settle it: this design resolves the effect in fewer than half of "
            "the studies where it is real, so an unresolved answer is no evidence against it"
        )
    return line


def design_power(study_name: str, preset: str) -> str | None:
    """The preset's power line from its committed calibration, if there is one: the study's own
    (`<study>-<preset>.json`), else the preset's for both flagships."""
    folder = ROOT / "analysis" / "results" / "calibration"
    for path in (folder / f"{study_name}-{preset}.json", folder / f"{preset}.json"):
        if path.exists():
            return power_line(json.loads(path.read_text()), study_name)
    return None
