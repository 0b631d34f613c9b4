"""`rng.flat` draws what `jax.random` draws for the shape itself, bit for bit: the models'
initialisation, dropout and augmentation keep their values while compiling faster."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import rng

# (sampler, keyword arguments) as the package calls them; shapes with a short last axis,
# several axes, and none. The second way of numbering a draw's elements
# (`jax_threefry_partitionable` off, not JAX's default) is checked for one sampler.
DRAWS = [
    (jax.random.normal, {"dtype": jnp.float32}),
    (jax.random.bernoulli, {"p": 0.7}),
    (jax.random.randint, {"minval": -2, "maxval": 3}),
    (jax.random.uniform, {"minval": -1.0, "maxval": 2.0}),
]
SHAPES = [(16, 10), (3, 3, 1, 16), (7, 2), (2, 5, 5, 1), ()]


CASES = [(*d, True) for d in DRAWS] + [(*DRAWS[0], False)]


@pytest.mark.parametrize(
    "draw, kwargs, partitionable", CASES, ids=[f"{d.__name__}-{p}" for d, _, p in CASES]
)
def test_a_flat_draw_reshaped_is_the_draw_of_the_shape(draw, kwargs, partitionable):
    key = jax.random.key(7)
    with jax.threefry_partitionable(partitionable):
        want = jax.jit(lambda k: [draw(k, shape=s, **kwargs) for s in SHAPES])(key)
        got = jax.jit(lambda k: [rng.flat(draw, k, s, **kwargs) for s in SHAPES])(key)
    for shape, a, b in zip(SHAPES, got, want, strict=True):
        assert a.shape == b.shape == shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b, err_msg=f"{draw.__name__} {shape}")


def test_vmapped_over_keys_as_members_draw_it():
    keys = jax.random.split(jax.random.key(1), 3)
    want = jax.vmap(lambda k: jax.random.normal(k, (128, 10)))(keys)
    got = jax.vmap(lambda k: rng.flat(jax.random.normal, k, (128, 10)))(keys)
    np.testing.assert_array_equal(got, want)
