"""Every convolution formulation against `lax.conv_general_dilated`; pooling; auto choice."""

import dataclasses
import logging
from functools import partial
from importlib import metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.custom_derivatives import SymbolicZero

from jaxmnist import config
from jaxmnist.errors import ConfigError
from jaxmnist.models import cnn, conv, onednn

# (B, H, W, C_in, C_out, k): a first layer (one channel), a deeper one, odd sizes, k = 5,
# and the first layer of RGB images.
SHAPES = [(3, 8, 8, 1, 4, 3), (2, 7, 9, 5, 6, 3), (2, 6, 5, 3, 2, 5), (3, 8, 8, 3, 4, 3)]
TOLERANCE = {"float32": 1e-5, "bfloat16": 3e-2}  # relative to the largest magnitude


def reference(x, w, padding="same"):
    return lax.conv_general_dilated(
        x, w, (1, 1), padding.upper(), dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def _inputs(shape, dtype, padding="same"):
    b, h, wd, c, o, k = shape
    rng = np.random.default_rng(sum(shape))  # NumPy: eager jax.random compiles per shape
    x, w = rng.normal(size=(b, h, wd, c)), rng.normal(size=(k, k, c, o))
    shrink = 0 if padding == "same" else k - 1
    g = rng.normal(size=(b, h - shrink, wd - shrink, o))  # a cotangent for the VJP
    return tuple(jnp.asarray(a, jnp.float32).astype(dtype) for a in (x, w, g))


def _close(actual, expected, dtype):
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    assert actual.shape == expected.shape
    scale = np.abs(expected).max()
    np.testing.assert_allclose(actual, expected, atol=TOLERANCE[dtype] * scale, rtol=0)


@pytest.mark.parametrize("padding", conv.PADDINGS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("impl", sorted(conv.CONV_IMPLS))
def test_convolution_and_its_gradients_match_xla(impl, shape, dtype, padding):
    if impl == "onednn" and not onednn.supports(dtype):
        pytest.skip(f"oneDNN has no {dtype} convolution for this CPU")
    x, w, g = _inputs(shape, jnp.dtype(dtype), padding)
    fn = jax.jit(conv.CONV_IMPLS[impl], static_argnums=2)  # one compile, not one per eager op
    out, vjp = jax.vjp(lambda x, w: fn(x, w, padding), x, w)
    ref_out, ref_vjp = jax.vjp(lambda x, w: reference(x, w, padding), x, w)
    assert out.dtype == jnp.dtype(dtype)
    _close(out, ref_out, dtype)
    for got, want in zip(vjp(g), ref_vjp(g), strict=True):  # d/dx and d/dw
        _close(got, want, dtype)


@pytest.mark.parametrize("impl", ["auto", *sorted(conv.CONV_IMPLS)])
def test_conv2d_dispatches_every_choice(impl):
    x, w, _ = _inputs(SHAPES[1], jnp.float32)
    got = jax.jit(conv.conv2d, static_argnums=2)(x, w, impl)
    _close(got, reference(x, w), "float32")


def test_auto_is_xla_on_accelerators_and_the_fastest_measured_on_cpu():
    assert conv.resolve("auto", "gpu") == "xla"
    assert conv.resolve("auto", "tpu") == "xla"
    assert jax.device_count() == 1  # the multi-device suite checks the mesh's choice
    assert conv.resolve("auto", "cpu") == conv.CPU_FASTEST == "onednn"
    assert conv.resolve("patches", "gpu") == "patches"  # a forced choice is kept
    assert set(conv.CHOICES) == {"auto", "xla", "im2col", "patches", "onednn"}


def test_auto_falls_back_to_plain_xla_without_onednn(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert conv.resolve("auto", "cpu") == conv.CPU_FASTEST_XLA == "im2col"


def test_auto_falls_back_where_onednn_lacks_the_dtype(monkeypatch, caplog):
    monkeypatch.setattr(onednn, "supports", lambda dtype: jnp.dtype(dtype) == jnp.float32)
    conv._say_fallback.cache_clear()
    assert conv.resolve("auto", "cpu", "float32") == "onednn"
    with caplog.at_level(logging.WARNING):
        assert conv.resolve("auto", "cpu", "bfloat16") == "im2col"
    assert "oneDNN has no bfloat16 convolution for this CPU" in caplog.text
    cfg = dataclasses.replace(config.get_preset("cnn").model, dtype="bfloat16")
    assert cnn.run_facts(cfg) == {"conv_impl": "im2col"}
    with pytest.raises(ConfigError, match="^model.conv_impl=onednn: oneDNN has no bfloat16 "):
        cnn.validate(dataclasses.replace(cfg, conv_impl="onednn"))
    cnn.validate(cfg)  # auto: falls back, no error


def test_supports_says_whether_the_convolution_runs():
    """Either way on this CPU: a dtype oneDNN is said to support runs, one it is said not
    to fails inside oneDNN."""
    assert onednn.supports("float32")
    x, w = jnp.ones((1, 4, 4, 2), jnp.bfloat16), jnp.ones((3, 3, 2, 2), jnp.bfloat16)
    if onednn.supports("bfloat16"):
        jax.block_until_ready(onednn.conv_onednn(x, w))
    else:
        with pytest.raises(jax.errors.JaxRuntimeError, match="primitive descriptor"):
            jax.block_until_ready(onednn.conv_onednn(x, w))


def test_portable_never_names_a_custom_call():
    assert conv.portable("onednn") == conv.portable("auto", "cpu") == "im2col"
    assert conv.portable("auto", "gpu") == "xla"
    assert conv.portable("patches") == "patches"


def test_onednn_is_available_where_its_extra_is_installed():
    """The test extra installs oneDNN, so a failed build here fails (not skips) the
    parametrized tests above."""
    metadata.version("onednn-devel-cpu-gomp")  # PackageNotFoundError if the extra is missing
    assert onednn.unavailable_reason() is None


def test_onednn_loops_over_vmap_dimensions_and_broadcasts_unbatched_operands():
    """A population's vmap reaches the custom calls as leading dimensions: shared images
    with per-member weights, nested vmaps, and the backward calls of both."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(3, 6, 6, 2)), jnp.float32)
    ws = jnp.asarray(rng.normal(size=(4, 3, 3, 2, 5)), jnp.float32)
    gs = jnp.asarray(rng.normal(size=(4, 3, 6, 6, 5)), jnp.float32)
    xs = jnp.asarray(rng.normal(size=(2, 4, 3, 6, 6, 2)), jnp.float32)

    def population(fn):
        shared = jax.vmap(lambda w, g: jax.vjp(fn, x, w)[1](g))(ws, gs)
        nested = jax.vmap(jax.vmap(fn))(xs, jnp.broadcast_to(ws, (2, *ws.shape)))
        crossed = jax.vmap(jax.vmap(fn, (0, None)), (None, 0))(xs[0], ws)
        return shared, nested, crossed

    got, want = jax.jit(population, static_argnums=0)(onednn.conv_onednn), population(reference)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        _close(a, b, "float32")


def test_a_failed_onednn_build_says_why_and_leaves_no_library(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(onednn.Unavailable, match="building the oneDNN convolution failed"):
        onednn.build(onednn.find_onednn(), tmp_path)
    assert not list(tmp_path.rglob("*.so*"))


def test_onednn_builds_once_per_cache_and_reuses_the_library(tmp_path, monkeypatch):
    """A stand-in compiler that writes the library's file: the real build is the one every
    oneDNN test above loads, and the one without OpenMP below."""
    log = tmp_path / "compiles"
    cxx = tmp_path / "cxx"
    cxx.write_text(
        f"#!/bin/sh\necho x >> {log}\n"
        'while [ "$#" -gt 0 ]; do [ "$1" = -o ] && echo library > "$2"; shift; done\n'
    )
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    first = onednn.build(onednn.find_onednn(), tmp_path / "cache")
    again = onednn.build(onednn.find_onednn(), tmp_path / "cache")
    assert first == again and first.read_text() == "library\n"
    assert log.read_text().count("x") == 1
    assert [p.name for p in first.parent.iterdir() if p.suffix == ".tmp"] == []


def test_a_compiler_without_openmp_still_builds_the_library(tmp_path, monkeypatch):
    """OpenMP only spreads the first block over threads: a compiler that lacks it (clang
    without libomp) builds the library without it, the first block then serial."""
    log = tmp_path / "compiles"
    cxx = tmp_path / "cxx"
    cxx.write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        'case "$*" in *-fopenmp*) echo "error: unsupported option -fopenmp" >&2; exit 1;; esac\n'
        'exec c++ "$@"\n'
    )
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    library = onednn.build(onednn.find_onednn(), tmp_path / "cache")
    assert library.is_file()
    tries = log.read_text().splitlines()
    assert len(tries) == 2 and "-fopenmp" in tries[0] and "-fopenmp" not in tries[1]


def test_without_onednn_its_explicit_choice_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setattr(onednn, "unavailable_reason", lambda: "no oneDNN 3 here")
    cfg = config.get_preset("cnn").model
    with pytest.raises(ConfigError, match="^model.conv_impl=onednn: no oneDNN 3 here$"):
        cnn.validate(dataclasses.replace(cfg, conv_impl="onednn"))
    cnn.validate(dataclasses.replace(cfg, conv_impl="im2col"))  # the others are untouched


POOL_IMPLS = ["xla", "onednn"]  # the convolution's formulation; oneDNN's pools beside it


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", POOL_IMPLS)
def test_max_pool_matches_reduce_window_and_drops_odd_edges(impl, dtype):
    if impl == "onednn" and not onednn.supports(dtype):
        pytest.skip(f"oneDNN has no {dtype} kernels for this CPU")
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 7, 6, 3)), dtype)
    want = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    pool = jax.jit(lambda x: conv.max_pool(x, impl=impl))
    got = pool(x)
    assert got.shape == (2, 3, 3, 3) and got.dtype == x.dtype
    np.testing.assert_array_equal(got, want)
    # Beside oneDNN's convolution oneDNN pools without a gradient too (evaluation): faster.
    assert ("jaxmnist_onednn_pool" in pool.lower(x).as_text()) == (impl == "onednn")


def _reduce_window_max(x, size):
    window = (1, size, size, 1)
    return lax.reduce_window(x, -jnp.inf, lax.max, window, window, "VALID")


@pytest.mark.parametrize("impl", POOL_IMPLS)
@pytest.mark.parametrize("size", [2, 3, 12])  # 12: more elements than a signed byte numbers
def test_max_pools_gradient_goes_to_each_windows_first_maximum(size, impl):
    """As `lax.reduce_window`'s gradient (and PyTorch's): one element of each window gets
    it, the first in row-major order where several tie, which small integers make common;
    under a population's vmap and for odd edges too."""
    rng = np.random.default_rng(size)
    x = jnp.asarray(rng.integers(0, 3, size=(3, 2, 3 * size + 1, 2 * size, 4)), jnp.float32)
    tied = _windows_with_ties(x[0, :, : 3 * size], size)
    assert tied > 10  # the test is about them

    def loss(pool):
        def f(x):
            y = pool(x)
            return (y * jnp.arange(1, y.size + 1, dtype=y.dtype).reshape(y.shape)).sum()

        return jax.jit(jax.vmap(jax.grad(f)))

    got = loss(lambda x: conv.max_pool(x, size, impl))(x)
    want = loss(lambda x: _reduce_window_max(x, size))(x)
    np.testing.assert_array_equal(got, want)
    training = loss(lambda x: conv.max_pool(x, size, impl)).lower(x).as_text()
    for call in ("jaxmnist_onednn_pool_forward", "jaxmnist_onednn_pool_backward"):
        assert (call in training) == (impl == "onednn")
    assert float(got.sum()) == float(want.sum())  # each window's gradient given once


def _windows_with_ties(x, size) -> int:
    b, h, w, c = x.shape
    v = x.reshape(b, h // size, size, w // size, size, c)
    return int(((v == v.max(axis=(2, 4), keepdims=True)).sum(axis=(2, 4)) > 1).sum())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("impl", POOL_IMPLS)
def test_pool_bias_relu_is_the_pooled_activation_under_vmap_and_differentiated(impl, dtype):
    """A block's pooling, bias and ReLU: exactly relu(max + b), with odd edges dropped,
    for a population (per-member maps and biases, shared maps, shared biases); beside
    oneDNN's convolution one call computes it (in training with the pooling's workspace),
    and its gradients, with respect to the maps and the biases, are the parts'."""
    if impl == "onednn" and not onednn.supports(dtype):
        pytest.skip(f"oneDNN has no {dtype} kernels for this CPU")
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(4, 2, 7, 6, 3)), dtype)  # 4 members
    b = jnp.asarray(rng.normal(size=(4, 3)), dtype)  # negative ones: the ReLU has work

    def want(x, b):
        return jax.nn.relu(_reduce_window_max(x, 2) + b)

    def block(x, b):
        return conv.max_pool_bias_relu(x, b, impl=impl)

    def grads(fn, axes):
        def loss(x, b):
            return jnp.tanh(fn(x, b).astype(jnp.float32)).sum()

        return jax.jit(jax.vmap(jax.grad(loss, (0, 1)), axes))

    for axes in [(0, 0), (None, 0), (0, None)]:
        xs, bs = (x[0] if axes[0] is None else x), (b[0] if axes[1] is None else b)
        fused = jax.jit(jax.vmap(block, axes))
        got = fused(xs, bs)
        assert got.shape == (4, 2, 3, 3, 3) and got.dtype == x.dtype
        np.testing.assert_array_equal(got, jax.vmap(want, axes)(xs, bs))
        assert 0 < int((got == 0).sum()) < got.size
        for g, expected in zip(grads(block, axes)(xs, bs), grads(want, axes)(xs, bs), strict=True):
            np.testing.assert_array_equal(g, expected)
    inference = fused.lower(xs, bs).as_text()
    training = grads(block, (0, 0)).lower(x, b).as_text()
    assert ("jaxmnist_onednn_pool_bias_relu(" in inference) == (impl == "onednn")
    for call in ("jaxmnist_onednn_pool_bias_relu_forward", "jaxmnist_onednn_pool_backward"):
        assert (call in training) == (impl == "onednn")
    assert "jaxmnist_onednn_pool_bias_relu(" not in training


# (H, W, k, O, padding): the presets' first blocks, odd maps, every channel count.
FIRST_BLOCKS = [
    (28, 28, 3, 16, "same"),
    (28, 28, 5, 24, "valid"),
    (13, 14, 3, 32, "same"),
    (9, 8, 5, 8, "valid"),
    (7, 7, 3, 48, "same"),
    (11, 10, 3, 64, "valid"),
]


@pytest.mark.parametrize("shape", FIRST_BLOCKS, ids=str)
def test_first_block_is_its_parts_under_vmap_and_differentiated(shape):
    """A one-channel ReLU block whole (convolution, pooling with odd edges dropped, bias,
    ReLU) in one call of jaxmnist's kernel: the values of the parts, for a population
    (per-member weights and biases over shared images, per-member images, both), and the
    parts' gradients exactly (its VJP is theirs)."""
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    h, wd, k, o, padding = shape
    rng = np.random.default_rng(h * o)
    x = jnp.asarray(rng.uniform(size=(3, 5, h, wd, 1)), jnp.float32)  # 3 members
    w = jnp.asarray(rng.normal(size=(3, k, k, 1, o)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(3, o)), jnp.float32)

    def block(x, w, b):
        return conv.conv_pool_bias_relu(x, w, b, "onednn", padding)

    def parts(x, w, b):
        return jax.nn.relu(_reduce_window_max(reference(x, w, padding), 2) + b)

    def unfused(x, w, b):  # oneDNN's convolution, then its pooling with bias and ReLU
        return conv._block_parts(x, w, b, "onednn", padding)

    def grads(fn, axes):
        def loss(x, w, b):
            return jnp.tanh(fn(x, w, b)).sum()

        return jax.jit(jax.vmap(jax.grad(loss, (0, 1, 2)), axes))

    for axes in [(None, 0, 0), (0, None, None), (0, 0, 0)]:
        args = [a[0] if axis is None else a for a, axis in zip((x, w, b), axes, strict=True)]
        fused = jax.jit(jax.vmap(block, axes))
        got, want = fused(*args), jax.vmap(parts, axes)(*args)
        assert "jaxmnist_first_block" in fused.lower(*args).as_text()
        _close(got, want, "float32")
        assert 0 < int((got == 0).sum()) < got.size
        for g, expected in zip(grads(block, axes)(*args), grads(unfused, axes)(*args), strict=True):
            np.testing.assert_array_equal(g, expected)


@pytest.mark.parametrize("shape", FIRST_BLOCKS, ids=str)
def test_first_block_in_training_is_two_calls_with_the_parts_gradients(shape):
    """Differentiated for its weights and bias only (the input is the data), the block is
    its kernel's training forward pass and gradient, no oneDNN convolution: the parts'
    values and, summed in another order, their gradients, for a population's members."""
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    h, wd, k, o, padding = shape
    rng = np.random.default_rng(h + o)
    x = jnp.asarray(rng.uniform(size=(6, h, wd, 1)) * (rng.uniform(size=(6, h, wd, 1)) > 0.3))
    w = jnp.asarray(rng.normal(size=(3, k, k, 1, o)), jnp.float32)  # 3 members
    b = jnp.asarray(rng.normal(size=(3, o)), jnp.float32)

    def step(block):
        def loss(w, b):
            return jnp.tanh(block(x.astype(jnp.float32), w, b, "onednn", padding)).sum()

        return jax.jit(jax.vmap(jax.value_and_grad(loss, (0, 1))))

    fused, parts = step(conv.conv_pool_bias_relu), step(conv._block_parts)
    text = fused.lower(w, b).as_text()
    assert "jaxmnist_first_block_forward" in text and "jaxmnist_first_block_backward" in text
    assert "jaxmnist_onednn" not in text
    (value, grads), (want_value, want_grads) = fused(w, b), parts(w, b)
    _close(value, want_value, "float32")
    for g, want in zip(grads, want_grads, strict=True):
        _close(g, want, "float32")
        assert float(jnp.abs(want).max()) > 0


def test_first_block_differentiated_for_its_input_uses_the_parts():
    """An input that is differentiated (an image asked for its gradient) gets the parts'
    gradient, which the kernel's pass does not compute."""
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.uniform(size=(4, 28, 28, 1)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(3, 3, 1, 16)), jnp.float32)
    b = jnp.asarray(rng.normal(size=(16,)), jnp.float32)

    def loss(block):
        return lambda x, w, b: jnp.tanh(block(x, w, b, "onednn", "same")).sum()

    fused = jax.jit(jax.grad(loss(conv.conv_pool_bias_relu), (0, 1, 2)))
    assert "jaxmnist_first_block_backward" not in fused.lower(x, w, b).as_text()
    want = jax.jit(jax.grad(loss(conv._block_parts), (0, 1, 2)))(x, w, b)
    for g, expected in zip(fused(x, w, b), want, strict=True):
        np.testing.assert_array_equal(g, expected)
        assert float(jnp.abs(expected).max()) > 0

    # A cotangent JAX knows to be zero (with symbolic zeros, the VJP may be handed one):
    # zero gradients from either pass.
    y, first = onednn.first_block_forward(x, w, b)
    zero = SymbolicZero(jax.typeof(y))
    kernel = conv._first_block_bwd("same", (None, (x, y, first, w)), zero)
    _, vjp = jax.vjp(partial(conv._block_parts, impl="onednn", padding="same"), x, w, b)
    for grads in (kernel[1:], conv._first_block_bwd("same", (vjp, None), zero)):
        for g in grads:
            np.testing.assert_array_equal(g, 0.0)


