"""The deployment templates in deploy/ match their formats and the CLI (issue 22).

Each YAML parses; the KubeRay RayJob carries the fields KubeRay needs, with every secret taken
from a Kubernetes secret; the `ray up` config passes Ray's own validator (ray.autoscaler's schema
and checks, offline). Every `k3scale ...` command line in the templates and in deploy/*.md is one
that k3scale's own argparse parser accepts (parsing only, nothing runs), and each template's
entrypoint runs a study file and preset that exist, on a team's MLflow server and PostgreSQL.
"""

from __future__ import annotations

import copy
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import yaml

from k3scale.cli import build_parser
from k3scale.sweep.declaration import load_study

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RAYJOB = DEPLOY / "kuberay" / "rayjob.yaml"
RAY_UP = DEPLOY / "ray-up" / "cluster.yaml"
DOCS = sorted(DEPLOY.glob("*.md"))
IMAGE = "registry.example.com/k3scale:0.1.0"
# Where deploy/Dockerfile puts the checkout, and where every node mounts the shared folder.
IMAGE_CHECKOUT = "/home/ray/k3scale"
SHARED = "/mnt/k3scale"
MLFLOW_CREDENTIALS = {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET", re.IGNORECASE)
SEPARATORS = {";", "&&", "||", "|", "&"}
# The env file every `ray up` node reads before `ray start`: its path in the container (the
# user ray's home), and how the start commands name it.
ENV_FILE = "/home/ray/k3scale.env"
ENV_FILE_FROM_HOME = "~/k3scale.env"


def load(path: Path) -> dict:
    document = yaml.safe_load(path.read_text())
    assert isinstance(document, dict), f"{path}: not a YAML mapping"
    return document


def strings(node) -> Iterator[str]:
    """Every string value in a parsed YAML document."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from strings(value)


def shell_words(text: str) -> Iterator[list[str]]:
    """The words of each shell line of `text`, separators (`;`, `&&`, ...) as words of their
    own; a line whose quote closes on a later line is read with those lines."""
    pending = ""
    for line in text.replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        lexer = shlex.shlex(pending, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            words = list(lexer)
        except ValueError:  # no closing quotation yet
            continue
        pending = ""
        yield words


def k3scale_commands(shell: str) -> list[list[str]]:
    """The arguments of every `k3scale` command in shell text: a command of its own, or one
    quoted inside another (a Ray Job's entrypoint after `ray job submit ... --`)."""
    found = []
    for words in shell_words(shell):
        command: list[str] = []
        for word in [*words, ";"]:
            if word not in SEPARATORS:
                command.append(word)
                continue
            if command[:1] == ["k3scale"]:
                found.append(command[1:])
            for quoted in command[1:]:
                if quoted.startswith("k3scale "):
                    found.extend(k3scale_commands(quoted))
            command = []
    return found


def fenced_blocks(markdown: str) -> list[str]:
    return re.findall(r"^ *```[^\n]*\n(.*?)^ *```", markdown, flags=re.DOTALL | re.MULTILINE)


def parse(argv: list[str]):
    """k3scale's own parser on `argv`; argparse exits on anything it refuses."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exit_:
        pytest.fail(f"`k3scale {shlex.join(argv)}` is refused by k3scale's parser ({exit_})")


def env_of(container: dict) -> dict[str, dict]:
    return {entry["name"]: entry for entry in container.get("env", [])}


def rayjob_containers(spec: dict) -> list[tuple[str, dict]]:
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
    found = [("head", container) for container in head]
    for group in spec["rayClusterSpec"]["workerGroupSpecs"]:
        found += [(group["groupName"], c) for c in group["template"]["spec"]["containers"]]
    return found


def check_study_entrypoint(entrypoint: str) -> None:
    """A `k3scale study run` of a study file and preset in the image, on a team's services."""
    (argv,) = k3scale_commands(entrypoint)
    args = parse(argv)
    assert (args.command, args.action) == ("study", "run"), entrypoint
    assert args.study.startswith(f"{IMAGE_CHECKOUT}/"), args.study
    study_file = ROOT / args.study.removeprefix(f"{IMAGE_CHECKOUT}/")
    load_study(study_file).preset(args.preset)  # raises for an unknown file or preset
    assert args.study_dir.startswith(f"{SHARED}/") and args.data_root.startswith(f"{SHARED}/")
    assert args.tracking_uri.startswith("http"), "trials must log to a team's MLflow server"
    assert args.storage.startswith("postgresql://"), args.storage
    # libpq reads PGPASSWORD; a password here would land in study.json and the job's entrypoint.
    user_info = args.storage.removeprefix("postgresql://").split("@")[0]
    assert ":" not in user_info, "the storage URL must not carry a password"


def test_every_k3scale_command_in_the_templates_and_docs_parses():
    # A one-word value (a namespace, a cluster name "k3scale") is no command line.
    texts = [text for path in (RAYJOB, RAY_UP) for text in strings(load(path)) if " " in text]
    texts += [block for doc in DOCS for block in fenced_blocks(doc.read_text())]
    commands = [argv for text in texts for argv in k3scale_commands(text)]
    assert len(commands) >= 6, commands  # both entrypoints and the docs' commands were found
    for argv in commands:
        parse(argv)


def test_the_rayjob_manifest_has_what_kuberay_needs():
    job = load(RAYJOB)
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    assert job["metadata"]["name"]
    spec = job["spec"]
    check_study_entrypoint(spec["entrypoint"])
    cluster = spec["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__, "the image's Ray is the Ray k3scale pins"
    assert cluster["authOptions"]["mode"] == "token" and cluster["authOptions"]["secretName"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for group in groups:
        # KubeRay's rayStartParams is a map of strings.
        assert all(isinstance(v, str) for v in group["rayStartParams"].values()), group
        pod = group["template"]["spec"]
        volumes = {volume["name"] for volume in pod.get("volumes", [])}
        for container in pod["containers"]:
            mounts = {mount["name"] for mount in container.get("volumeMounts", [])}
            assert mounts <= volumes, f"{container['name']} mounts undefined volumes"
            assert SHARED in {m["mountPath"] for m in container["volumeMounts"]}
    for worker in cluster["workerGroupSpecs"]:
        assert worker["groupName"]
        assert worker["minReplicas"] <= worker["replicas"] <= worker["maxReplicas"]


def test_the_rayjob_takes_every_secret_from_a_kubernetes_secret():
    containers = rayjob_containers(load(RAYJOB)["spec"])
    assert {group for group, _ in containers} >= {"head", "gpu"}
    for group, container in containers:
        assert container["image"] == IMAGE, group
        env = env_of(container)
        needed = MLFLOW_CREDENTIALS | ({"PGPASSWORD"} if group == "head" else set())
        assert needed <= env.keys(), f"{group} lacks {needed - env.keys()}"
        for name, entry in env.items():
            if SECRET_NAME.search(name) or name in needed:
                assert "value" not in entry, f"{group}: {name} is written in the manifest"
                assert {"name", "key"} <= entry["valueFrom"]["secretKeyRef"].keys(), name


def test_the_ray_up_config_passes_rays_own_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = load(RAY_UP)
    validate_config(prepare_config(copy.deepcopy(config)))
    assert config["docker"]["image"] == IMAGE
    check_study_entrypoint(config["metadata"]["entrypoint"])  # a field Ray leaves alone


def test_every_ray_up_node_starts_ray_with_the_env_file_and_no_secret_in_the_config():
    config = load(RAY_UP)
    assert config["file_mounts"][ENV_FILE].startswith("~/"), "its source is outside the repo"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config[key] if "ray start" in c]
        assert starts, key
        for command in starts:
            assert command.index(f". {ENV_FILE_FROM_HOME}") < command.index("ray start"), command
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start, "the Jobs API stays on the head's loopback"
    assert not any(re.search(r"(PASSWORD|TOKEN)=\S", s) for s in strings(config))


def test_the_image_runs_the_ray_that_k3scale_pins_with_the_checkout_where_entrypoints_look():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", dockerfile, re.MULTILINE).group(1)
    assert base.startswith(f"rayproject/ray:{ray.__version__}-py311"), base  # Python 3.11 too
    assert f"WORKDIR {IMAGE_CHECKOUT}\n" in dockerfile
