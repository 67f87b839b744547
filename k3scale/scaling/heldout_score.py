"""Predictions registered before held-out runs, scored against what the runs found (issue 47
item 5; methods.md 4.11 (c)).

Inputs: the predictions file (`analysis/heldout.py register`, committed before any held-out run
existed), the fit of the held-out study alone (its cell optima and located LRs), and the fit of
the reference study and the held-out study together (M(C) where both now reach). Every
prediction is scored, whether or not its route passed its checks: error, and whether its 95%
interval holds what was found. A prediction at a compute beyond the fitted data says by what
factor it extrapolated; one inside it (a new size at a compute the fit saw) is marked too.
"""

from __future__ import annotations

import numpy as np

from k3scale.scaling.predict import Prediction
from k3scale.scaling.values.fitdoc import read_cell_optima, read_comparisons

CONV = "c_6n"


def _row(kind, arm, where, predictor, observed, p: Prediction, ratio: bool = False) -> dict:
    """One scored prediction (ratio: the error is predicted / observed, not a difference)."""
    if p.value is None or observed is None:
        error = None
    else:
        error = p.value / observed if ratio else p.value - observed
    covered = (
        None
        if p.interval is None or observed is None
        else (p.interval[0] <= observed <= p.interval[1])
    )
    return {
        "kind": kind,
        "arm": arm,
        "where": where,
        "predictor": predictor,
        "observed": observed,
        "predicted": p.value,
        "interval": p.interval,
        "verdict": p.verdict.to_json(),
        "extrapolation": p.extrapolation,
        "error": error,
        "covered": covered,
    }


def _cell_key(arch: str, n: float, tokens: float) -> tuple:
    return (arch, round(float(n)), round(float(tokens)))


def score(predictions: dict, heldout_fit: dict, combined_fit: dict) -> dict:
    """Every registered prediction against the held-out runs: cells (loss, LR), frontier at each
    cell's compute, and M(C) at the new computes by each law and by the reference rate."""
    found = {
        _cell_key(o.cell["arch"], o.n, o.tokens): o
        for o in read_cell_optima(heldout_fit["results"])
    }
    rows = []
    order: dict[str, int] = {}
    for cell in predictions["cells"]:
        arch = cell["arch"]
        i = order.get(arch, 0)
        order[arch] = i + 1
        part = predictions["arms"][arch]["cells"][i]
        optimum = found.get(_cell_key(arch, cell["n"], cell["tokens"]))
        where = f"{cell['size']} D={cell['tokens']:,}"
        if optimum is None:
            rows.append({"kind": "cell", "arm": arch, "where": where, "missing": "not run"})
            continue
        loss = optimum.loss.value if optimum.loss.identified else None
        for name, p in part["loss"].items():
            rows.append(_row("loss", arch, where, name, loss, Prediction.from_json(p)))
        lr = Prediction.from_json(part["lr_opt"])
        located = optimum.lr_opt if optimum.loss.identified else None
        rows.append(_row("lr", arch, where, "lr law", located, lr, ratio=True))
        frontier = next(
            f for f in predictions["arms"][arch]["frontier"] if f["compute"] == cell["compute"]
        )
        for route, p in frontier.items():
            if route != "compute":
                rows.append(_row("frontier", arch, where, route, loss, Prediction.from_json(p)))
    rows += _multiplier_rows(predictions, combined_fit)
    return {"rows": rows, "summary": summary(rows)}


def _multiplier_rows(predictions: dict, combined_fit: dict) -> list[dict]:
    """M(C) read off the reference and held-out optima together (each passing route) at the
    new computes, against each law's extrapolation registered before."""
    comparison = read_comparisons(combined_fit["results"]).get(CONV)
    if comparison is None or comparison.skipped:
        return []
    at = np.log(np.array(comparison.compute))
    rows = []
    for new, registered in predictions["multiplier"].items():
        for entry in registered:
            c = entry["compute"]
            if not at[0] <= np.log(c) <= at[-1]:
                continue  # beyond what the combined optima cover: nothing observed to score
            for route, part in sorted(comparison.routes.items()):
                if part.skipped or new not in part.multiplier:
                    continue
                estimates = part.multiplier[new]
                if not any(e.identified for e in estimates):
                    continue  # the route reads M nowhere (its law is refused): it observes nothing
                observed = _interpolated(estimates, at, np.log(c))
                if observed is None:
                    unread = next(
                        estimates[i]
                        for i in _neighbours(at, np.log(c))
                        if not estimates[i].identified
                    )
                    reason = unread.verdict.to_json().replace("not identified: ", "")
                    where = f"C={c:.3g} (observed by {route})"
                    rows.append(
                        {
                            "kind": "M",
                            "arm": new,
                            "where": where,
                            "missing": f"not observed: {reason}",
                        }
                    )
                    continue
                for law, p in entry.items():
                    if law != "compute":
                        rows.append(
                            _row(
                                "M",
                                new,
                                f"C={c:.3g} (observed by {route})",
                                law,
                                observed,
                                Prediction.from_json(p),
                                ratio=True,
                            )
                        )
    return rows


