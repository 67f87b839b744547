"""Where a run trains: `train.device` resolved once, at the start of the run.

`auto` becomes cuda where torch sees a CUDA device and cpu elsewhere; `cuda` where there is none
is a config error (one line from the CLI), raised before any data or model is built, by `train`
and by `k3scale train --dry-run` alike.
"""

from __future__ import annotations

import torch

from k3scale.config import RunConfig
from k3scale.errors import ConfigError
from k3scale.ops.backend import check_backend


def resolve_device(setting: str) -> torch.device:
    """The torch device of a `train.device` setting (`cpu`, `cuda` or `auto`) on this machine.

    Raises:
        ConfigError: `cuda` where no CUDA device is visible, or an unknown setting.
    """
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"train.device=cuda: {_why_no_cuda()}; set train.device=cpu or auto")
    if setting not in ("cpu", "cuda"):
        raise ConfigError(f"train.device: {setting!r} is not one of ['cpu', 'cuda', 'auto']")
    return torch.device(setting)


def run_device(cfg: RunConfig) -> torch.device:
    """The device `cfg` trains on, checked against its model backend (Triton needs CUDA)."""
    device = resolve_device(cfg.train.device)
    check_backend(cfg.model.backend, device.type)
    return device


def _why_no_cuda() -> str:
    if torch.version.cuda is None and torch.version.hip is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    return "no CUDA device is visible (torch.cuda.is_available() is False)"
