"""A checkpoint written on 4 devices resumes on 1: Orbax restores onto the new mesh.

Runs with 8 fake CPU devices (see conftest.py). The first run stops after epoch 2
as if SIGTERM had come (the stop rule is forced), then continues on one device;
its result equals the same run left alone on 4 devices to float tolerance (the
sums of a 4-member program are split differently on one device).
"""

import signal

import numpy as np

from jaxmnist import checkpoint
from jaxmnist.cli import main
from jaxmnist.preemption import StopRequest


def stop_after_epoch_2(self, end, train_seconds):
    if end.epoch == 2:
        self.signum = signal.SIGTERM
    return self.requested


def test_four_devices_resume_on_one(train_argv, tmp_path, monkeypatch):
    args = ("--seeds", "4", "--epochs", "4", "--quiet", "--no-report")
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as m:
        m.setattr(StopRequest, "__call__", stop_after_epoch_2)
        assert main(train_argv(stopped, *args, "--devices", "4")) == 143
    assert checkpoint.checkpoint_steps(stopped) == [20, 40]
    assert (
        main(["train", "--resume", str(stopped), "--devices", "1", "--quiet", "--no-report"]) == 0
    )
    alone = tmp_path / "alone"
    assert main(train_argv(alone, *args, "--devices", "4")) == 0
    with np.load(stopped / "params.npz") as a, np.load(alone / "params.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            assert a[k].shape[0] == 4
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-6)
