"""The Optuna study a search draws from: sampler, pruner, storage, heartbeats, the budget.

Optuna owns sampling, pruning and storage; this module only chooses and wires them:

- the sampler: TPE (with `constant_liar`, so the trials of one batch, asked before any
  is told, spread out), random, or a grid over finite parameters; seeded with the
  search's seed by the worker that makes the study, afresh by every worker that joins
  it or resumes it (`open_study`)
- the pruner: median, successive halving, Hyperband, or none, fed the trials' mean
  validation accuracy after every epoch
- the storage: any SQLAlchemy URL Optuna's `RDBStorage` takes (an SQLite file by
  default, PostgreSQL for workers on several machines), with a heartbeat: a worker
  records one for each of its running trials every `heartbeat` seconds (`Heartbeat`);
  a trial whose heartbeat is older than the grace period is failed by the next worker
  that looks (`optuna.storages.fail_stale_trials`), and Optuna's
  `RetryHeartbeatStaleTrialCallback` enqueues it again with the same parameters, so a killed
  worker loses nothing

The study's size is its budget of `trials`: every worker counts the same trials.
`admitted` says whether a trial just asked is within it: the trials that are not
failed, taken in the order Optuna numbered them, fill the budget, so when two workers
ask at the same moment exactly one of them gets the last place (a trial only ever
moves forward in that order, when one before it fails and leaves it). A trial asked
past the budget is told failed at once, marked `over_budget`, and never trained.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import socket
import threading
import time
import warnings

import filelock
import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from sqlalchemy.engine import URL, make_url  # SQLAlchemy comes with Optuna's storage
from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from jaxmnist.errors import ConfigError
from jaxmnist.search.space import Param, grid_space

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "hyperband", "none")
OVER_BUDGET = "over_budget"  # user attribute of a trial asked past the budget
DONE = (TrialState.COMPLETE, TrialState.PRUNED)


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    name: str
    storage: str  # a SQLAlchemy URL
    trials: int  # the study's budget, shared by every worker
    sampler: str = "tpe"
    seed: int = 0  # the sampler's
    pruner: str = "median"
    heartbeat: int = 60  # seconds between a running trial's heartbeats
    grace: int = 180  # seconds without one before a trial counts as lost
    retries: int = 3  # times a lost trial is run again


class _GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid, told trial by trial: the search stops on its own budget, so the
    grid's request to stop `study.optimize` (which a study driven by ask and tell does
    not run, and refuses) is not made."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def make_sampler(kind: str, seed: int, params: list[Param]) -> optuna.samplers.BaseSampler:
    if kind == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return _GridSampler(grid_space(params), seed=seed)
    raise ConfigError(f"unknown sampler {kind!r}; choose from: {', '.join(SAMPLERS)}")


def make_pruner(kind: str, epochs: int) -> optuna.pruners.BasePruner:
    """Pruners compare trials at the same epoch. The search asks them only after an epoch
    that is neither the first nor the last (`batch.Pruning`)."""
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=1)
    if kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    if kind == "none":
        return optuna.pruners.NopPruner()
    raise ConfigError(f"unknown pruner {kind!r}; choose from: {', '.join(PRUNERS)}")


def open_storage(opts: StudyOptions, attempts: int = 10) -> RDBStorage:
    """The study's storage, with heartbeats and retries; ConfigError for a bad URL or an
    unreachable database (one line). Workers started together on a new database race to
    create its tables, and all but one fail on a unique name or a table that already
    exists: they try again, and find the tables made. On an SQLite file they also take
    turns (`_schema_lock`)."""
    for attempt in range(1, attempts + 1):
        try:
            with _schema_lock(opts.storage), warnings.catch_warnings():
                # Optuna marks heartbeats and its retry callback experimental; they are its
                # documented way to run a lost trial again.
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(
                    opts.storage,
                    heartbeat_interval=opts.heartbeat,
                    grace_period=opts.grace,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(opts.retries),
                    engine_kwargs={"pool_pre_ping": True},
                )
        except (SQLAlchemyError, ImportError, ValueError, RuntimeError) as e:  # URL, driver
            if _lost_creation_race(e) and attempt < attempts:
                time.sleep(0.2 * attempt)
                continue
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--storage {safe_url(opts.storage)}: {first}") from None
    raise AssertionError("unreachable")


def _sqlite_file(url: str) -> str | None:
    """The file an SQLite URL names; None for any other database, or SQLite in memory."""
    try:
        parsed = make_url(url)
    except SQLAlchemyError:
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or database in (None, "", ":memory:"):
        return None
    return database


@contextlib.contextmanager
def _schema_lock(url: str):
    """A lock file beside an SQLite database (`<file>.lock`), held while a worker opens
    it: SQLite commits each `CREATE` on its own, so a worker that came second saw the
    studies table made, skipped its unique index, and two workers each added the study
    (found later as `Multiple rows were found`). PostgreSQL creates the schema in one
    transaction: no lock. The lock makes the file's folder if need be; where it cannot
    (no right to write there), none is taken, and opening the database says why."""
    path = _sqlite_file(url)
    with contextlib.ExitStack() as held:
        if path is not None:
            with contextlib.suppress(OSError):
                held.enter_context(filelock.FileLock(f"{path}.lock"))
        yield


# PostgreSQL's SQLSTATEs for a table (duplicate_table) or a type or constraint
# (duplicate_object) that another session has just created.
_ALREADY_CREATED = ("42P07", "42710")


def _lost_creation_race(e: Exception) -> bool:
    """Whether `e` says another worker made first what this one was making: a unique row
    (IntegrityError), on PostgreSQL a table or type (Optuna's schema, alembic's), on
    SQLite a table or index (its driver gives no code: only the message says it), or on
    SQLite a file another worker holds locked while it creates them."""
    code = getattr(getattr(e, "orig", None), "sqlstate", None)
    if isinstance(e, IntegrityError) or code in _ALREADY_CREATED:
        return True
    message = str(getattr(e, "orig", e))
    sqlite = isinstance(e, OperationalError) and type(getattr(e, "orig", None)).__module__ in (
        "sqlite3",
        "_sqlite3",
    )
    return sqlite and ("already exists" in message or "database is locked" in message)


def sqlite_url(path) -> str:
    """The SQLAlchemy URL of the SQLite file at `path`, its characters escaped: a path is
    a path (a `?` in it is no query, a `%41` no `A`)."""
    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def safe_url(url: str) -> str:
    """The URL without its password, for a message."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:  # not a URL at all: say it as given
        return url


