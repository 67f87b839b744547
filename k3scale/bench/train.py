"""`k3scale bench train`: the fast training step against the reference step, per model and shape.

For every model, one process builds the same model (same seed) twice: `model.backend="torch"`,
the reference path, and `"cpu"`, the fast path studies use (ops/backend.py). A step is what the
trainer's `_train_step` does: zero the gradients, forward and backward over the batch, the
optimizer step (Muon with Per-Head Muon for K3, AdamW), balancing updates and QK-Clip. The steps
of the two paths (and of the fast path under bf16 autocast) run interleaved, and each time is the
median process CPU time over the rounds (`bench/timing.py`), so load from other processes moves
both paths alike and the speedup is a ratio measured side by side.

Columns per model:
- `tokens_per_s_reference`, `tokens_per_s`, `speedup_vs_reference`;
- `mfu`: training FLOPs per token (`accounting.flops_per_token`, attention included) times
  tokens/s over the fp32 matmul peak measured in this run on the same thread count;
- `gemm_bound`: the FLOP rate of the fast forward+backward's aten GEMMs, each timed alone at its
  shape (`gemm_bound.py`), over the peak: the MFU of a step whose every FLOP ran as fast as the
  GEMMs these shapes allow; `mfu_over_gemm_bound` is the fair measure at these shapes (issue #5).
  A rate, not a sum of GEMM times: the fast path does attention (flash SDPA), KDA and the MoE
  experts outside aten's GEMMs, so summing the recorded GEMMs' time would leave their FLOPs out;
- `core_flops_share`: the fraction of those FLOPs in the attention and KDA cores, which run in
  the fused kernels, not at the GEMMs' rate;
- `kernel_bound`: the MFU of a step that were nothing but its aten GEMMs and fused C++ kernel
  calls, each timed alone (`kernel_bound.py`), the optimizer's included; `mfu_over_kernel_bound`
  is the share of the measured step those take, the rest being the small ops and Python between
  them; `compute_s` holds the parts (GEMMs, then each kernel) in seconds per step, and
  `attention_kernel_gflops` the causal attention kernel's rate on the MLA cores' FLOPs;
- `tokens_per_s_compiled`, `compiled_speedup` (over the fast eager step), at the study shapes:
  the fast step with its forward and backward through `torch.compile` (`train.compile`), one
  graph each; the compile itself is left out (the warm-up pays it; `bench compile` times it);
- `tokens_per_s_bf16`, `bf16_speedup` (over the fast fp32 step) and `mfu_bf16` (over the bf16
  matmul peak). Under autocast the fused C++ MoE, GLU and head kernels step aside (they are fp32),
  so this column says what bf16 buys as the code stands.

Shapes: the demo study's rungs (vocab 8192, 64-token sequences, 16 per step) and the v2
reference studies' rungs (the small-vocabulary ladders s1-s3: vocab 512, 256-token sequences, 7
per step, as `cpu_v2` trains them). Threads: one, what a trial gets in the `cpu` presets
(`threads_per_trial = 1`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from k3scale.bench.gemm_bound import record_gemms, time_gemms
from k3scale.bench.kernel_bound import time_compute
from k3scale.bench.timing import median_times
from k3scale.config import OptimConfig
from k3scale.models import accounting
from k3scale.models.balancing import update_balancing
from k3scale.models.config import K3Config, ModelConfig
from k3scale.models.model import build_model, mla_modules
from k3scale.models.presets import get_preset, small_ladder
from k3scale.optim.muon import build_optimizer
from k3scale.optim.qk_clip import qk_clip
from k3scale.track.provenance import git_state
from k3scale.train.perf import measure_matmul_peak, mfu

NUM_THREADS = 1


@dataclass(frozen=True)
class Shape:
    name: str
    vocab: int
    seq_len: int
    batch_size: int
    """Sequences per step."""


DEMO = Shape("demo", 8192, 64, 16)
STUDY = Shape("study", 512, 256, 7)  # sweeps/presets.py::cpu_v2
DEMO_RUNGS = ("t1", "t2", "t3")
# (interleaved rounds, seconds per matmul peak) for the full and quick runs.
SETTINGS = {"full": (7, 1.0), "quick": (2, 0.2)}
STUDY_RUNGS = 3


def models(quick: bool) -> list[tuple[str, Shape, ModelConfig]]:
    """(name, shape, model config) of every measured model."""
    demo = DEMO_RUNGS[-1:] if quick else DEMO_RUNGS
    runs: list[tuple[str, Shape, ModelConfig]] = []
    for family in ("k2", "k3"):
        runs += [(f"{family}-{rung}", DEMO, get_preset(f"{family}-{rung}")) for rung in demo]
        # The reference studies' rungs (s1-s3); s4 and s5 are the held-out check's (issue 47).
        study = small_ladder(family)[:STUDY_RUNGS]
        runs += [(name, STUDY, get_preset(name)) for name in (study[:1] if quick else study)]
    return runs


def training_step(
    model_cfg: ModelConfig, shape: Shape, bf16: bool = False, compiled: bool = False
) -> tuple[Callable[[], None], Callable[[], None]]:
    """One trainer step of a fresh model (seed 0) on fixed random tokens, as a closure, and the
    same model's bare forward+backward (for the GEMM bound). `compiled`: the forward runs
    through `torch.compile`, as `train.compile` trains (the optimizer step stays eager)."""
    torch.manual_seed(0)
    model = build_model(model_cfg)
    optimizer = build_optimizer(
        model, OptimConfig(lr=1e-3, per_head_muon=isinstance(model_cfg, K3Config))
    )
    for module in mla_modules(model):
        module.track_max_logits = True
    model.train()
    tokens = torch.randint(0, model_cfg.vocab_size, (shape.batch_size, shape.seq_len + 1))
    forward = torch.compile(model) if compiled else model

    def forward_backward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = forward(tokens[:, :-1], targets=tokens[:, 1:], with_logits=False)
        out.loss.backward()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        optimizer.step()
        update_balancing(model)
        qk_clip(model, 100.0)

    return step, forward_backward


def core_flops_share(model_cfg: ModelConfig, seq_len: int) -> float:
    """Fraction of the training FLOPs in the attention and KDA cores (`accounting`): FLOPs the
    fused kernels do outside aten's GEMMs, with a softmax or decay per few multiply-adds, which
    `gemm_bound` nonetheless prices at the GEMMs' rate."""
    terms = accounting.flops_breakdown(model_cfg, seq_len)
    return float((terms["mla_core"] + terms["kda_core"]) / sum(terms.values()))


