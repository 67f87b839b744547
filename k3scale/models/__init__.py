"""Model families: K2-style and K3-style decoders, their blocks, accounting and presets.

Torch-free on import: `k3scale.models.config`, `accounting` and `presets` need no torch, so the
torch-using names below (`build_model`, `ModelOutput`, `mla_modules`, `moe_modules`) are loaded
on first access (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "build_model": "k3scale.models.model",
    "ModelOutput": "k3scale.models.model",
    "DecoderLM": "k3scale.models.model",
    "mla_modules": "k3scale.models.model",
    "moe_modules": "k3scale.models.model",
    "get_preset": "k3scale.models.presets",
    "ladder": "k3scale.models.presets",
    "preset_names": "k3scale.models.presets",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'k3scale.models' has no attribute {name!r}")
