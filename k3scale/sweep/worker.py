"""What one Ray task runs: a trial (one run), or a WSD trunk with its decay branches.

The task sets its torch threads from the CPUs Ray assigned to it (Ray reuses worker processes,
so this is done per task) and returns plain dicts, so the driver never unpickles library objects.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ATTEMPTS_FILE = "attempts.jsonl"


def run_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """Train what the payload describes; returns per-budget results and busy seconds.

    `busy_s` runs from the task's start, imports included (a fresh worker pays them once), so
    busy time minus the runs' step time (`time_s["steps"]` of each result) is the trial's fixed
    cost; `import_s` is the imports' share of it.
    """
    started = time.perf_counter()
    for key, value in payload.get("env", {}).items():
        os.environ.setdefault(key, value)
    import torch

    from k3scale.config import load_run_config
    from k3scale.train import train
    from k3scale.train.branching import run_branches

    import_s = time.perf_counter() - started
    threads = _assigned_cpus(payload.get("threads", 1))
    torch.set_num_threads(threads)
    cfg = load_run_config(payload["config"])
    tags = attempt_tags(Path(cfg.train.out_dir))
    if payload.get("branches"):
        branches = [load_run_config(b) for b in payload["branches"]]
        results = run_branches(cfg, branches, extra_tags=tags)
    else:
        results = {cfg.train.budget_tokens: train(cfg, extra_tags=tags)}
    return {
        "results": {str(budget): _summary(result) for budget, result in results.items()},
        "busy_s": time.perf_counter() - started,
        "import_s": import_s,
        "pid": os.getpid(),
    }


def attempt_tags(out_dir: Path) -> dict[str, str]:
    """Tags saying which attempt of its trial this task is and on which Ray node it runs.

    Attempts are counted in the trial's folder, which every node reaches (a retry on another
    node after its first node died counts 2), so a retried trial shows it in MLflow: the run
    resumed from its checkpoint carries the latest attempt's tags.
    """
    from k3scale.track import schema

    out_dir.mkdir(parents=True, exist_ok=True)
    node = _ray_node_id()
    with open(out_dir / ATTEMPTS_FILE, "a") as out:
        out.write(json.dumps({"node": node, "pid": os.getpid(), "time": time.time()}) + "\n")
    with open(out_dir / ATTEMPTS_FILE) as lines:
        attempt = sum(1 for _ in lines)
    return {schema.TAG_ATTEMPT: str(attempt), schema.TAG_RAY_NODE: node}


def _ray_node_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    except Exception:
        return "local"


def _summary(result) -> dict[str, Any]:
    out = asdict(result)
    out.pop("losses")
    return out


def _assigned_cpus(default: int) -> int:
    try:
        import ray

        # Outside a Ray task (a direct call) asking for the runtime context would start a Ray.
        cpus = ray.is_initialized() and ray.get_runtime_context().get_assigned_resources().get(
            "CPU"
        )
    except Exception:
        cpus = None
    return max(1, int(cpus)) if cpus else max(1, default)