def gemm_rate(forward_backward: Callable[[], None]) -> float:
    """FLOP/s of a forward+backward's aten GEMMs, each run alone (`gemm_bound.py`)."""
    timed = time_gemms(record_gemms(forward_backward))
    return timed["flops"] / timed["seconds"]


def kernel_columns(
    model_cfg: ModelConfig, shape: Shape, step: Callable[[], None], step_s: float, peak: float
) -> dict:
    """The kernel bound's columns for one fast step that took `step_s` (median)."""
    timed = time_compute(step)
    tokens = shape.batch_size * shape.seq_len
    flops = accounting.flops_per_token(model_cfg, shape.seq_len) * tokens
    attention_s = sum(
        s for name, s in timed["kernel_seconds"].items() if name.startswith("causal_attention")
    )
    mla_flops = accounting.flops_breakdown(model_cfg, shape.seq_len)["mla_core"] * tokens
    return {
        "kernel_bound": flops / timed["seconds"] / peak,
        "mfu_over_kernel_bound": timed["seconds"] / step_s,
        "compute_s": {"step": step_s, "gemms": timed["gemm_seconds"], **timed["kernel_seconds"]},
        "attention_kernel_gflops": float(mla_flops) / attention_s / 1e9 if attention_s else None,
    }


def measure(name: str, shape: Shape, model_cfg: ModelConfig, rounds: int, peaks: dict) -> dict:
    """Interleaved reference, fast and fast-bf16 steps of one model; the columns above."""
    fast_cfg = dataclasses.replace(model_cfg, backend="cpu")
    built = {
        "reference": training_step(dataclasses.replace(model_cfg, backend="torch"), shape),
        "fast": training_step(fast_cfg, shape),
        "fast_bf16": training_step(fast_cfg, shape, bf16=True),
    }
    if shape == STUDY:  # the shapes studies train; the warm-up call pays the compile
        built["fast_compiled"] = training_step(fast_cfg, shape, compiled=True)
    seconds = median_times({key: step for key, (step, _) in built.items()}, rounds)
    tokens = shape.batch_size * shape.seq_len
    rates = {key: tokens / value for key, value in seconds.items()}
    flops_per_token = accounting.flops_per_token(model_cfg, shape.seq_len)
    gemm_bound = gemm_rate(built["fast"][1]) / peaks["fp32"]
    fp32_mfu = mfu(flops_per_token, rates["fast"], peaks["fp32"])
    return {
        "name": name,
        "shape": shape.name,
        "vocab": shape.vocab,
        "seq_len": shape.seq_len,
        "batch_size": shape.batch_size,
        "d_model": model_cfg.d_model,
        "num_layers": model_cfg.num_layers,
        "n_active": accounting.num_params_active(model_cfg),
        "flops_per_token": flops_per_token,
        "core_flops_share": core_flops_share(model_cfg, shape.seq_len),
        "tokens_per_s_reference": rates["reference"],
        "tokens_per_s": rates["fast"],
        "speedup_vs_reference": seconds["reference"] / seconds["fast"],
        "mfu": fp32_mfu,
        "gemm_bound": gemm_bound,
        "mfu_over_gemm_bound": fp32_mfu / gemm_bound,
        **kernel_columns(model_cfg, shape, built["fast"][0], seconds["fast"], peaks["fp32"]),
        "tokens_per_s_compiled": rates.get("fast_compiled"),
        "compiled_speedup": (
            seconds["fast"] / seconds["fast_compiled"] if "fast_compiled" in seconds else None
        ),
        "tokens_per_s_bf16": rates["fast_bf16"],
        "bf16_speedup": seconds["fast"] / seconds["fast_bf16"],
        "mfu_bf16": mfu(flops_per_token, rates["fast_bf16"], peaks["bf16"]),
    }


