"""The TPU 101 tutorial's training script, reproduced as the baseline to beat.

Same recipe as jaxmnist's `tpu101` preset (MNIST, 784-256-10 ReLU, He init,
Adam 1e-3, batch 128, 5 epochs, last partial batch dropped, reshuffled every
epoch), written the way the tutorial writes it: the data normalised to float32
in host memory, a NumPy permutation per epoch, every batch sliced on the host
and copied to the device by a call to one jitted step, one sync per epoch, and
train and test accuracy computed over whole arrays after each epoch.

It reads the data through jaxmnist's loader so that both scripts pay the same
for finding and verifying files. Run alone it prints one line per epoch and a
JSON summary; `benchmarks/epoch_vs_tutorial.py` imports `TutorialLoop` and runs
this script as a whole program.

Usage: JAXMNIST_DATA_DIR=../shared/datasets python benchmarks/tutorial_tpu101.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

# Only the data loader: as a whole program this script is the baseline whose start-up
# and memory jaxmnist's are compared with.
from jaxmnist.cli import end_process
from jaxmnist.data import load_dataset

BATCH, EPOCHS, LR = 128, 5, 1e-3


def init_params(key):
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (784, 256)) * np.sqrt(2 / 784),
        "b1": jnp.zeros(256),
        "w2": jax.random.normal(k2, (256, 10)) * np.sqrt(2 / 256),
        "b2": jnp.zeros(10),
    }


def forward(params, x):
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def loss_fn(params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(forward(params, x), y).mean()


class TutorialLoop:
    """The tutorial's loop: `epoch()` trains one epoch the tutorial's way."""

    def __init__(self, train_images: np.ndarray, train_labels: np.ndarray, seed: int = 0):
        self.x = train_images.reshape(len(train_images), -1).astype(np.float32) / 255.0
        self.y = train_labels.astype(np.int32)
        self.rng = np.random.default_rng(seed)
        self.optimizer = optax.adam(LR)
        self.params = init_params(jax.random.key(seed))
        self.opt_state = self.optimizer.init(self.params)

        @jax.jit
        def train_step(params, opt_state, x, y):
            loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        self.train_step = train_step

    def epoch(self) -> float:
        """One epoch; returns the mean training loss (the epoch's one sync)."""
        perm = self.rng.permutation(len(self.y))
        losses = []
        for i in range(len(self.y) // BATCH):
            idx = perm[i * BATCH : (i + 1) * BATCH]
            self.params, self.opt_state, loss = self.train_step(
                self.params, self.opt_state, self.x[idx], self.y[idx]
            )
            losses.append(loss)
        return float(jnp.mean(jnp.stack(losses)))


@jax.jit
def accuracy(params, x, y):
    return jnp.mean(jnp.argmax(forward(params, x), -1) == y)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--smoke", action="store_true", help="one epoch of tiny random data: checks that it runs"
    )
    args = p.parse_args(argv)
    start = time.perf_counter()
    if args.smoke:
        rng, epochs = np.random.default_rng(0), 1
        train_images, test_images = (rng.integers(0, 256, (n, 28, 28), np.uint8) for n in (512, 64))
        train_labels, test_labels = (rng.integers(0, 10, n).astype(np.uint8) for n in (512, 64))
    else:
        ds, epochs = load_dataset("mnist", download=False), EPOCHS
        train_images, train_labels = ds.train_images, ds.train_labels
        test_images, test_labels = ds.test_images, ds.test_labels
    loop = TutorialLoop(train_images, train_labels)
    x_test = test_images.reshape(-1, 784).astype(np.float32) / 255.0
    y_test = test_labels.astype(np.int32)
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        loss = loop.epoch()
        seconds = time.perf_counter() - t0
        train_acc = float(accuracy(loop.params, loop.x, loop.y))
        test_acc = float(accuracy(loop.params, x_test, y_test))
        print(
            f"epoch {epoch}: loss {loss:.4f} train acc {train_acc:.4f} test acc {test_acc:.4f} "
            f"({seconds:.2f} s)",
            file=sys.stderr,
        )
    print(json.dumps({"test_accuracy": test_acc, "wall_seconds": time.perf_counter() - start}))


if __name__ == "__main__":
    main()
    # Ends as `jaxmnist train` ends, so that the two programs' wall times count the same work.
    end_process(0)
