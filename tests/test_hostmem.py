"""The host allocator setting: freed buffers are reused, not unmapped and faulted in again."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from test_validation import tiny_cfg

from jaxmnist import cli, hostmem, runtime
from jaxmnist import config as config_lib
from jaxmnist.commands import options
from jaxmnist.training import loop, population

# Allocates (malloc), touches and frees a 256 MB block five times and prints the page faults of
# the last four rounds. glibc's default maps a block that large afresh every time.
PROBE = """
import ctypes, resource
from jaxmnist import hostmem
print(hostmem.keep_freed_memory(), hostmem.describe())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(5):
    if i == 1:
        start = faults()
    block = libc.malloc(2**28)
    ctypes.memset(block, 1, 2**28)
    libc.free(block)
print(faults() - start)
"""


def _probe(keep: str) -> tuple[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={"JAXMNIST_KEEP_HOST_MEMORY": keep, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    return out[0], int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_and_the_default_is_kept_on_request():
    pages = 4 * 2**28 // 4096  # four rounds of a 256 MB buffer, in 4 KiB pages
    said, faults = _probe("1")
    assert said == "True glibc, freed memory kept for reuse (one arena, no mmap)"
    assert faults < pages // 20  # the heap's block is reused: next to no new pages
    said, faults = _probe("0")
    assert said == "False default"
    assert faults > pages // 2  # glibc's default: every round maps and faults it anew


# A freed 256 MB block that cannot rejoin the heap's top (another block lies above it), a
# 16 MB request cut from it, then 256 MB again: it no longer fits in what is left, so the
# heap grows while the old block's pages stay resident. Prints how far the peak resident
# set rose for the second block, with or without `hand_back` first (argv[1] == "1").
SPLIT_PROBE = """
import ctypes, sys
from jaxmnist import hostmem
print(hostmem.keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def peak_mb():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) // 1024
size = 2**28
block = libc.malloc(size)
ctypes.memset(block, 1, size)
above = libc.malloc(size)  # never touched: no resident pages
libc.free(block)
cut = libc.malloc(2**24)
assert cut == block, "the request was not cut from the freed block"
if sys.argv[1] == "1":
    hostmem.hand_back()
