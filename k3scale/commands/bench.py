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
    "train": "matmul peak, then tokens/s and MFU of the demo models and a dense GPT",
    "fit": "Chinchilla surface fit and 1000-resample bootstrap on 1 and 2 cores",
}


def register(sub) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print measured ratios")
    parser.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke check)")
    parser.epilog = "; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items())
    parser.set_defaults(handler=run_benchmark)


def run_benchmark(args) -> int:
    try:
        module = importlib.import_module(f"k3scale.bench.{args.name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"k3scale.bench.{args.name}":
            raise K3ScaleError(f"benchmark {args.name!r} is not built yet") from None
        raise
    result = module.run(quick=args.quick)
    print(json.dumps(result) if args.json else module.render(result))
    return 0
