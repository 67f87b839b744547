"""`k3scale ui`: start the lean local MLflow server of a study and keep it up until Ctrl-C."""

from __future__ import annotations

import ipaddress
import json
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from k3scale.errors import K3ScaleError
from k3scale.track import schema

DEFAULT_PORT = 5000
# MLflow 3.17's UI picks its GenAI or model-training pages from `workflowType`: the URL's query
# first, then the browser's localStorage (written by the sidebar's switch), else GenAI. No server
# setting or experiment tag changes that (the experimentKind tag is not read). The server runs
# k3scale's MLflow app plugin (k3scale/track/ui_app.py), whose index.html stores the
# model-training choice in a browser that has made none, so links without the query (the
# Experiments list, breadcrumbs) open model-training pages too; a view picked in the sidebar
# replaces that choice and sticks. The printed links still carry the query, which wins anyway.
TRAINING_VIEW = "workflowType=machine_learning"
TRAINING_VIEW_HINT = (
    "other links open MLflow's model-training view too, until another view is picked in the "
    "sidebar (remembered per browser and address)"
)
# An editable install older than the plugin's entry point runs MLflow's plain app.
PLAIN_VIEW_HINT = (
    "links without that query (the Experiments list, breadcrumbs) open MLflow's GenAI view until "
    "'Model training' is picked once in the sidebar; `pip install --no-deps -e .` in the k3scale "
    "checkout registers the app that opens model training by default"
)


def register(sub) -> None:
    parser = sub.add_parser(
        "ui",
        help="start the local MLflow server (UI + tracking API) of a study; Ctrl-C stops it",
        description=(
            "Start a lean MLflow server (one worker, SQLite backend) on 127.0.0.1 and print its "
            "URL, which is also the --tracking-uri for training runs. Ctrl-C stops it."
        ),
    )
    store = parser.add_mutually_exclusive_group()
    store.add_argument(
        "--study-dir",
        default=".",
        help="study folder; its MLflow data lives in DIR/mlflow/ (default: current folder)",
    )
    store.add_argument(
        "--backend-store-uri",
        metavar="URI",
        help="any MLflow backend store instead, e.g. sqlite:////abs/path/mlflow.db",
    )
    parser.add_argument(
        "--artifacts-dir",
        help="artifact folder for --backend-store-uri (default: ./mlartifacts)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--i-know",
        action="store_true",
        help="bind a --host beyond loopback although MLflow has no authentication",
    )
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="TCP port (0 picks a free one)"
    )
    parser.set_defaults(handler=run_ui)


def _default_artifacts_dir(backend_uri: str) -> Path:
    """Next to a SQLite file; MLflow's own default (./mlartifacts) for other stores."""
    if backend_uri.startswith("sqlite:///"):
        return Path(backend_uri.removeprefix("sqlite:///")).parent / "artifacts"
    return Path("mlartifacts")


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def runs_url(server_url: str, experiment_id: str | None) -> str:
    """The runs list of an experiment in the model-training view with k3scale's columns (or
    the experiments list)."""
    if experiment_id is None:
        return f"{server_url}/#/experiments?{TRAINING_VIEW}"
    view = f"viewStateShareKey={schema.RUNS_VIEW_KEY}"
    return f"{server_url}/#/experiments/{experiment_id}/runs?{TRAINING_VIEW}&{view}"


def _study_experiment(args, server_url: str) -> str | None:
    """Id of the experiment named in the study folder's study.json, if there is one."""
    record = Path(args.study_dir) / "study.json"
    if args.backend_store_uri or not record.exists():
        return None
    name = json.loads(record.read_text()).get("study")
    return experiment_id_by_name(server_url, name) if name else None


def experiment_id_by_name(server_url: str, name: str) -> str | None:
    """The experiment's id from the server's REST API; None when it has no such experiment.

    Plain HTTP, not MLflow's client: importing the client loads polars, whose SIGINT handler
    sometimes turns a Ctrl-C this command has already handled into a kill by SIGINT at exit.
    """
    query = urllib.parse.urlencode({"experiment_name": name})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"{server_url}/api/2.0/mlflow/experiments/get-by-name?{query}") as reply:
            return json.load(reply)["experiment"]["experiment_id"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def run_ui(args) -> int:
    from k3scale.track import ui_app
    from k3scale.track.server import log_tail, start_local_server, study_store

    if not _is_loopback(args.host):
        if not args.i_know:
            raise K3ScaleError(
                f"--host {args.host} exposes the MLflow server, which has no authentication, "
                "beyond this machine: anyone who reaches it can read and change every run; "
                "add --i-know to do it anyway"
            )
        print(
            f"k3scale ui: warning: MLflow on {args.host} has no authentication",
            file=sys.stderr,
        )

    if args.backend_store_uri:
        backend = args.backend_store_uri
        artifacts = Path(args.artifacts_dir or _default_artifacts_dir(backend)).resolve()
        log_path = artifacts.parent / "mlflow-server.log"
    else:
        if args.artifacts_dir:
            raise K3ScaleError("--artifacts-dir goes with --backend-store-uri only")
        if not Path(args.study_dir).is_dir():
            # A misspelt folder would otherwise get a new, empty MLflow store and be served.
            raise K3ScaleError(
                f"no study folder {args.study_dir}: pass the folder `k3scale study run` made "
                "(studies/<study>-<preset>, or the -<commit> one scripts/main.sh makes); nothing "
                "was created"
            )
        store = study_store(Path(args.study_dir))
        backend, artifacts, log_path = store.db_path, store.artifacts_dir, store.log_path
    # A `kill` (SIGTERM) stops the server as cleanly as Ctrl-C does.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    print(f"starting MLflow server ({backend}) ...", flush=True)
    server = start_local_server(
        backend, artifacts, host=args.host, port=args.port, log_path=log_path
    )
    try:
        print(f"MLflow UI and tracking URI: {server.url}  (log {log_path}; Ctrl-C stops it)")
        print(f"train against it with: k3scale train --tracking-uri {server.url}", flush=True)
        print(f"runs: {runs_url(server.url, _study_experiment(args, server.url))}", flush=True)
        hint = TRAINING_VIEW_HINT if ui_app.registered() else PLAIN_VIEW_HINT
        print(f"  ({hint})", flush=True)
        while server.alive():
            time.sleep(0.5)
        raise K3ScaleError(f"MLflow server exited unexpectedly: {log_tail(log_path)}")
    except KeyboardInterrupt:
        print("stopping MLflow server ...", flush=True)
    finally:
        server.stop()
    print("stopped", flush=True)
    return 0
