"""`k3scale bench compile`: what `torch.compile` does for a training step at the study shapes.

Issue 19 asked why compiling did not pay before choosing how to speed the step up. For each
model and path (the fast path studies use, `model.backend=cpu`, and the reference path,
`torch`), one process:
- asks Dynamo to explain the forward: graphs, graph breaks and their reasons (first line of
  each, counted);
- compiles the model with the default inductor backend into an empty cache and times the first
  forward+backward (the compile a fresh trial would pay), then, after `torch._dynamo.reset()`,
  compiles it again from the now-warm cache (what a trial pays when every trial of a study
  shares one cache);
- steps the eager and the compiled model interleaved and reports the median process CPU time of
  each and their ratio (`compiled_over_eager` below 1 means compiling pays).

Issue 34 asked for a step the compiler sees whole: each run also counts the graphs AOTAutograd
compiles for one forward+backward (a step with no graph break compiles one forward graph and
one backward graph).

Shapes: every rung of the v2 ladders (k2/k3 s1-s3) on the fast path, the s1 rungs on the
reference path, at the study shape (`train.STUDY`), one thread, as a trial gets. Quick: k2-s1's
fast path only.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable

import torch

from k3scale.bench.timing import median_times
from k3scale.bench.train import NUM_THREADS, STUDY
from k3scale.models.model import build_model, mla_modules
from k3scale.models.presets import get_preset
from k3scale.track.provenance import git_state

MODELS = ("k2-s1", "k3-s1", "k2-s2", "k3-s2", "k2-s3", "k3-s3")
PATHS = {"fast": "cpu", "reference": "torch"}
# (model, path) pairs measured: the reference path only where it shows what the kernels save.
RUNS = (*((name, "fast") for name in MODELS), ("k2-s1", "reference"), ("k3-s1", "reference"))
ROUNDS = {"full": 7, "quick": 3}
TOP_REASONS = 4


def _forward_backward(model: torch.nn.Module, tokens: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        model.zero_grad(set_to_none=True)
        out = model(tokens[:, :-1], targets=tokens[:, 1:], with_logits=False)
        out.loss.backward()

    return step


# Where Dynamo's reasons name the culprit: a traced function's target, a pybind builtin, or a
# line of k3scale's own code.
CULPRITS = (
    re.compile(r"target: <function (\w+)"),
    re.compile(r"trace the builtin `[^`]*?\.(\w+)\.?`"),
    re.compile(r'File "[^"]*/(k3scale/[^"]+", line \d+)'),
)


def _reason_key(reason: str) -> str:
    """The first line of a break reason, and its culprit where the text names one."""
    first = reason.strip().splitlines()[0][:120]
    for pattern in CULPRITS:
        if found := pattern.search(reason):
            culprit = found.group(1).replace('", line ', ":")
            return f"{first} ({culprit})"
    return first


def _explain(model: torch.nn.Module, tokens: torch.Tensor) -> dict:
    import torch._dynamo as dynamo

    torch._dynamo.reset()
    report = dynamo.explain(model)(tokens[:, :-1], targets=tokens[:, 1:], with_logits=False)
    reasons = collections.Counter(_reason_key(str(b.reason)) for b in report.break_reasons)
    return {
        "graphs": report.graph_count,
        "graph_breaks": report.graph_break_count,
        "ops_in_graphs": report.op_count,
        "break_reasons": dict(reasons.most_common(TOP_REASONS)),
    }


def training_model(name: str, backend: str) -> torch.nn.Module:
    """The preset's model in training mode as the trainer runs it (QK-Clip's logit tracking on)."""
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(get_preset(name), backend=backend)).train()
    for module in mla_modules(model):
        module.track_max_logits = True
    return model


def compiled_graphs(model: torch.nn.Module, tokens: torch.Tensor) -> dict[str, int]:
    """Forward and backward graphs AOTAutograd compiles for one training step (run eagerly)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    counts = {"forward_graphs": 0, "backward_graphs": 0}

    def counting(kind: str):
        def compiler(graph: torch.fx.GraphModule, _example_inputs):
            counts[kind] += 1
            return make_boxed_func(graph.forward)

        return compiler

    torch._dynamo.reset()
    backend = aot_autograd(
        fw_compiler=counting("forward_graphs"), bw_compiler=counting("backward_graphs")
    )
    _forward_backward(torch.compile(model, backend=backend), tokens)()
    torch._dynamo.reset()
    return counts


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, path: str, rounds: int) -> dict:
    """Explain, cold and warm compile, and eager against compiled, for one model and path."""
    model = training_model(name, PATHS[path])
    cfg = model.cfg
    tokens = torch.randint(0, cfg.vocab_size, (STUDY.batch_size, STUDY.seq_len + 1))
    explained = _explain(model, tokens)
    graphs = compiled_graphs(model, tokens)
    eager = _forward_backward(model, tokens)
    with tempfile.TemporaryDirectory(prefix="k3scale-inductor-") as cache:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        try:
            torch._dynamo.reset()
            cold_s = _timed(_forward_backward(torch.compile(model), tokens))
            torch._dynamo.reset()
            compiled = _forward_backward(torch.compile(model), tokens)
            warm_s = _timed(compiled)
            seconds = median_times({"eager": eager, "compiled": compiled}, rounds)
        finally:
            if previous is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
            torch._dynamo.reset()
    return {
        "name": name,
        "path": path,
        **explained,
        **graphs,
        "first_step_cold_cache_s": cold_s,
        "first_step_warm_cache_s": warm_s,
        "eager_ms": seconds["eager"] * 1e3,
        "compiled_ms": seconds["compiled"] * 1e3,
        "compiled_over_eager": seconds["compiled"] / seconds["eager"],
    }


