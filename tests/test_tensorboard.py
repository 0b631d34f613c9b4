"""TensorBoard events: written by a tiny run, read back with TensorBoard's own reader."""

import dataclasses
import json

import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.cli import main
from jaxmnist.report.tensorboard import EPOCH_SCALARS, EVENTS_DIR, EventWriter
from jaxmnist.train import train_and_evaluate

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (its event reader) is in the [test] extra",
)


def read_events(run_dir):
    acc = event_accumulator.EventAccumulator(
        str(run_dir / EVENTS_DIR), size_guidance={"images": 0, "scalars": 0}
    )
    acc.Reload()
    return acc


def test_events_hold_every_tag_at_the_right_steps(tiny_dataset, tmp_path):
    cfg = config_lib.get_preset("tpu101")
    cfg = dataclasses.replace(
        cfg,
        compile_cache=False,
        tensorboard=True,
        train=dataclasses.replace(cfg.train, batch_size=64, steps=25, eval_batch_size=64),
    )
    run = tmp_path / "run"
    train_and_evaluate(cfg, run, dataset=tiny_dataset)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [10, 20, 25]  # the last epoch is partial

    acc = read_events(run)
    tags = acc.Tags()
    assert set(EPOCH_SCALARS) | {"loss/train_step"} <= set(tags["scalars"])
    assert {"confusion_matrix", "predictions"} <= set(tags["images"])
    for tag, key in EPOCH_SCALARS.items():
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [r["step"] for r in records], tag
        assert [e.value for e in events] == pytest.approx([r[key] for r in records], rel=1e-6), tag
    assert [e.step for e in acc.Scalars("loss/train_step")] == list(range(1, 26))
    for tag in ("confusion_matrix", "predictions"):
        (image,) = acc.Images(tag)
        assert image.step == 25 and image.width > 200 and image.height > 200
        assert image.encoded_image_string.startswith(b"\x89PNG")


def test_cli_flag_writes_events(train_argv, tmp_path, capsys):
    run = tmp_path / "run"
    argv = train_argv(
        run, "--batch-size", "64", "--steps", "5", "--no-report", "--quiet", "--tensorboard"
    )
    assert main(argv) == 0
    assert json.loads((run / "config.json").read_text())["tensorboard"] is True
    assert [e.step for e in read_events(run).Scalars("loss/test")] == [5]
    assert not (run / "report.html").exists()  # --no-report
    capsys.readouterr()


def test_rerun_replaces_old_events(tmp_path):
    for steps in (12, 5):  # the same run directory twice
        writer = EventWriter(tmp_path)
        writer.write_epoch({"epoch": 1, "step": steps, "test_loss": 0.5}, np.ones(steps))
        writer.close()
    assert len(list((tmp_path / EVENTS_DIR).glob("events.out.tfevents.*"))) == 1
    acc = read_events(tmp_path)
    assert [e.step for e in acc.Scalars("loss/test")] == [5]
    assert [e.step for e in acc.Scalars("loss/train_step")] == [1, 2, 3, 4, 5]
