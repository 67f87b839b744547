"""`StudyLedger`: one Optuna study with its trials kept in memory between the driver's writes.

The driver is the only Optuna writer of a study, so the trials it last read stay true until it
writes again. Before each launch it reads every cell's trials several times (which cell is least
served, whose grid needs extending, whose tuning is done, the progress line); against a remote
PostgreSQL each read is a round trip and a scan, and the bookkeeping grew with the number of
cells times trials (issue 22). A ledger answers reads from the trials it holds and reloads them
from the storage only after its own write (ask, tell, enqueue, add), so a launch costs the
writes it makes, not a scan of the whole study.

Everything else (the sampler, `optuna.trial.Trial(ledger, id)`, the storage) is the wrapped
study's: attributes a ledger does not define are the study's own.
"""

from __future__ import annotations

import copy
from collections.abc import Container
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState


class StudyLedger:
    """An Optuna study whose reads are served from memory until the next write through it.

    Args:
        study: the study, opened on any storage; nothing else may write to it while the ledger
            is in use (trial attributes set on a trial object are seen after the next tell).
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
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
            self._trials = self.study.get_trials(deepcopy=False)
        trials = [t for t in self._trials if states is None or t.state in states]
        return copy.deepcopy(trials) if deepcopy else trials

    # -- writes, through to the storage ------------------------------------------------------

    def ask(self, fixed_distributions: dict | None = None) -> optuna.trial.Trial:
        self._trials = None
        return self.study.ask(fixed_distributions)

    def tell(self, trial, values=None, state=None, skip_if_finished: bool = False):
        self._trials = None
        return self.study.tell(trial, values, state=state, skip_if_finished=skip_if_finished)

    def enqueue_trial(self, params: dict, user_attrs=None, skip_if_exists: bool = False) -> None:
        self._trials = None
        self.study.enqueue_trial(params, user_attrs, skip_if_exists=skip_if_exists)

    def add_trial(self, trial: FrozenTrial) -> None:
        self._trials = None
        self.study.add_trial(trial)
