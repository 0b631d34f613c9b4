"""The ensemble on the validation split: a run of several seeds that holds examples out
(`data.validation`) evaluates the mean of its members' probabilities on them after every
epoch too (`ensemble_val_*` in metrics.jsonl and summary.json, and on the terminal), its
chunks together as on the test set."""

import dataclasses
import io
import json

import jax
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.commands.terminal import TerminalReporter
from jaxmnist.models import apply_uint8
from jaxmnist.report import plots
from jaxmnist.report.tensorboard import EVENTS_DIR, EventWriter
from jaxmnist.train import train_and_evaluate
from jaxmnist.training import memory, validation
from jaxmnist.training.hooks import Callback

SEEDS, HELD_OUT = 3, 100


class _Finish(Callback):
    def on_finish(self, end):
        self.end = end


def _numpy_ensemble(model_cfg, params, images, labels) -> tuple[float, float]:
    """(accuracy, loss) of the mean of the members' softmax probabilities, in float64."""
    probs = []
    for i in range(SEEDS):
        member = jax.tree.map(lambda x, i=i: x[i], params)
        logits = np.asarray(apply_uint8(member, images, model_cfg), np.float64)
        z = logits - logits.max(-1, keepdims=True)
        probs.append(np.exp(z) / np.exp(z).sum(-1, keepdims=True))
    mean = np.mean(probs, axis=0)
    accuracy = float(np.mean(mean.argmax(-1) == labels))
    loss = float(-np.log(mean[np.arange(len(labels)), labels]).mean())
    return accuracy, loss


@pytest.fixture(scope="module")
def val_run(tmp_path_factory, tiny_dataset):
    """Three seeds on the tiny set with 100 examples held out, the population forced into
    two chunks (2 + 1), at a learning rate low enough that the members still differ."""
    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        cfg,
        compile_cache=False,
        data=dataclasses.replace(cfg.data, validation=HELD_OUT),
        optimizer=dataclasses.replace(cfg.optimizer, lr=3e-5),
        train=dataclasses.replace(
            cfg.train, batch_size=32, epochs=2, eval_batch_size=64, seeds=SEEDS, eval_train=False
        ),
    )
    path = tmp_path_factory.mktemp("ensemble-val") / "run"
    finish, out = _Finish(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        about = {"chunks": [2, 1], "memory_estimate_mb": 1.0, "memory_budget_mb": None}
        mp.setattr(memory, "chunks_for", lambda *a, **k: ((2, 1), about))
        summary = train_and_evaluate(
            cfg, path, [finish, TerminalReporter("normal", stream=out)], dataset=tiny_dataset
        )
    return cfg, path, summary, finish.end, out.getvalue()


def test_the_val_ensemble_is_the_mean_of_the_members_probabilities(val_run, tiny_dataset):
    cfg, _, summary, end, _ = val_run
    assert end.result.population.chunks == (2, 1)  # one ensemble over both chunks
    idx = validation.validation_indices(tiny_dataset.train_labels, HELD_OUT)
    images, labels = tiny_dataset.train_images[idx], tiny_dataset.train_labels[idx]
    accuracy, loss = _numpy_ensemble(cfg.model, end.params, images, labels)
    assert summary["ensemble_val_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert summary["ensemble_val_loss"] == pytest.approx(loss, rel=1e-4)
    # Not the test set's ensemble, nor any member's figure on the split.
    t_acc, t_loss = _numpy_ensemble(
        cfg.model, end.params, tiny_dataset.test_images, tiny_dataset.test_labels
    )
    assert summary["ensemble_test_loss"] == pytest.approx(t_loss, rel=1e-4)
    assert summary["ensemble_test_accuracy"] == pytest.approx(t_acc, abs=1e-9)
    assert abs(summary["ensemble_val_loss"] - summary["ensemble_test_loss"]) > 1e-4
    assert summary["ensemble_val_loss"] not in summary["val_loss_per_seed"]
    # RunResult.ensemble keeps meaning the test set's.
    assert end.result.ensemble.loss == summary["ensemble_test_loss"]
    assert end.result.ensemble.count == len(tiny_dataset.test_labels)


def test_metrics_and_summary_carry_the_val_ensemble(val_run):
    _, path, summary, _, _ = val_run
    records = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for key in ("ensemble_val_accuracy", "ensemble_val_loss"):
        assert all(key in r for r in records)
        assert summary[key] == records[-1][key]
    assert records[0]["ensemble_val_loss"] != records[1]["ensemble_val_loss"]  # each epoch's
    assert json.loads((path / "summary.json").read_text()) == summary


def test_the_terminal_shows_the_val_ensemble(val_run):
    _, path, summary, _, out = val_run
    records = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    epoch_lines = [line for line in out.splitlines() if "(mean of 3)" in line]
    assert len(epoch_lines) == len(records) == 2
    for line, r in zip(epoch_lines, records, strict=True):
        ensemble = f"ensemble {r['ensemble_test_accuracy']:.2%}"
        assert line.endswith(f"{ensemble} (val {r['ensemble_val_accuracy']:.2%})"), line
    final = next(line for line in out.splitlines() if line.startswith("ensemble of 3"))
    assert final.endswith(
        f"; validation accuracy {summary['ensemble_val_accuracy']:.2%}, "
        f"loss {summary['ensemble_val_loss']:.4f}"
    )


def test_without_a_validation_split_there_is_no_val_ensemble(tiny_dataset):
    from test_seeds import small_cfg

    from jaxmnist.training import population
    from jaxmnist.training.loop import train_population

    cfg = small_cfg(seeds=2, epochs=1)
    result = train_population(cfg, population.seed_members(cfg), tiny_dataset)
    assert "ensemble_test_accuracy" in result.records[-1]
    assert not any(k.startswith("ensemble_val") for k in result.records[-1])
    assert set(result.population.ensemble_log_probs) == {"test"}


def test_tensorboard_and_the_accuracy_plot_show_the_val_ensemble(val_run, tmp_path):
    _, path, _, _, _ = val_run
    records = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    labels = [line.get_label() for line in plots.accuracy_curves(records).axes[0].lines]
    assert "validation, ensemble" in labels and "test, ensemble" in labels

    tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = EventWriter(tmp_path / "tb")
    for record in records:
        writer.write_epoch(record)
    writer.close()
    events = tb.EventAccumulator(str(tmp_path / "tb" / EVENTS_DIR))
    events.Reload()
    values = [e.value for e in events.Scalars("accuracy/ensemble_val")]
    assert values == pytest.approx([r["ensemble_val_accuracy"] for r in records])
    assert len(events.Scalars("loss/ensemble_val")) == len(records)
