"""`k3scale predict FIT_JSON`: what a fit's laws say about runs it has not seen (issue 47).

  k3scale predict fit.json --compute 4e12 [--compute ...] [--cell k3:249800:4996000 ...]
      [--conv c_6n] [--json] [--out predictions.json]

Per arm: the frontier loss at each compute by each frontier law (E free and E pinned at 0), with
a 95% interval for a new run on a new seed, and how far the compute lies beyond the law's data;
the compute-optimal N and D (from the surface, under 6ND); M(C) over the baseline by each law.
Per cell (ARM:N:D, N in the study's N column): the optimum loss by the surface and by a
log-linear response surface, and the tuned LR (and batch) from a law across the cells. A law
its checks refused still predicts, marked refused, so that its predictions can be scored too.
"""

from __future__ import annotations

import json
from pathlib import Path

from k3scale.errors import K3ScaleError


def register(sub) -> None:
    parser = sub.add_parser("predict", help="predict unseen runs from a fit artifact's laws")
    parser.add_argument("fit", metavar="FIT_JSON", help="a `k3scale fit` artifact")
    parser.add_argument(
        "--compute", type=float, action="append", default=[], help="FLOPs to predict at"
    )
    parser.add_argument(
        "--cell", action="append", default=[], metavar="ARM:N:D", help="a cell to predict"
    )
    parser.add_argument("--conv", default="c_6n", help="FLOP convention (c_6n or c_attn)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--out", help="also write the JSON to this path")
    parser.set_defaults(handler=run_predict)


def parse_cell(text: str):
    from k3scale.scaling.predict import CellQuery

    parts = text.split(":")
    try:
        arm, n, d = parts
        return CellQuery(arm, float(n), float(d))
    except ValueError:
        raise K3ScaleError(f"--cell wants ARM:N:D (e.g. k3:249800:4996000), got {text!r}") from None


def run_predict(args) -> int:
    from k3scale.scaling.predict import forecast
    from k3scale.scaling.values.result import dumps

    path = Path(args.fit)
    if not path.is_file():
        raise K3ScaleError(f"no fit artifact at {path}")
    if not args.compute and not args.cell:
        raise K3ScaleError("give at least one --compute or --cell")
    if any(c <= 0 for c in args.compute):
        raise K3ScaleError("--compute must be positive FLOPs")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise K3ScaleError(f"{path} is not JSON ({exc})") from None
    cells = [parse_cell(c) for c in args.cell]
    out = forecast(doc, sorted(args.compute), cells, args.conv)
    out["fit"] = str(path)
    text = dumps(out)
    if args.out:
        Path(args.out).write_text(text)
    print(text if args.json else "\n".join(lines(out)))
    return 0


def lines(out: dict) -> list[str]:
    """The forecast as text: refused routes say so instead of a number."""
    from k3scale.scaling.predict import Prediction

    def say(p: dict) -> str:
        e = Prediction.from_json(p)
        reach = f", {e.extrapolation:.2g}x beyond its data" if (e.extrapolation or 0) > 1 else ""
        if not e.verdict.identified:
            return f"refused ({e.verdict.reason})"
        if e.value is None or e.interval is None:
            return "undefined"
        return f"{e.value:.4g} [{e.interval[0]:.4g}, {e.interval[1]:.4g}]{reach}"

    text = [f"new run on a new seed: sd {out['new_run_sd']:.3g} nats ({out['conv']})"]
    for arm, part in out["arms"].items():
        for row in part["frontier"]:
            for route, p in row.items():
                if route != "compute":
                    text.append(f"{arm} frontier at C={row['compute']:.3g} ({route}): {say(p)}")
        for row in part["allocation"]:
            text.append(
                f"{arm} compute-optimal at C={row['compute']:.3g} (surface): N {say(row['N'])}, "
                f"D {say(row['D'])}"
            )
        for cell in part["cells"]:
            where = f"{arm} N={cell['n']:.4g} D={cell['d']:.4g}"
            for name, p in cell["loss"].items():
                text.append(f"{where} optimum loss ({name}): {say(p)}")
            text.append(f"{where} peak LR: {say(cell['lr_opt'])}")
    for new, rows in out["multiplier"].items():
        for row in rows:
            for route, p in row.items():
                if route != "compute":
                    text.append(
                        f"M {new} over {out['baseline']} at C={row['compute']:.3g} ({route}): "
                        f"{say(p)}"
                    )
    return text
