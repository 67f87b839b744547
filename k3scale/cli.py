"""The `k3scale` command: one sub-command group per stage of the platform.

Each group lives in `k3scale/commands/<group>.py` with a `register(subparsers)` function; heavy
imports (torch, ray, mlflow) happen inside the handlers so `k3scale --help` stays instant.
Errors print one line and exit non-zero; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from k3scale.errors import K3ScaleError

GROUPS = ("data", "model", "train", "study", "export", "fit", "predict", "dashboard", "bench", "ui")

# Set in every entry point, before Ray or MLflow are imported. Ray's RAY_AUTH_MODE is not among
# them: the Ray a study starts for itself sets token auth (k3scale/sweep/run.py), and a cluster
# a study joins or is submitted to keeps the mode its owner gave it (issue 23).
_ENTRY_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
    # MLflow prints "View run at http://127.0.0.1:PORT" when a run ends; a study's report logs to
    # a server it stops on exit, so the link is dead before anyone can open it (issues 36, 37).
    # `k3scale ui --study-dir DIR` is the way to the runs, and every report prints it.
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # glibc reads this only at process start, so it reaches the processes an entry point
    # starts (Ray's workers, servers), not the entry point itself. Transparent huge pages for
    # large allocations made k3-t3 training steps 1.02-1.11x faster at full load here
    # (interleaved A/B of `k3scale train`); glibc < 2.35 ignores the setting.
    "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1",
}


class OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line naming the command and where to get help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def set_entry_environment() -> None:
    """Environment every entry point needs; explicit user settings win."""
    for key, value in _ENTRY_ENV.items():
        os.environ.setdefault(key, value)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="k3scale",
        description=(
            "Scaling-law studies of K2-style and K3-style LLMs: prepare data, train, run tuned "
            "sweeps on Ray, track in MLflow, fit scaling laws and render dashboards."
        ),
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=OneLineParser
    )
    for group in GROUPS:
        importlib.import_module(f"k3scale.commands.{group}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    set_entry_environment()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except K3ScaleError as exc:
        if args.debug:
            raise
        print(f"k3scale {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"k3scale {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(
            f"k3scale {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
