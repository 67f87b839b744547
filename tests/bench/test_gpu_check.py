"""`benchmarks/gpu_check.py` without a GPU: the no-GPU exit, the JSON writer, and the
ahead-of-time compile check that no k3scale kernel spills at the realistic sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check  # noqa: E402

KDA_KERNELS = {
    "_cumsum_kernel", "_pair_fwd_kernel", "_solve_fwd_kernel", "_state_fwd_kernel",
    "_state_bwd_kernel", "_local_bwd_kernel", "_pair_bwd_kernel",
}  # fmt: skip


def test_without_a_gpu_the_script_exits_2_at_once_with_one_line(tmp_path):
    if gpu_check.no_gpu_reason() is None:
        pytest.skip("this machine has a usable GPU")
    out = tmp_path / "check.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHON=sys.executable)
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks/gpu_check.sh"), "--json", str(out)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1
    assert "nothing was checked" in done.stderr
    assert not out.exists()


def test_json_has_the_documented_keys(tmp_path):
    rows = [
        gpu_check.Row("kda fwd", "torch", 1.5),
        gpu_check.Row("kda fwd", "triton", 0.5, 3.0, "90.0 TFLOP/s", 0.1, 1e-3, True),
        gpu_check.Row("kda", "fla", None, note="skipped: ImportError"),
    ]
    path = tmp_path / "check.json"
    gpu_check.write_json(str(path), "NVIDIA H200", 900.0, 4000.0, rows, 0)
    result = json.loads(path.read_text())
    assert set(result) == {"schema", "device", "exit_code", "peaks", "rows"}
    assert result["schema"] == 1 and result["exit_code"] == 0
    assert set(result["peaks"]) == {"bf16_matmul_tflops", "device_copy_gbps"}
    documented = {"op", "path", "ms", "vs_torch", "achieved", "fraction", "error", "ok", "note"}
    assert all(set(row) == documented for row in result["rows"])
    assert result["rows"][2]["ms"] is None
    readme = (ROOT / "benchmarks/README.md").read_text()
    assert all(f"`rows[].{key}`" in readme for key in documented)


@pytest.mark.slow
def test_no_k3scale_kernel_spills_when_compiled_for_sm90():
    """Compile-only (no GPU; needs triton's bundled ptxas): registers, spills, shared memory.

    Runs the script in a fresh process: a kernel module an earlier test imported under
    TRITON_INTERPRET=1 stays an interpreted function for the rest of the process, and the
    recorder would then run it through the interpreter instead of compiling it."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--compile-only",
         "--impl", "k3scale", "--no-count"],
        capture_output=True, text=True, env=env, timeout=1200, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("k3scale ")]
    assert not any("SPILLS/OVER" in " ".join(row) for row in rows)
    seen = {(row[1], int(row[2]), row[3]) for row in rows}
    for d_head in (64, 128):
        for dtype in ("bfloat16", "float32"):
            assert {(name, d_head, dtype) for name in KDA_KERNELS} <= seen
    other = {name for name, d_head, _ in seen if d_head == 0}
    assert any("situ" in name for name in other) and any("margin" in name for name in other)
