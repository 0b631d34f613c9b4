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


def _need_onednn(dtype="float32"):
    """Skips, saying why, where oneDNN cannot run here in `dtype`."""
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    if not onednn.supports(dtype):
        pytest.skip(f"oneDNN has no {dtype} kernels for this CPU")


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
    if impl == "onednn":
        _need_onednn(dtype)
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
    if impl == "onednn":
        _need_onednn()
    x, w, _ = _inputs(SHAPES[1], jnp.float32)
    got = jax.jit(conv.conv2d, static_argnums=2)(x, w, impl)
    _close(got, reference(x, w), "float32")


def test_auto_is_xla_on_accelerators_and_the_fastest_at_hand_on_cpu():
    assert conv.resolve("auto", "gpu") == "xla"
    assert conv.resolve("auto", "tpu") == "xla"
    assert jax.device_count() == 1  # the multi-device suite checks the mesh's choice
    assert (conv.CPU_FASTEST, conv.CPU_FASTEST_XLA) == ("onednn", "im2col")
    fastest = "onednn" if onednn.available() else "im2col"  # with jaxmnist-onednn or not
    assert conv.resolve("auto", "cpu") == fastest
    assert conv.resolve("patches", "gpu") == "patches"  # a forced choice is kept
    assert set(conv.CHOICES) == {"auto", "xla", "im2col", "patches", "banded", "onednn"}


def test_auto_is_banded_or_patches_for_a_one_channel_input_on_a_tpu_only():
    """A grayscale first layer on a TPU: `banded` where its matmul does at most
    `BANDED_MAX_WORK` times the convolution's work (padded width over kernel), else
    patches (`conv.resolve`); every other input there, every input elsewhere, and every
    forced choice as before."""
    assert conv.BANDED_MAX_WORK == 8
    tpu = partial(conv.resolve, "auto", "tpu", in_channels=1)
    assert tpu(kernel=5, width=28, padding="valid") == "banded"  # 28 / 5
    assert tpu(kernel=5, width=36, padding="same") == "banded"  # 40 / 5, the bound
    assert tpu(kernel=5, width=37, padding="same") == "patches"  # 41 / 5
    assert tpu(kernel=3, width=28, padding="same") == "patches"  # 30 / 3
    assert tpu() == "patches"  # the layer's shape unknown
    assert conv.resolve("auto", "tpu", in_channels=3, kernel=5, width=28) == "xla"
    assert conv.resolve("auto", "gpu", in_channels=1, kernel=5, width=28) == "xla"
    assert conv.resolve("xla", "tpu", in_channels=1, kernel=5, width=28) == "xla"
    fastest = "onednn" if onednn.available() else "im2col"
    assert conv.resolve("auto", "cpu", in_channels=1, kernel=5, width=28) == fastest


@pytest.mark.parametrize(
    ("preset", "channels", "first"),
    [("speedrun", 1, "banded"), ("cnn", 1, "patches"), ("speedrun", 3, "xla")],
)
def test_a_cnn_on_a_tpu_convolves_a_grayscale_first_layer_its_own_way(
    monkeypatch, preset, channels, first
):
    """Each layer's formulation as the network is traced on a TPU (JAX's backend answered
    as a TPU's): for the first layer of one-channel images, banded with `speedrun`'s 5×5
    kernels and patches with `cnn`'s 3×3; XLA's everywhere else; and environment.json
    says so."""
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    used = []
    for name, fn in list(conv.CONV_IMPLS.items()):
        monkeypatch.setitem(conv.CONV_IMPLS, name, lambda *a, n=name, f=fn: used.append(n) or f(*a))
    cfg = config.get_preset(preset).model
    shape = (28, 28) if channels == 1 else (28, 28, channels)
    params = cnn.init(jax.random.key(0), cfg, shape, 10)
    jax.eval_shape(lambda p, x: cnn.apply(p, x, cfg), params, jnp.zeros((2, *shape)))
    assert used == [first, "xla"]
    facts = cnn.run_facts(cfg, shape)
    assert facts == {
        "conv_impl": "xla",
        **({"conv_impl_first_layer": first} if first != "xla" else {}),
    }


def test_auto_falls_back_to_plain_xla_without_onednn(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    assert conv.resolve("auto", "cpu") == conv.CPU_FASTEST_XLA == "im2col"


def test_auto_falls_back_where_onednn_lacks_the_dtype(monkeypatch, caplog):
    monkeypatch.setattr(onednn, "unavailable_reason", lambda: None)
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
    _need_onednn()
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


def test_onednn_is_available_where_its_package_is_installed():
    """Installed, the package must load (a broken one fails here rather than skipping
    the tests above); not installed, oneDNN is unavailable for that reason alone."""
    try:
        metadata.version("jaxmnist-onednn")
    except metadata.PackageNotFoundError:
        assert onednn.unavailable_reason() == onednn.NOT_INSTALLED
        assert not onednn.load_failed()
    else:
        assert onednn.unavailable_reason() is None


def test_onednn_loops_over_vmap_dimensions_and_broadcasts_unbatched_operands():
    """A population's vmap reaches the custom calls as leading dimensions: shared images
    with per-member weights, nested vmaps, and the backward calls of both."""
    _need_onednn()
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
    if impl == "onednn":
        _need_onednn(dtype)
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
    if impl == "onednn":
        _need_onednn()
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
    if impl == "onednn":
        _need_onednn(dtype)
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


def test_environment_records_the_onednn_package_without_loading_it(monkeypatch):
    def version(name):
        if name in missing:
            raise metadata.PackageNotFoundError(name)
        return {"jaxmnist-onednn": "0.1.0", "onednn-cpu-gomp": "2023.2.0"}[name]

    monkeypatch.setattr(onednn.metadata, "version", version)
    missing = set()
    assert onednn.describe() == {"package": "0.1.0", "onednn_cpu_gomp": "2023.2.0"}
    missing = {"jaxmnist-onednn"}
    assert onednn.describe() == {"package": None, "reason": onednn.NOT_INSTALLED}


# The package as a process finds it: not installed (an import of it fails as a missing
# module does), or installed but unable to load its library (as a missing libdnnl fails).
HIDDEN = "import sys; sys.modules['jaxmnist_onednn'] = None\n"
BROKEN_REASON = "libdnnl.so.3: cannot open shared object file"
BROKEN = f"raise ImportError({BROKEN_REASON!r})\n"


@pytest.mark.parametrize("package", ["missing", "broken"])
def test_auto_uses_im2col_without_the_package_and_says_so_once_where_it_is_broken(
    package, tmp_path
):
    """A package that is not installed is an optional part left out: `auto` takes im2col
    without a word. One that is installed yet cannot load is a fault: one warning line,
    as the compilation cache gives, and the run goes on with im2col."""
    import os
    import subprocess
    import sys

    code = "from jaxmnist.models import conv; print(conv.resolve('auto'), conv.resolve('auto'))"
    env = dict(os.environ)
    if package == "missing":
        code = HIDDEN + code
    else:
        (tmp_path / "jaxmnist_onednn").mkdir()
        (tmp_path / "jaxmnist_onednn" / "__init__.py").write_text(BROKEN)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
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
    said = done.stderr.splitlines()
    if package == "missing":
        assert said == []
    else:
        reason = "jaxmnist-onednn is installed but cannot be loaded: " + BROKEN_REASON
        assert said == [f"{reason}; conv_impl=auto uses im2col"]
