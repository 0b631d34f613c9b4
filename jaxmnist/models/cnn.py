"""The convolutional network: conv blocks, then dense layers.

Each block is a stride-1 convolution with k×k kernels (`kernel_size`: one size for every
block, or one per block; `padding` "same" keeps the map's size, "valid" shrinks it by
k - 1), `channels[i]` output channels, a bias, the activation, and 2×2 max-pooling
(`pool`: 1 for every block, or a flag per block; a block without it keeps its map's size,
so that several convolutions can come between two pools, as in VGG networks); the
last block's maps are flattened and go through dense layers of sizes `hidden` and a linear
classifier. The reference CNN is `channels=(16, 32), kernel_size=3, hidden=(128,)`: conv
3×3 1→16, ReLU, pool; conv 3×3 16→32, ReLU, pool; dense 1568→128, ReLU; dense 128→10
(206,922 parameters). ReLU commutes with max-pooling (as does adding a per-channel bias),
so with ReLU the block pools first and adds and rectifies a quarter of the values; GELU,
which is not monotonic, is applied before pooling.

Parameters are `{"conv": [{"w": (k, k, C_in, C_out), "b": (C_out,)}, ...], "dense":
[{"w": (fan_in, fan_out), "b": (fan_out,)}, ...]}`, float32, He-normal weights (std =
sqrt(2 / fan_in), fan_in = k²·C_in for a kernel) and zero biases. The compute dtype scheme
is the MLP's: images and weights are cast to `dtype`, the logits come back float32.
In training (`train=True`), with `dropout` set, the input of every dense layer (the
flattened feature maps, then each hidden layer's activations) goes through dropout.

With `residual`, a block whose convolution keeps its input's shape (as many channels in
as out, "same" padding) adds its input to the convolution's output (after batch norm
where there is one) before the bias and the activation: an identity shortcut, as in
ResNets, so that the second convolution of each VGG stage learns a correction to the
first's maps. Blocks that change the channels stay plain.

With `batch_norm`, each convolution is followed by batch normalisation (before the
activation): its bias becomes the normalisation's shift and each conv layer gains a
`"scale"` (ones); the running statistics live in the params too, as `params["stats"] =
[{"mean", "var"} per conv layer]`, so evaluation, prediction, export, checkpoints and
populations carry them without knowing. They are not trained: the forward pass in training
normalises by the batch and never reads them, so their gradient is zero, and the step
writes the moved statistics `apply` returns over whatever the optimizer did to them.
`count_params` leaves them out (as Keras' "non-trainable" count does). On a mesh the
batch's statistics are those of the whole global batch (the compiler all-reduces them).

Pure functions rather than Flax: `init`/`apply` over a pytree is all a module system
would give these models, and plain functions vmap over a population of models and shard
without any adapter; it keeps one dependency out; and the convolution's formulation,
which decides CPU speed, is ours to choose per backend (`jaxmnist.models.conv`,
`model.conv_impl`). Keeping the running statistics in the params pytree (rather than a
separate collection, as Flax does) leaves every caller but the training step unchanged.

Its config, `CNNConfig`, lives in `cnn_config` (no jax there, for the command line's
start-up); `MODEL` is the family's registry entry (`jaxmnist.models`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from jaxmnist import rng
from jaxmnist.errors import ConfigError
from jaxmnist.models import Model, conv, onednn
from jaxmnist.models.cnn_config import CNNConfig
from jaxmnist.models.layers import ACTIVATIONS, STATS, dropout, matmul


def _given(value) -> tuple[int, ...]:
    """A per-block field (`kernel_size`, `pool`) as a tuple (a plain int from Python code
    counts as one value)."""
    return (value,) if isinstance(value, int) else tuple(value)


def _per_block(value, cfg) -> tuple[int, ...]:
    """One value per conv block: a per-block field as given, or its one value repeated."""
    given = _given(value)
    return given * len(cfg.channels) if len(given) == 1 else given


def kernel_sizes(cfg) -> tuple[int, ...]:
    """One kernel size per conv block: `kernel_size` as given, or its one value repeated."""
    return _per_block(cfg.kernel_size, cfg)


def pools(cfg) -> tuple[bool, ...]:
    """One flag per conv block: whether 2×2 max-pooling ends it (`pool` as given, or its one
    value repeated)."""
    return tuple(bool(p) for p in _per_block(cfg.pool, cfg))


def _in_channels(input_shape) -> int:
    """The images' channels: input_shape is (H, W) for one, (H, W, C) for C."""
    return input_shape[2] if len(input_shape) == 3 else 1