@pytest.mark.parametrize(
    "x_shape, w_shape, dtype",
    [
        ((2, 8, 8, 3), (3, 3, 3, 16), "float32"),  # three input channels
        ((2, 8, 8, 1), (3, 3, 1, 16), "bfloat16"),
        ((2, 8, 8, 1), (7, 7, 1, 16), "float32"),  # a kernel size it has no kernel for
        ((2, 8, 8, 1), (3, 3, 1, 20), "float32"),  # a channel count it has no kernel for
    ],
)
def test_blocks_without_a_first_block_kernel_are_computed_by_their_parts(x_shape, w_shape, dtype):
    if not onednn.supports(dtype):
        pytest.skip(f"oneDNN has no {dtype} kernels for this CPU")
    x, w = jnp.ones(x_shape, dtype), jnp.ones(w_shape, dtype)
    b = jnp.ones(w_shape[3:], dtype)
    assert not onednn.first_block_supported(x_shape, w_shape, dtype, "valid")
    text = (
        jax.jit(conv.conv_pool_bias_relu, static_argnums=(3, 4))
        .lower(x, w, b, "onednn", "valid")
        .as_text()
    )
    assert "jaxmnist_first_block" not in text and "jaxmnist_onednn_conv_forward" in text
    with pytest.raises(ValueError, match="first block: no kernel"):
        onednn.first_block(x, w, b, "valid")