# The study's user attribute that holds its search space and its budget of trials, as
# one value: written as two, a worker joining between the writes found the space
# without the budget.
SEARCH_ATTR = "search"


def declared(study: optuna.Study) -> dict | None:
    """What the study searches, {"space": [...], "trials": N}, as its first worker
    declared it; None before that (studies of older jaxmnist hold the two as attributes
    of their own)."""
    attrs = study.user_attrs
    if SEARCH_ATTR in attrs:
        return attrs[SEARCH_ATTR]
    if "space" in attrs and "trials" in attrs:
        return {"space": attrs["space"], "trials": attrs["trials"]}
    return None


def joining_seed(seed: int) -> int:
    """A sampler seed for a worker that joins a study another made (or resumes one): drawn
    from `seed`, this host, this process and the time, so that no two workers, and no
    worker and the one before it, draw the same values in the same order."""
    text = f"{seed}:{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def open_study(opts: StudyOptions, params: list[Param], epochs: int) -> optuna.Study:
    """Creates the study, its sampler seeded with `opts.seed` (a fresh search repeats
    itself), or joins it (another worker made it, or this is a resumed search), its
    sampler seeded anew (`joining_seed`): seeded alike, two workers drew the same values
    trial after trial. Refuses to join one whose search space differs."""
    storage = open_storage(opts)
    pruner = make_pruner(opts.pruner, epochs)
    try:
        study = optuna.create_study(
            study_name=opts.name,
            storage=storage,
            sampler=make_sampler(opts.sampler, opts.seed, params),
            pruner=pruner,
            direction="maximize",
        )
    except optuna.exceptions.DuplicatedStudyError:  # one name, one study: made by another
        study = optuna.load_study(
            study_name=opts.name,
            storage=storage,
            sampler=make_sampler(opts.sampler, joining_seed(opts.seed), params),
            pruner=pruner,
        )
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise ConfigError(f"study {opts.name!r} minimises; a search maximises validation accuracy")
    space = [p.spec for p in params]
    joined = declared(study)
    if joined is None:  # the first worker here: say what the study searches, in one write
        # A worker declaring at the same moment makes this write a no-op or an update;
        # either way the read after it is the declaration that stands.
        study.set_user_attr(SEARCH_ATTR, {"space": space, "trials": opts.trials})
        joined = declared(study)
    if joined["space"] != space:
        raise ConfigError(
            f"study {opts.name!r} searches {' '.join(joined['space'])}, not "
            f"{' '.join(space)}; name another --study"
        )
    if joined["trials"] != opts.trials:
        raise ConfigError(
            f"study {opts.name!r} is a search of {joined['trials']} trials, not "
            f"{opts.trials}; give --trials {joined['trials']}"
        )
    return study


