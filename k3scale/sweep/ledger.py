"""`StudyLedger`: one Optuna study with its trials kept in memory between the driver's writes.

The driver is the only Optuna writer of a study, so the trials it last read stay true until it
writes again. Before each launch it reads every cell's trials several times (which cell is least
served, whose grid needs extending, whose tuning is done, the progress line); against a remote
PostgreSQL each read is a round trip and a scan, and the bookkeeping grew with the number of
cells times trials (issue 22). A ledger answers reads from the trials it holds, and after each of
its own writes (ask, tell, enqueue, add) re-reads only the trial that write touched, so a launch
costs the writes it makes, not a scan of the whole study.

Everything else (the sampler, `optuna.trial.Trial(ledger, id)`, the storage) is the wrapped
study's: attributes a ledger does not define are the study's own.

A storage that stops answering (a PostgreSQL restart, a network blip) is waited for: every
storage call through the ledger is retried with backoff for up to `OUTAGE_S`, so a study
outlives a database restart instead of dying on the first write (issue 22).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Container
from numbers import Integral, Real
from typing import Any, TypeVar

import numpy as np
import optuna
from optuna.exceptions import StorageInternalError
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import DBAPIError, OperationalError

T = TypeVar("T")
# How long a storage outage is waited out before the driver gives up (seconds), and the first
# and largest pause between attempts.
OUTAGE_S = 300.0
FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 10.0


def _is_outage(exc: Exception) -> bool:
    """A lost connection (retry), not a rejected statement (raise)."""
    if isinstance(exc, OperationalError):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated
    # Optuna wraps a failed commit; its cause says whether the connection was lost.
    return isinstance(exc, StorageInternalError) and isinstance(
        exc.__cause__, OperationalError | DBAPIError
    )


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message, cut to `limit` characters ("" if none)."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


def retrying(call: Callable[[], T], log: Callable[[str], None] = print) -> T:
    """`call()`, retried with backoff while the storage is unreachable, up to `OUTAGE_S`."""
    deadline = time.monotonic() + OUTAGE_S
    pause = FIRST_PAUSE_S
    while True:
        try:
            return call()
        except (OperationalError, DBAPIError, StorageInternalError) as exc:
            if not _is_outage(exc) or time.monotonic() + pause > deadline:
                raise
            log(
                f"study storage unreachable ({type(exc).__name__}: {first_line(exc)}); "
                f"retrying in {pause:g} s"
            )
            time.sleep(pause)
            pause = min(2 * pause, MAX_PAUSE_S)


class StudyLedger:
    """An Optuna study whose reads are served from memory until the next write through it.

    Args:
        study: the study, opened on any storage; nothing else may write to it while the ledger
            is in use (trial attributes set on a trial object are seen after the next tell).
        log: where waits for an unreachable storage are reported.
    """

    def __init__(self, study: optuna.Study, log: Callable[[str], None] = print) -> None:
        self.study = study
        self.log = log
        self._trials: list[FrozenTrial] | None = None

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the ledger lacks: the study's sampler, storage, name, ids.
        return getattr(self.__dict__["study"], name)

    # -- reads, from memory ------------------------------------------------------------------

    def get_trials(
        self, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        """The study's trials as of the last write through this ledger (copies if `deepcopy`)."""
        if self._trials is None:
            self._trials = retrying(lambda: self.study.get_trials(deepcopy=False), self.log)
        trials = [t for t in self._trials if states is None or t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    # -- writes, through to the storage ------------------------------------------------------
    # After a write the ledger re-reads only the trial it wrote (two indexed queries), not the
    # study: a trial's bookkeeping stays flat as a study grows (issue 22). Trial numbers are
    # 0, 1, ... in creation order, and only this ledger creates trials.

    def ask(self, fixed_distributions: dict | None = None) -> optuna.trial.Trial:
        trial = retrying(lambda: self.study.ask(fixed_distributions), self.log)
        self._refresh(trial.number)
        return trial

    def tell(self, trial, values=None, state=None, skip_if_finished: bool = False):
        # Idempotent with skip_if_finished: a tell whose commit landed before the connection
        # dropped is not told twice.
        told = retrying(
            lambda: self.study.tell(trial, values, state=state, skip_if_finished=skip_if_finished),
            self.log,
        )
        self._refresh(trial if isinstance(trial, int) else trial.number)
        return told

    def enqueue_trial(self, params: dict, user_attrs=None, skip_if_exists: bool = False) -> None:
        if skip_if_exists and self._holds(params):
            return
        retrying(lambda: self.study.enqueue_trial(params, user_attrs), self.log)
        self._refresh_new()

    def add_trial(self, trial: FrozenTrial) -> None:
        retrying(lambda: self.study.add_trial(trial), self.log)
        self._refresh_new()

    def set_user_attrs(self, trial: optuna.trial.Trial, attrs: dict[str, Any]) -> None:
        """Set `trial`'s user attributes (seen by reads after the next write)."""
        for key, value in attrs.items():
            retrying(lambda key=key, value=value: trial.set_user_attr(key, value), self.log)

    def _holds(self, params: dict) -> bool:
        """Whether a trial with these params exists already (Optuna's `skip_if_exists` rule:
        the same names, floats equal to rounding, other values equal), read from memory."""
        for held in self.get_trials(deepcopy=False):
            old = held.system_attrs.get("fixed_params", held.params)
            if old.keys() == params.keys() and all(
                _same_value(params[name], old[name]) for name in params
            ):
                return True
        return False

    def _refresh_new(self) -> None:
        if self._trials is not None:
            self._refresh(len(self._trials))

    def _refresh(self, number: int) -> None:
        """Re-read trial `number` into memory (nothing held yet: the next read loads all)."""
        if self._trials is None:
            return
        storage, study_id = self.study._storage, self.study._study_id
        trial = retrying(
            lambda: storage.get_trial(
                storage.get_trial_id_from_study_id_trial_number(study_id, number)
            ),
            self.log,
        )
        if number < len(self._trials) and self._trials[number].number == number:
            self._trials[number] = trial
        elif number == len(self._trials):
            self._trials.append(trial)
        else:  # not the numbering this ledger assumes: read the study again
            self._trials = None


def _same_value(new: Any, old: Any) -> bool:
    if not isinstance(new, type(old)):
        return False
    if isinstance(new, Real) and not isinstance(new, Integral):
        return bool(np.isclose(float(new), float(old), atol=0.0, equal_nan=True))
    return new == old
