"""Which parameter goes to Muon and which to AdamW, by name, shape and module (INTERFACES.md 6).

Rules, first match wins (architecture.md 8.1, 8.3):

1. `A_log`, `dt_bias` (KDA decay parameters)            -> AdamW, no weight decay
2. every 1-D tensor (norm weights, biases, AttnRes query and key norm) -> AdamW, no weight decay
3. weights of an `nn.Embedding`                         -> AdamW
4. weights of a module named `head` (LM head)           -> AdamW
5. conv kernels (`nn.Conv*`, or a name part ending in `_conv`) -> AdamW
6. MoE router (module named `router`)                   -> `cfg.router_optimizer`
7. any other 2-D weight                                 -> Muon (per head when marked, see below)
8. any other 3-D weight (expert tensors `[E, a, b]`)    -> Muon, each of the E matrices on its own
   (6, 7 and 8 go to AdamW instead with `cfg.matrix_optimizer = "adamw"`)
9. anything else                                        -> ValueError naming the parameter

Per-Head Muon: with `cfg.per_head_muon`, a module's `per_head_projections = {child: H}` marks
`<child>.weight` for H row blocks. Frozen parameters (`requires_grad=False`) get no group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from k3scale.config import OptimConfig

_NO_DECAY_NAMES = ("A_log", "dt_bias")


@dataclass(frozen=True, kw_only=True)
class ParamAssignment:
    """Where one named parameter goes."""

    name: str
    """Dotted parameter name in the model."""
    shape: tuple[int, ...]
    """Parameter shape."""
    algorithm: Literal["muon", "adamw"]
    """Update rule."""
    weight_decay: bool
    """Whether decoupled weight decay applies."""
    num_heads: int | None
    """Per-Head Muon row blocks; None for full-matrix Muon and for AdamW."""
    rule: str
    """The rule that decided (for the table)."""
    param: nn.Parameter = field(repr=False, compare=False)
    """The parameter itself."""


@dataclass(frozen=True, kw_only=True)
class ParamGroups:
    """Every trainable parameter's assignment, in `named_parameters` order."""

    assignments: tuple[ParamAssignment, ...]
    """One entry per trainable parameter."""
    weight_decay: float
    """Decoupled weight decay of the decayed groups."""

    def optimizer_groups(self) -> list[dict[str, Any]]:
        """torch param groups, one per (algorithm, weight decay, num_heads), in first-seen order.

        Each dict holds `params`, `name`, `algorithm`, `weight_decay` and `num_heads`; lr and
        the other settings come from the optimizer's defaults.
        """
        groups: dict[tuple[str, bool, int | None], dict[str, Any]] = {}
        for a in self.assignments:
            key = (a.algorithm, a.weight_decay, a.num_heads)
            if key not in groups:
                groups[key] = {
                    "params": [],
                    "name": _group_name(*key),
                    "algorithm": a.algorithm,
                    "weight_decay": self.weight_decay if a.weight_decay else 0.0,
                    "num_heads": a.num_heads,
                }
            groups[key]["params"].append(a.param)
        return list(groups.values())


def _group_name(algorithm: str, weight_decay: bool, num_heads: int | None) -> str:
    name = algorithm if num_heads is None else f"{algorithm}/heads={num_heads}"
    return name if weight_decay else f"{name}/no_wd"


def build_param_groups(model: nn.Module, cfg: OptimConfig) -> ParamGroups:
    """Assign every trainable parameter of `model` to Muon or AdamW by the module rules.

    Args:
        model: Any module; roles come from parameter names, shapes, owning module types and
            `per_head_projections` attributes.
        cfg: Reads `weight_decay`, `router_optimizer`, `matrix_optimizer` and `per_head_muon`.

    Returns:
        `ParamGroups` covering each trainable parameter exactly once.

    Raises:
        ValueError: a parameter no rule covers, or a head count that does not divide the rows.
    """
    owners = {name: module for name, module in model.named_modules()}
    heads = _per_head_marks(model) if cfg.per_head_muon else {}
    assignments = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        module_name, _, leaf = name.rpartition(".")
        assignments.append(
            _assign(name, leaf, module_name, owners[module_name], param, heads.get(id(param)), cfg)
        )
    return ParamGroups(assignments=tuple(assignments), weight_decay=cfg.weight_decay)