def _map_sizes(cfg, input_shape) -> list[tuple[int, int]]:
    """(H, W) of each block's convolution output, then of the last block's output."""
    h, w = input_shape[:2]
    sizes = []
    for k, pooled in zip(kernel_sizes(cfg), pools(cfg), strict=True):
        if cfg.padding == "valid":
            h, w = h - k + 1, w - k + 1
        sizes.append((h, w))
        if pooled:
            h, w = max(h, 0) // 2, max(w, 0) // 2
    return [*sizes, (h, w)]


def _feature_shape(cfg, input_shape) -> tuple[int, int, int]:
    """(H, W, C) after the conv blocks; each pool halves H and W (floor)."""
    h, w = _map_sizes(cfg, input_shape)[-1]
    return h, w, cfg.channels[-1]


def init(key, cfg, input_shape=(28, 28), num_classes=10) -> dict:
    """He-normal weights, zero biases. cfg: a CNNConfig (`channels`, `kernel_size`,
    `hidden`). Raises ConfigError when the images are too small for the number of blocks."""
    h, w, c = _feature_shape(cfg, input_shape)
    if h <= 0 or w <= 0:
        raise ConfigError(
            f"model.channels: {len(cfg.channels)} conv blocks shrink {input_shape[0]}x"
            f"{input_shape[1]} images to nothing; use fewer blocks or smaller kernels"
        )
    convs = list(itertools.pairwise((_in_channels(input_shape), *cfg.channels)))
    dense = [h * w * c, *cfg.hidden, num_classes]
    keys = iter(jax.random.split(key, len(convs) + len(dense) - 1))

    def he(shape, fan_in):
        w = rng.flat(jax.random.normal, next(keys), shape, dtype=jnp.float32)
        return w * math.sqrt(2.0 / fan_in)

    params = {
        "conv": [
            {"w": he((k, k, cin, cout), k * k * cin), "b": jnp.zeros((cout,), jnp.float32)}
            for k, (cin, cout) in zip(kernel_sizes(cfg), convs, strict=True)
        ],
        "dense": [
            {"w": he((fan_in, fan_out), fan_in), "b": jnp.zeros((fan_out,), jnp.float32)}
            for fan_in, fan_out in itertools.pairwise(dense)
        ],
    }
    if cfg.batch_norm:  # the bias is the normalisation's shift; it gains a scale
        for layer, (_, cout) in zip(params["conv"], convs, strict=True):
            layer["scale"] = jnp.ones((cout,), jnp.float32)
        params[STATS] = [
            {"mean": jnp.zeros((cout,), jnp.float32), "var": jnp.ones((cout,), jnp.float32)}
            for _, cout in convs
        ]
    return params


# Activations that never decrease: max-pooling commutes with them.
MONOTONIC = frozenset({"relu"})

BN_MOMENTUM = 0.9  # running = 0.9 running + 0.1 batch, each training step (PyTorch's 0.1)
BN_EPSILON = 1e-5


def _batch_norm(x, layer, stats, train: bool):
    """x (B, H, W, C) normalised per channel, then scaled and shifted; statistics in float32.

    Training normalises by the batch's mean and (biased) variance and returns the running
    statistics moved towards them; inference uses the running statistics. Returns (y, new
    stats) in training, (y, None) otherwise."""
    x32 = x.astype(jnp.float32)
    if not train:
        r = lax.rsqrt(stats["var"] + BN_EPSILON)
        y = (x32 - stats["mean"]) * (r * layer["scale"]) + layer["b"]
        return y.astype(x.dtype), None
    y, mean, var = _normalise(x32, layer["scale"], layer["b"])
    new = {
        k: BN_MOMENTUM * stats[k] + (1 - BN_MOMENTUM) * lax.stop_gradient(v)
        for k, v in (("mean", mean), ("var", var))
    }
    return y.astype(x.dtype), new


def _moments(x):
    axes = tuple(range(x.ndim - 1))
    mean = x.mean(axis=axes)
    return mean, jnp.square(x - mean).mean(axis=axes)


@jax.custom_vjp
def _normalise(x, scale, shift):
    """(x - mean) / sqrt(var + eps) * scale + shift by the batch's own per-channel moments;
    returns (y, mean, var). Its VJP is written out (the textbook batch-norm gradient: two
    reductions and one elementwise pass) because XLA's CPU code for the differentiated
    mean and variance was slower (docs/results.md; benchmarks/batch_norm_cost.py)."""
    return _normalise_fwd(x, scale, shift)[0]


def _normalise_fwd(x, scale, shift):
    mean, var = _moments(x)
    r = lax.rsqrt(var + BN_EPSILON)
    return ((x - mean) * (r * scale) + shift, mean, var), (x, mean, r, scale)