def ask(study: optuna.Study) -> optuna.Trial:
    """A trial to run: a retried one first (Optuna hands out enqueued trials first). Its
    first heartbeat is recorded at once: a trial that never beat is never found stale,
    so one asked by a worker killed before its `Heartbeat` started would stay running."""
    with warnings.catch_warnings():
        # Optuna warns that heartbeats are meant for `optimize`; here `Heartbeat` beats.
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed")
        trial = study.ask()
    study._storage.record_heartbeat(trial._trial_id)
    return trial


def admitted(study: optuna.Study, trial: optuna.Trial, budget: int) -> bool:
    """Whether `trial` (just asked) is within the budget (see the module doc); if not,
    it is told failed and marked over budget."""
    live = [
        t.number
        for t in study.get_trials(deepcopy=False)
        if t.state != TrialState.FAIL and t.number <= trial.number
    ]
    if len(live) <= budget:
        return True
    trial.set_user_attr(OVER_BUDGET, True)
    study.tell(trial, state=TrialState.FAIL)
    return False


def fail_stale(study: optuna.Study) -> None:
    """Fails the running trials whose heartbeat stopped; the retry callback enqueues them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state name (COMPLETE, PRUNED, RUNNING, WAITING, FAIL), and OVER_BUDGET:
    those asked past the budget, which never ran (told FAIL, not counted there)."""
    out = {s.name: 0 for s in TrialState} | {"OVER_BUDGET": 0}
    for t in study.get_trials(deepcopy=False):
        over = t.state == TrialState.FAIL and t.user_attrs.get(OVER_BUDGET)
        out["OVER_BUDGET" if over else t.state.name] += 1
    return out


def counts_text(c: dict) -> str:
    """`4 complete, 1 pruned, 0 failed trials`, and how many were asked past the budget
    and never ran, where any were."""
    text = f"{c['COMPLETE']} complete, {c['PRUNED']} pruned, {c['FAIL']} failed trials"
    over = c.get("OVER_BUDGET", 0)
    return text + (f" ({over} more asked past the budget, never run)" if over else "")


STORAGE_ERRORS = (SQLAlchemyError, optuna.exceptions.StorageInternalError)


class Heartbeat:
    """Records a heartbeat for each of `trial_ids` every `interval` seconds, in a thread,
    while the batch trains (Optuna's `optimize` does this for one trial at a time). A
    storage that stops answering stops the beats, quietly: `error` keeps what it raised,
    and the search says it in one line when it next needs the storage."""

    def __init__(self, storage: RDBStorage, trial_ids: list[int], interval: float):
        self.storage, self.trial_ids, self.interval = storage, list(trial_ids), interval
        self.stopped = threading.Event()
        self.error: Exception | None = None
        self.thread = threading.Thread(target=self._beat, name="search-heartbeat", daemon=True)

    def _beat(self) -> None:
        while True:
            try:
                for trial_id in self.trial_ids:
                    self.storage.record_heartbeat(trial_id)
            except STORAGE_ERRORS as e:
                self.error = e
                return
            if self.stopped.wait(self.interval):
                return

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()
