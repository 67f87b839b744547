"""`k3scale bench train`: matmul peak, then tokens/s and MFU of the demo models and dense GPTs.

In one run on 2 threads: the fp32 and bf16 matmul peaks measured now (and again next to every
model, keeping the best: the peak this machine gave during the run), then each model trained
for a fixed number of steps by the real `train()` (data loading, Muon/AdamW, balancing, QK-Clip
included; evaluation excluded from the timing). Throughput is the median of the per-step
`perf/tokens_per_s` the trainer writes to its replica, after the first (warm-up) step. MFU is
`flops_per_token(cfg, seq_len)` (training, attention included) times tokens/s over the matmul
peak of the run's precision. `step_split` then times forward+backward and the optimizer step
apart on the same model, which shows how much of the gap to the peak the optimizer accounts for,
and `bounds` says how far MFU could go on these shapes: the GEMMs of one forward+backward timed
alone (`gemm_bound`), and the share of a step's FLOPs that Muon's Newton-Schulz adds uncounted.

Models: the K2 and K3 rungs of the demo study (`experiments/k2_vs_k3.py`, preset `demo`: rungs
t1-t3, seq_len 64) and, for each rung, a dense GPT of the K2 rung's active size: a `K2Config`
with `moe=None` (a dense MLA transformer with SwiGLU FFNs, same width and depth, FFN width chosen
to match N_active). The full run adds a ~5M-parameter dense model in fp32 and bf16 autocast, the
size platform.md section 8 quotes (about 70% of the fp32 peak there).

The training data is the committed sample, prepared in a temporary folder (tokens only feed the
timing; the models keep their 8192-token vocabulary). Other processes on the machine lower every
number: the result records the load average before and after.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from k3scale.bench.gemm_bound import record_gemms, time_gemms
from k3scale.config import DataConfig, OptimConfig, RunConfig, ScheduleConfig, TrainConfig
from k3scale.data.sample import prepare_sample
from k3scale.models import accounting
from k3scale.models.balancing import update_balancing
from k3scale.models.config import K2Config, ModelConfig
from k3scale.models.model import build_model
from k3scale.models.presets import get_preset, k2_config
from k3scale.optim.muon import build_optimizer
from k3scale.track import schema
from k3scale.track.replica import read_replica
from k3scale.train.loop import train
from k3scale.train.perf import measure_matmul_peak, mfu

NUM_THREADS = 2
# experiments/k2_vs_k3.py, preset "demo" (sweeps/presets.py): sweeps/ladders.DEMO rungs,
# 64-token sequences, and sweeps/spaces.DEMO's largest batch, 16 sequences (its micro-batch).
DEMO_RUNGS = ("t1", "t2", "t3")
SEQ_LEN = 64
BATCH_SIZE = 16
TOKENS_PER_STEP = BATCH_SIZE * SEQ_LEN
# platform.md section 8: "a dense 5M-parameter GPT"; here d 256, 4 layers, d_ff 688 gives
# N_active 5.5M (head included).
REFERENCE_DENSE = (256, 4, 688)
# (steps per run, seconds per matmul peak); the first step of each run is warm-up.
SETTINGS = {"full": (8, 1.0), "quick": (4, 0.3)}


def dense_like(cfg: K2Config) -> K2Config:
    """A dense K2-style model with `cfg`'s width and depth and (about) its N_active.

    Every layer gets the dense FFN; its width is solved from the (linear) dependence of
    N_active on `d_ff_dense`, rounded to a multiple of 8.
    """
    target = accounting.num_params_active(cfg)
    step = 64
    base = dataclasses.replace(cfg, moe=None, d_ff_dense=step)
    per_unit = (
        accounting.num_params_active(dataclasses.replace(base, d_ff_dense=2 * step))
        - accounting.num_params_active(base)
    ) / step
    d_ff = step + (target - accounting.num_params_active(base)) / per_unit
    return dataclasses.replace(base, d_ff_dense=max(8, round(d_ff / 8) * 8))


def reference_dense() -> K2Config:
    """The ~5M-parameter dense model of platform.md section 8 (N_active with its head)."""
    d_model, num_layers, d_ff = REFERENCE_DENSE
    return dataclasses.replace(k2_config(d_model, num_layers), moe=None, d_ff_dense=d_ff)


def models(quick: bool) -> list[tuple[str, ModelConfig, str]]:
    """(name, model config, precision) of every run, smallest first per family."""
    rungs = DEMO_RUNGS[-1:] if quick else DEMO_RUNGS
    runs: list[tuple[str, ModelConfig, str]] = []
    for rung in rungs:
        k2 = get_preset(f"k2-{rung}")
        runs.append((f"k2-{rung}", k2, "fp32"))
        runs.append((f"k3-{rung}", get_preset(f"k3-{rung}"), "fp32"))
        runs.append((f"dense-{rung}", dense_like(k2), "fp32"))
    if not quick:
        runs.append(("dense-5m", reference_dense(), "fp32"))
        runs.append(("dense-5m-bf16", reference_dense(), "bf16"))
    return runs


def _run_config(model: ModelConfig, data_root: Path, out_dir: Path, steps: int, precision: str):
    return RunConfig(
        model=model,
        data=DataConfig(
            dataset="sample", root=str(data_root), seq_len=SEQ_LEN, eval_tokens=SEQ_LEN
        ),
        optim=OptimConfig(lr=1e-2),
        schedule=ScheduleConfig(kind="constant"),
        train=TrainConfig(
            budget_tokens=steps * TOKENS_PER_STEP,
            batch_size=BATCH_SIZE,
            micro_batch_size=BATCH_SIZE,
            precision=precision,
            out_dir=str(out_dir),
            num_threads=NUM_THREADS,
        ),
    )


def measure_run(name: str, model: ModelConfig, precision: str, data_root: Path, steps: int) -> dict:
    """Train `model` for `steps` steps with the real trainer; median per-step throughput."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as out_dir:
        cfg = _run_config(model, data_root, Path(out_dir), steps, precision)
        result = train(cfg, resume=False)
        record = read_replica(Path(out_dir))
    per_step = [v for s, k, v in record.metrics if k == schema.METRIC_TOKENS_PER_S and s > 1]
    tokens_per_s = statistics.median(per_step)
    flops_per_token = accounting.flops_per_token(model, SEQ_LEN)
    return {
        "name": name,
        "precision": precision,
        "d_model": model.d_model,
        "num_layers": model.num_layers,
        "n_active": accounting.num_params_active(model),
        "flops_per_token": flops_per_token,
        "tokens_per_s": tokens_per_s,
        "achieved_flops_per_s": flops_per_token * tokens_per_s,
        "steps": result.steps,
        "status": result.status,
    }