def _interpolated(estimates, at: np.ndarray, x: float) -> float | None:
    """M at log compute x from identified estimates on the grid `at` (log-linear), or None."""
    values = np.array([e.value if e.identified else np.nan for e in estimates])
    lo, hi = _neighbours(at, x)
    if not (np.isfinite(values[lo]) and np.isfinite(values[hi])):
        return None
    if hi == lo:
        return float(values[lo])
    w = (x - at[lo]) / (at[hi] - at[lo])
    return float(np.exp((1 - w) * np.log(values[lo]) + w * np.log(values[hi])))


def _neighbours(at: np.ndarray, x: float) -> tuple[int, int]:
    """The grid indices either side of x (equal at or beyond an end)."""
    j = int(np.searchsorted(at, x))
    return max(j - 1, 0), min(j, len(at) - 1)


def summary(rows: list[dict]) -> dict:
    """Per kind and predictor: scored, mean absolute error (log ratio for LR and M), inside."""
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("error") is None:
            continue
        key = f"{r['kind']} | {r['predictor']}"
        entry = out.setdefault(key, {"n": 0, "errors": [], "covered": 0, "passing": 0})
        ratio = r["kind"] in ("lr", "M")
        entry["n"] += 1
        entry["errors"].append(abs(np.log(r["error"])) if ratio else abs(r["error"]))
        entry["covered"] += bool(r["covered"])
        entry["passing"] += r["verdict"] == "identified"
    return {
        k: {
            "n": v["n"],
            "mean_abs_error": float(np.mean(v["errors"])),
            "covered": v["covered"],
            "passing": v["passing"],
        }
        for k, v in sorted(out.items())
    }


def markdown(result: dict) -> str:
    """The predicted-against-observed tables: a summary, then every scored prediction."""
    rows = [
        "| what | predictor | scored | of them passing its checks | mean abs error | inside "
        "its 95% interval |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for key, s in result["summary"].items():
        kind, predictor = key.split(" | ")
        unit = "(log ratio)" if kind in ("lr", "M") else "nats"
        rows.append(
            f"| {kind} | {predictor} | {s['n']} | {s['passing']} | "
            f"{s['mean_abs_error']:.3f} {unit} | {s['covered']} of {s['n']} |"
        )
    rows += [
        "",
        "| what | arm | where | predictor | observed | predicted [95%] | error | inside | route |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- | --- |",
    ]
    for r in result["rows"]:
        if "missing" in r:
            rows.append(
                f"| {r['kind']} | {r['arm']} | {r['where']} | - | - | - | - | - | {r['missing']} |"
            )
            continue
        ratio = r["kind"] in ("lr", "M")
        fmt = (lambda v: f"{v:.3g}") if ratio else (lambda v: f"{v:.3f}")
        observed = "not identified" if r["observed"] is None else fmt(r["observed"])
        predicted = "-" if r["predicted"] is None else fmt(r["predicted"])
        ci = f" [{fmt(r['interval'][0])}, {fmt(r['interval'][1])}]" if r["interval"] else ""
        if r["error"] is None:
            error = "-"
        else:
            error = f"x{r['error']:.3g}" if ratio else f"{r['error']:+.3f}"
        inside = "-" if r["covered"] is None else ("yes" if r["covered"] else "no")
        route = (
            "passes"
            if r["verdict"] == "identified"
            else r["verdict"].replace("not identified: ", "refused: ")
        )
        reach = r.get("extrapolation")
        where = r["where"] + (f", {reach:.2g}x past the fit" if reach and reach > 1 else "")
        rows.append(
            f"| {r['kind']} | {r['arm']} | {where} | {r['predictor']} | {observed} | "
            f"{predicted}{ci} | {error} | {inside} | {route} |"
        )
    return "\n".join(rows) + "\n"
