"""One search worker: join the study, then ask, train and tell batches until it is done.

`run_search(base, params, opts)` is what `jaxmnist search` calls, and what a notebook
or a test can call. Every worker that names the same study in the same storage runs
this loop; the study is done when `opts.trials` trials are COMPLETE or PRUNED,
whichever workers ran them. Before each batch a worker fails the trials whose
heartbeat stopped (`optuna.storages.fail_stale_trials`: Optuna's retry callback
enqueues them again, and the next batch asked picks them up first); when every place
left in the budget is running in other workers, it waits a heartbeat and looks again,
so that a place lost with a killed worker is taken over. A batch that fails here
(an error, Ctrl-C) fails its unfinished trials at once and enqueues them again in the
same way, rather than leaving them to time out.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from jaxmnist import config as config_lib
from jaxmnist import runtime
from jaxmnist.data import load_dataset
from jaxmnist.errors import ConfigError, JaxmnistError
from jaxmnist.search import study as study_lib
from jaxmnist.search.batch import batch_size, run_batch
from jaxmnist.search.space import Param, suggest

VALIDATION_FIELD = "data.validation"  # training examples held out to choose by


def with_validation(base: config_lib.Config, examples: int) -> config_lib.Config:
    """`base` holding out `examples` training examples for validation (0: none)."""
    return config_lib.apply_overrides(base, {VALIDATION_FIELD: examples})


def grid_trials(params: list[Param], trials: int) -> int:
    """The budget of a grid search: at most every point of the grid."""
    return min(trials, math.prod(len(p.grid_values()) for p in params))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the search is, to stop it as Ctrl-C does."""


def _terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_ctrl_c():
    """SIGTERM raises `Terminated` (a KeyboardInterrupt) while the block runs, so that a
    search stops on it as on Ctrl-C: the batch's trials failed and queued. Signals reach
    the main thread alone: elsewhere this changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped_line(e: KeyboardInterrupt, again: str) -> tuple[str, int]:
    """(what a search stopped by Ctrl-C or SIGTERM says, its exit code)."""
    name, code = ("SIGTERM", 143) if isinstance(e, Terminated) else ("Ctrl-C", 130)
    line = (
        f"jaxmnist search: {name}: stopped; the trials under way are failed and queued to "
        f"run again first; resume with: {again}"
    )
    return line, code


def storage_failure(e: Exception, storage: str, again: str) -> JaxmnistError:
    """One line for a study storage that stopped answering mid-search."""
    first = str(getattr(e, "orig", e)).strip().splitlines() or [type(e).__name__]
    return JaxmnistError(
        f"the study's storage {study_lib.safe_url(storage)} stopped answering ({first[0]}); "
        f"the trials under way run again once a worker finds them lost; resume with: {again}"
    )


def _fail_and_retry(study: optuna.Study, storage, trials: list) -> None:
    """Fails `trials` that are still running and hands each to the storage's retry
    callback, as `fail_stale_trials` does for a lost worker's trials. Where the storage
    does not answer, nothing more can be done here: the next worker to look finds the
    trials stale and retries them."""
    try:
        _fail_and_retry_now(study, storage, trials)
    except study_lib.STORAGE_ERRORS:
        pass


def _fail_and_retry_now(study: optuna.Study, storage, trials: list) -> None:
    retry = storage.get_heartbeat_stale_trial_callback()
    for trial in trials:
        if storage.get_trial(trial._trial_id).state != TrialState.RUNNING:
            continue
        study.tell(trial, state=TrialState.FAIL)
        if retry is not None:
            retry(study, storage.get_trial(trial._trial_id))


def run_search(
    base: config_lib.Config,
    params: list[Param],
    opts: study_lib.StudyOptions,
    *,
    batch: int = 8,
    dataset=None,
    log: Callable[[str], None] | None = None,
) -> optuna.Study:
    """Runs batches of trials of `base` (validated, validation split set) with `params`
    drawn by the study `opts` describes, until the study holds `opts.trials` finished
    trials; returns the study. `dataset` (a `jaxmnist.data.Dataset`) replaces loading
    `base.data`'s, for tests. `batch`: the most trials per batch."""
    log = log or (lambda line: None)
    if base.compile_cache:
        runtime.enable_compilation_cache()
    study = study_lib.open_study(opts, params, base.train.epochs)  # a bad URL: before the data
    d = base.data
    data = dataset
    if data is None:
        data = load_dataset(d.dataset, d.data_dir, download=d.download)
    storage = study._storage  # the RDBStorage open_study made
    k, about = batch_size(base, params, data, cap=min(batch, opts.trials))
    fit = about.get("models_that_fit")
    log(
        f"search {opts.name!r}: {opts.trials} trials of {base.train.seeds} seed"
        f"{'s' * (base.train.seeds != 1)}, up to {k} per batch"
        + (f" ({fit:,} models fit in memory)" if fit is not None else "")
    )
    number = 0
    while True:
        study_lib.fail_stale(study)
        c = study_lib.counts(study)
        done = c["COMPLETE"] + c["PRUNED"]
        if done >= opts.trials:
            break
        free = opts.trials - done - c["RUNNING"]  # enqueued retries are among them
        if free <= 0:
            time.sleep(opts.heartbeat)  # other workers run the rest; one may be lost
            continue
        trials, values = [], []
        for _ in range(min(k, free)):
            trial = study_lib.ask(study)
            if not study_lib.admitted(study, trial, opts.trials):
                break
            trials.append(trial)
            values.append(suggest(trial, params))  # stored now: a retry runs these again
        if not trials:
            continue
        number += 1
        retried = [
            t for t in trials if "failed_trial" in storage.get_trial_system_attrs(t._trial_id)
        ]
        log(
            f"batch {number}: trials {', '.join(str(t.number) for t in trials)}"
            + (f" (retrying {len(retried)})" if retried else "")
        )
        try:
            with study_lib.Heartbeat(storage, [t._trial_id for t in trials], opts.heartbeat):
                run_batch(study, trials, values, base, params, data, batch=number, log=log)
        except BaseException:
            _fail_and_retry(study, storage, trials)
            raise
        _check_refused(study, opts.trials)
    return study


def _check_refused(study: optuna.Study, trials: int) -> None:
    """ConfigError once the drawn combinations the config refuses outnumber what the
    search may spend on them (twice its trials, at least 10): a space that is mostly
    invalid would otherwise be sampled for ever."""
    refused = [
        t.user_attrs["error"]
        for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if "error" in t.user_attrs
    ]
    if len(refused) > max(2 * trials, 10):
        raise ConfigError(
            f"{len(refused)} drawn combinations were not valid configs (the last: "
            f"{refused[-1]}); narrow the --param ranges"
        )