def step_split(model_cfg: ModelConfig, precision: str, steps: int) -> dict:
    """Where one training step's time goes: forward+backward vs the optimizer step.

    The same model and optimizer builders and the same micro-batch as the trainer, timed apart
    (median over `steps` after a warm-up step; random tokens). The 6ND-style FLOP count has no
    term for Muon's Newton-Schulz iterations, so the optimizer's share of the step comes straight
    off MFU at the demo's 1024-token steps. Also returned, for `bounds`: the time of the same
    forward+backward's GEMMs each run alone (`gemm_bound`), and the optimizer's Newton-Schulz
    FLOPs per step.
    """
    torch.manual_seed(0)
    model = build_model(model_cfg)
    optimizer = build_optimizer(model, OptimConfig(lr=1e-2))
    tokens = torch.randint(0, model_cfg.vocab_size, (BATCH_SIZE, SEQ_LEN + 1))
    times: dict[str, list[float]] = {"fwd_bwd": [], "optimizer": []}

    def forward_backward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model(tokens[:, :-1], targets=tokens[:, 1:], with_logits=False)
        out.loss.backward()

    for step in range(steps + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        forward_backward()
        middle = time.perf_counter()
        optimizer.step()
        update_balancing(model)
        end = time.perf_counter()
        if step > 0:
            times["fwd_bwd"].append(middle - start)
            times["optimizer"].append(end - middle)
    fwd_bwd, optimizer_s = (statistics.median(times[key]) for key in ("fwd_bwd", "optimizer"))
    gemms = time_gemms(record_gemms(forward_backward))
    return {
        "fwd_bwd_s": fwd_bwd,
        "optimizer_s": optimizer_s,
        "gemm_alone_s": gemms["seconds"],
        "gemm_calls": gemms["calls"],
        "newton_schulz_flops_per_step": optimizer.newton_schulz_flops_per_step(),
    }


def bounds(entry: dict, peak: float) -> dict:
    """What MFU could reach, and the FLOP rate counting Muon's work, for one run.

    - `mfu_bound_gemms_alone`: MFU if a forward+backward took only the time of its aten GEMMs,
      each timed alone on this machine (`gemm_bound`; the optimizer step free as well).
    - `mfu_bound_newton_schulz`: MFU if every FLOP, the model's and Newton-Schulz's, ran at
      the matmul peak: the model's share of the FLOPs a step must do.
    - `hfu`: the achieved rate counting Newton-Schulz FLOPs too, over the peak.
    """
    model_flops = entry["flops_per_token"] * TOKENS_PER_STEP
    newton_schulz = entry["newton_schulz_flops_per_step"]
    steps_per_s = entry["tokens_per_s"] / TOKENS_PER_STEP
    return {
        "mfu_bound_gemms_alone": model_flops / entry["gemm_alone_s"] / peak,
        "mfu_bound_newton_schulz": model_flops / (model_flops + newton_schulz),
        "hfu": (model_flops + newton_schulz) * steps_per_s / peak,
    }


def run(quick: bool) -> dict:
    """Measure the matmul peaks, then every model's training throughput and MFU.

    Returns:
        `{"matmul_peak_flops": {"fp32": FLOP/s, "bf16": FLOP/s}, "runs": [{"name",
        "tokens_per_s", "mfu", "achieved_flops_per_s", ...}], "num_threads", "seq_len",
        "batch_size", "matmul_peak_flops_1_thread": {"fp32": FLOP/s}, "load_avg_1min": [before,
        after]}`.
    """
    steps, peak_seconds = SETTINGS["quick" if quick else "full"]
    previous_threads = torch.get_num_threads()
    load_before = os.getloadavg()[0]
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    try:
        torch.set_num_threads(1)
        # One thread too: on a shared machine the 2-thread peak can fall below it.
        fp32_one_thread = measure_matmul_peak(torch.float32, seconds=peak_seconds)
        torch.set_num_threads(NUM_THREADS)
        samples = {
            key: [measure_matmul_peak(dtype, seconds=peak_seconds)] for key, dtype in dtypes.items()
        }
        runs = []
        with tempfile.TemporaryDirectory(prefix="bench-train-data-") as data_root:
            prepare_sample(Path(data_root))
            for name, model, precision in models(quick):
                # Re-measured next to every run: the peak is the best the machine gave in this
                # run, so a load that eases mid-run rarely pushes MFU above 1.
                samples[precision].append(measure_matmul_peak(dtypes[precision], seconds=0.3))
                runs.append(measure_run(name, model, precision, Path(data_root), steps))
                runs[-1].update(step_split(model, precision, steps))
    finally:
        torch.set_num_threads(previous_threads)
    peaks = {key: max(values) for key, values in samples.items()}
    for entry in runs:
        peak = peaks[entry["precision"]]
        entry["mfu"] = mfu(entry["flops_per_token"], entry["tokens_per_s"], peak)
        # MFU of forward+backward alone, and the optimizer's share of a step (step_split).
        split_tokens_per_s = TOKENS_PER_STEP / entry["fwd_bwd_s"]
        entry["mfu_fwd_bwd"] = mfu(entry["flops_per_token"], split_tokens_per_s, peak)
        entry["optimizer_share"] = entry["optimizer_s"] / (
            entry["optimizer_s"] + entry["fwd_bwd_s"]
        )
        entry.update(bounds(entry, peak))
    return {
        "matmul_peak_flops": peaks,
        "matmul_peak_flops_1_thread": {"fp32": fp32_one_thread},
        "runs": runs,
        "num_threads": NUM_THREADS,
        "seq_len": SEQ_LEN,
        "batch_size": BATCH_SIZE,
        "steps": steps,
        "load_avg_1min": [load_before, os.getloadavg()[0]],
        "cpu_count": os.cpu_count(),
    }


def render(result: dict) -> str:
    """The human table: peaks, then one row per model."""
    peaks = result["matmul_peak_flops"]
    before, after = result["load_avg_1min"]
    lines = [
        f"matmul peak ({result['num_threads']} threads, 1024^2): "
        f"fp32 {peaks['fp32'] / 1e9:.1f} GFLOP/s, bf16 {peaks['bf16'] / 1e9:.1f} GFLOP/s "
        f"(fp32 on 1 thread: {result['matmul_peak_flops_1_thread']['fp32'] / 1e9:.1f})",
        f"training: seq_len {result['seq_len']}, batch {result['batch_size']} sequences, "
        f"median of steps 2-{result['steps']}; load average {before:.1f} -> {after:.1f} "
        f"on {result['cpu_count']} CPUs (other processes lower every number)",
        "",
        f"{'model':<14} {'prec':<5} {'d':>4} {'L':>3} {'N_active':>10} {'FLOP/token':>11} "
        f"{'tokens/s':>9} {'GFLOP/s':>8} {'MFU':>6} {'fwd+bwd MFU':>12} {'opt share':>10} "
        f"{'HFU':>6} {'GEMM bound':>11} {'NS bound':>9}",
    ]
    for r in result["runs"]:
        lines.append(
            f"{r['name']:<14} {r['precision']:<5} {r['d_model']:>4} {r['num_layers']:>3} "
            f"{r['n_active']:>10,} {r['flops_per_token']:>11,} {r['tokens_per_s']:>9,.0f} "
            f"{r['achieved_flops_per_s'] / 1e9:>8.2f} {r['mfu']:>6.1%} "
            f"{r['mfu_fwd_bwd']:>12.1%} {r['optimizer_share']:>10.0%} {r['hfu']:>6.1%} "
            f"{r['mfu_bound_gemms_alone']:>11.1%} {r['mfu_bound_newton_schulz']:>9.1%}"
        )
    lines += [
        "fwd+bwd MFU: forward+backward alone; opt share: optimizer step (Muon's Newton-Schulz, "
        "AdamW, balancing) over the whole step, a cost 6ND does not count",
        "HFU: MFU counting Newton-Schulz FLOPs too; GEMM bound: MFU if forward+backward took "
        "only its aten GEMMs' time, each timed alone; NS bound: MFU if every FLOP (model and "
        "Newton-Schulz) ran at the peak",
    ]
    return "\n".join(lines)