def run(quick: bool) -> dict:
    """Matmul peaks, then every model's columns.

    Returns:
        `{"matmul_peak_flops": {"fp32", "bf16"}, "runs": [{"name", "shape", "tokens_per_s",
        "speedup_vs_reference", "mfu", "gemm_bound", "mfu_over_gemm_bound", ...}],
        "num_threads", "rounds", "load_avg_1min": [before, after], "cpu_count", "git_sha",
        "git_dirty", "summary"}`.
    """
    rounds, peak_seconds = SETTINGS["quick" if quick else "full"]
    sha, dirty = git_state()
    previous_threads = torch.get_num_threads()
    load_before = os.getloadavg()[0]
    try:
        torch.set_num_threads(NUM_THREADS)
        peaks = {
            "fp32": measure_matmul_peak(torch.float32, seconds=peak_seconds),
            "bf16": measure_matmul_peak(torch.bfloat16, seconds=peak_seconds),
        }
        runs = [measure(*entry, rounds, peaks) for entry in models(quick)]
    finally:
        torch.set_num_threads(previous_threads)
    return {
        "matmul_peak_flops": peaks,
        "runs": runs,
        "num_threads": NUM_THREADS,
        "rounds": rounds,
        "load_avg_1min": [load_before, os.getloadavg()[0]],
        "cpu_count": os.cpu_count(),
        "git_sha": sha,
        "git_dirty": dirty,
        "summary": summary(runs),
    }


def summary(runs: list[dict]) -> dict:
    """Per family and shape: the smallest speedup and the MFU over the GEMM bound at the largest
    model (the numbers the issue's targets read)."""
    out = {}
    for family in ("k2", "k3"):
        for shape in (DEMO.name, STUDY.name):
            group = [r for r in runs if r["name"].startswith(family) and r["shape"] == shape]
            if not group:
                continue
            largest = max(group, key=lambda r: r["n_active"])
            out[f"{family}-{shape}"] = {
                "min_speedup_vs_reference": min(r["speedup_vs_reference"] for r in group),
                "median_speedup_vs_reference": statistics.median(
                    r["speedup_vs_reference"] for r in group
                ),
                "largest": largest["name"],
                "mfu_over_gemm_bound_at_largest": largest["mfu_over_gemm_bound"],
                "mfu_over_kernel_bound_at_largest": largest["mfu_over_kernel_bound"],
                # What a step with nothing between its GEMMs and kernels would reach.
                "kernel_bound_over_gemm_bound_at_largest": largest["kernel_bound"]
                / largest["gemm_bound"],
            }
    return out


