"""Regenerate (or check) the generated tables of analysis/README.md from the committed artefacts.

A generated block sits between two comments; the first names its source:

    <!-- generated: k3scale study report ... --markdown -->   (a k3scale command's output)
    <!-- generated: calibration analysis/results/calibration/cpu.json -->   (a calibration JSON)
    <!-- generated: calibration designs STUDY QUANTITY a.json b.json -->   (designs compared)
    <!-- generated: committed studies -->   (runs.parquet and study.json of each results folder)
    <!-- generated: batch check analysis/results/batch_check 7 -->   (its folders, batch 7 the reference)
    <!-- generated: bench train analysis/results/bench/train.json -->   (a `k3scale bench train --json`)
    <!-- generated: bench sweep analysis/results/bench/sweep.json -->   (a `k3scale bench sweep --json`)
    <!-- generated: bench compile analysis/results/bench/compile.json -->   (a `k3scale bench compile --json`)
    <!-- generated: bench stack analysis/results/bench/stack.json -->   (a `k3scale bench stack --json`)
    <!-- generated: leave one rung out analysis/results/loro.json -->   (scripts/leave_one_rung_out.py)
    <!-- generated: held-out predictions analysis/results/predictions/k2_vs_k3-heldout-scored.json -->
    ...
    <!-- end generated -->

Usage: .venv/bin/python scripts/analysis_readme.py [--check] [--figures]. With --check it exits 1
when a block differs from what its source makes now (tests/analysis runs the same check);
--figures also writes the batch check's figure, `loss_vs_lr.png` in its folder (needs Chromium).
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "analysis" / "README.md"
# Sources that are one JSON file, and the module whose `markdown(dict)` renders it.
JSON_SOURCES = {
    "calibration ": "k3scale.bench.calibrate",
    "bench sweep ": "k3scale.bench.sweep",
    "bench train ": "k3scale.bench.train",
    "bench compile ": "k3scale.bench.compile",
    "bench stack ": "k3scale.bench.stack",
    "leave one rung out ": "k3scale.scaling.holdout",
    "held-out predictions ": "k3scale.scaling.heldout_score",
}
BLOCK = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end generated -->)", re.DOTALL)


def committed_studies() -> str:
    """One row per results folder: runs by arm, code commits, wall time of the sweep."""
    import polars as pl

    rows = [
        "| folder | preset | runs by arm | code commits | sweep wall time |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    results = ROOT / "analysis" / "results"
    for folder in sorted(results.rglob("runs.parquet")):
        runs = pl.read_parquet(folder)
        record = json.loads((folder.parent / "study.json").read_text())
        arms = runs["arm"].fill_null("tuned").value_counts().sort("arm").rows()
        by_arm = ", ".join(f"{n} {arm}" for arm, n in arms)
        rows.append(
            f"| `results/{folder.parent.relative_to(results)}` | {record['preset']} | {runs.height} ({by_arm}) | "
            f"{runs['git_sha'].n_unique()} | {record['sweep_s'] / 60:.1f} min |"
        )
    return "\n".join(rows) + "\n"


def batch_check(folder: str, reference: str) -> dict:
    """compare_batches over every study folder under `folder` (one cell, one batch each)."""
    from k3scale.scaling.batch_check import compare_batches
    from k3scale.scaling.study import StudyOptions

    return compare_batches(check_runs(folder), int(reference), StudyOptions(num_resamples=4000))


def check_runs(folder: str):
    import polars as pl

    tables = sorted((ROOT / folder).glob("*/runs.parquet"))
    return pl.concat([pl.read_parquet(t) for t in tables], how="diagonal_relaxed")


def render(source: str) -> str:
    """The Markdown a block's source makes now (paths relative to the repository root)."""
    if source == "committed studies":
        return committed_studies()
    if source.startswith("calibration designs "):
        from k3scale.bench.calibrate import designs_markdown

        name, quantity, *files = source.removeprefix("calibration designs ").split()
        results = [json.loads((ROOT / f).read_text()) for f in files]
        return designs_markdown(results, name, quantity)
    if source.startswith("batch check "):
        from k3scale.scaling.batch_check import markdown

        return markdown(batch_check(*source.removeprefix("batch check ").split()))
    for prefix, module in JSON_SOURCES.items():
        if source.startswith(prefix):
            markdown = importlib.import_module(module).markdown
            return markdown(json.loads((ROOT / source.removeprefix(prefix)).read_text()))
    from k3scale.cli import main

    words = shlex.split(source)
    if words[0] != "k3scale":
        raise ValueError(f"unknown generated-block source: {source}")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.chdir(ROOT):
        code = main(words[1:])
    if code != 0:
        raise ValueError(f"`{source}` exited {code}")
    return out.getvalue()


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group(2)) + m.group(4), text)


def main(argv: list[str]) -> int:
    text = README.read_text()
    new = regenerate(text)
    if "--check" in argv:
        if new != text:
            print(f"{README} has generated tables that differ from their sources", file=sys.stderr)
            return 1
        return 0
    README.write_text(new)
    print(f"updated {len(BLOCK.findall(text))} generated blocks in {README}")
    if "--figures" in argv:
        write_figures(text)
    return 0


def write_figures(text: str) -> None:
    """The figure of each batch check block, beside its runs."""
    from k3scale.viz.batch_check import batch_check_panel
    from k3scale.viz.export_png import export_pngs

    for source in BLOCK.findall(text):
        if source[1].startswith("batch check "):
            folder, reference = source[1].removeprefix("batch check ").split()
            panel = batch_check_panel(check_runs(folder), batch_check(folder, reference))
            (path,) = export_pngs([panel], ROOT / folder)
            path.rename(path.with_name("loss_vs_lr.png"))
            print(f"wrote {path.with_name('loss_vs_lr.png')}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