def _per_head_marks(model: nn.Module) -> dict[int, int]:
    """`id(weight) -> H` from every module's `per_head_projections`."""
    marks: dict[int, int] = {}
    for module_name, module in model.named_modules():
        for child_name, num_heads in getattr(module, "per_head_projections", {}).items():
            child = getattr(module, child_name, None)
            weight = getattr(child, "weight", None)
            where = f"{module_name}.{child_name}".lstrip(".")
            if not isinstance(weight, nn.Parameter) or weight.ndim != 2:
                raise ValueError(f"per_head_projections: {where} has no 2-D weight")
            if num_heads < 1 or weight.shape[0] % num_heads:
                raise ValueError(
                    f"per_head_projections: {where} has {weight.shape[0]} rows, "
                    f"not divisible into {num_heads} heads"
                )
            marks[id(weight)] = num_heads
    return marks


def _assign(
    name: str,
    leaf: str,
    module_name: str,
    module: nn.Module,
    param: nn.Parameter,
    num_heads: int | None,
    cfg: OptimConfig,
) -> ParamAssignment:
    owner = module_name.rpartition(".")[2]

    def to(algorithm: str, decay: bool, rule: str, heads: int | None = None) -> ParamAssignment:
        return ParamAssignment(
            name=name,
            shape=tuple(param.shape),
            algorithm=algorithm,
            weight_decay=decay,
            num_heads=heads,
            rule=rule,
            param=param,
        )

    if leaf in _NO_DECAY_NAMES:
        return to("adamw", False, "decay parameter")
    if param.ndim <= 1:
        return to("adamw", False, "1-D tensor")
    if isinstance(module, nn.Embedding):
        return to("adamw", True, "embedding")
    if owner == "head":
        return to("adamw", True, "lm head")
    if isinstance(module, nn.modules.conv._ConvNd) or _is_conv_name(name):
        return to("adamw", True, "conv kernel")
    if cfg.matrix_optimizer == "adamw" and param.ndim in (2, 3):
        return to("adamw", True, "matrix (AdamW on every matrix)")
    if owner == "router":
        return to(cfg.router_optimizer, True, f"router ({cfg.router_optimizer})")
    if param.ndim == 2:
        rule = "matrix" if num_heads is None else f"per-head matrix (H={num_heads})"
        return to("muon", True, rule, num_heads)
    if param.ndim == 3:
        return to("muon", True, f"expert tensor ({param.shape[0]} matrices)")
    raise ValueError(
        f"optimizer groups: no rule for parameter {name} of shape {tuple(param.shape)} "
        "(Muon takes 2-D matrices and 3-D expert tensors)"
    )


def _is_conv_name(name: str) -> bool:
    return any(part.endswith("_conv") for part in name.split("."))


def format_param_table(groups: ParamGroups) -> str:
    """Human-readable table: one line per parameter (name, shape, algorithm, wd, heads, rule).

    Args:
        groups: The output of `build_param_groups`.

    Returns:
        Text table with a header and a per-algorithm parameter-count footer.
    """
    header = ("parameter", "shape", "optimizer", "wd", "heads", "rule")
    rows = [
        (
            a.name,
            "x".join(map(str, a.shape)) or "scalar",
            a.algorithm,
            "yes" if a.weight_decay else "no",
            "-" if a.num_heads is None else str(a.num_heads),
            a.rule,
        )
        for a in groups.assignments
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [header, *rows]
    ]
    for algorithm in ("muon", "adamw"):
        chosen = [a for a in groups.assignments if a.algorithm == algorithm]
        numel = sum(a.param.numel() for a in chosen)
        lines.append(f"{algorithm}: {len(chosen)} tensors, {numel:,} parameters")
    return "\n".join(lines)