def _compiled_text(run: dict) -> str:
    """The compiled step's speedup over the eager fast step ('-' where not measured)."""
    speedup = run.get("compiled_speedup")
    return "-" if speedup is None else f"{speedup:.2f}x"


def render(result: dict) -> str:
    """The human table: peaks, then one row per model, then the summary."""
    peaks = result["matmul_peak_flops"]
    before, after = result["load_avg_1min"]
    lines = [
        f"matmul peak ({result['num_threads']} thread, 1024^2): fp32 "
        f"{peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s",
        f"batch: {DEMO.batch_size} (demo) or {STUDY.batch_size} (study) sequences per step; "
        f"median of {result['rounds']} interleaved "
        f"rounds (process CPU time); load average {before:.1f} -> {after:.1f} on "
        f"{result['cpu_count']} CPUs",
        "",
        f"{'model':<14} {'shape':<6} {'N_active':>9} {'ref tok/s':>9} {'tok/s':>7} "
        f"{'speedup':>7} {'MFU':>6} {'GEMM bnd':>8} {'MFU/bnd':>7} {'kern bnd':>8} "
        f"{'MFU/kbnd':>8} {'compiled x':>10} {'bf16 tok/s':>10} {'bf16 x':>6}",
    ]
    for r in result["runs"]:
        lines.append(
            f"{r['name']:<14} {r['shape']:<6} {r['n_active']:>9,} "
            f"{r['tokens_per_s_reference']:>9,.0f} {r['tokens_per_s']:>7,.0f} "
            f"{r['speedup_vs_reference']:>6.2f}x {r['mfu']:>6.1%} {r['gemm_bound']:>8.1%} "
            f"{r['mfu_over_gemm_bound']:>7.2f} {r['kernel_bound']:>8.1%} "
            f"{r['mfu_over_kernel_bound']:>8.2f} {_compiled_text(r):>10} "
            f"{r['tokens_per_s_bf16']:>10,.0f} "
            f"{r['bf16_speedup']:>5.2f}x"
        )
    lines.append("")
    for key, entry in result["summary"].items():
        lines.append(
            f"{key}: smallest speedup {entry['min_speedup_vs_reference']:.2f}x, median "
            f"{entry['median_speedup_vs_reference']:.2f}x; MFU over GEMM bound at "
            f"{entry['largest']} {entry['mfu_over_gemm_bound_at_largest']:.2f}, over kernel "
            f"bound {entry['mfu_over_kernel_bound_at_largest']:.2f}"
        )
    lines.append(
        "reference: model.backend=torch; fast: model.backend=cpu (the studies' default); "
        "GEMM bound: the rate of the step's aten GEMMs, each timed alone, over the peak; "
        "kernel bound: the step's GEMMs and fused kernels, each timed alone"
    )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    """The study rungs' columns as a Markdown table, with the run's provenance and the issue's
    targets read off (analysis/README.md embeds it)."""
    peaks = result["matmul_peak_flops"]
    lines = [
        f"Measured at commit `{result['git_sha'][:7]}` on {result['cpu_count']} CPUs, "
        f"{result['num_threads']} thread per step (a trial's share in the `cpu` presets), median "
        f"of {result['rounds']} interleaved rounds; matmul peak fp32 "
        f"{peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s.",
        "",
        "| model | N_active | reference tokens/s | fast tokens/s | speedup | MFU | GEMM bound "
        "| MFU / GEMM bound | core FLOPs | compiled tokens/s | compiled / eager | bf16 tokens/s "
        "| bf16 / fp32 |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: |",
    ]
    for r in (r for r in result["runs"] if r["shape"] == STUDY.name):
        lines.append(
            f"| {r['name']} | {r['n_active']:,} | {r['tokens_per_s_reference']:,.0f} "
            f"| {r['tokens_per_s']:,.0f} | {r['speedup_vs_reference']:.2f}x | {r['mfu']:.1%} "
            f"| {r['gemm_bound']:.1%} | {r['mfu_over_gemm_bound']:.2f} "
            f"| {r['core_flops_share']:.0%} | {r['tokens_per_s_compiled']:,.0f} "
            f"| {_compiled_text(r)} | {r['tokens_per_s_bf16']:,.0f} "
            f"| {r['bf16_speedup']:.2f}x |"
        )
    lines += [
        "",
        "Core FLOPs: the share of the training FLOPs in the attention and KDA cores, which the "
        "fused kernels compute with a softmax or decay per few multiply-adds; the GEMM bound "
        "prices them at the GEMMs' rate.",
        "",
    ]
    lines += breakdown_markdown(result)
    for family in ("k2", "k3"):
        # From the runs, not the stored summary: a result saved before a summary column existed
        # renders the same.
        entry = summary(result["runs"])[f"{family}-{STUDY.name}"]
        speedup, ratio = entry["min_speedup_vs_reference"], entry["mfu_over_gemm_bound_at_largest"]
        lines.append(
            f"- {family.upper()}: smallest speedup {speedup:.2f}x "
            f"(target 2.0: {'met' if speedup >= 2.0 else 'not met'}); MFU over the GEMM bound "
            f"at {entry['largest']} {ratio:.2f} (target 0.5: {'met' if ratio >= 0.5 else 'not met'}); "
            f"over the kernel bound {entry['mfu_over_kernel_bound_at_largest']:.2f}; with "
            "nothing between its GEMMs and kernels, the step would reach "
            f"{entry['kernel_bound_over_gemm_bound_at_largest']:.2f} of the GEMM bound."
        )
    return "\n".join(lines) + "\n"


