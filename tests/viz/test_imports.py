"""`k3scale/viz` and the dashboard command never import torch or Ray (INTERFACES.md, style.md)."""

from __future__ import annotations

import subprocess
import sys

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
