"""A study's identity: the code commit, the kernel path and the data its trials train on, fixed
at its start.

Recorded in the Optuna storage (the sweep's state, wherever it lives: the user attributes of the
cells' tuning studies) the first time a study starts, and in `study.json`. A resume under another commit or on another kernel path (the fused
CPU kernels or the torch paths: the same results to rounding, far apart in speed) would mix
two versions in one study, and one on other data would re-evaluate finished trials on it: all are
refused. A code or path change can be accepted explicitly (`--allow-code-change`); every run's
`k3scale.git_sha` and `k3scale.kernel_path` tags then name its own. Other data always needs a new
study folder.
"""

from __future__ import annotations

import optuna

from k3scale.errors import K3ScaleError
from k3scale.ops.cpu.build import kernel_path
from k3scale.sweep.sources import open_storage
from k3scale.track.provenance import git_state

# The Optuna study that held the identity in folders started before it moved to the cells'
# studies (it never held a trial).
IDENTITY_STUDY = "k3scale|identity"
GIT_SHA, GIT_DIRTY, DATA_FINGERPRINT = "git_sha", "git_dirty", "data_fingerprint"
KERNEL_PATH, CPU_CAPABILITY = "kernel_path", "cpu_capability"


def current_identity(data_fingerprint: str) -> dict[str, str]:
    """This process's code commit and dirty flag (as run tags record them), its kernel path and
    CPU capability, and the data's fingerprint."""
    sha, dirty = git_state()
    path = kernel_path()
    return {
        GIT_SHA: sha,
        GIT_DIRTY: dirty,
        KERNEL_PATH: path.name,
        CPU_CAPABILITY: path.capability,
        DATA_FINGERPRINT: data_fingerprint,
    }


def check_identity(
    storage: str, identity: dict[str, str], allow_code_change: bool, studies, log=print
) -> dict[str, str]:
    """Record `identity` when the study starts; on a resume, refuse another commit or data.

    The identity is kept in the user attributes of the cells' tuning studies (`studies`, made
    here if new): a study of its own would sit empty in optuna-dashboard. Folders started
    before that keep theirs in the study IDENTITY_STUDY, which is still read.

    Returns:
        The identity the study started with.

    Raises:
        K3ScaleError: the data differs, or the code or kernel path differs without
            `allow_code_change`.
    """
    recorded = _recorded_identity(storage, studies)
    if not recorded:
        _stamp(storage, studies, identity)
        return dict(identity)
    if recorded[DATA_FINGERPRINT] != identity[DATA_FINGERPRINT]:
        raise K3ScaleError(
            f"this study started on data {recorded[DATA_FINGERPRINT]}, but --data-root/--dataset "
            f"give {identity[DATA_FINGERPRINT]}: resume with the same data, or pass a new --study-dir"
        )
    started, now = _code(recorded), _code(identity)
    if started != now:
        if not allow_code_change:
            raise K3ScaleError(
                f"this study started at commit {started} and the code is now at {now}: resume "
                "with that code, pass --allow-code-change to mix commits (each run's "
                "k3scale.git_sha tag names its own), or pass a new --study-dir"
            )
        log(f"code changed since the study started ({started} -> {now}): continuing as asked")
    _check_kernel_path(recorded, identity, allow_code_change, log)
    return recorded


def _recorded_identity(storage: str, studies) -> dict[str, str]:
    """The identity an earlier start recorded in `storage`, or {}."""
    attrs = {
        s.study_name: s.user_attrs for s in optuna.get_all_study_summaries(open_storage(storage))
    }
    for name in (IDENTITY_STUDY, *studies):
        if GIT_SHA in attrs.get(name, {}):
            return {k: str(v) for k, v in attrs[name].items()}
    return {}


def _stamp(storage: str, studies, identity: dict[str, str]) -> None:
    for name in studies:
        study = optuna.create_study(
            storage=open_storage(storage),
            study_name=name,
            direction="minimize",
            load_if_exists=True,
        )
        for key, value in identity.items():
            study.set_user_attr(key, value)


def _check_kernel_path(
    recorded: dict[str, str], identity: dict[str, str], allow_code_change: bool, log
) -> None:
    # Studies started before the kernel path was recorded have none to compare.
    started, now = recorded.get(KERNEL_PATH), identity.get(KERNEL_PATH)
    if started is None or now is None or started == now:
        return
    if not allow_code_change:
        raise K3ScaleError(
            f"this study started on the {started} kernel path and this process takes the {now} "
            f"path ({kernel_path().describe()}): resume where the same path runs, pass "
            "--allow-code-change to mix paths (each run's k3scale.kernel_path tag names its "
            "own), or pass a new --study-dir"
        )
    log(f"kernel path changed since the study started ({started} -> {now}): continuing as asked")


def _code(identity: dict[str, str]) -> str:
    dirty = " (dirty)" if identity[GIT_DIRTY] == "true" else ""
    return f"{identity[GIT_SHA][:12]}{dirty}"
