"""`k3scale bench kda`: chunked vs recurrent KDA, and the KDA layer vs the MLA layer.

Side by side in one run, interleaved repetitions, median process CPU time on one thread:
* forward+backward of `chunk_kda` vs `naive_recurrent_kda` (the step-by-step reference) at
  B=1, H=4, d_k=d_v=64, chunk 64, K3 bounded gates at their init statistics (target: the chunked
  form >= 20x faster at T=1024);
* forward+backward of one `KimiDeltaAttention` layer (K3 variant) over one
  `MultiHeadLatentAttention` layer (K3 NoPE + output gate) of the same width d=256 across T.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from k3scale.bench.timing import median_times
from k3scale.models.config import KDAConfig, MLAConfig
from k3scale.models.kda import KimiDeltaAttention, init_dt_bias
from k3scale.ops.kda import chunk_kda, kda_gate_bounded, naive_recurrent_kda

# (sequence lengths, repetitions) per mode.
SIZES = {"full": ((256, 1024, 4096), 5), "quick": ((64, 256), 3)}
# Core-op shape: a small model's KDA layer (4 heads of 64 channels).
BATCH, HEADS, D_HEAD = 1, 4, 64
# Layer comparison width and the MLA shape that matches it (4 heads, 64-dim values).
D_MODEL = 256
MLA_CFG = dict(num_heads=4, kv_lora_rank=128, d_nope=64, d_rope=32, d_v=64, rope=False)


def _core_inputs(seq_len: int, seed: int = 0) -> list[torch.Tensor]:
    """q, k (L2-normalised), v, g (K3 gate, A_log = 0, fla dt_bias init), beta; fp32 leaves."""
    gen = torch.Generator().manual_seed(seed)
    shape = (BATCH, seq_len, HEADS, D_HEAD)
    q = F.normalize(torch.randn(*shape, generator=gen), dim=-1)
    k = F.normalize(torch.randn(*shape, generator=gen), dim=-1)
    v = torch.randn(*shape, generator=gen)
    g = kda_gate_bounded(
        torch.randn(*shape, generator=gen), torch.zeros(HEADS), init_dt_bias(HEADS * D_HEAD)
    )
    beta = torch.sigmoid(torch.randn(BATCH, seq_len, HEADS, generator=gen))
    return [x.requires_grad_() for x in (q, k, v, g, beta)]


def _core_step(fn, inputs: list[torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        for x in inputs:
            x.grad = None
        o, _ = fn(*inputs)
        o.square().mean().backward()

    return step


def _layer_step(module: torch.nn.Module, x: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        module.zero_grad(set_to_none=True)
        module(x).square().mean().backward()

    return step


def compare_core(seq_lens: tuple[int, ...], reps: int) -> dict:
    """Chunked over recurrent fwd+bwd time per T."""
    chunk_ms, recurrent_ms, speedup = {}, {}, {}
    for seq_len in seq_lens:
        inputs = _core_inputs(seq_len)
        times = median_times(
            {
                "chunk": _core_step(chunk_kda, inputs),
                "recurrent": _core_step(naive_recurrent_kda, inputs),
            },
            reps,
        )
        chunk_ms[str(seq_len)] = 1e3 * times["chunk"]
        recurrent_ms[str(seq_len)] = 1e3 * times["recurrent"]
        speedup[str(seq_len)] = times["recurrent"] / times["chunk"]
    return {
        "chunk_vs_recurrent_speedup": speedup,
        "chunk_ms": chunk_ms,
        "recurrent_ms": recurrent_ms,
    }


def compare_layers(seq_lens: tuple[int, ...], reps: int) -> dict:
    """KDA layer over MLA layer fwd+bwd time per T (empty with a note if MLA is missing)."""
    try:
        from k3scale.models.mla import MultiHeadLatentAttention
    except ImportError as exc:
        return {"kda_over_mla_time": {}, "mla_note": f"MLA layer not available: {exc}"}
    torch.manual_seed(0)
    kda_cfg = KDAConfig(num_heads=HEADS, d_head=D_HEAD)
    kda = KimiDeltaAttention(D_MODEL, kda_cfg, rms_eps=1e-5, init_std=0.02)
    mla_cfg = MLAConfig(**MLA_CFG, output_gate=True)
    mla = MultiHeadLatentAttention(D_MODEL, mla_cfg, rms_eps=1e-5, init_std=0.02)
    kda_ms, mla_ms, ratio = {}, {}, {}
    for seq_len in seq_lens:
        x = torch.randn(1, seq_len, D_MODEL)
        times = median_times({"kda": _layer_step(kda, x), "mla": _layer_step(mla, x)}, reps)
        kda_ms[str(seq_len)] = 1e3 * times["kda"]
        mla_ms[str(seq_len)] = 1e3 * times["mla"]
        ratio[str(seq_len)] = times["kda"] / times["mla"]
    return {"kda_over_mla_time": ratio, "kda_layer_ms": kda_ms, "mla_layer_ms": mla_ms}


def run(quick: bool) -> dict:
    """Measure both comparisons on one thread; returns the JSON-able result."""
    seq_lens, reps = SIZES["quick" if quick else "full"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = compare_core(seq_lens, reps) | compare_layers(seq_lens, reps)
    finally:
        torch.set_num_threads(threads)
    shapes = {
        "core": {"batch": BATCH, "heads": HEADS, "d_head": D_HEAD, "chunk_size": 64},
        "layer": {"d_model": D_MODEL, "batch": 1, "kda_heads": HEADS, "mla": MLA_CFG},
    }
    timer = f"process CPU time, median of {reps} interleaved reps after a warm-up, fwd+bwd"
    return result | {"shapes": shapes, "threads": 1, "timer": timer, "quick": quick}


def render(result: dict) -> str:
    """Human-readable table of `run`'s result."""
    core = result["shapes"]["core"]
    lines = [
        f"KDA core fwd+bwd, B={core['batch']} H={core['heads']} d_head={core['d_head']} "
        f"C={core['chunk_size']} ({result['threads']} thread, {result['timer']})",
        "{:>6}{:>14}{:>16}{:>10}".format("T", "chunk ms", "recurrent ms", "speedup"),
    ]
    for seq_len, speedup in result["chunk_vs_recurrent_speedup"].items():
        lines.append(
            f"{seq_len:>6}{result['chunk_ms'][seq_len]:>14.1f}"
            f"{result['recurrent_ms'][seq_len]:>16.1f}{speedup:>10.1f}"
        )
    if not result["kda_over_mla_time"]:
        lines.append(result.get("mla_note", "MLA comparison skipped"))
        return "\n".join(lines)
    lines += [
        f"KDA layer vs MLA layer fwd+bwd, d_model={result['shapes']['layer']['d_model']}",
        "{:>6}{:>10}{:>10}{:>10}".format("T", "KDA ms", "MLA ms", "KDA/MLA"),
    ]
    for seq_len, ratio in result["kda_over_mla_time"].items():
        lines.append(
            f"{seq_len:>6}{result['kda_layer_ms'][seq_len]:>10.1f}"
            f"{result['mla_layer_ms'][seq_len]:>10.1f}{ratio:>10.2f}"
        )
    return "\n".join(lines)