def run(quick: bool) -> dict:
    """Every (model, path) of RUNS (quick: the first).

    Returns:
        `{"runs": [{"name", "path", "graphs", "graph_breaks", "break_reasons",
        "forward_graphs", "backward_graphs",
        "first_step_cold_cache_s", "first_step_warm_cache_s", "eager_ms", "compiled_ms",
        "compiled_over_eager"}], "rounds", "num_threads", "seq_len", "batch_size", "git_sha",
        "git_dirty"}`.
    """
    rounds = ROUNDS["quick" if quick else "full"]
    previous_threads = torch.get_num_threads()
    sha, dirty = git_state()
    try:
        torch.set_num_threads(NUM_THREADS)
        # Dynamo warns once per pybind kernel it cannot trace; the break reasons carry that.
        warnings.filterwarnings("ignore", module=r"torch\._dynamo")
        runs = [measure(name, path, rounds) for name, path in RUNS[: 1 if quick else None]]
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "runs": runs,
        "rounds": rounds,
        "num_threads": NUM_THREADS,
        "seq_len": STUDY.seq_len,
        "batch_size": STUDY.batch_size,
        "git_sha": sha,
        "git_dirty": dirty,
    }


def _fwd_bwd(run: dict) -> str:
    return f"{run['forward_graphs']}/{run['backward_graphs']}"


def render(result: dict) -> str:
    lines = [
        f"torch.compile (inductor) vs eager, forward+backward, {result['batch_size']} x "
        f"{result['seq_len']} tokens, {result['num_threads']} thread, median of "
        f"{result['rounds']} interleaved rounds (process CPU time)",
        "",
        f"{'model':<7} {'path':<10} {'graphs':>6} {'breaks':>6} {'fwd/bwd':>7} {'cold s':>7} "
        f"{'warm s':>7} {'eager ms':>8} {'compiled ms':>11} {'ratio':>6}",
    ]
    for r in result["runs"]:
        lines.append(
            f"{r['name']:<7} {r['path']:<10} {r['graphs']:>6} {r['graph_breaks']:>6} "
            f"{_fwd_bwd(r):>7} {r['first_step_cold_cache_s']:>7.1f} {r['first_step_warm_cache_s']:>7.1f} "
            f"{r['eager_ms']:>8.1f} {r['compiled_ms']:>11.1f} {r['compiled_over_eager']:>6.2f}"
        )
    for r in result["runs"]:
        lines.append(f"breaks of {r['name']} {r['path']}:")
        lines += [f"  {count:>3}  {reason}" for reason, count in r["break_reasons"].items()]
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The table analysis/README.md embeds, with its provenance."""
    lines = [
        f"`k3scale bench compile` at commit `{result['git_sha'][:7]}`: forward+backward of "
        f"{result['batch_size']} x {result['seq_len']} tokens on {result['num_threads']} thread, "
        f"median of {result['rounds']} interleaved rounds.",
        "",
        "| model | path | graphs | graph breaks | compiled graphs, forward/backward "
        "| first step, empty cache (s) | first step, warm cache (s) | eager ms | compiled ms "
        "| compiled / eager |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['name']} | {r['path']} | {r['graphs']} | {r['graph_breaks']} | {_fwd_bwd(r)} "
            f"| {r['first_step_cold_cache_s']:.1f} | {r['first_step_warm_cache_s']:.1f} "
            f"| {r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | {r['compiled_over_eager']:.2f} |"
        )
    lines += ["", "The most frequent graph-break reasons (count, first line of Dynamo's reason):"]
    for r in result["runs"]:
        reasons = "; ".join(f"{n}x {reason}" for reason, n in r["break_reasons"].items())
        lines.append(f"- {r['name']} {r['path']}: {reasons}")
    return "\n".join(lines) + "\n"
