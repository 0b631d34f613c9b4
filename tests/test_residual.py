"""Residual blocks (`model.residual`): a conv block whose convolution keeps its input's
shape adds that input to its output (after batch norm, before the bias and the
activation); blocks that change the channels stay plain. A config with no such block is
refused in one line.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn

# conv 4, conv 4 (shortcut), pool; conv 8 (channels change: plain), conv 8 (shortcut), pool
CFG = cnn.CNNConfig(channels=(4, 4, 8, 8), pool=(0, 1, 0, 1), hidden=(16,), residual=True)


@pytest.fixture(scope="module")
def images():
    return jax.random.uniform(jax.random.key(1), (8, 28, 28))


def _pool(x):
    return x.reshape(x.shape[0], x.shape[1] // 2, 2, x.shape[2] // 2, 2, -1).max((2, 4))


@pytest.mark.parametrize("batch_norm", [False, True])
def test_blocks_that_keep_their_shape_add_their_input(images, batch_norm):
    cfg = dataclasses.replace(CFG, batch_norm=batch_norm)
    params = cnn.init(jax.random.key(0), cfg)
    if batch_norm:  # running statistics other than the initial ones
        stats = [{"mean": jnp.full_like(s["mean"], 0.1), "var": jnp.full_like(s["var"], 2.0)}
                 for s in params["stats"]]  # fmt: skip
        params = {**params, "stats": stats}
    x = images[..., None]
    for i, layer in enumerate(params["conv"]):
        y = cnn.conv.conv2d(x, layer["w"], "xla")
        if batch_norm:
            y = (y - 0.1) / jnp.sqrt(2.0 + cnn.BN_EPSILON) * layer["scale"]
        if i in (1, 3):  # the blocks whose convolution keeps the shape
            y = y + x
        x = jax.nn.relu(y + layer["b"])
        if i in (1, 3):
            x = _pool(x)
    x = jax.nn.relu(x.reshape(8, -1) @ params["dense"][0]["w"] + params["dense"][0]["b"])
    want = x @ params["dense"][1]["w"] + params["dense"][1]["b"]
    np.testing.assert_allclose(cnn.apply(params, images, cfg), want, rtol=1e-4, atol=1e-4)
    plain = cnn.apply(params, images, dataclasses.replace(cfg, residual=False))
    assert not np.allclose(plain, want, atol=1e-3)  # the shortcuts change the network


def test_the_network_says_so_and_a_config_without_such_a_block_is_refused():
    assert cnn.describe(CFG).endswith(", residual")
    cnn.validate(CFG)
    for bad in (
        dataclasses.replace(CFG, channels=(4, 8), pool=(1,)),  # every block changes channels
        dataclasses.replace(CFG, padding="valid"),  # every block shrinks its map
    ):
        with pytest.raises(ConfigError, match="^model.residual: no conv block keeps"):
            cnn.validate(bad)
