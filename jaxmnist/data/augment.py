"""Data augmentation on the device: a pure function of a key and a uint8 batch.

`augment(key, images, cfg)` moves every image of a batch (B, H, W), or (B, H, W, C)
for images of several channels, by its own random offset
(zero-padding by `max_shift` pixels and cropping back to the original size, the usual
pad-and-random-crop), when `max_rotation` is set also turns it by a random angle, and
with `flip` mirrors a random half of them left-right (for clothes, never for digits).
It sees no labels, so it cannot disturb them; it keeps shape and dtype, so it slots into
the compiled epoch between the batch gather and the model; and it is deterministic in its
key, so a run stays reproducible from its seed while each key (each step, epoch and
member of a population) draws different offsets. With `cfg.augment` off it returns the
images unchanged, so a caller can always call it.

Translations alone are an exact integer crop (a gather, about a copy of the batch).
Rotations need interpolation: the whole move becomes one bilinear warp
(`jax.scipy.ndimage.map_coordinates`), rounded back to uint8. Every channel of an
image moves with it, by the same offset, angle and flip.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy import ndimage


def augment(key: jax.Array, images: jax.Array, cfg) -> jax.Array:
    """images: uint8 (B, H, W) or (B, H, W, C) -> the same shape, each image moved at random.

    cfg: DataConfig (`augment`, `max_shift` in pixels, `max_rotation` in degrees, `flip`).
    """
    if not cfg.augment:
        return images
    if cfg.flip:  # its own draw, so the moves are those of the same key without flips
        images = random_flip(jax.random.fold_in(key, FLIP_STREAM), images)
    if cfg.max_rotation != 0:
        return random_warp(key, images, cfg.max_shift, cfg.max_rotation)
    if cfg.max_shift != 0:
        return random_translate(key, images, cfg.max_shift)
    return images


FLIP_STREAM = 0x666C6970  # fold_in data for the flips' key ("flip"), far from split indices


def random_flip(key: jax.Array, images: jax.Array) -> jax.Array:
    """Each image of (B, H, W) or (B, H, W, C) mirrored left-right with probability 1/2."""
    mirror = jax.random.bernoulli(key, 0.5, (images.shape[0],) + (1,) * (images.ndim - 1))
    return jnp.where(mirror, images[:, :, ::-1], images)


def random_translate(key: jax.Array, images: jax.Array, max_shift: int) -> jax.Array:
    """Pad by `max_shift` zeros, crop each image back at its own random offset.

    images (B, H, W) or (B, H, W, C), any dtype -> same; offsets uniform in
    [-max_shift, max_shift]².
    """
    b, h, w, *c = images.shape
    s = max_shift
    padded = jnp.pad(images, ((0, 0), (s, s), (s, s), *((0, 0),) * len(c)))
    corners = jax.random.randint(key, (b, 2), 0, 2 * s + 1)

    def crop(image, corner):
        return lax.dynamic_slice(image, (corner[0], corner[1], *(0,) * len(c)), (h, w, *c))

    return jax.vmap(crop)(padded, corners)


def random_warp(
    key: jax.Array, images: jax.Array, max_shift: int, max_rotation: float
) -> jax.Array:
    """A random rotation about the centre (uniform in ±`max_rotation` degrees) and an
    integer shift (uniform in ±`max_shift`) per image, as one bilinear warp with zero
    fill. images uint8 (B, H, W) or (B, H, W, C) -> the same shape."""
    b, h, w = images.shape[:3]
    k_angle, k_shift = jax.random.split(key)
    limit = math.radians(max_rotation)
    angles = jax.random.uniform(k_angle, (b,), jnp.float32, -limit, limit)
    shifts = jax.random.randint(k_shift, (b, 2), -max_shift, max_shift + 1).astype(jnp.float32)
    rows, cols = jnp.meshgrid(jnp.arange(h, dtype=jnp.float32), jnp.arange(w, dtype=jnp.float32))
    rows, cols = rows.T, cols.T  # (H, W) grids of output coordinates
    cy, cx = (h - 1) / 2, (w - 1) / 2

    def warp(image, angle, shift):
        # Output pixel p samples the input at R(-angle) (p - centre - shift) + centre.
        y, x = rows - cy - shift[0], cols - cx - shift[1]
        cos, sin = jnp.cos(angle), jnp.sin(angle)
        src = [cos * y + sin * x + cy, -sin * y + cos * x + cx]

        def plane(p):
            return ndimage.map_coordinates(p.astype(jnp.float32), src, order=1, cval=0.0)

        # Several channels: each is warped by the same coordinates.
        return plane(image) if image.ndim == 2 else jax.vmap(plane, -1, -1)(image)

    out = jax.vmap(warp)(images, angles, shifts)
    return jnp.clip(jnp.round(out), 0, 255).astype(jnp.uint8)