def _normalise_bwd(res, cotangents):
    x, mean, r, scale = res
    dy = cotangents[0]  # mean and var leave only through stop_gradient: no cotangent
    axes = tuple(range(x.ndim - 1))
    n = x.size // x.shape[-1]
    xhat = (x - mean) * r
    dshift = dy.sum(axis=axes)
    dscale = (dy * xhat).sum(axis=axes)
    dx = (r * scale) * (dy - dshift / n - xhat * (dscale / n))
    return dx, dscale, dshift


_normalise.defvjp(_normalise_fwd, _normalise_bwd)


def _formulation(cfg, dtype, channels: int, kernel: int, width: int) -> str:
    """The convolution's formulation for one block: `cfg.conv_impl` as `conv.resolve`
    reads it for inputs of `channels` channels, `width` wide, and `kernel`×`kernel`."""
    return conv.resolve(
        cfg.conv_impl, dtype=dtype, in_channels=channels, kernel=kernel, width=width,
        padding=cfg.padding,
    )  # fmt: skip


def apply(params: dict, images: jax.Array, cfg, key: jax.Array | None = None, train=False):
    """images: float (B, H, W), or (B, H, W, C), in [0, 1] -> float32 logits (B, num_classes).

    `train=True` is the training step's forward pass: dropout with `key` (when
    `cfg.dropout`) and batch normalisation by the batch's statistics (when
    `cfg.batch_norm`); it returns `(logits, new running statistics or None)`. Inference
    (the default) uses the running statistics, drops nothing, and returns the logits."""
    if images.ndim not in (3, 4):
        raise ValueError(f"cnn.apply takes images (B, H, W) or (B, H, W, C), got {images.shape}")
    dtype = jnp.dtype(cfg.dtype)
    activation = ACTIVATIONS[cfg.activation]
    impl = conv.resolve(cfg.conv_impl, dtype=dtype)
    x = (images[..., None] if images.ndim == 3 else images).astype(dtype)  # NHWC
    new_stats = []
    pool_first = cfg.activation in MONOTONIC
    for i, (layer, pooled) in enumerate(zip(params["conv"], pools(cfg), strict=True)):
        w, b = layer["w"].astype(dtype), layer["b"].astype(dtype)
        block_input = x
        formulation = _formulation(cfg, dtype, x.shape[-1], w.shape[0], x.shape[2])
        x = conv.conv2d(x, w, formulation, cfg.padding)
        if cfg.batch_norm:  # statistics of the whole map, before pooling
            x, stats = _batch_norm(x, layer, params[STATS][i], train)
            new_stats.append(stats)
        # After batch norm, before the bias and the activation; a block that changes the
        # channels (or the size) has no shortcut.
        if cfg.residual and block_input.shape == x.shape:
            x = x + block_input
        if cfg.batch_norm:  # the normalisation's shift is the bias
            if not pooled:
                x = activation(x)
            elif pool_first:
                x = activation(conv.max_pool(x, impl=impl))
            else:
                x = conv.max_pool(activation(x), impl=impl)
        elif not pooled:
            x = activation(x + b)
        elif pool_first:  # ReLU: the block whole
            x = conv.max_pool_bias_relu(x, b, impl=impl)
        else:
            x = conv.max_pool(activation(x + b), impl=impl)
    x = x.reshape(x.shape[0], -1)
    drop_key = key if train else None
    for i, layer in enumerate(params["dense"]):
        x = dropout(drop_key, x, cfg.dropout, i)
        x = matmul(x, layer["w"].astype(dtype)) + layer["b"].astype(dtype)
        if i < len(params["dense"]) - 1:
            x = activation(x)
    logits = x.astype(jnp.float32)
    if not train:
        return logits
    return logits, (new_stats if cfg.batch_norm else None)


def flops_per_example(cfg, input_shape=(28, 28), num_classes=10) -> int:
    """Multiply-add FLOPs (2 per MAC) of one training example: forward, weight gradients,
    and input gradients of every layer but the first (the images need none). Bias,
    activation and pooling work is left out (a few percent for these shapes)."""
    *conv_maps, (h, w) = _map_sizes(cfg, input_shape)  # each conv's output; the last pool's
    macs = [
        ho * wo * k**2 * cin * cout
        for (ho, wo), k, (cin, cout) in zip(
            conv_maps,
            kernel_sizes(cfg),
            itertools.pairwise((_in_channels(input_shape), *cfg.channels)),
            strict=True,
        )
    ]
    sizes = [h * w * cfg.channels[-1], *cfg.hidden, num_classes]
    macs += [a * b for a, b in itertools.pairwise(sizes)]
    return 2 * sum(macs) + 2 * sum(macs) + 2 * sum(macs[1:])


