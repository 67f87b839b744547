"""`k3scale bench NAME`: benchmarks that measure ratios side by side in one run.

Each benchmark is `k3scale/bench/<name>.py` with `run(quick: bool) -> dict` (JSON-able, the
`--json` output) and `render(result: dict) -> str` (the human table).
"""

from __future__ import annotations

import importlib
import json

from k3scale.errors import K3ScaleError

BENCHMARKS = {
    "kda": "chunked vs recurrent KDA, and KDA vs MLA layer time across sequence lengths",
    "moe": "MoE layer throughput vs a dense FFN of equal active size; QB update cost",
    "train": "fast vs reference training step per model and shape: speedup, MFU, GEMM bound, bf16",
    "compile": "torch.compile against eager per model and path: graph breaks and their reasons, "
    "compile time with an empty and a warm cache, step time",
    "stack": "M trials' steps separately, stacked under vmap, and folded into one batch (the "
    "ceiling of stacking), eager and compiled, per model",
    "sweep": "a smoke study's fixed cost per trial (slot time minus step time) and utilization",
    "fit": "Chinchilla surface fit and 1000-resample bootstrap on 1 and 2 cores",
    "bookkeeping": "per-run MLflow logging, export time and memory, Optuna time per trial as a "
    "study grows (N runs), on SQLite and PostgreSQL",
    "calibrate": "coverage, bias and identification of the headline intervals on simulated "
    "studies with a known truth",
}
# Options only `bench calibrate` reads (its design and size); other benchmarks refuse them.
CALIBRATE_OPTIONS = (
    "study",
    "preset",
    "studies",
    "workers",
    "draws",
    "noise",
    "lr_grid",
    "seeds",
    "write_tables",
    "seed_effects_from",
)


def register(sub) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print measured ratios")
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke check)")
    cal = parser.add_argument_group("calibrate")
    cal.add_argument(
        "--study",
        choices=("cosine_vs_wsd", "k2_vs_k3", "k3_ablations"),
        help="default: cosine_vs_wsd and k2_vs_k3",
    )
    cal.add_argument("--preset", help="study preset whose design is simulated (default cpu)")
    cal.add_argument("--studies", type=int, help="simulated studies per scenario (default 200)")
    cal.add_argument("--workers", type=int, help="processes (default 2)")
    cal.add_argument("--draws", type=int, help="draws per cell optimum (default 200)")
    cal.add_argument("--noise", type=float, help="run-to-run noise sd in nats (default 0.02)")
    cal.add_argument(
        "--lr-grid",
        type=int,
        help="what-if design: this many LRs 1.6x apart at the middle batch size, every cell",
    )
    cal.add_argument("--seeds", type=int, help="what-if design: runs at each cell's best point")
    cal.add_argument(
        "--seed-effects-from",
        metavar="DIR",
        help="simulate the seed effects (and, without --noise, the run noise) measured in the "
        "study exported in DIR, e.g. analysis/results/k2_vs_k3-cpu_v2 ({study} in DIR stands "
        "for each study: analysis/results/{study}-cpu_v2)",
    )
    cal.add_argument(
        "--write-tables",
        metavar="DIR",
        help="also write one simulated study per scenario as run tables (for `k3scale fit`)",
    )
    parser.epilog = "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())
    parser.set_defaults(handler=run_benchmark)


def run_benchmark(args) -> int:
    try:
        module = importlib.import_module(f"k3scale.bench.{args.name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"k3scale.bench.{args.name}":
            raise K3ScaleError(f"benchmark {args.name!r} is not built yet") from None
        raise
    options = {k: getattr(args, k) for k in CALIBRATE_OPTIONS if getattr(args, k) is not None}
    if options and args.name != "calibrate":
        raise K3ScaleError(
            f"bench {args.name}: --{sorted(options)[0].replace('_', '-')} is an "
            "option of `bench calibrate` only"
        )
    _check_calibrate(options)
    result = module.run(quick=args.quick, **options)
    print(json.dumps(result) if args.json else module.render(result))
    return 0


def _check_calibrate(options: dict) -> None:
    for name in ("studies", "workers", "draws", "lr_grid", "seeds"):
        if name in options and options[name] < 1:
            raise K3ScaleError(f"bench calibrate: --{name.replace('_', '-')} must be >= 1")
    if options.get("draws", 20) < 20:
        raise K3ScaleError("bench calibrate: --draws must be >= 20 (percentile intervals)")
    if options.get("lr_grid", 3) < 3:
        raise K3ScaleError("bench calibrate: --lr-grid needs >= 3 learning rates (a quadratic)")
    if "noise" in options and not options["noise"] > 0:
        raise K3ScaleError("bench calibrate: --noise must be > 0")
