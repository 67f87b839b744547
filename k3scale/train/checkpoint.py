"""Atomic checkpoints that load with `torch.load(weights_only=True)`.

A checkpoint holds everything a bit-exact resume needs: model and optimizer state (balancing
biases are model buffers), the step and tokens seen (the data position follows from them), the
torch RNG state (and a GPU run's CUDA RNG state), the first-step loss (divergence reference) and
the run id to keep logging to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from k3scale.errors import K3ScaleError

LATEST = "latest.pt"


def fork_name(tokens: int) -> str:
    """File name of a WSD fork checkpoint taken after `tokens` training tokens."""
    return f"fork-{tokens}.pt"


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write to a temp name, fsync, then rename: a crash never leaves a torn checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, map_location: torch.device | str = "cpu") -> dict[str, Any]:
    """Load a checkpoint with `weights_only=True` (no pickled code is ever executed), its
    tensors placed on `map_location` (the run's device: a GPU run's checkpoint loads on CPU)."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise K3ScaleError(f"checkpoint {path} does not exist") from None
    except Exception as exc:
        raise K3ScaleError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); delete it to restart"
        ) from None