def validate(cfg) -> None:
    """The CNN reads `channels`, `kernel_size`, `padding`, `conv_impl` and `hidden` (its
    dense head)."""
    if not cfg.channels or any(c <= 0 for c in cfg.channels):
        raise ConfigError(
            f"model.channels: one or more positive channel counts, got {cfg.channels}"
        )
    if cfg.padding not in conv.PADDINGS:
        raise ConfigError(
            f"unknown model.padding {cfg.padding!r}; choose from: {', '.join(conv.PADDINGS)}"
        )
    ks = _given(cfg.kernel_size)
    if len(ks) not in (1, len(cfg.channels)):
        raise ConfigError(
            f"model.kernel_size: one size, or one per conv block ({len(cfg.channels)}), got {ks}"
        )
    if any(k <= 0 for k in ks) or (cfg.padding == "same" and any(k % 2 == 0 for k in ks)):
        what = "positive odd sizes (same padding)" if cfg.padding == "same" else "positive sizes"
        raise ConfigError(f"model.kernel_size: {what}, got {ks}")
    given_pools = _given(cfg.pool)
    if len(given_pools) not in (1, len(cfg.channels)) or any(p not in (0, 1) for p in given_pools):
        raise ConfigError(
            f"model.pool: 1 (pool) or 0 (not), one for all conv blocks or one per block "
            f"({len(cfg.channels)}), got {given_pools}"
        )
    if cfg.conv_impl not in conv.CHOICES:
        raise ConfigError(
            f"unknown model.conv_impl {cfg.conv_impl!r}; choose from: {', '.join(conv.CHOICES)}"
        )
    if cfg.conv_impl == "onednn":
        reason = onednn.unavailable_reason()
        if reason is not None:
            raise ConfigError(f"model.conv_impl=onednn: {reason}")
        if not onednn.supports(cfg.dtype):
            raise ConfigError(
                f"model.conv_impl=onednn: oneDNN has no {cfg.dtype} convolution for this CPU; "
                "model.conv_impl=auto uses im2col"
            )
    if cfg.residual and not (
        cfg.padding == "same" and any(a == b for a, b in itertools.pairwise(cfg.channels))
    ):
        raise ConfigError(
            "model.residual: no conv block keeps its input's shape (two blocks in a row with "
            f"the same channels, 'same' padding), got channels {cfg.channels} and "
            f"{cfg.padding!r} padding"
        )
    if any(h <= 0 for h in cfg.hidden):
        raise ConfigError(f"model.hidden: sizes must be positive, got {cfg.hidden}")


def describe(cfg) -> str:
    """The network in a few words, e.g. "cnn in → conv 3×3×16 → conv 3×3×32 → 128 → out"
    (each conv is followed by 2×2 max-pooling), with valid padding or batch norm said; where
    some block has no pooling, each pool is written where it is ("conv 3×3×32 → conv
    3×3×32 → pool → ...")."""
    convs = [f"conv {k}×{k}×{c}" for k, c in zip(kernel_sizes(cfg), cfg.channels, strict=False)]
    flags = pools(cfg)
    if len(flags) == len(convs) and not all(flags):
        convs = [step for c, p in zip(convs, flags, strict=True) for step in (c, "pool")[: 1 + p]]
    text = f"{cfg.name} " + " → ".join(map(str, ["in", *convs, *cfg.hidden, "out"]))
    notes = ["valid padding"] * (cfg.padding == "valid") + ["batch norm"] * cfg.batch_norm
    notes += ["residual"] * cfg.residual
    return ", ".join([text, *notes])


def portable(cfg):
    """`cfg` with a convolution that any backend can run (`conv.portable`): what export
    traces, since a custom call of this process (oneDNN) cannot travel."""
    return dataclasses.replace(cfg, conv_impl=conv.portable(cfg.conv_impl))


def run_facts(cfg, input_shape: tuple[int, ...] | None = None) -> dict:
    """What environment.json records of a CNN run: the convolution's formulation, as `auto`
    (or the user) chose it on this backend, and the first layer's where it differs for
    images of `input_shape` ((H, W) or (H, W, C); `conv.resolve`)."""
    impl = conv.resolve(cfg.conv_impl, dtype=cfg.dtype)
    facts = {"conv_impl": impl}
    if input_shape is not None:
        channels = input_shape[2] if len(input_shape) == 3 else 1
        first = _formulation(cfg, cfg.dtype, channels, kernel_sizes(cfg)[0], input_shape[1])
        if first != impl:
            facts["conv_impl_first_layer"] = first
    return facts


MODEL = Model(
    init,
    apply,
    flops_per_example,
    validate,
    CNNConfig,
    describe,
    portable=portable,
    run_facts=run_facts,
    first_kernel="['conv'][0]['w']",
)
