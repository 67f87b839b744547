"""The driver's `StudyLedger` (issue 22): reads between its writes come from memory and agree
with the storage; every kind of write the driver makes is seen by the next read.

SQL statements are counted with SQLAlchemy's own event hook on the real SQLite storage.
"""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState
from sqlalchemy import event

from k3scale.sweep import sources
from k3scale.sweep.ledger import StudyLedger

DISTRIBUTIONS = {
    "lr": FloatDistribution(1e-4, 1.0, log=True),
    "batch_size": CategoricalDistribution([7]),
}


@pytest.fixture()
def storage(tmp_path) -> str:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return f"sqlite:///{tmp_path / 'optuna.db'}"


def _fresh(storage: str, name: str) -> list[tuple[int, TrialState, float | None, dict]]:
    """The study's trials as a new process reading the storage would see them."""
    study = optuna.load_study(study_name=name, storage=storage)
    return [(t.number, t.state, t.value, t.params) for t in study.get_trials()]


def _seen(ledger: StudyLedger) -> list[tuple[int, TrialState, float | None, dict]]:
    return [(t.number, t.state, t.value, t.params) for t in ledger.get_trials()]


def _statements(ledger: StudyLedger) -> list[str]:
    executed: list[str] = []
    engine = ledger.study._storage._backend.engine
    event.listen(engine, "before_cursor_execute", lambda *args: executed.append(args[2]))
    return executed


def test_reads_between_writes_run_no_sql_and_writes_are_seen(storage):
    ledger = StudyLedger(optuna.create_study(storage=storage, study_name="cell"))
    executed = _statements(ledger)

    ledger.enqueue_trial({"lr": 1e-2, "batch_size": 7})
    ledger.enqueue_trial({"lr": 2e-2, "batch_size": 7})
    assert sources.count(ledger, TrialState.WAITING) == 2
    first = ledger.ask(DISTRIBUTIONS)
    assert first.params["lr"] == 1e-2
    assert sources.count(ledger, TrialState.RUNNING) == 1
    ledger.tell(first, 3.5)
    ledger.add_trial(
        optuna.trial.create_trial(
            params={"lr": 5e-3, "batch_size": 7}, distributions=DISTRIBUTIONS, value=3.1
        )
    )
    second = ledger.ask(DISTRIBUTIONS)
    ledger.tell(second, state=TrialState.FAIL)
    assert _seen(ledger) == _fresh(storage, "cell")

    before = len(executed)
    for _ in range(50):
        sources.count(ledger, TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)
        sources.best_params(ledger)
        ledger.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert len(executed) == before, executed[before:]
    assert sources.best_params(ledger) == {"lr": 5e-3, "batch_size": 7}
    assert sources.count(ledger, TrialState.COMPLETE) == 2
    assert sources.count(ledger, TrialState.FAIL) == 1


def test_copies_from_the_ledger_do_not_change_what_it_holds(storage):
    ledger = StudyLedger(optuna.create_study(storage=storage, study_name="cell"))
    ledger.add_trial(
        optuna.trial.create_trial(
            params={"lr": 1e-2, "batch_size": 7}, distributions=DISTRIBUTIONS, value=3.0
        )
    )
    ledger.get_trials()[0].params["lr"] = 99.0
    assert ledger.get_trials(deepcopy=False)[0].params["lr"] == 1e-2


def test_a_trial_left_running_is_told_through_the_ledger(storage):
    """A restarted driver re-attaches to trials a dead driver left RUNNING and tells them."""
    dead_driver = optuna.create_study(storage=storage, study_name="cell")
    dead_driver.enqueue_trial({"lr": 1e-2, "batch_size": 7})
    dead_driver.ask(DISTRIBUTIONS)

    ledger = StudyLedger(optuna.load_study(study_name="cell", storage=storage))
    (stale,) = sources.stale_running(ledger)
    stale.set_user_attr("run_id", "abc")
    ledger.tell(stale, 3.25)
    assert _seen(ledger) == _fresh(storage, "cell")
    (done,) = ledger.get_trials(states=(TrialState.COMPLETE,))
    assert done.value == 3.25 and done.user_attrs == {"run_id": "abc"}


def test_the_ledger_answers_with_the_study_s_own_attributes(storage):
    study = optuna.create_study(storage=storage, study_name="cell|extra")
    ledger = StudyLedger(study)
    assert ledger.study_name == "cell|extra"
    assert ledger.sampler is study.sampler
    assert ledger.direction == study.direction


def test_a_trial_costs_the_same_statements_in_a_study_of_any_size(storage):
    """Enqueue (with its duplicate check), ask, tell and the driver's reads: the SQL a trial runs
    does not grow with the trials the study already holds (issue 22)."""
    ledger = StudyLedger(optuna.create_study(storage=storage, study_name="cell"))
    ledger.get_trials(deepcopy=False)  # the one full read, when a driver opens the study
    executed = _statements(ledger)
    counts = []
    for index in range(120):
        before = len(executed)
        ledger.enqueue_trial({"lr": 1e-3 * (1 + index), "batch_size": 7}, skip_if_exists=True)
        ledger.enqueue_trial({"lr": 1e-3 * (1 + index), "batch_size": 7}, skip_if_exists=True)
        trial = ledger.ask(DISTRIBUTIONS)
        ledger.tell(trial, 3.0 + index)
        sources.best_params(ledger)
        sources.count(ledger, TrialState.WAITING, TrialState.RUNNING)
        counts.append(len(executed) - before)
    assert counts[10] == counts[-1], counts
    assert _seen(ledger) == _fresh(storage, "cell")
    assert len(ledger.get_trials()) == 120  # the duplicate enqueues were skipped
