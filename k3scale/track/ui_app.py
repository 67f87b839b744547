"""The MLflow server app of `k3scale ui`: MLflow's own app, whose UI opens on model training.

MLflow 3.17's UI picks its GenAI or model-training pages from `workflowType`: the URL's query
first, then the browser's localStorage key `mlflow.workflowType_v1` (written by the sidebar's
switch), else GenAI. No server setting or experiment tag changes that, so links without the
query (the Experiments list, breadcrumbs, `#/experiments/<id>`) would open GenAI pages.

`mlflow server --app-name k3scale-ui` loads `create_app` through MLflow's app-plugin entry points
(group `mlflow.app`, declared in pyproject.toml; `basic-auth` is MLflow's own). It returns
MLflow's unchanged app, with one difference: the page at `/` (index.html, the UI's only HTML)
carries a short inline script that stores "machine_learning" under that key when the browser has
no choice yet. A choice made later in the sidebar overwrites it and stays. Every other route,
the tracking REST API included, is MLflow's own handler on MLflow's own app object.

The runs table's columns and sort come from the browser too: MLflow keeps them per experiment
under the localStorage key RUNS_STATE_KEY (empty: MLflow's default columns), and applies the
experiment's k3scale view (tag `mlflow.sharedViewState.k3scale`) only for a link with
`viewStateShareKey=k3scale`. So the same script also reads the experiments (one synchronous
request to the server's REST API, before MLflow's bundle runs) and, for each one carrying that
tag, stores the view's state under its key when the browser has none: the k3scale columns then
show from every entry point (Experiments list, breadcrumbs) for a browser with no column choice
of its own, and a choice of its own is never overwritten.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from string import Template

from k3scale.track import schema

APP_NAME = "k3scale-ui"
ENTRY_POINT_GROUP = "mlflow.app"
ENTRY_POINT = "k3scale.track.ui_app:create_app"

WORKFLOW_KEY = "mlflow.workflowType_v1"
TRAINING_WORKFLOW = "machine_learning"
# Only when the key is absent; try/catch: a browser that blocks storage still gets the page.
WORKFLOW_SCRIPT = (
    "try{if(window.localStorage.getItem('" + WORKFLOW_KEY + "')===null)"
    "window.localStorage.setItem('"
    + WORKFLOW_KEY
    + "',JSON.stringify('"
    + TRAINING_WORKFLOW
    + "'))"
    "}catch(e){}"
)

# MLflow 3.17's per-experiment runs-table state (selectedColumns, orderByKey, orderByAsc, ...):
# ["MLflowLocalStorage", "1.1", "ExperimentPage-" + JSON.stringify(sorted ids),
# "ReactComponentState"].join("-"); a partial JSON object is fine.
RUNS_STATE_KEY = 'MLflowLocalStorage-1.1-ExperimentPage-["<experiment id>"]-ReactComponentState'
RUNS_VIEW_TAG = schema.MLFLOW_SHARED_VIEW_PREFIX + schema.RUNS_VIEW_KEY
# The path MLflow's UI itself requests, relative to the page (so under any --static-prefix).
EXPERIMENTS_URL = "ajax-api/2.0/mlflow/experiments/search?max_results=1000"
# Synchronous: it runs before MLflow's bundle reads the keys. Fails silently, key by key.
_RUNS_VIEW_JS = Template("""\
try{var s=window.localStorage,x=new XMLHttpRequest();x.open('GET',${url},false);x.send();\
if(x.status===200)(JSON.parse(x.responseText).experiments||[]).forEach(function(e){\
try{(e.tags||[]).forEach(function(t){if(t.key!==${tag})return;\
var k=${prefix}+JSON.stringify([e.experiment_id])+${suffix},v=JSON.parse(JSON.parse(t.value).state);\
if(s.getItem(k)===null&&v&&typeof v==='object')s.setItem(k,JSON.stringify(v))})}catch(r){}})\
}catch(e){}""")
_PREFIX, _SUFFIX = RUNS_STATE_KEY.split('["<experiment id>"]')
RUNS_VIEW_SCRIPT = _RUNS_VIEW_JS.substitute(
    url=json.dumps(EXPERIMENTS_URL),
    tag=json.dumps(RUNS_VIEW_TAG),
    prefix=json.dumps(_PREFIX),
    suffix=json.dumps(_SUFFIX),
)
DEFAULT_VIEW_SCRIPT = "<script>" + WORKFLOW_SCRIPT + RUNS_VIEW_SCRIPT + "</script>"
_HEAD = re.compile(r"<head[^>]*>", re.IGNORECASE)


def with_default_view(html: str) -> str:
    """index.html with DEFAULT_VIEW_SCRIPT first in its <head> (before MLflow's bundle runs)."""
    head = _HEAD.search(html)
    at = head.end() if head else 0
    return html[:at] + DEFAULT_VIEW_SCRIPT + html[at:]


def registered() -> bool:
    """Whether this installation declares the `k3scale-ui` app to MLflow (an editable install
    made before the entry point existed needs `pip install --no-deps -e .` once)."""
    from importlib.metadata import entry_points

    return any(
        entry.name == APP_NAME and entry.value == ENTRY_POINT
        for entry in entry_points(group=ENTRY_POINT_GROUP)
    )


def _serve_index_with_default_view(flask_app) -> None:
    """Replace the view of `/` (MLflow's `serve`) with one that sends index.html with the script.

    Without ETag or Last-Modified and with `no-cache`: a browser that cached MLflow's plain
    index.html at this address must not revalidate it to a 304 and keep the page without it.
    """
    from flask import Response
    from mlflow.server.handlers import _add_static_prefix

    root = _add_static_prefix("/")
    endpoints = [rule.endpoint for rule in flask_app.url_map.iter_rules() if rule.rule == root]
    if len(endpoints) != 1:
        raise RuntimeError(f"MLflow's app has {len(endpoints)} views at {root!r}, expected one")
    original = flask_app.view_functions[endpoints[0]]
    index = Path(flask_app.static_folder) / "index.html"

    def serve_index():
        if not index.exists():
            return original()  # MLflow's own "UI not built" page
        page = with_default_view(index.read_text(encoding="utf-8"))
        return Response(page, mimetype="text/html", headers={"Cache-Control": "no-cache"})

    flask_app.view_functions[endpoints[0]] = serve_index


def create_app():
    """The app MLflow's server runs for `--app-name k3scale-ui` (a factory: uvicorn calls it
    with no arguments in each worker). Under uvicorn, MLflow's default ASGI app
    (`mlflow.server.fastapi_app:app`, which mounts the Flask app changed here); under gunicorn
    or waitress, the Flask app, as MLflow runs them by default."""
    from mlflow.server import app as flask_app

    _serve_index_with_default_view(flask_app)
    # MLflow's `_run_server` tells its workers which server runs them; uvicorn is its default.
    if os.environ.get("_MLFLOW_SGI_NAME", "uvicorn") == "uvicorn":
        from mlflow.server.fastapi_app import app as asgi_app

        return asgi_app
    return flask_app
