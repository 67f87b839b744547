"""`k3scale model`: list presets and show a preset's parameter and FLOP accounting.

Counts come from the config alone (`k3scale.models.accounting`); nothing is built, so the
full-scale presets are instant and no torch is imported.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

# FLOPs of a preset no study trains (the full-scale ones) are given at this sequence length.
FULL_SCALE_SEQ_LEN = 4096
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def register(sub) -> None:
    parser = sub.add_parser("model", help="list model presets; show a preset's params and FLOPs")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    info = actions.add_parser("info", help="N_total, N_active, FLOPs per token, layout, breakdown")
    info.add_argument("preset", help="preset name, e.g. k3-t3 or kimi-k3 (see `model list`)")
    info.add_argument(
        "--seq-len",
        type=int,
        help="sequence length T for FLOPs (tokens; default: the one the repository's studies "
        f"train the preset at, else {FULL_SCALE_SEQ_LEN})",
    )
    info.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a model field"
    )
    info.add_argument("--json", action="store_true", help="print one JSON object instead")
    info.set_defaults(handler=show_info)
    listing = actions.add_parser("list", help="every preset with its N_active")
    listing.add_argument("--json", action="store_true", help="print one JSON list instead")
    listing.set_defaults(handler=show_list)


def model_info(cfg, seq_len: int) -> dict:
    """JSON-able accounting summary of one model config at sequence length `seq_len`."""
    from k3scale.models import accounting
    from k3scale.models.config import K3Config

    if seq_len < 1:
        from k3scale.errors import K3ScaleError

        raise K3ScaleError(f"--seq-len: must be >= 1, got {seq_len}")
    flops = accounting.flops_breakdown(cfg, seq_len)
    info = {
        "family": cfg.family,
        "d_model": cfg.d_model,
        "num_layers": cfg.num_layers,
        "vocab_size": cfg.vocab_size,
        "layout": accounting.layer_layout(cfg),
        "seq_len": seq_len,
        "num_params_total": accounting.num_params_total(cfg),
        "num_params_active": accounting.num_params_active(cfg),
        "flops_per_token": accounting.flops_per_token(cfg, seq_len),
        "flops_per_token_6n": accounting.flops_per_token_6n(cfg),
        "flops_breakdown": {key: round(value) for key, value in flops.items()},
        "param_breakdown": accounting.param_breakdown(cfg),
        "param_breakdown_active": accounting.param_breakdown(cfg, active=True),
    }
    if isinstance(cfg, K3Config):
        info["kda_flops_convention"] = cfg.kda.flops_convention
        other = "kimi_linear_eq13" if cfg.kda.flops_convention == "dense_chunk" else "dense_chunk"
        alt = dataclasses.replace(cfg, kda=dataclasses.replace(cfg.kda, flops_convention=other))
        info[f"flops_per_token_{other}"] = accounting.flops_per_token(alt, seq_len)
    return info


def render_info(name: str, info: dict) -> str:
    """Human-readable table of `model_info`."""
    layers = info["layout"].replace(" ", "")
    lines = [
        f"preset      {name} ({info['family']}, d_model {info['d_model']}, "
        f"vocab {info['vocab_size']})",
        f"layout      {info['layout']}  ({len(layers)} layers: {layers.count('K')} KDA, "
        f"{layers.count('M')} MLA)",
        f"N_total     {info['num_params_total']:,}",
        f"N_active    {info['num_params_active']:,}  (no input embedding, head included)",
        f"FLOPs/token at T={info['seq_len']} (training; {info.get('seq_len_source', 'given')}):",
        f"  6N                      {info['flops_per_token_6n']:,}",
        f"  with attention cores    {info['flops_per_token']:,}"
        + (f"  (KDA {info['kda_flops_convention']})" if "kda_flops_convention" in info else ""),
    ]
    for key, value in info.items():
        if key.startswith("flops_per_token_") and key != "flops_per_token_6n":
            convention = key.removeprefix("flops_per_token_")
            lines.append(f"  with cores, KDA {convention}: {value:,}")
    lines.append("  terms: " + ", ".join(f"{k} {v:,}" for k, v in info["flops_breakdown"].items()))
    lines.append(f"{'component':<14}{'total':>20}{'active':>20}")
    for key, value in info["param_breakdown"].items():
        if value:
            lines.append(f"{key:<14}{value:>20,}{info['param_breakdown_active'][key]:>20,}")
    return "\n".join(lines)


def training_seq_len(preset: str, experiments: Path = EXPERIMENTS) -> tuple[int, str]:
    """(T, where it comes from): the sequence length the repository's study presets train
    `preset` at (the most common one, if they differ), else FULL_SCALE_SEQ_LEN."""
    from k3scale.sweep.declaration import load_study

    found: Counter = Counter()
    users: dict[int, list[str]] = {}
    for path in sorted(experiments.glob("*.py")) if experiments.is_dir() else []:
        if path.name.startswith("_"):
            continue
        study = load_study(path)
        for name, p in study.presets.items():
            if any(preset in ladder for ladder in p.sizes.values()):
                found[p.seq_len] += 1
                users.setdefault(p.seq_len, []).append(f"{study.name} {name}")
    if not found:
        return FULL_SCALE_SEQ_LEN, "no study here trains it"
    seq_len = found.most_common(1)[0][0]
    return seq_len, "as " + ", ".join(users[seq_len]) + " train it"


def show_info(args) -> int:
    from k3scale.models.presets import get_preset

    cfg = get_preset(args.preset, args.set)
    seq_len, source = (
        (args.seq_len, "--seq-len") if args.seq_len is not None else training_seq_len(args.preset)
    )
    info = {**model_info(cfg, seq_len), "seq_len_source": source}
    print(
        json.dumps({"preset": args.preset, **info}) if args.json else render_info(args.preset, info)
    )
    return 0


def show_list(args) -> int:
    from k3scale.models import accounting
    from k3scale.models.presets import get_preset, preset_names

    rows = []
    for name in preset_names():
        cfg = get_preset(name)
        rows.append(
            {
                "preset": name,
                "family": cfg.family,
                "d_model": cfg.d_model,
                "num_layers": cfg.num_layers,
                "num_params_total": accounting.num_params_total(cfg),
                "num_params_active": accounting.num_params_active(cfg),
            }
        )
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'preset':<10}{'d_model':>8}{'layers':>7}{'N_total':>20}{'N_active':>20}")
    for row in rows:
        print(
            f"{row['preset']:<10}{row['d_model']:>8}{row['num_layers']:>7}"
            f"{row['num_params_total']:>20,}{row['num_params_active']:>20,}"
        )
    return 0
