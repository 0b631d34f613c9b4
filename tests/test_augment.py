"""Augmentation: a pure function of (key, uint8 images) that keeps shape, dtype and labels."""

import dataclasses
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxmnist import config as config_lib
from jaxmnist.data import augment as augment_lib
from jaxmnist.errors import ConfigError

ON = config_lib.DataConfig(augment=True, max_shift=2)
ROTATE = dataclasses.replace(ON, max_rotation=15.0)
augment = jax.jit(augment_lib.augment, static_argnums=2)


@pytest.fixture(scope="module")
def images():
    """Eight bright, distinct blobs well inside a zero border wider than any shift."""
    rng = np.random.default_rng(0)
    out = np.zeros((8, 28, 28), np.uint8)
    out[:, 6:22, 6:22] = rng.integers(1, 256, (8, 16, 16))
    return jnp.asarray(out)


def _shifted(image: np.ndarray, dy: int, dx: int) -> np.ndarray:
    return np.roll(image, (dy, dx), axis=(0, 1))  # exact here: the border is zeros


@pytest.mark.parametrize("cfg", [ON, ROTATE], ids=["translate", "rotate"])
def test_shape_dtype_kept_same_key_same_result_new_key_new_result(images, cfg):
    a = augment(jax.random.key(1), images, cfg)
    assert a.shape == images.shape and a.dtype == jnp.uint8
    np.testing.assert_array_equal(a, augment(jax.random.key(1), images, cfg))
    b = augment(jax.random.key(2), images, cfg)
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, images)


def test_each_image_is_its_own_integer_translation_within_max_shift(images):
    out = np.asarray(augment(jax.random.key(3), images, ON))
    src = np.asarray(images)
    offsets = []
    for i in range(len(src)):
        found = [
            (dy, dx)
            for dy in range(-2, 3)
            for dx in range(-2, 3)
            if np.array_equal(out[i], _shifted(src[i], dy, dx))
        ]
        assert len(found) == 1, f"image {i} is not a translation within 2 pixels"
        offsets += found
    assert len(set(offsets)) > 1  # drawn per image, not once per batch


def test_off_or_zero_moves_is_the_identity(images):
    for cfg in [
        dataclasses.replace(ON, augment=False),
        dataclasses.replace(ON, max_shift=0),
        dataclasses.replace(ROTATE, augment=False),
    ]:
        np.testing.assert_array_equal(augment(jax.random.key(4), images, cfg), images)


def test_flip_mirrors_a_random_half_and_leaves_the_moves_as_they_were(images):
    flip_only = dataclasses.replace(ON, max_shift=0, flip=True)
    out, src = np.asarray(augment(jax.random.key(7), images, flip_only)), np.asarray(images)
    mirrored = [np.array_equal(o, s[:, ::-1]) for o, s in zip(out, src, strict=True)]
    kept = [np.array_equal(o, s) for o, s in zip(out, src, strict=True)]
    assert all(m != k for m, k in zip(mirrored, kept, strict=True))  # each one or the other
    assert 0 < sum(mirrored) < len(src)  # drawn per image
    both = np.asarray(augment(jax.random.key(7), images, dataclasses.replace(ON, flip=True)))
    moved = np.asarray(augment(jax.random.key(7), jnp.asarray(out), ON))
    np.testing.assert_array_equal(both, moved)  # the flips, then the same key's moves


def test_a_tiny_rotation_is_an_integer_translation(images):
    # With the angle ~0 the bilinear warp samples on the pixel grid: it must reduce to
    # the same crops as the translation, which pins its coordinate arithmetic.
    cfg = dataclasses.replace(ON, max_shift=1, max_rotation=1e-6)
    out, src = np.asarray(augment(jax.random.key(5), images, cfg)), np.asarray(images)
    for i in range(len(src)):
        assert any(
            np.array_equal(out[i], _shifted(src[i], dy, dx))
            for dy in (-1, 0, 1)
            for dx in (-1, 0, 1)
        ), f"image {i}"


def test_rotation_keeps_the_ink_roughly(images):
    out = np.asarray(augment(jax.random.key(6), images, ROTATE), np.float64)
    src = np.asarray(images, np.float64)
    ratio = out.sum(axis=(1, 2)) / src.sum(axis=(1, 2))
    assert np.all((ratio > 0.9) & (ratio < 1.1)), ratio


@pytest.mark.parametrize(
    "cfg",
    [ON, ROTATE, dataclasses.replace(ROTATE, flip=True), dataclasses.replace(ON, flip=True)],
    ids=["translate", "rotate", "rotate-flip", "translate-flip"],
)
def test_colour_images_move_every_channel_as_one(images, cfg):
    """(B, H, W, C): each channel gets exactly the moves its image's key draws for a
    one-channel batch, so the channels stay aligned."""
    rgb = jnp.stack([images, 255 - images, images // 2], axis=-1)  # (8, 28, 28, 3)
    out = np.asarray(augment(jax.random.key(8), rgb, cfg))
    assert out.shape == rgb.shape and out.dtype == np.uint8
    for c in range(3):
        alone = augment(jax.random.key(8), rgb[..., c], cfg)
        np.testing.assert_array_equal(out[..., c], alone)
    assert not np.array_equal(out, rgb)


def test_it_never_sees_labels():
    assert list(inspect.signature(augment_lib.augment).parameters) == ["key", "images", "cfg"]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("max_shift", "-1", "data.max_shift must be >= 0"),
        ("max_rotation", "200", r"data.max_rotation: degrees in \[0, 180\]"),
        ("max_rotation", "nan", "data.max_rotation"),
    ],
)
def test_bad_augment_fields_are_config_errors(field, value, message):
    cfg = config_lib.apply_overrides(config_lib.Config(), {f"data.{field}": value})
    with pytest.raises(ConfigError, match=message):
        config_lib.validate(cfg)