before = peak_mb()
again = libc.malloc(size)
ctypes.memset(again, 1, size)
print(peak_mb() - before)
"""


def _split_probe(hand_back: bool) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SPLIT_PROBE, str(int(hand_back))],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0] == "True"
    return int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_hand_back_keeps_a_block_cut_from_a_freed_one_from_being_held_twice():
    assert _split_probe(hand_back=False) >= 250  # both blocks' pages resident at once
    assert _split_probe(hand_back=True) < 64  # the freed block's pages went back first


@pytest.mark.parametrize(
    "working, handed_back",
    [
        ({"test": 100, "val": 100, "train": 50}, ["test"]),
        ({"test": 100, "val": 200, "train": 100}, ["test", "val"]),
        ({"test": 100, "val": 50, "train": 101}, ["test", "train"]),
        ({"test": 100, "val": 50, "train": 80}, ["test"]),  # the test set's block still fits
    ],
)
def test_the_loop_hands_back_before_each_phase(tiny_dataset, monkeypatch, working, handed_back):
    """Every epoch's steps and its first evaluation (the test set, with the ensemble) start
    right after `hand_back`; the validation split's and the training subset's that follow
    it too, unless their program needs no more working memory than the test set's, whose
    freed block they reuse."""
    calls: list[str] = []
    monkeypatch.setattr(hostmem, "hand_back", lambda: calls.append("hand_back"))
    # The hand-backs before phases alone: the growth check's, as a call runs, depend on
    # how much memory that call happens to take (tests of their own pin them).
    monkeypatch.setattr(hostmem.GrowthCheck, "watch", lambda self, ready: None)
    monkeypatch.setattr(loop, "eval_working_bytes", lambda pop: working)
    for name in ("plan_epoch", "evaluate"):
        original = getattr(population.Population, name)

        def record(self, *args, _name=name, _original=original, **kwargs):
            what = args[1] if _name == "evaluate" else _name  # evaluate(states, set name, ...)
            calls.append(what)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(population.Population, name, record)
    cfg = tiny_cfg(seeds=2, epochs=2, eval_train=True, eval_train_examples=64)
    loop.train_population(cfg, population.seed_members(cfg), tiny_dataset)
    phases = [i for i, c in enumerate(calls) if c != "hand_back"]
    # per epoch: its plan, then the test set, the validation split and the training subset
    assert [calls[i] for i in phases[:4]] == ["plan_epoch", "test", "val", "train"]
    assert len(phases) == 8
    after = {calls[i] for i in phases if calls[i - 1] == "hand_back"}
    assert after == {"plan_epoch", *handed_back}


class _Heap:
    """A resident set and heap use the test sets, and the hand-backs it saw."""

    def __init__(self):
        self.rss, self.used, self.trims = 0, 0, 0

    def trim(self, pad):
        self.trims += 1


def _check(monkeypatch, heap: _Heap, kept: bool = True) -> hostmem.GrowthCheck:
    monkeypatch.setitem(hostmem._state, "trim", heap.trim if kept else None)
    monkeypatch.setattr(hostmem, "heap_in_use", lambda: lambda: heap.used)
    monkeypatch.setattr(hostmem, "GROWTH_SLACK", 1)
    # A program whose working memory is 80: growth of an eighth of it, 10, is let stand.
    return hostmem.GrowthCheck(block=80, wait=0.02, poll=1e-4, rss=lambda: heap.rss)


def _call(check, heap: _Heap, resident_while_running: list[int], after: int) -> None:
    """One call: the resident set takes each value in turn while `watch` polls, then
    `after` once the call is done."""
    values = iter(resident_while_running)

    def ready() -> bool:  # not yet, while there are values left
        value = next(values, None)
        if value is not None:
            heap.rss = value
        return value is None

    check.before_call()
    check.watch(ready)
    heap.rss = after
    check.after_call()


def test_a_call_that_takes_a_fresh_block_makes_the_freed_one_go_back(monkeypatch):
    heap = _Heap()
    check = _check(monkeypatch, heap)
    _call(check, heap, [100, 300, 400], after=400)  # the phase's first call: nothing to compare
    assert heap.trims == 0 and check.floor == 400
    _call(check, heap, [400, 405, 410, 410], after=410)  # within the slack
    assert heap.trims == 0
    # A fresh block faulted in beside the freed one: handed back as soon as it shows,
    # while the call still runs (its own block is in use, so it stays), and only once.
    _call(check, heap, [400, 405, 411, 500, 700, 780], after=420)
    assert heap.trims == 1 and check.handed_back == 1
    _call(check, heap, [415, 420, 420], after=415)
    assert heap.trims == 2  # measured from the least resident set after a call (400)
    check.reset()  # a new phase: its first call sets the floor again
    _call(check, heap, [900, 1000, 1000], after=1000)
    _call(check, heap, [1000, 1005, 1005], after=1005)
    assert heap.trims == 2


def test_after_a_call_the_check_waits_for_its_working_memory_to_be_freed(monkeypatch):
    heap = _Heap()
    check = _check(monkeypatch, heap)
    mb = 2**20
    heap.used = 50 * mb
    check.before_call()
    heap.used = 500 * mb  # the call's block, not yet freed by the worker thread
    freed = threading.Timer(0.005, lambda: setattr(heap, "used", 55 * mb))
    freed.start()
    check.after_call()
    assert heap.used == 55 * mb  # it returned only once the block was freed
    heap.used = 500 * mb  # never freed: it gives up after `wait`
    start = time.perf_counter()
    check.after_call()
    assert 0.02 <= time.perf_counter() - start < 1.0


def test_the_growth_check_does_nothing_where_memory_is_not_kept(monkeypatch):
    heap = _Heap()
    check = _check(monkeypatch, heap, kept=False)
    heap.used = 500
    for grown in (100, 1000, 2000):
        _call(check, heap, [grown, grown * 2], after=grown)
    assert heap.trims == 0 and check.floor is None


def test_the_loop_checks_growth_around_every_steps_call(tiny_dataset, monkeypatch):
    """Before each call, while it runs (once dispatched, until it is ready) and after it
    is done; a new phase after each epoch's `hand_back`. (The evaluations' checks, other
    instances, are left out here.)"""
    calls: list[tuple[str, int]] = []
    for name in ("before_call", "after_call", "reset"):
        monkeypatch.setattr(
            hostmem.GrowthCheck, name, lambda self, _n=name, **_: calls.append((_n, id(self)))
        )

    def watch(self, ready):
        calls.append(("watch", id(self)))
        while not ready():  # the outputs of the call dispatched just before
            time.sleep(1e-3)
        calls.append(("ready", id(self)))

    monkeypatch.setattr(hostmem.GrowthCheck, "watch", watch)
    original = population.Population.train_steps

    def steps(self, *args):
        calls.append(("train_steps", 0))
        return original(self, *args)

    monkeypatch.setattr(population.Population, "train_steps", steps)
    cfg = tiny_cfg(seeds=2, epochs=2)
    loop.train_population(cfg, population.seed_members(cfg), tiny_dataset)
    steps_check = next(who for what, who in calls if what == "before_call")
    call = "before_call,train_steps,watch,ready,after_call"
    epochs = ",".join(what for what, who in calls if who in (0, steps_check)).split("reset")
    assert len(epochs) == 3 and epochs[0] == ""
    for epoch in epochs[1:]:
        n = epoch.count("train_steps")
        assert n >= 1 and epoch.strip(",") == ",".join([call] * n)


def test_a_phase_started_from_now_hands_back_a_fresh_block_at_once(monkeypatch):
    """An evaluation meant to reuse a freed block (no hand-back before it): its floor is the
    resident set at its start, so fresh pages show during its first call."""
    heap = _Heap()
    check = _check(monkeypatch, heap)
    heap.rss = 400
    check.reset(from_now=True)
    assert check.floor == 400
    _call(check, heap, [400, 405, 410], after=410)  # the freed block reused
    assert heap.trims == 0
    check.reset(from_now=True)
    _call(check, heap, [410, 415, 500, 600], after=490)  # fresh pages beside the freed block
    assert heap.trims == 1
    kept_not = _check(monkeypatch, _Heap(), kept=False)
    kept_not.reset(from_now=True)
    assert kept_not.floor is None


def test_evaluations_that_reuse_a_block_are_watched_from_where_they_start(
    tiny_dataset, monkeypatch
):
    """Each evaluation's growth check starts a phase: from its first call after a hand-back,
    from the resident set now where it follows without one; and it watches the dispatched
    programs until they are ready."""
    calls: list = []
    monkeypatch.setattr(hostmem, "hand_back", lambda: calls.append("hand_back"))
    monkeypatch.setattr(
        hostmem.GrowthCheck, "reset", lambda self, from_now=False: calls.append(("reset", from_now))
    )

    def watch(self, ready):
        while not ready():
            time.sleep(1e-3)
        calls.append("watched")

    monkeypatch.setattr(hostmem.GrowthCheck, "watch", watch)
    original = population.Population.evaluate

    def evaluate(self, states, name, data, watch=None):
        calls.append(name)
        return original(self, states, name, data, watch)

    monkeypatch.setattr(population.Population, "evaluate", evaluate)
    working = {}
    original_working = loop.eval_working_bytes

    def eval_working(pop):
        working.update(original_working(pop))
        return working

    monkeypatch.setattr(loop, "eval_working_bytes", eval_working)
    cfg = tiny_cfg(seeds=2, epochs=1, eval_train=True, eval_train_examples=64)
    loop.train_population(cfg, population.seed_members(cfg), tiny_dataset)
    # Each set's programs' working memory, by name, as the compiler reports it.
    assert set(working) == {"test", "val", "train"}
    assert all(isinstance(b, int) and b > 0 for b in working.values()), working
    names = [i for i, c in enumerate(calls) if c in working]
    assert [calls[i] for i in names] == ["test", "val", "train"]
    for i in names:
        handed_back = "hand_back" in calls[i - 2 : i]
        assert calls[i - 1] == ("reset", not handed_back), calls
        assert calls[i + 1] == "watched"
    assert calls[names[0] - 2] == "hand_back"  # the test set, after the steps


@pytest.mark.parametrize(
    ("platforms", "plugins", "expected"),
    [
        ("", (), False),  # no plugin: JAX runs on the CPU
        ("", ("libtpu",), True),  # a TPU VM
        ("", ("jax_cuda12_plugin",), True),  # a GPU machine
        ("cpu", ("libtpu",), False),  # pinned to the CPU
        ("tpu,cpu", ("libtpu",), True),
    ],
)
def test_an_accelerator_is_told_apart_without_starting_jax(
    monkeypatch, platforms, plugins, expected
):
    import importlib.util

    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: (
            object()
            if name in plugins
            else (None if "plugin" in name or name == "libtpu" else real(name, *a))
        ),
    )
    assert hostmem.accelerator_installed() is expected


def test_where_an_accelerator_may_run_the_allocator_keeps_its_arenas(monkeypatch):
    # One arena there would make the threads that compile a run's programs at once wait
    # on each other's allocations.
    monkeypatch.setattr(hostmem, "_state", {**hostmem._state, "trim": None})
    monkeypatch.setattr(hostmem, "accelerator_installed", lambda: True)
    assert hostmem.keep_freed_memory() is False
    assert hostmem._state["trim"] is None


MiB = 2**20


@pytest.fixture
def no_tpu_buffer(monkeypatch):
    """Neither TPU buffer variable set, and none set by jaxmnist in this process."""
    monkeypatch.delenv(hostmem.TPU_BUFFER_ENV, raising=False)
    monkeypatch.delenv(hostmem.TPU_THRESHOLD_ENV, raising=False)
    monkeypatch.setitem(hostmem._state, "tpu_buffer", None)


def _largest(cfg) -> int:
    return runtime.largest_copy_bytes(cfg.data.dataset, cfg.model, cfg.train.seeds)


def _buffer_env() -> tuple[str | None, str | None]:
    return os.environ.get(hostmem.TPU_BUFFER_ENV), os.environ.get(hostmem.TPU_THRESHOLD_ENV)


def test_the_tpu_transfer_buffer_holds_the_largest_copy_twice(no_tpu_buffer):
    assert hostmem.size_tpu_transfer_buffer() == 256 * MiB  # the floor
    assert _buffer_env() == (str(256 * MiB),) * 2  # the threshold is the size
    assert hostmem.size_tpu_transfer_buffer(47_040_000) == 256 * MiB  # MNIST's images
    assert hostmem.size_tpu_transfer_buffer(129 * MiB) == 512 * MiB  # 258 MiB: next power
    assert hostmem.size_tpu_transfer_buffer(100 * MiB) == 512 * MiB  # it only grows
    assert hostmem.size_tpu_transfer_buffer(3 * 2**30) == 4 * 2**30  # libtpu's default at most
    assert _buffer_env() == (str(4 * 2**30),) * 2


@pytest.mark.parametrize("variable", [hostmem.TPU_BUFFER_ENV, hostmem.TPU_THRESHOLD_ENV])
def test_a_users_tpu_buffer_setting_is_left_alone(no_tpu_buffer, monkeypatch, variable):
    monkeypatch.setenv(variable, "123456789")
    before = _buffer_env()
    assert hostmem.size_tpu_transfer_buffer(47_040_000) is None
    assert _buffer_env() == before
    described = hostmem.describe_tpu_buffer()
    if variable == hostmem.TPU_BUFFER_ENV:
        assert described == {"bytes": 123456789, "set_by": "user"}
    else:
        assert described is None  # libtpu's default size


def test_a_tpu_buffer_changed_after_jaxmnist_set_it_is_the_users(no_tpu_buffer, monkeypatch):
    hostmem.size_tpu_transfer_buffer()
    monkeypatch.setenv(hostmem.TPU_BUFFER_ENV, str(64 * MiB))
    assert hostmem.size_tpu_transfer_buffer(300 * MiB) is None
    assert os.environ[hostmem.TPU_BUFFER_ENV] == str(64 * MiB)


def test_a_runs_largest_copy_is_its_images_or_every_models_largest_parameter():
    mnist = config_lib.get_preset("tpu101")
    assert _largest(mnist) == 60_000 * 28 * 28
    cnn = config_lib.get_preset("cnn")  # one CNN: its parameters are smaller
    assert _largest(cnn) == 60_000 * 28 * 28
    record = config_lib.get_preset("record")  # 8 CNNs: their dense layers together
    assert _largest(record) == 8 * (7 * 7 * 128) * 256 * 4
    wide = config_lib.apply_overrides(mnist, {"model.hidden": "4096", "train.seeds": "64"})
    assert _largest(wide) == 64 * 784 * 4096 * 4  # float32, every model


def test_a_runs_environment_says_who_sized_the_tpu_buffer(
    no_tpu_buffer, monkeypatch, train_argv, tmp_path
):
    assert cli.main(train_argv(tmp_path / "a", "--steps", "2", "--no-report")) == 0
    saved = json.loads((tmp_path / "a" / "environment.json").read_text())
    assert saved["tpu_transfer_buffer"] == {"bytes": 256 * MiB, "set_by": "jaxmnist"}
    monkeypatch.setitem(hostmem._state, "tpu_buffer", None)
    monkeypatch.setenv(hostmem.TPU_BUFFER_ENV, str(2**30))
    assert cli.main(train_argv(tmp_path / "b", "--steps", "2", "--no-report")) == 0
    saved = json.loads((tmp_path / "b" / "environment.json").read_text())
    assert saved["tpu_transfer_buffer"] == {"bytes": 2**30, "set_by": "user"}


def test_train_sizes_the_tpu_buffer_for_its_run_before_the_device_opens(
    no_tpu_buffer, tiny_data_dir, monkeypatch
):
    monkeypatch.setattr(hostmem, "tpu_installed", lambda: True)
    cfg = config_lib.apply_overrides(
        config_lib.get_preset("tpu101"),
        {"data.dataset": "tiny", "data.data_dir": str(tiny_data_dir), "model.hidden": "4096"},
    )
    cfg = config_lib.apply_overrides(cfg, {"train.seeds": "64"})  # 64 x 3 MiB of a layer
    args = cli.build_parser().parse_args(["train"])
    options.start_ahead(args, cfg).result()
    expected = hostmem.tpu_buffer_size(_largest(cfg))
    assert expected > hostmem.TPU_BUFFER_MIN
    assert _buffer_env() == (str(expected),) * 2


def test_every_command_starts_with_the_tpu_buffers_floor(no_tpu_buffer, capsys):
    assert cli.main(["config"]) == 0  # a command that opens no device, and leaves it set
    assert _buffer_env() == (str(hostmem.TPU_BUFFER_MIN),) * 2


def test_without_a_tpu_train_leaves_the_buffer_at_its_floor(
    no_tpu_buffer, tiny_data_dir, monkeypatch
):
    monkeypatch.setattr(hostmem, "tpu_installed", lambda: False)
    monkeypatch.setattr(runtime, "largest_copy_bytes", lambda *a: pytest.fail("computed"))
    cfg = config_lib.apply_overrides(
        config_lib.get_preset("tpu101"),
        {"data.dataset": "tiny", "data.data_dir": str(tiny_data_dir), "train.seeds": "64"},
    )
    hostmem.size_tpu_transfer_buffer()  # as `cli.main` does first
    options.start_ahead(cli.build_parser().parse_args(["train"]), cfg).result()
    assert _buffer_env() == (str(hostmem.TPU_BUFFER_MIN),) * 2


@pytest.mark.parametrize(
    ("platforms", "installed", "expected"),
    [("", True, True), ("", False, False), ("cpu", True, False), ("tpu,cpu", True, True)],
)
def test_a_tpu_is_told_apart_without_starting_jax(monkeypatch, platforms, installed, expected):
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    found = object() if installed else None
    monkeypatch.setattr(
        hostmem.importlib.util, "find_spec", lambda name: found if name == "libtpu" else None
    )
    assert hostmem.tpu_installed() is expected
