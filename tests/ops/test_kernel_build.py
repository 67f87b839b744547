"""The fused kernels' build on any x86-64 CPU (issue 31) and without locks (issue 35): every source
compiles at every capability torch may report, on any host; a dead builder's leftovers never
block a later process; the slow path announces itself and every run says which path it took."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from k3scale.data.sample import prepare_sample
from k3scale.ops.cpu.build import (
    BUILD_PREFIX,
    CAPABILITY_FLAGS,
    FUSED_SPEEDUP_RANGE,
    SOURCES,
    STALE_BUILD_S,
    _remove_stale_builds,
    compile_command,
    extension_name,
    kernel_dir,
)
from k3scale.track import schema
from tests.conftest import require_fused_kernels

ROOT = Path(__file__).resolve().parents[2]


def _syntax_errors(source: Path, capability: str) -> str | None:
    command = [*compile_command(source, capability, "syntax_check"), "-fsyntax-only"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return None
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    return f"{source.relative_to(ROOT)}: " + "\n".join(errors[:5])


@pytest.mark.parametrize("capability", sorted(CAPABILITY_FLAGS))
def test_every_source_compiles_at_every_capability(capability):
    # Compiling for AVX-512 needs no AVX-512 CPU: an AVX2 machine's CI checks both (the
    # `vec_reduce_all` calls that broke the AVX-512 build compiled under AVX2).
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        failures = [e for e in pool.map(lambda s: _syntax_errors(s, capability), SOURCES) if e]
    assert not failures, "\n".join(failures)


def _load_in_process(cache: Path, timeout_s: float, **env: str) -> subprocess.CompletedProcess:
    code = "from k3scale.ops.cpu.build import status; print(status())"
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TORCH_EXTENSIONS_DIR": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_a_dead_builders_leftovers_do_not_block_loading(tmp_path):
    require_fused_kernels()
    from k3scale.ops.cpu.build import kernel_path

    name = extension_name(kernel_path().capability)
    folder = tmp_path / "k3scale"
    folder.mkdir()
    shutil.copy(kernel_dir() / f"{name}.so", folder / f"{name}.so")
    # What killed builders leave: torch's lock file (which wedged every later process before)
    # and a private build folder of ours.
    (folder / "lock").touch()
    (tmp_path / "lock").touch()
    (folder / f"{BUILD_PREFIX}host-1-abc").mkdir()
    started = time.monotonic()
    done = _load_in_process(tmp_path, timeout_s=60)
    assert done.returncode == 0, done.stderr
    assert f"fused CPU kernels: {folder / name}.so" in done.stdout
    assert time.monotonic() - started < 60


def test_only_stale_private_builds_are_removed(tmp_path):
    old, young = tmp_path / f"{BUILD_PREFIX}a-1-x", tmp_path / f"{BUILD_PREFIX}a-2-y"
    old.mkdir(), young.mkdir()
    past = time.time() - STALE_BUILD_S - 60
    os.utime(old, (past, past))
    _remove_stale_builds(tmp_path)
    assert not old.exists() and young.exists()


@pytest.fixture(scope="module")
def sample_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    prepare_sample(root, vocab_size=512)
    return root


@pytest.fixture(scope="module")
def sample_data(sample_root) -> tuple[str, ...]:
    return ("--set", f"data.root={sample_root}", "--set", "data.dataset=sample")


def _train(out: Path, sample_data: tuple[str, ...], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "k3scale.cli", "train", "--preset", "k3-t0", "--steps", "2",
         "--out", str(out), *sample_data],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )  # fmt: skip


def _run_tags(out: Path) -> dict[str, str]:
    tags: dict[str, str] = {}
    for line in (out / schema.REPLICA_FILE).read_text().splitlines():
        entry = json.loads(line)
        if entry["type"] == "tags":
            tags.update(entry["tags"])
    return tags


def test_the_slow_path_says_so_and_its_runs_carry_it(tmp_path, sample_data):
    done = _train(tmp_path / "off", sample_data, K3SCALE_CPU_KERNELS="0")
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "SLOW PATH" in line]
    low, high = FUSED_SPEEDUP_RANGE
    assert len(notices) == 1 and "K3SCALE_CPU_KERNELS=0" in notices[0]
    assert f"{low}-{high}x" in notices[0]
    tags = _run_tags(tmp_path / "off")
    assert tags[schema.TAG_KERNEL_PATH] == "torch"
    assert tags[schema.TAG_CPU_CAPABILITY]


def test_the_fused_path_is_quiet_and_its_runs_carry_it(tmp_path, sample_data):
    module = require_fused_kernels()
    done = _train(tmp_path / "on", sample_data)
    assert done.returncode == 0, done.stderr
    assert "SLOW PATH" not in done.stderr
    tags = _run_tags(tmp_path / "on")
    assert tags[schema.TAG_KERNEL_PATH] == "fused"
    assert tags[schema.TAG_CPU_CAPABILITY].lower() in Path(module.__file__).name


def _train_command(out: Path, sample_data: tuple[str, ...]) -> list[str]:
    return [sys.executable, "-m", "k3scale.cli", "train", "--preset", "k3-t0", "--steps", "2",
            "--out", str(out), *sample_data]  # fmt: skip


def _kill_after(command: list[str], env: dict[str, str], seconds: float) -> None:
    victim = subprocess.Popen(command, env=env, cwd=ROOT)
    time.sleep(seconds)
    victim.kill()
    victim.wait()


@pytest.mark.slow
@pytest.mark.parametrize("kill_after_s", [15.0, 50.0], ids=["mid-compile", "late-build"])
def test_a_run_killed_while_building_the_kernels_does_not_wedge_the_next(
    tmp_path, sample_data, kill_after_s
):
    """Issue 35's reproduction: SIGKILL a run while it builds the kernels into an empty cache,
    then the same command again must finish in its normal time (it waited forever before)."""
    require_fused_kernels()
    cache = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "cache")}
    command = _train_command(tmp_path / "run", sample_data)
    _kill_after(command, {**os.environ, **cache}, kill_after_s)
    started = time.monotonic()
    done = subprocess.run(
        command, env={**os.environ, **cache}, cwd=ROOT, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "SLOW PATH" not in done.stderr
    # The rerun builds once (about a minute on 2 cores) and trains two steps.
    assert time.monotonic() - started < 400
    assert _run_tags(tmp_path / "run")[schema.TAG_KERNEL_PATH] == "fused"


@pytest.mark.slow
def test_a_study_after_a_killed_build_runs_to_the_end(tmp_path, sample_root, sample_data):
    """The wedge held every later process, a study's trials included: after a build killed
    mid-compile, a smoke study's driver builds the kernels and its trials only load them."""
    from tests.sweep.test_study_runs import study_command

    require_fused_kernels()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "cache")}
    _kill_after(_train_command(tmp_path / "run", sample_data), env, 15.0)
    study_dir = tmp_path / "study"
    command = study_command(ROOT / "experiments" / "k2_vs_k3.py", study_dir, sample_root)
    done = subprocess.run(
        command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    record = json.loads((study_dir / "study.json").read_text())
    assert record["kernel_path"]["name"] == "fused" and record["trials"]["failed"] == 0
