"""The epoch's shuffle (`training.shuffle`) is `jax.random.permutation`, bit for bit, drawn
from one-operand sorts on the CPU."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from jaxmnist.training import shuffle


def sorts(fn, *args) -> list[int]:
    """The operand count of every sort in `fn`'s jaxpr, nested calls included."""

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name == "sort":
                yield len(e.invars)
            for inner in jaxprs_in_params(e.params):
                yield from walk(inner)

    return list(walk(jax.make_jaxpr(fn)(*args).jaxpr))


@pytest.mark.parametrize("n", [1, 2, 3, 257, 4096, 65536, 65537, 2**20 + 1])
@pytest.mark.parametrize("spread", ["full", "ties"])
def test_stable_argsort_is_numpys_stable_argsort(n, spread):
    rng = np.random.default_rng(n)
    # "ties": keys from a handful of values that differ in both halves of their bits, so
    # that every radix pass and the order among equal keys are exercised.
    if spread == "full":
        keys = rng.integers(0, 2**32, n, dtype=np.uint32)
    else:
        keys = rng.choice(np.array([0, 1, 2**16, 2**16 + 1, 2**32 - 1], np.uint32), n)
    got = np.asarray(jax.jit(shuffle.stable_argsort)(jnp.asarray(keys)))
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.argsort(keys, kind="stable"))


def test_stable_argsort_sorts_each_row_of_a_batch():
    keys = np.random.default_rng(0).integers(0, 50, (3, 2, 1000), dtype=np.uint32)
    got = np.asarray(shuffle.stable_argsort(jnp.asarray(keys)))
    np.testing.assert_array_equal(got, np.argsort(keys, axis=-1, kind="stable"))


def test_stable_argsort_refuses_more_keys_than_its_positions_can_number():
    too_many = jax.ShapeDtypeStruct((shuffle.MAX_RADIX_ELEMENTS + 1,), jnp.uint32)
    with pytest.raises(ValueError, match="at most"):
        jax.eval_shape(shuffle.stable_argsort, too_many)


@pytest.mark.parametrize("n", [0, 1, 2, 10, 1000, 50000, 60000, 65536, 65537, 100000])
def test_permutation_is_the_librarys_bit_for_bit(n):
    # Typed and raw (uint32 pair) keys, as the run loop passes either; 60,000 elements
    # draw a collision among a round's 60,000 random keys for about one key in three, so
    # the seeds here include orders decided by the sort's stability.
    for seed in range(12):
        for key in (jax.random.key(seed), jax.random.PRNGKey(seed)):
            want = jax.random.permutation(key, n)
            got = jax.jit(shuffle.permutation, static_argnums=1)(key, n)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_with_64_bit_integers_on_it_keeps_the_librarys_dtype():
    with jax.enable_x64(True):
        key = jax.random.key(3)
        want = jax.random.permutation(key, 1000)
        got = shuffle.permutation(key, 1000)
    assert want.dtype == np.int64 and got.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_permutation_is_the_librarys_under_vmap():
    keys = jax.random.split(jax.random.key(7), 5)
    want = jax.vmap(lambda k: jax.random.permutation(k, 60000))(keys)
    got = jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 60000)))(keys)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("n", [2, 1000, 60000, 2**24])
def test_rounds_is_the_librarys_count_of_sorts(n):
    library = sorts(lambda k: jax.random.permutation(k, n), jax.random.key(0))
    assert len(library) == shuffle.rounds(n)


def test_on_the_cpu_every_sort_is_of_one_operand():
    counts = sorts(lambda k: shuffle.permutation(k, 60000), jax.random.key(0))
    assert counts and set(counts) == {1}
    assert set(sorts(lambda k: jax.random.permutation(k, 60000), jax.random.key(0))) == {2}


def test_elsewhere_and_past_its_size_it_is_the_library():
    key = jax.random.key(0)
    with mock.patch.object(jax, "default_backend", return_value="gpu"):
        assert set(sorts(lambda k: shuffle.permutation(k, 60000), key)) == {2}
    large = shuffle.MAX_RADIX_ELEMENTS + 1
    assert set(sorts(lambda k: shuffle.permutation(k, large), key)) == {2}
