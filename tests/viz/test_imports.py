"""`k3scale/viz` and the dashboard command never import torch or Ray (INTERFACES.md, style.md),
and no module of k3scale/viz fits anything."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

CHECK = """
import sys
import k3scale.commands.dashboard, k3scale.viz.dashboard, k3scale.viz.export_png
from k3scale.commands.dashboard import render
from pathlib import Path
render(Path(sys.argv[1]), None, None, "final_val_ood_loss", "file")
heavy = sorted(m for m in ("torch", "ray", "mlflow", "optuna") if m in sys.modules)
print(",".join(heavy))
"""


def test_rendering_imports_no_torch_ray_mlflow():
    from tests.viz.conftest import DATA

    out = subprocess.run(
        [sys.executable, "-c", CHECK, str(DATA)], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == ""


# Fitting functions and the modules that hold them (issue 32: figures never fit; every fitted
# quantity drawn is read from the `k3scale fit` artifact the report prints from).
FITTING_TEXT = re.compile(
    r"polyfit|polyval|lstsq|curve_fit|least_squares|minimize|Akima|isoflop_minim|\bfit_\w*\("
)
FITTING_MODULES = ("scipy.optimize", "scipy.interpolate", "k3scale.scaling")
# What a figure may read: the values wing (records, verdicts, estimates: k3scale/scaling/values/),
# the report's text and answers, the artifact's provenance and the run tables' schema, and the rule that
# groups cells into IsoFLOP levels (a rounding of C, not a fit), so a figure groups them as the
# fit did. Constants (upper-case names) besides.
READING_ONLY = (
    "k3scale.scaling.values",
    "k3scale.scaling.headline",
    "k3scale.scaling.component_text",
    "k3scale.scaling.answers",
    "k3scale.scaling.artifact",
    "k3scale.scaling.inputs.tables",
    "k3scale.scaling.laws.isoflop.compute_level",
)


def _scaling_imports(tree: ast.AST) -> list[str]:
    """Every name a module imports from k3scale.scaling, scipy.optimize or scipy.interpolate."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(FITTING_MODULES):
                names += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name.startswith(FITTING_MODULES)]
    return names


def _allowed(name: str) -> bool:
    if name.rsplit(".", 1)[-1].isupper():
        return name.startswith("k3scale.scaling.")
    return any(name == p or name.startswith(p + ".") for p in READING_ONLY)


def test_no_viz_module_fits():
    modules = sorted((Path(__file__).resolve().parents[2] / "k3scale" / "viz").glob("*.py"))
    assert len(modules) > 10
    fitting, imported = [], []
    for path in modules:
        text = path.read_text()
        fitting += [f"{path.name}: {m.group(0)}" for m in FITTING_TEXT.finditer(text)]
        imported += [
            f"{path.name}: {name}"
            for name in _scaling_imports(ast.parse(text))
            if not _allowed(name)
        ]
    assert not fitting, fitting
    assert not imported, imported
