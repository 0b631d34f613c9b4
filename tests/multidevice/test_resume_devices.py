"""A checkpoint written on 4 devices resumes on 1: Orbax restores onto the new mesh.

Runs with 8 fake CPU devices (see conftest.py). The first run stops inside
epoch 2 as if SIGTERM had come (calls end every 7 steps of the 20 an epoch has:
after steps 1, 7, 14, 20, 21 and 28; the stop is asked for at the sixth), then
continues on one device from step 28, its epoch accumulators restored onto the
new mesh too; its result equals the same run left alone on 4 devices to float
tolerance (the sums of a 4-member program are split differently on one device).
"""

import numpy as np
import pytest

from jaxmnist.cli import main
from jaxmnist.runs import checkpoint
from jaxmnist.training.preemption import StopRequest


def stop_at_poll(n: int) -> property:
    """`StopRequest.requested`, true from the loop's n-th question on."""
    polls = []

    def requested(self) -> bool:
        polls.append(1)
        return len(polls) >= n

    return property(requested)


@pytest.mark.slow
def test_four_devices_resume_on_one(train_argv, tmp_path, monkeypatch, paced_by_steps):
    args = ("--seeds", "4", "--epochs", "4", "--quiet", "--no-report")
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as m:
        m.setattr(StopRequest, "requested", stop_at_poll(6))
        argv = train_argv(stopped, *args, "--devices", "4", "train.progress_every=7")
        assert main(argv) == 143
    assert checkpoint.checkpoint_steps(stopped) == [20, 28]
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
