"""Many models in one program: members, their keys, stacked states, compiled programs.

A population is the set of models a run trains together. Each member has a seed
and the optimizer hyperparameters that do not change any array's shape
(learning rate, weight decay, momentum). One member runs today's single-model
programs unchanged. Several members share one config otherwise: their states
are stacked along a leading axis, their hyperparameters are written into the
stacked optimizer state as traced arrays (`optim.set_hyperparams`), and the
very same `train_epoch` and `evaluate` functions run under `jax.vmap`, the
training data shared (`in_axes=None`). The members are cut into chunks that fit
in device memory (`jaxmnist.memory`); the chunks run one after another inside
each epoch, with every member's state kept on the device.

A member's random keys do not depend on its company: seed s gives
`init_key, shuffle_key = split(key(s))` and epoch keys `split(shuffle_key,
epochs)`, exactly as a single run does, so a seed trained in a group follows
the same trajectory as that seed trained alone (up to float summation order).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxmnist import evaluate as evaluate_lib
from jaxmnist import optim
from jaxmnist.train import init_state, make_train_epoch

HYPERPARAMS = ("lr", "weight_decay", "momentum")  # OptimizerConfig fields held as traced arrays
# Config fields that vary between members of one program (everything else shapes it).
TRACED_FIELDS = ("train.seed", *(f"optimizer.{h}" for h in HYPERPARAMS))


@dataclasses.dataclass(frozen=True)
class Member:
    seed: int
    lr: float
    weight_decay: float
    momentum: float

    @classmethod
    def of(cls, cfg, seed: int | None = None) -> Member:
        o = cfg.optimizer
        return cls(cfg.train.seed if seed is None else seed, o.lr, o.weight_decay, o.momentum)


def seed_members(cfg) -> tuple[Member, ...]:
    """`train.seeds` members with seeds train.seed ... train.seed + seeds - 1."""
    return tuple(Member.of(cfg, cfg.train.seed + i) for i in range(cfg.train.seeds))


def member_keys(seed: int, num_epochs: int):
    """(init_key, epoch_keys (num_epochs,)): the keys of a single run with this seed."""
    init_key, shuffle_key = jax.random.split(jax.random.key(seed))
    return init_key, jax.random.split(shuffle_key, num_epochs)


class Evaluation(NamedTuple):
    """One evaluation set, every member: arrays with a leading member axis (N,)."""

    loss: np.ndarray  # float64 (N,): mean cross-entropy over the real examples
    accuracy: np.ndarray  # float64 (N,)
    confusion: np.ndarray  # int64 (N, C, C)
    count: int


def _stack(trees):
    return jax.tree.map(lambda *xs: np.concatenate(xs), *trees)


class Population:
    """The states and compiled programs of `members` trained under one `cfg`.

    `chunks` are the sizes the members train in (from `memory.plan_chunks`);
    with one member the programs are the plain single-model ones.
    """

    def __init__(self, cfg, optimizer, members, chunks, input_shape, num_classes, num_epochs):
        self.cfg, self.optimizer, self.members = cfg, optimizer, tuple(members)
        self.stacked = len(self.members) > 1
        if not self.stacked and self.members[0] != Member.of(cfg, self.members[0].seed):
            raise ValueError("a single member must match its config")  # a caller's bug
        self.chunks = tuple(chunks) if self.stacked else (1,)
        ends = np.cumsum((0, *self.chunks))
        self.slices = [slice(int(a), int(b)) for a, b in itertools.pairwise(ends)]
        self._init = lambda k: init_state(k, cfg, optimizer, input_shape, num_classes)
        self.num_classes = num_classes
        keys = [member_keys(m.seed, num_epochs) for m in self.members]
        if self.stacked:
            init, epochs = jnp.stack([k for k, _ in keys]), jnp.stack([e for _, e in keys])
            self.init_keys = [init[s] for s in self.slices]
            # Sliced once here: inside the epoch loop transfers are disallowed.
            self.epoch_keys = [[epochs[s, e] for s in self.slices] for e in range(num_epochs)]
        else:
            self.init_keys = [keys[0][0]]
            self.epoch_keys = [[k] for k in keys[0][1]]
        self.epoch_fns: dict = {}
        self.eval_fns: dict = {}
        self.counts: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.members)

    def state_shapes(self):
        """One member's TrainState as shapes (nothing allocated)."""
        return jax.eval_shape(
            self._init, self.init_keys[0] if not self.stacked else self.init_keys[0][0]
        )

    def init_states(self) -> list:
        """One state per chunk; stacked states carry each member's hyperparameters."""
        if not self.stacked:
            return [jax.jit(self._init)(self.init_keys[0])]
        init = jax.jit(jax.vmap(self._init))
        states = []
        for s, keys in zip(self.slices, self.init_keys):
            state = init(keys)
            values = {
                h: np.array([getattr(m, h) for m in self.members[s]], np.float32)
                for h in HYPERPARAMS
            }
            states.append(
                state._replace(opt_state=optim.set_hyperparams(state.opt_state, **values))
            )
        return states

    def compile(
        self, states, epoch_steps, train_data, eval_sets: dict, progress=None, progress_every=0
    ):
        """Compiles the epoch for every (chunk size, steps) and evaluation for every
        (chunk size, set) ahead of time; `eval_sets` maps a name to its EvalData."""
        vmap = (lambda f, axes: jax.vmap(f, in_axes=axes)) if self.stacked else (lambda f, axes: f)
        first = {}
        for i, size in enumerate(self.chunks):
            first.setdefault(size, i)
        for n in sorted(set(epoch_steps)):
            fn = vmap(
                make_train_epoch(self.cfg, self.optimizer, n, progress, progress_every),
                (0, 0, None),
            )
            for size, i in first.items():
                lowered = jax.jit(fn, donate_argnums=0).lower(
                    states[i], self.epoch_keys[0][i], train_data
                )
                self.epoch_fns[size, n] = lowered.compile()
        evaluate = vmap(evaluate_lib.make_evaluate(self.cfg.model, self.num_classes), (0, None))
        for name, data in eval_sets.items():
            for size, i in first.items():
                self.eval_fns[size, name] = (
                    jax.jit(evaluate).lower(states[i].params, data).compile()
                )
            self.counts[name] = int(np.asarray(jax.device_get(data.mask)).sum())

    def train_epoch(self, states, epoch_index: int, num_steps: int, data, before_chunk=None):
        """Runs one epoch of every chunk, in turn; returns (states, [EpochMetrics per chunk]).
        `before_chunk(i)`, if given, is called before chunk i is launched."""
        out_states, metrics = [], []
        for i, (size, state) in enumerate(zip(self.chunks, states)):
            if before_chunk is not None:
                before_chunk(i)
            state, m = self.epoch_fns[size, num_steps](state, self.epoch_keys[epoch_index][i], data)
            out_states.append(state)
            metrics.append(m)
        return out_states, metrics

    def host_metrics(self, metrics) -> tuple[np.ndarray, np.ndarray]:
        """(losses float32 (N, steps), correct int (N,)) on the host."""
        losses, correct = jax.device_get(([m.loss for m in metrics], [m.correct for m in metrics]))
        if not self.stacked:
            return np.asarray(losses[0])[None], np.asarray(correct[0]).reshape(1)
        return np.concatenate(losses), np.concatenate(correct)

    def evaluate(self, states, name: str, data) -> Evaluation:
        """Exact evaluation of every member on the set compiled as `name`."""
        parts = jax.device_get(
            [self.eval_fns[size, name](s.params, data) for size, s in zip(self.chunks, states)]
        )
        if self.stacked:
            loss_sum, correct, confusion = (np.concatenate([p[k] for p in parts]) for k in range(3))
        else:
            loss_sum, correct, confusion = (np.asarray(x)[None] for x in parts[0])
        count = self.counts[name]
        return Evaluation(
            loss_sum.astype(np.float64) / count,
            correct.astype(np.float64) / count,
            confusion.astype(np.int64),
            count,
        )

    def learning_rates(self, states) -> np.ndarray | None:
        """float64 (N,): the learning rate each member's last update used."""
        lrs = [optim.current_learning_rate(s.opt_state) for s in states]
        if lrs[0] is None:
            return None
        return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.device_get(lrs)])

    def params(self, states):
        """Parameters on the host: a single tree, or stacked with a leading member axis."""
        if not self.stacked:
            return jax.device_get(states[0].params)
        return _stack([jax.device_get(s.params) for s in states])

    def member_params(self, states, index: int):
        """Member `index`'s parameters (on the device), unstacked."""
        if not self.stacked:
            return states[0].params
        for s, state in zip(self.slices, states):
            if s.start <= index < s.stop:
                return jax.tree.map(lambda x, i=index - s.start: x[i], state.params)
        raise IndexError(index)