def test_onednn_pool_bias_relu_refuses_a_bias_that_is_not_one_per_channel():
    x = jnp.zeros((2, 4, 4, 3), jnp.float32)
    with pytest.raises(ValueError, match="a bias"):
        onednn.max_pool_bias_relu(x, jnp.zeros((4,), jnp.float32))
    with pytest.raises(ValueError, match="a bias"):
        onednn.max_pool_bias_relu(x, jnp.zeros((3,), jnp.bfloat16))


@pytest.mark.parametrize("padding", conv.PADDINGS)
def test_written_out_backward_pass_equals_autodiff_under_vmap(padding):
    # A population vmaps the model: the hand-written VJP of im2col must give autodiff's
    # gradients for every member.
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=(3, 2, 9, 8, 4)), jnp.float32)  # 3 members
    w = jnp.asarray(rng.normal(size=(3, 3, 3, 4, 5)), jnp.float32)

    def loss(conv_fn):
        def member(x, w):
            return jnp.sum(jnp.tanh(conv.max_pool(conv_fn(x, w, padding))))

        return jax.jit(jax.vmap(jax.grad(member, argnums=(0, 1))))

    got = loss(conv.conv_im2col)(x, w)
    want = loss(conv.im2col_autodiff)(x, w)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(jnp.abs(r).max()))


