"""`k3scale study run` exits non-zero and names the count when trials fail (issue 23).

The study below trains for real, on a real local Ray: its batch of 12 sequences is not a
multiple of its micro-batch of 8, which `train()` refuses inside each trial's worker (the
declaration itself is valid), so every trial fails the way a crashing run does.
"""

from __future__ import annotations

import json

import pytest

from tests.sweep.test_study_runs import data_root, k3scale_cli  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.ray]

FAILING_STUDY = """
from k3scale.sweep.declaration import SearchSpace, Study, StudyPreset

SMOKE = StudyPreset(
    sizes={"k2": ("k2-t0",)},
    budgets=(16_384,),
    search=SearchSpace(lr_low=1e-3, lr_high=1e-2, batch_sizes=(12,)),
    trials_per_cell=2,
    seq_len=64,
    eval_tokens=4_096,
    eval_points=1,
    micro_batch_size=8,
)
STUDY = Study(name="failing", archs=("k2",), schedules=("cosine",), presets={"smoke": SMOKE})
"""


def test_failed_trials_make_study_run_exit_1_with_their_count(data_root, tmp_path):  # noqa: F811
    study = tmp_path / "failing.py"
    study.write_text(FAILING_STUDY)
    study_dir = tmp_path / "study"
    done = k3scale_cli(
        *("study", "run", str(study), "--preset", "smoke", "--study-dir", str(study_dir)),
        *("--data-root", str(data_root), "--dataset", "sample"),
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "k3scale study run: 2 of 2 trials failed" in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    record = json.loads((study_dir / "study.json").read_text())
    assert record["trials"] == {"finished": 0, "diverged": 0, "failed": 2}
    # The driver's line names the worker's own reason, not Ray's traceback header.
    output = done.stdout + done.stderr
    failed = [line for line in output.splitlines() if " failed: " in line and "trial " in line]
    assert failed and all("K3ScaleError: " in line for line in failed), failed
    assert all("multiple" in line for line in failed), failed