def epoch_record(
    epoch: int,
    step: int,
    examples: int,
    losses,
    correct,
    test: Evaluation,
    train_eval: Evaluation | None,
    learning_rates,
    seconds: float,
) -> dict:
    """One metrics.jsonl line. losses: float32 (N, steps); correct: (N,) right in the
    epoch's batches; examples: training examples per member this epoch.

    Figures are means over the members, so one member's line is exactly a single
    run's; several members add per-member lists (`*_per_seed`) and the spread of
    test accuracy. examples_per_second counts every member's examples.
    """
    train_loss = losses.mean(axis=1)
    batch_accuracy = correct / examples
    train_accuracy = train_eval.accuracy if train_eval is not None else batch_accuracy
    record = {
        "epoch": epoch,
        "step": step,
        "train_loss": float(train_loss.mean()),
        "train_accuracy": float(train_accuracy.mean()),
        "train_batch_accuracy": float(batch_accuracy.mean()),
        "test_loss": float(test.loss.mean()),
        "test_accuracy": float(test.accuracy.mean()),
        "learning_rate": None if learning_rates is None else float(learning_rates.mean()),
        "epoch_seconds": seconds,
        "examples_per_second": len(losses) * examples / seconds,
    }
    if len(losses) > 1:
        record.update(
            test_accuracy_std=float(test.accuracy.std(ddof=1)),
            test_accuracy_per_seed=test.accuracy.tolist(),
            test_loss_per_seed=test.loss.tolist(),
            train_accuracy_per_seed=np.asarray(train_accuracy, np.float64).tolist(),
            train_loss_per_seed=train_loss.astype(np.float64).tolist(),
        )
    return record


def seed_summary(result) -> dict:
    """summary.json's multi-seed fields from a `train.RunResult`: the seeds, the
    test accuracy's mean, std, 95% CI, min and max, and the per-seed figures."""
    from jaxmnist import stats

    acc = result.test.accuracy
    last = result.records[-1]
    return {
        "seeds": [m.seed for m in result.population.members],
        **stats.spread(acc).to_json("test_accuracy"),
        "test_accuracy_per_seed": acc.tolist(),
        "test_loss_per_seed": result.test.loss.tolist(),
        "train_accuracy_per_seed": last["train_accuracy_per_seed"],
        "chunks": list(result.population.chunks),
    }
