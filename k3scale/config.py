"""Frozen dataclass configs: dotted overrides, canonical JSON and `config_hash`.

Every config is a frozen, keyword-only dataclass nested by concern. A run's identity is the hash of
its canonical JSON (sorted keys, no whitespace), so two configs that resolve to the same values
have the same hash whatever order the overrides came in.

Overrides are strings `a.b.c=value`; the value is parsed against the field's type annotation
(int, float, bool, str, Literal, `X | None`, tuples) and anything else is a `ConfigError` that
names the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from k3scale.errors import ConfigError
from k3scale.models.config import K2Config, K3Config, ModelConfig

_NONE_WORDS = {"none", "null"}
# Fields that say where a run logs or how fast it goes, not what it trains: left out of config_hash.
_NOT_IDENTITY = {"identity": False}
# Fields added after runs were hashed: part of config_hash only away from their default, so every
# hash logged before them still names the same run.
_LATER_IDENTITY = {"identity": "unless_default"}
_TRUE_WORDS = {"true", "1", "yes", "on"}
_FALSE_WORDS = {"false", "0", "no", "off"}

Device = Literal["cpu", "cuda", "auto"]
DEVICES: tuple[str, ...] = typing.get_args(Device)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    dataset: str = "english_mix"
    """Prepared dataset: a name under `root`, or a path to a prepared dataset folder."""
    root: str = "data_cache"
    """Folder holding prepared datasets (relative paths resolve against the working directory)."""
    seq_len: int = 256
    """Tokens per training sequence (each window holds seq_len + 1 tokens)."""
    eval_tokens: int = 65_536
    """Tokens evaluated per validation split at every eval (the same windows for every run)."""
    fingerprint: str | None = None
    """Expected data fingerprint; None accepts the prepared data and records its fingerprint."""

    def __post_init__(self) -> None:
        _require(self.seq_len >= 2, "data.seq_len", "must be at least 2")
        _require(self.eval_tokens >= self.seq_len, "data.eval_tokens", "must be >= data.seq_len")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    lr: float = 3e-3
    """Peak learning rate, shared by the Muon and AdamW groups (Moonlight RMS matching)."""
    weight_decay: float = 0.1
    """Decoupled weight decay (Moonlight, K2: 0.1); never applied to A_log, dt_bias or 1-D tensors."""
    muon_momentum: float = 0.95
    """Muon momentum (Moonlight convention)."""
    nesterov: bool = True
    """Nesterov momentum for Muon."""
    ns_steps: int = 5
    """Newton-Schulz iterations."""
    per_head_muon: bool = False
    """Orthogonalise Q, K, V projection momenta per head (K3 section 2.5)."""
    per_head_scale: Literal["block", "matrix"] = "block"
    """Per-Head Muon update scale: 0.2*sqrt(max(a, b)) of each head block, or of the whole matrix."""
    router_optimizer: Literal["muon", "adamw"] = "muon"
    """Optimizer group of MoE router weights (Moonlight rule: every 2-D non-embedding matrix is Muon)."""
    matrix_optimizer: Literal["muon", "adamw"] = field(default="muon", metadata=_LATER_IDENTITY)
    """Optimizer of the hidden matrices and expert tensors: Muon, or AdamW on every matrix (the
    ablation study's positive control)."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.95
    """AdamW beta2."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables it."""
    qk_clip: bool = True
    """Apply QK-Clip to MLA layers after every optimizer step."""
    qk_clip_tau: float = 100.0
    """QK-Clip threshold on the per-head max attention logit (K2 report: 100)."""

    def __post_init__(self) -> None:
        _require(0 < self.lr < math.inf, "optim.lr", "must be finite and > 0")
        _require(0 <= self.muon_momentum < 1, "optim.muon_momentum", "must be in [0, 1)")
        _require(self.ns_steps >= 1, "optim.ns_steps", "must be >= 1")
        _require(self.qk_clip_tau > 0, "optim.qk_clip_tau", "must be > 0")


@dataclass(frozen=True, kw_only=True)
class ScheduleConfig:
    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    """LR schedule after warmup."""
    warmup_tokens: int = 0
    """Linear warmup length in tokens (same for both schedules at a cell)."""
    lr_min: float = 3e-5
    """Absolute LR floor reached at the last step; one number for every trial of both schedules."""
    decay_fraction: float = 0.2
    """WSD: fraction of the whole run (warmup included) spent decaying."""
    decay_shape: Literal["linear", "1-sqrt", "cosine", "square", "exponential"] = "1-sqrt"
    """WSD decay shape g(p); exponential needs lr_min > 0."""

    def __post_init__(self) -> None:
        _require(self.warmup_tokens >= 0, "schedule.warmup_tokens", "must be >= 0")
        _require(self.lr_min >= 0, "schedule.lr_min", "must be >= 0")
        _require(0 < self.decay_fraction <= 1, "schedule.decay_fraction", "must be in (0, 1]")
        if self.kind == "wsd" and self.decay_shape == "exponential":
            _require(self.lr_min > 0, "schedule.lr_min", "must be > 0 for the exponential shape")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    budget_tokens: int = 1_000_000
    """Training tokens D (the run's length; schedules are functions of tokens seen)."""
    batch_size: int = 16
    """Global batch in sequences per optimizer step."""
    micro_batch_size: int = 16
    """Sequences per forward/backward pass; batch_size must be a multiple of it (times ranks)."""
    seed: int = 0
    """Seed for initialisation and data order."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """fp32, or bf16 autocast with fp32 master weights."""
    # Not identity, like num_threads: the same run on a GPU is the same experiment (only its
    # rounding differs), and every config_hash from before this field existed stays valid.
    device: Device = field(default="cpu", metadata=_NOT_IDENTITY)
    """Where the run trains: cpu, cuda (refused where no CUDA device is visible), or auto (cuda
    where one is visible, else cpu), resolved once at the start and logged as the resolved one."""
    eval_interval_tokens: int = 0
    """Tokens between evaluations; 0 evaluates only at the end."""
    log_interval_steps: int = field(default=10, metadata=_NOT_IDENTITY)
    """Optimizer steps between metric batches sent to the tracker."""
    log_interval_s: float = field(default=5.0, metadata=_NOT_IDENTITY)
    """Least seconds between metric batches sent mid-run (issue 19: each costs a replica fsync
    and a server commit); 0 sends every `log_interval_steps`. The replica holds every point as
    it is logged; the end of a run sends what is left."""
    diagnostics_interval_steps: int = field(default=10, metadata=_NOT_IDENTITY)
    """Optimizer steps between points of the diagnostic curves (grad norm, router and QK-Clip
    statistics, FLOPs, throughput); loss, LR and tokens are logged every step. Issue 19: the
    MLflow server's insert cost is per point (about 0.2 ms on SQLite), and 15 of a step's 18
    keys are diagnostics; 1 logs everything every step."""
    checkpoint_interval_tokens: int = 0
    """Tokens between checkpoints; 0 writes only the final one."""
    fork_tokens: tuple[int, ...] = ()
    """WSD trunk: token counts at which to save fork checkpoints for decay branches."""
    out_dir: str = field(default="runs/default", metadata=_NOT_IDENTITY)
    """Folder for checkpoints and the run's JSONL replica."""
    num_threads: int = field(default=0, metadata=_NOT_IDENTITY)
    """torch intra-op threads; 0 leaves torch's default."""
    divergence_factor: float = 3.0
    """A loss above this multiple of the first step's loss (or NaN/inf) ends the run as diverged."""
    compile: bool = field(default=False, metadata=_LATER_IDENTITY)
    """Train through `torch.compile` (inductor): the fast path's forward and backward are one
    graph each (issue 34). Evaluation stays eager. Losses match eager to float rounding, not to
    the bit (inductor fuses and reorders the small ops), so it is part of the run's identity."""

    def __post_init__(self) -> None:
        _require(self.budget_tokens > 0, "train.budget_tokens", "must be > 0")
        _require(self.batch_size >= 1, "train.batch_size", "must be >= 1")
        _require(self.micro_batch_size >= 1, "train.micro_batch_size", "must be >= 1")
        _require(self.divergence_factor > 1, "train.divergence_factor", "must be > 1")
        _require(self.log_interval_steps >= 1, "train.log_interval_steps", "must be >= 1")
        _require(self.log_interval_s >= 0, "train.log_interval_s", "must be >= 0")
        _require(
            self.diagnostics_interval_steps >= 1, "train.diagnostics_interval_steps", "must be >= 1"
        )
        _require(self.device in DEVICES, "train.device", f"must be one of {list(DEVICES)}")


@dataclass(frozen=True, kw_only=True)
class TrackConfig:
    tracking_uri: str | None = None
    """MLflow tracking URI; None logs to the JSONL replica only."""
    experiment: str = "k3scale"
    """MLflow experiment name (one per study)."""
    run_name: str | None = None
    """Human-readable run name; identity is config_hash, never the name."""
    tags: tuple[tuple[str, str], ...] = ()
    """Extra (key, value) tags, e.g. the study's cell and trial."""
    paths_relative_to: str | None = None
    """Folder (a study's) that `train.out_dir` and `data.root` are logged relative to, so run
    tables carry no machine's absolute paths; None logs them as given."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    model: ModelConfig
    """Architecture (K2Config or K3Config)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus and windows."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """LR schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Loop, budget and batch."""
    track: TrackConfig = field(default_factory=TrackConfig, metadata=_NOT_IDENTITY)
    """Tracking."""


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {message}")


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict of a config (tuples become lists), the input of canonical JSON."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        out[f.name] = _plain(getattr(cfg, f.name))
    return out


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def canonical_json(cfg: Any) -> str:
    """Sorted-key, whitespace-free JSON of a config: equal configs give equal strings."""
    return json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"), allow_nan=False)


def identity_dict(cfg: Any) -> dict[str, Any]:
    """`to_dict` without the fields that do not change what is trained (out_dir, threads, track)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        rule, value = f.metadata.get("identity", True), getattr(cfg, f.name)
        if not rule or (rule == "unless_default" and value == f.default):
            continue
        out[f.name] = identity_dict(value) if dataclasses.is_dataclass(value) else _plain(value)
    return out


def config_hash(cfg: Any, length: int = 16) -> str:
    """First `length` hex digits of sha256 of the canonical JSON of `identity_dict(cfg)`.

    A run's identity: the same model, data, optimizer, schedule, budget, batch and seed give the
    same hash wherever the run logs or writes its checkpoints.
    """
    text = json.dumps(identity_dict(cfg), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def flatten(cfg: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted-key view of a config (`optim.lr` -> 3e-3), as logged to MLflow params."""
    out: dict[str, Any] = {}
    for key, value in to_dict(cfg).items():
        _flatten_into(out, f"{prefix}{key}", value)
    return out


def _flatten_into(out: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(out, f"{key}.{k}", v)
    else:
        out[key] = value


def from_dict(cls: type, data: dict[str, Any], path: str = "") -> Any:
    """Rebuild a config dataclass from `to_dict` output, checking every key and type."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{path}{unknown[0]}: unknown key in {cls.__name__}")
    kwargs = {name: _coerce(hints[name], value, f"{path}{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{path.rstrip('.') or cls.__name__}: {exc}") from None


def _coerce(tp: Any, value: Any, key: str) -> Any:
    """Check (and convert JSON lists to tuples for) one value against its annotation."""
    options = _union_options(tp)
    if options is not None:
        if value is None and type(None) in options:
            return None
        dataclass_options = [o for o in options if dataclasses.is_dataclass(o)]
        if dataclass_options and isinstance(value, dict):
            return from_dict(_pick_family(dataclass_options, value, key), value, key + ".")
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{key}: must be None")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a section, got {value!r}")
        return from_dict(tp, value, key + ".")
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{key}: {value!r} is not one of {list(typing.get_args(tp))}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item_types = [args[0]] * len(value) if args[-1] is Ellipsis else list(args)
        if len(item_types) != len(value):
            raise ConfigError(f"{key}: expected {len(item_types)} items, got {len(value)}")
        return tuple(
            _coerce(t, v, f"{key}[{i}]") for i, (t, v) in enumerate(zip(item_types, value))
        )
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (type(value) is not tp):
        raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}")
    return value


def _union_options(tp: Any) -> tuple[Any, ...] | None:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return typing.get_args(tp)
    return None


def _pick_family(options: list[type], value: dict[str, Any], key: str) -> type:
    family = value.get("family")
    for option in options:
        if getattr(option, "family", None) == family:
            return option
    names = [getattr(o, "family", o.__name__) for o in options]
    raise ConfigError(f"{key}.family: {family!r} is not one of {names}")


def apply_overrides(cfg: Any, overrides: list[str] | tuple[str, ...]) -> Any:
    """Return `cfg` with each `a.b.c=value` applied, parsing values against field types."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{item!r}: an override must look like a.b.c=value")
        cfg = _set_path(cfg, key.strip().split("."), raw.strip(), key.strip())
    return cfg


def _set_path(cfg: Any, parts: list[str], raw: str, full_key: str) -> Any:
    name = parts[0]
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    if name not in fields:
        where = full_key[: -len(".".join(parts))].rstrip(".") or type(cfg).__name__
        raise ConfigError(
            f"{full_key}: unknown key {name!r} in {where} (known: {', '.join(sorted(fields))})"
        )
    current = getattr(cfg, name)
    if len(parts) > 1:
        if not dataclasses.is_dataclass(current):
            raise ConfigError(f"{full_key}: {name!r} is a value, not a section")
        new_value = _set_path(current, parts[1:], raw, full_key)
    else:
        if dataclasses.is_dataclass(current):
            raise ConfigError(f"{full_key}: is a section; set one of its fields ({full_key}.FIELD)")
        new_value = parse_value(typing.get_type_hints(type(cfg))[name], raw, full_key)
    try:
        return dataclasses.replace(cfg, **{name: new_value})
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{full_key}: {exc}") from None


def parse_value(tp: Any, raw: str, key: str) -> Any:
    """Parse the text of an override against a type annotation."""
    options = _union_options(tp)
    if options is not None:
        if raw.lower() in _NONE_WORDS and type(None) in options:
            return None
        for option in options:
            if option is type(None) or dataclasses.is_dataclass(option):
                continue
            try:
                return parse_value(option, raw, key)
            except ConfigError:
                continue
        raise ConfigError(f"{key}: cannot parse {raw!r} as {_type_name(tp)}")
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        for choice in choices:
            if str(choice) == raw:
                return choice
        raise ConfigError(f"{key}: {raw!r} is not one of {[str(c) for c in choices]}")
    if origin is tuple:
        args = typing.get_args(tp)
        items = [s.strip() for s in raw.split(",") if s.strip()] if raw.strip() else []
        item_types = [args[0]] * len(items) if args[-1] is Ellipsis else list(args)
        if len(item_types) != len(items):
            raise ConfigError(f"{key}: expected {len(item_types)} comma-separated items")
        return tuple(parse_value(t, s, key) for t, s in zip(item_types, items))
    if tp is bool:
        if raw.lower() in _TRUE_WORDS:
            return True
        if raw.lower() in _FALSE_WORDS:
            return False
        raise ConfigError(f"{key}: expected a bool (true/false), got {raw!r}")
    if tp is int:
        return _parse_int(raw, key)
    if tp is float:
        try:
            return float(raw)
        except ValueError:
            raise ConfigError(f"{key}: expected a float, got {raw!r}") from None
    if tp is str:
        return raw
    raise ConfigError(f"{key}: cannot set a field of type {_type_name(tp)} from the command line")


def _parse_int(raw: str, key: str) -> int:
    try:
        return int(raw.replace("_", ""))
    except ValueError:
        pass
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{key}: expected an int, got {raw!r}") from None
    if not value.is_integer():
        raise ConfigError(f"{key}: expected an int, got {raw!r}")
    return int(value)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def load_run_config(data: dict[str, Any]) -> RunConfig:
    """RunConfig from its `to_dict` form (e.g. a checkpoint's or an artifact's JSON)."""
    return from_dict(RunConfig, data)


__all__ = [
    "ConfigError",
    "DataConfig",
    "K2Config",
    "K3Config",
    "OptimConfig",
    "RunConfig",
    "ScheduleConfig",
    "TrackConfig",
    "TrainConfig",
    "apply_overrides",
    "canonical_json",
    "config_hash",
    "flatten",
    "from_dict",
    "load_run_config",
    "parse_value",
    "to_dict",
]
