"""`k3scale bench moe`: MoE layer vs a dense FFN of equal active size, and the QB update cost.

Side by side in one run, interleaved repetitions, median CPU times on one thread:
* forward+backward tokens/s of one MoE layer (training mode, statistics recorded) for the K2 and
  K3 ladder configs of `k3scale.models.presets`, over that of a dense GLU FFN whose width gives the
  same ACTIVE parameter count (router, shared experts, k routed experts, latent projections).
  The ratio is the price of routing and dispatch; target >= 0.5.
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

# Full run: the t5 rungs (d = 256); quick: t3 (d = 64). Tokens per step of the layer.
PRESETS = {"full": ("t5", 8192, 9), "quick": ("t3", 2048, 7)}


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
    x = torch.randn(1, num_tokens, d_model)
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
    size, num_tokens, reps = PRESETS["quick" if quick else "full"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(size, num_tokens, reps) | {"quick": quick}
    finally:
        torch.set_num_threads(threads)


def _measure(size: str, num_tokens: int, reps: int) -> dict:
    results = {family: compare_family(family, size, num_tokens, reps) for family in ("k2", "k3")}
    k3 = results["k3"]
    qb = qb_costs(k3.pop("moe"), k3.pop("x"), k3.pop("step_s"), reps)
    for detail in results.values():
        for key in ("moe", "x", "step_s"):
            detail.pop(key, None)
    return {**results, **qb, "threads": torch.get_num_threads()}


def render(result: dict) -> str:
    """Human-readable table of `run`'s result."""
    header = ("family", "preset", "E/k", "active", "moe tok/s", "dense tok/s", "ratio")
    lines = [
        "MoE layer fwd+bwd vs dense FFN of equal active params "
        f"({result['threads']} thread; ratio = moe/dense throughput)",
        "{:8}{:10}{:>7}{:>10}{:>12}{:>13}{:>8}".format(*header),
    ]
    for family in ("k2", "k3"):
        r = result[family]
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
