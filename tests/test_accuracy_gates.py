"""Real-data accuracy gates: the reference recipes reach their known accuracy.

These train on the real MNIST and Fashion-MNIST, found wherever jaxmnist looks
for data ($JAXMNIST_DATA_DIR, the user cache, the system folder) without
downloading; they are skipped, with the reason, only when no copy is found.
"""

import pytest

from jaxmnist import config as config_lib
from jaxmnist.data import load_dataset
from jaxmnist.errors import DataError
from jaxmnist.train import train_and_evaluate


def real_dataset(name):
    try:
        return load_dataset(name, download=False)
    except DataError as e:
        pytest.skip(f"no real {name} data found (set JAXMNIST_DATA_DIR): {e}")


@pytest.mark.realdata
def test_tpu101_reaches_97_3_percent_on_mnist(tmp_path):
    summary = train_and_evaluate(
        config_lib.get_preset("tpu101"), tmp_path, dataset=real_dataset("mnist")
    )
    assert summary["num_test_examples"] == 10_000 and summary["steps"] == 5 * 468
    assert summary["test_accuracy"] >= 0.973, summary["test_accuracy"]


@pytest.mark.realdata
def test_tpu101_first_epoch_loss_matches_the_tutorial(tmp_path):
    """The tutorial's known first-epoch mean training loss is about 0.309."""
    import dataclasses
    import json

    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, epochs=1, eval_train=False))
    train_and_evaluate(cfg, tmp_path, dataset=real_dataset("mnist"))
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["train_loss"] == pytest.approx(0.309, abs=0.01)


@pytest.mark.realdata
def test_codelab_reaches_86_5_percent_on_fashion_mnist(tmp_path):
    summary = train_and_evaluate(
        config_lib.get_preset("codelab"), tmp_path, dataset=real_dataset("fashion_mnist")
    )
    assert summary["num_test_examples"] == 10_000 and summary["steps"] == 400
    assert summary["test_accuracy"] >= 0.865, summary["test_accuracy"]


@pytest.mark.realdata
@pytest.mark.slow
def test_the_speedrun_cnn_reaches_98_5_percent_in_one_epoch(tmp_path):
    """The CNN path end to end on real data (im2col convolutions and their written-out
    backward pass, augmentation inside the compiled epoch, one-cycle Adam): the speedrun
    preset's one epoch."""
    cfg = config_lib.get_preset("speedrun")
    cfg = config_lib.apply_overrides(
        cfg, {"train.target_accuracy": None, "train.eval_train": False}
    )
    summary = train_and_evaluate(cfg, tmp_path, dataset=real_dataset("mnist"))
    assert summary["steps"] == 234 and summary["num_test_examples"] == 10_000
    assert summary["test_accuracy"] >= 0.985, summary["test_accuracy"]
