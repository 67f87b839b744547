"""`k3scale bench moe`: MoE layer vs a dense FFN of equal active size, and the QB update cost.

Side by side in one run, interleaved repetitions, median CPU times on one thread:
* forward+backward tokens/s (the input's gradient included, as inside a network) of one MoE
  layer (training mode, statistics recorded, fused CPU kernels when built) for the K2 and
  K3 rungs of the demo study (t1-t3; the full run adds t5), over that of a dense GLU FFN whose
  width gives the same ACTIVE parameter count (router, shared experts, k routed experts, latent
  projections). The ratio is the price of routing and dispatch; target >= 0.5 at the demo sizes.
  The top-level `k2`/`k3` entries are the demo's largest rung, t3.
* the cost of one `update_balancing` (Quantile Balancing, histogram threshold) over one training
  step (forward+backward) of the K3 layer, plus the per-forward cost of recording QB counts.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from k3scale.bench.timing import median_times, time_once
from k3scale.models.balancing import update_balancing
from k3scale.models.config import MoEConfig
from k3scale.models.ffn import GLUFeedForward
from k3scale.models.moe import MoE
from k3scale.models.presets import get_preset

# The target's sizes: the demo study's rungs (sweeps/ladders.DEMO); its largest is the headline.
DEMO_RUNGS = ("t1", "t2", "t3")
HEADLINE_RUNG = "t3"
# (rungs, repetitions) per mode; the full run adds t5 (d = 256) to show the trend with width.
SETTINGS = {"full": ((*DEMO_RUNGS, "t5"), 9), "quick": ((HEADLINE_RUNG,), 7)}
# Tokens per layer call: two demo micro-batches (16 x 64), more for the wider t5.
TOKENS = {"t5": 8192}
DEFAULT_TOKENS = 2048


def active_params(d_model: int, cfg: MoEConfig) -> int:
    """Parameters one token touches in the MoE layer (bias buffer excluded)."""
    width = cfg.d_latent or d_model
    count = d_model * cfg.num_experts  # router
    count += 3 * d_model * cfg.num_shared * cfg.d_expert
    count += cfg.top_k * 3 * width * cfg.d_expert
    if cfg.d_latent is not None:
        count += 2 * d_model * cfg.d_latent + (cfg.d_latent if cfg.latent_norm else 0)
    return count


def _train_step(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        module.zero_grad(set_to_none=True)
        x.grad = None
        module(x).square().mean().backward()

    return step


def compare_family(family: str, size: str, num_tokens: int, reps: int) -> dict:
    """MoE vs equal-active dense FFN for one family's ladder rung."""
    model_cfg = get_preset(f"{family}-{size}")
    d_model, cfg = model_cfg.d_model, model_cfg.moe
    torch.manual_seed(0)
    moe = MoE(
        d_model,
        cfg,
        model_cfg.activation,
        model_cfg.situ_beta,
        model_cfg.situ_linear_beta,
        model_cfg.init_std,
        model_cfg.rms_eps,
    )
    active = active_params(d_model, cfg)
    d_ff = round(active / (3 * d_model))
    dense = GLUFeedForward(
        d_model,
        d_ff,
        model_cfg.activation,
        model_cfg.situ_beta,
        model_cfg.situ_linear_beta,
        model_cfg.init_std,
    )
    # Inside a network the FFN input needs its gradient too (it comes from the residual stream),
    # so both layers also pay for the backward to their input.
    x = torch.randn(1, num_tokens, d_model, requires_grad=True)
    moe.train()
    times = median_times({"moe": _train_step(moe, x), "dense": _train_step(dense, x)}, reps)
    update_balancing(moe)
    return {
        "preset": f"{family}-{size}",
        "d_model": d_model,
        "num_experts": cfg.num_experts,
        "top_k": cfg.top_k,
        "d_expert": cfg.d_expert,
        "d_latent": cfg.d_latent,
        "active_params": active,
        "dense_d_ff": d_ff,
        "tokens": num_tokens,
        "moe_tokens_per_s": num_tokens / times["moe"],
        "dense_tokens_per_s": num_tokens / times["dense"],
        "moe_over_dense_throughput": times["dense"] / times["moe"],
        "moe": moe,
        "x": x,
        "step_s": times["moe"],
    }


def qb_costs(moe: MoE, x: torch.Tensor, step_s: float, reps: int) -> dict:
    """One QB `update_balancing` and one forward's count recording, relative to a training step."""
    moe.train()
    with torch.no_grad():
        routing = moe.route(x.reshape(-1, x.shape[-1]))

    def record() -> None:
        moe.record_statistics(routing)

    def fill_and_update() -> None:
        update_balancing(moe)

    record()
    times = median_times({"record": record}, reps)
    update_samples = []
    for _ in range(reps):
        record()  # the update must see a step's worth of counts
        update_samples.append(time_once(fill_and_update))
    update_s = statistics.median(update_samples)
    return {
        "qb_update_over_step": update_s / step_s,
        "qb_update_ms": 1e3 * update_s,
        "qb_record_over_step": times["record"] / step_s,
        "k3_step_ms": 1e3 * step_s,
    }


def run(quick: bool) -> dict:
    """Measure both families and the QB update; returns the JSON-able result.

    Runs on one thread: on shared cores, intra-op threads spin against other processes and
    made small layers 10-30x slower and erratic (measured at load 6 on 2 cores).
    """
    rungs, reps = SETTINGS["quick" if quick else "full"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(rungs, reps) | {"quick": quick}
    finally:
        torch.set_num_threads(threads)


def _measure(rungs: tuple[str, ...], reps: int) -> dict:
    by_size = {"k2": {}, "k3": {}}
    qb = {}
    for size in rungs:
        for family in ("k2", "k3"):
            result = compare_family(family, size, TOKENS.get(size, DEFAULT_TOKENS), reps)
            moe, x, step_s = (result.pop(key) for key in ("moe", "x", "step_s"))
            if family == "k3" and size == HEADLINE_RUNG:
                qb = qb_costs(moe, x, step_s, reps)
            by_size[family][size] = result
    headline = {family: by_size[family][HEADLINE_RUNG] for family in ("k2", "k3")}
    return {**headline, "by_size": by_size, **qb, "threads": torch.get_num_threads()}


def render(result: dict) -> str:
    """Human-readable table of `run`'s result."""
    header = ("family", "preset", "E/k", "active", "moe tok/s", "dense tok/s", "ratio")
    lines = [
        "MoE layer fwd+bwd vs dense FFN of equal active params "
        f"({result['threads']} thread; ratio = moe/dense throughput)",
        "{:8}{:10}{:>7}{:>10}{:>12}{:>13}{:>8}".format(*header),
    ]
    rows = [r for family in ("k2", "k3") for r in result["by_size"][family].values()]
    for r in rows:
        family = r["preset"].split("-")[0]
        lines.append(
            f"{family:8}{r['preset']:10}{r['num_experts']:>4}/{r['top_k']:<2}"
            f"{r['active_params']:>10}{r['moe_tokens_per_s']:>12.0f}"
            f"{r['dense_tokens_per_s']:>13.0f}{r['moe_over_dense_throughput']:>8.2f}"
        )
    lines.append(
        f"QB update: {result['qb_update_ms']:.2f} ms = {result['qb_update_over_step']:.4f} x one K3 "
        f"layer training step ({result['k3_step_ms']:.1f} ms); recording counts per forward: "
        f"{result['qb_record_over_step']:.4f} x step"
    )
    return "\n".join(lines)