# The fused kernels by what they compute, for the step breakdown.
KERNEL_GROUPS = {
    "causal_attention": "attention",
    "kda_recurrent": "KDA",
    "moe_layer": "MoE",
    "latent_moe_layer": "MoE",
    "experts": "MoE",
    "route": "MoE",
    "plan_dispatch": "MoE",
    "sequence_aux": "MoE",
    "margin_counts": "MoE",
}
BREAKDOWN = ("GEMMs", "attention", "KDA", "MoE", "other kernels", "between them")


def step_breakdown(run: dict) -> dict[str, float]:
    """A fast step's seconds by part: aten GEMMs, the fused kernels by group (each timed alone),
    and the rest of the measured step."""
    parts = dict.fromkeys(BREAKDOWN, 0.0)
    parts["GEMMs"] = run["compute_s"]["gemms"]
    for name, seconds in run["compute_s"].items():
        if name in ("step", "gemms"):
            continue
        group = next((g for k, g in KERNEL_GROUPS.items() if name.startswith(k)), "other kernels")
        parts[group] += seconds
    parts["between them"] = run["compute_s"]["step"] - sum(parts.values())
    return parts


def breakdown_markdown(result: dict) -> list[str]:
    """Where a study rung's fast step goes, in milliseconds."""
    lines = [
        "| model | step ms | " + " | ".join(f"{part} ms" for part in BREAKDOWN)
        + " | kernel bound | MFU / kernel bound | attention kernel GFLOP/s |",
        "| --- | ---: | " + " | ".join("---:" for _ in BREAKDOWN) + " | ---: | ---: | ---: |",
    ]  # fmt: skip
    for r in (r for r in result["runs"] if r["shape"] == STUDY.name):
        parts = step_breakdown(r)
        rate = r["attention_kernel_gflops"]
        lines.append(
            f"| {r['name']} | {r['compute_s']['step'] * 1e3:.1f} | "
            + " | ".join(f"{parts[part] * 1e3:.1f}" for part in BREAKDOWN)
            + f" | {r['kernel_bound']:.1%} | {r['mfu_over_kernel_bound']:.2f} | "
            + (f"{rate:.1f} |" if rate else "- |")
        )
    return [
        *lines,
        "",
        "Kernel bound: the MFU of a step that were only its aten GEMMs and fused C++ kernel calls "
        "(the optimizer's included), each timed alone on the arguments it had in the step; "
        '"between them" is the rest of the measured step: the small aten ops, Python and '
        "cache misses between those calls.",
        "",
    ]
