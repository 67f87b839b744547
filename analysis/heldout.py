"""The held-out check of the k2_vs_k3 cpu_v3 laws (issue 47 item 5; methods.md 4.11 (c)).

`register`: from the committed v3 fit, predict every cell the `heldout` and `heldout_s5` presets
will train (each arch's optimum loss there, its tuned LR) and each arch's frontier and M(C) at
their computes, by every route, and write the predictions file. It is committed before any
held-out run exists: main's history shows that order.

  .venv/bin/python analysis/heldout.py register

`score` (once the held-out study is committed): every prediction against what the runs found.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FIT = ROOT / "analysis/results/k2_vs_k3-cpu_v3/fit.json"
PREDICTIONS = ROOT / "analysis/results/predictions/k2_vs_k3-heldout.json"
HELDOUT = ROOT / "analysis/results/k2_vs_k3-heldout"
REFERENCE = ROOT / "analysis/results/k2_vs_k3-cpu_v3"
SCORED = ROOT / "analysis/results/predictions/k2_vs_k3-heldout-scored.json"
PRESETS = ("heldout", "heldout_s5")
CONV = "c_6n"


def heldout_cells() -> list[dict]:
    """Every cell the held-out presets train: preset, arch, size, N_active, tokens, 6ND."""
    from k3scale.bench.calibrate import design_from_study

    out = []
    for preset in PRESETS:
        for cell in design_from_study("k2_vs_k3", preset).cells:
            out.append(
                {
                    "preset": preset,
                    "arch": cell.arch,
                    "size": cell.size,
                    "n": cell.n,
                    "tokens": cell.budget_tokens,
                    "compute": cell.flops_per_token_6n * cell.budget_tokens,
                }
            )
    return out


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()


def register() -> Path:
    from k3scale.scaling.predict import CellQuery, forecast
    from k3scale.scaling.values.result import dumps

    cells = heldout_cells()
    doc = json.loads(FIT.read_text())
    queries = [CellQuery(c["arch"], c["n"], c["tokens"]) for c in cells]
    computes = sorted({c["compute"] for c in cells})
    out = forecast(doc, computes, queries, CONV)
    out["cells"] = cells
    out["provenance"] = {
        "fit": str(FIT.relative_to(ROOT)),
        "fit_sha256": hashlib.sha256(FIT.read_bytes()).hexdigest(),
        "fit_commit": doc["provenance"]["code"]["git_sha"],
        "registered_at_commit": _commit(),
    }
    PREDICTIONS.parent.mkdir(parents=True, exist_ok=True)
    PREDICTIONS.write_text(dumps(out))
    return PREDICTIONS


def predicted_lr_centers(path: Path = PREDICTIONS) -> dict[str, float]:
    """Each held-out size's LR grid centre: the geometric mean of its cells' predicted peak LRs
    (one WSD trunk serves every budget of a size, so its grid serves them all)."""
    import numpy as np

    doc = json.loads(path.read_text())
    by_size: dict[str, list[float]] = {}
    for cell, (_, part) in zip(doc["cells"], _cells_in_order(doc), strict=True):
        by_size.setdefault(cell["size"], []).append(part["lr_opt"]["value"])
    return {size: float(np.exp(np.mean(np.log(v)))) for size, v in by_size.items()}


def _cells_in_order(doc: dict) -> list[tuple[str, dict]]:
    """The forecast's cell records in the order the cells were registered."""
    seen: dict[str, int] = {}
    out = []
    for cell in doc["cells"]:
        i = seen.get(cell["arch"], 0)
        out.append((cell["arch"], doc["arms"][cell["arch"]]["cells"][i]))
        seen[cell["arch"]] = i + 1
    return out


def score() -> Path:
    """The registered predictions against the held-out study (its own fit, and the reference
    and held-out optima fitted together for M(C) at the new computes)."""
    import polars as pl

    from k3scale.scaling import artifact, heldout_score, study
    from k3scale.scaling.inputs import tables
    from k3scale.scaling.values.result import dumps

    recipe = artifact.load_recipe("k2_vs_k3")
    options = study.StudyOptions()
    runs, curves = tables.load_tables(HELDOUT)
    ref_runs, ref_curves = tables.load_tables(REFERENCE)
    both_runs = pl.concat([ref_runs, runs], how="diagonal_relaxed")
    both_curves = pl.concat([ref_curves, curves], how="diagonal_relaxed")
    result = heldout_score.score(
        json.loads(PREDICTIONS.read_text()),
        {"results": recipe.run(runs, curves, options)},
        {"results": recipe.run(both_runs, both_curves, options)},
    )
    result["provenance"] = {
        "predictions": str(PREDICTIONS.relative_to(ROOT)),
        "heldout": str(HELDOUT.relative_to(ROOT)),
        "scored_at_commit": _commit(),
    }
    SCORED.write_text(dumps(result))
    return SCORED


if __name__ == "__main__":
    commands = {"register": register, "score": score}
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command not in commands:
        sys.exit("usage: analysis/heldout.py register|score")
    print(f"wrote {commands[command]()}")
