"""Leave the top rung out of every committed study, predict it, and write the scores (issue 47).

Usage: .venv/bin/python scripts/leave_one_rung_out.py [--out analysis/results/loro.json]
The tables in analysis/README.md come from that file (scripts/analysis_readme.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (results folder, recipe): every committed study the issue names.
STUDIES = (
    ("k2_vs_k3-cpu_v2", "k2_vs_k3"),
    ("k2_vs_k3-cpu_v3", "k2_vs_k3"),
    ("cosine_vs_wsd-cpu_v3", "cosine_vs_wsd"),
    ("k3_ablations-cpu", "k3_ablations"),
)

# Why a study gives nothing to score, beyond the error its refit raised.
NOT_SCORED_WHY = {
    "k3_ablations-cpu": "its recipe reads K3's frontier law only inside the arm effects, and "
    "without its top rung (s2) each arm keeps 2 cells (s1 at 10 and 15 tokens per parameter), "
    "too few for any law with a degree of freedom left to test it",
}


def main() -> int:
    from k3scale.errors import K3ScaleError
    from k3scale.scaling import holdout
    from k3scale.scaling.values.result import dumps

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(ROOT / "analysis/results/loro.json"))
    args = parser.parse_args()
    scores, not_scored = [], {}
    for folder, recipe in STUDIES:
        print(f"{folder}: refitting without its top rung", flush=True)
        try:
            scores += holdout.leave_top_rung_out(ROOT / "analysis/results" / folder, recipe)
        except K3ScaleError as exc:
            not_scored[folder] = f"{exc}; {NOT_SCORED_WHY.get(folder, '')}".rstrip("; ")
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    result = {
        "computed_at_commit": commit,
        "scores": [s.to_json() for s in scores],
        "summary": holdout.summary(scores),
        "not_scored": not_scored,
    }
    Path(args.out).write_text(dumps(result))
    print(f"wrote {args.out} ({len(scores)} predictions scored)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
