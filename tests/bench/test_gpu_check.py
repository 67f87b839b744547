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
    """Compile-only (no GPU; needs triton's bundled ptxas): registers, spills, shared memory."""
    pytest.importorskip("triton")
    import kernel_table

    rows = kernel_table.other_k3scale_rows(90)
    rows += kernel_table.build_table(90, ["k3scale"], work=False)
    problems = [r for r in rows if not r.fits]
    assert not problems, "\n".join(
        f"{r.kernel} d={r.d_head} {r.dtype}: regs {r.registers} spill {r.spill_bytes} "
        f"smem {r.shared_bytes} {r.note}"
        for r in problems
    )
    seen = {(r.kernel, r.d_head, r.dtype) for r in rows}
    for d_head in (64, 128):
        for dtype in ("bfloat16", "float32"):
            assert {(name, d_head, dtype) for name in KDA_KERNELS} <= seen