def test_environment_records_the_onednn_found_without_loading_it(monkeypatch):
    found = onednn.describe()
    assert found["found"] and found["version"].split(".")[0] == "3"
    monkeypatch.setenv("DNNLROOT", "/nonexistent")
    monkeypatch.setattr(onednn.sys, "prefix", "/nonexistent")
    assert onednn.describe() == {
        "found": None,
        "reason": "no oneDNN 3 (headers and libdnnl) in /nonexistent or /nonexistent: "
        "pip install 'jaxmnist[onednn]'",
    }


def test_auto_says_once_when_the_onednn_build_cannot_be_written(tmp_path):
    """A cache folder that cannot be made (a path under a regular file: root ignores
    permissions) drops oneDNN for im2col with one warning line, as the compile cache does."""
    import os
    import subprocess
    import sys

    try:
        onednn.find_onednn()
    except onednn.Unavailable as e:
        pytest.skip(str(e))
    (tmp_path / "file").write_text("")
    code = "from jaxmnist.models import conv; print(conv.resolve('auto'), conv.resolve('auto'))"
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "file" / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "im2col im2col\n"
    [line] = done.stderr.splitlines()
    assert line.startswith("the oneDNN convolution cannot be built: cannot write ")
    assert line.endswith("(Not a directory); conv_impl=auto uses im2col")
