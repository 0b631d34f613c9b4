"""The convolution, and the max-pooling after it, as oneDNN's kernels, called from XLA on
the CPU (`model.conv_impl=onednn`).

oneDNN (the library behind PyTorch's CPU convolutions) computes a convolution directly,
with kernels that build each patch in registers and never write an im2col buffer; its
forward, input-gradient and weight-gradient primitives run here as three XLA FFI custom
calls (`native/src/onednn_conv.cc`), with the VJP written out in terms of them.
Activations stay NHWC in place; weights go into the kernel's preferred layout by a
reorder (the weight gradient comes back through one). A population's vmap reaches the
handlers as leading dimensions (`vmap_method="expand_dims"`), which they loop over. Each
primitive runs with a scratchpad of its own, not oneDNN's thread-local shared one, since
XLA runs a cached primitive on whichever of its threads is free (`onednn_conv.cc` says
more). Shapes the handlers cannot compute as `lax.conv_general_dilated` does are refused
with a ValueError before the call (`_check_shapes`); the CNN's config never produces one.

Max-pooling's forward pass (which also writes oneDNN's workspace, a byte per output naming
its window's maximum) and its backward pass are two more calls (`max_pool_forward`,
`max_pool_backward`), which `conv.max_pool` differentiates with beside this convolution.
With ReLU a block's pooling, bias and activation are one call (`max_pool_bias_relu`): the
bias and ReLU applied as the kernel writes each output (oneDNN's post-ops), in training
with the workspace (`max_pool_bias_relu_forward`), in inference without.

The handlers are compiled when the optional package `jaxmnist-onednn` (`native/` in
jaxmnist's source tree; `make` installs it) is installed: pip builds it against JAX's FFI
headers and Intel's oneDNN wheels, and it hands each handler over as a capsule, which
the first use registers with JAX. Nothing is compiled at run time. `available()` says
whether this worked and `unavailable_reason()` why not; `conv.resolve("auto")` picks
oneDNN on a one-device CPU only when it is available and has kernels for the network's
dtype (`supports`: bfloat16 needs AVX-512 or later).

Not for export: the custom calls exist only in a process that registered them, so
`jaxmnist export` traces with a portable formulation instead (`conv.portable`). Not for a
multi-device mesh either: XLA's partitioner cannot see into a custom call and would
gather a sharded batch onto every device before it, so `auto` keeps im2col there.
"""

from __future__ import annotations

import functools
from functools import partial
from importlib import metadata

import jax
import jax.numpy as jnp

DISTRIBUTION = "jaxmnist-onednn"
NOT_INSTALLED = (
    "the jaxmnist-onednn package is not installed (`pip install ./native` in jaxmnist's "
    "source tree builds it; needs a C++17 compiler)"
)
DTYPES = (jnp.float32, jnp.bfloat16)


class Unavailable(Exception):
    """oneDNN cannot be used in this process; the message says why, in one line."""


@functools.cache
def _load() -> str | None:
    """Registers the package's handlers with JAX once per process; the reason it could
    not, or None."""
    global _load_failed
    try:
        # The optional package: imported on first use, since it loads oneDNN's library.
        import jaxmnist_onednn
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name == "jaxmnist_onednn":
            return NOT_INSTALLED
        _load_failed = True  # installed, yet not usable: `load_failed`
        return f"jaxmnist-onednn is installed but cannot be loaded: {e}"
    for target, capsule in jaxmnist_onednn.handlers().items():
        jax.ffi.register_ffi_target(target, capsule, platform="cpu")
    return None


_load_failed = False


def load_failed() -> bool:
    """Whether jaxmnist-onednn is installed but cannot be loaded here (its oneDNN library
    missing or of another release): what `conv_impl=auto` says when it falls back,
    unlike a package that is not installed."""
    return unavailable_reason() is not None and _load_failed


def describe() -> dict:
    """For environment.json: the jaxmnist-onednn release installed and the oneDNN wheel
    beside it, without loading either."""
    try:
        package = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return {"package": None, "reason": NOT_INSTALLED}
    try:
        wheel = metadata.version("onednn-cpu-gomp")
    except metadata.PackageNotFoundError:
        wheel = None
    return {"package": package, "onednn_cpu_gomp": wheel}


def available() -> bool:
    """Whether `conv_onednn` works in this process (registering the handlers on first
    call)."""
    return unavailable_reason() is None


def supports(dtype) -> bool:
    """Whether `conv_onednn` works here in `dtype`, forward and both gradients, and the
    max-pooling beside it. oneDNN has float32 kernels for every x86-64 CPU, bfloat16 ones
    only for some (AVX-512 and later) by rules of its own build, so for bfloat16 this runs
    one tiny convolution and pooling, once per process."""
    if jnp.dtype(dtype) == jnp.float32:
        return available()
    return available() and _runs_in(jnp.dtype(dtype).name)


@functools.cache
def _runs_in(dtype: str) -> bool:
    def loss(x, w):
        return conv_onednn(x, w, "valid").astype(jnp.float32).sum()

    def both(x, w):  # the convolution and its gradients, the pooling and its gradient
        dx, _ = jax.grad(loss, argnums=(0, 1))(x, w)
        pooled, workspace = max_pool_forward(dx)
        return max_pool_backward(pooled, workspace, dx.shape)

    with jax.ensure_compile_time_eval():  # run now, even when called while tracing
        x, w = jnp.ones((1, 4, 4, 1), dtype), jnp.ones((1, 1, 1, 1), dtype)
        try:
            jax.block_until_ready(both(x, w))
        except jax.errors.JaxRuntimeError:  # oneDNN: no primitive for this dtype here
            return False
    return True


def unavailable_reason() -> str | None:
    """Why `conv_onednn` cannot run here, in one line; None when it can."""
    backend = jax.default_backend()
    if backend != "cpu":
        return f"it runs on the CPU only, and JAX's backend is {backend}"
    return _load()


def _call(target: str, result, *operands, **attributes):
    reason = unavailable_reason()
    if reason is not None:
        raise Unavailable(reason)
    call = jax.ffi.ffi_call(target, result, vmap_method="expand_dims")
    return call(*operands, **attributes)


def _pad(w: jax.Array, padding: str) -> int:
    return w.shape[0] // 2 if padding == "same" else 0


def _check_shapes(x_shape, w_shape, padding: str) -> None:
    """Raises ValueError, in one line, for a convolution the handlers cannot compute as
    `lax.conv_general_dilated` would: their padding is k // 2 on every side, which is
    "same" only for odd k (lax pads an even kernel unevenly), and "valid" needs the
    kernel to fit the map. A kernel larger than the map is fine with "same"."""
    if padding not in ("same", "valid"):
        raise ValueError(f"oneDNN conv: padding 'same' or 'valid', got {padding!r}")
    if len(x_shape) != 4 or len(w_shape) != 4:
        raise ValueError(
            f"oneDNN conv: x (B, H, W, C) and w (k, k, C, O), got {x_shape} and {w_shape}"
        )
    (_, h, wd, c), (k, k2, c2, _) = x_shape, w_shape
    if k != k2 or c != c2 or k < 1:
        raise ValueError(f"oneDNN conv: w (k, k, {c}, O) for x {x_shape}, got {w_shape}")
    if padding == "same" and k % 2 == 0:
        raise ValueError(f"oneDNN conv: 'same' padding takes an odd kernel, got k={k}")
    if padding == "valid" and (k > h or k > wd):
        raise ValueError(f"oneDNN conv: a {k}x{k} kernel does not fit {h}x{wd} maps ('valid')")


def _forward(x, w, padding):
    if x.dtype != w.dtype or x.dtype not in DTYPES:
        raise TypeError(f"oneDNN conv takes float32 or bfloat16, got {x.dtype} and {w.dtype}")
    _check_shapes(x.shape, w.shape, padding)
    k, p = w.shape[0], _pad(w, padding)
    b, h, wd, _ = x.shape
    out = jax.ShapeDtypeStruct((b, h + 2 * p - k + 1, wd + 2 * p - k + 1, w.shape[3]), x.dtype)
    return _call("jaxmnist_onednn_conv_forward", out, x, w, pad=p)


@partial(jax.custom_vjp, nondiff_argnums=(2,))
def _conv(x, w, padding):
    return _forward(x, w, padding)


def _conv_fwd(x, w, padding):
    return _forward(x, w, padding), (x, w)


def _conv_bwd(padding, residuals, g):
    x, w = residuals
    p = _pad(w, padding)
    dx = _call("jaxmnist_onednn_conv_backward_data", jax.typeof(x), g, w, pad=p)
    dw = _call("jaxmnist_onednn_conv_backward_weights", jax.typeof(w), x, g, pad=p)
    return dx, dw


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_onednn(x: jax.Array, w: jax.Array, padding: str = "same") -> jax.Array:
    """oneDNN's direct convolution (module docstring). x (B, H, W, C), w (k, k, C, O),
    one dtype, float32 or bfloat16 -> (B, H', W', O)."""
    return _conv(x, w, padding)


def _pooled(x, size: int) -> jax.ShapeDtypeStruct:
    if x.dtype not in DTYPES:
        raise TypeError(f"oneDNN max-pooling takes float32 or bfloat16, got {x.dtype}")
    if x.ndim != 4 or size < 1 or x.shape[1] < size or x.shape[2] < size:
        raise ValueError(
            f"oneDNN max-pooling: {size}x{size} windows of (B, H, W, C), not {x.shape}"
        )
    b, h, w, c = x.shape
    return jax.ShapeDtypeStruct((b, h // size, w // size, c), x.dtype)


def max_pool_forward(x: jax.Array, size: int = 2) -> tuple[jax.Array, jax.Array]:
    """oneDNN's max-pooling over non-overlapping size×size windows, odd edges dropped:
    x (B, H, W, C) -> (pooled (B, H // size, W // size, C), workspace): the workspace, one
    byte per output, names the element of its window that was the maximum (the first in
    row-major order where several tie, as `conv.max_pool`), for `max_pool_backward`."""
    out = _pooled(x, size)
    workspace = jax.ShapeDtypeStruct(out.shape, jnp.uint8)
    return _call("jaxmnist_onednn_pool_forward", (out, workspace), x, size=size)


def max_pool_backward(g: jax.Array, workspace: jax.Array, x_shape, size: int = 2) -> jax.Array:
    """The gradient of `max_pool_forward` for input shape `x_shape`: each output's
    cotangent `g` at its window's maximum, zero elsewhere."""
    dx = jax.ShapeDtypeStruct(tuple(x_shape), g.dtype)
    return _call("jaxmnist_onednn_pool_backward", dx, g, workspace, size=size)


def _bias_checked(x: jax.Array, b: jax.Array) -> None:
    if b.dtype != x.dtype or b.shape != x.shape[-1:]:
        raise ValueError(
            f"oneDNN max-pooling: a bias {x.shape[-1:]} {x.dtype}, not {b.shape} {b.dtype}"
        )


def max_pool_bias_relu(x: jax.Array, b: jax.Array, size: int = 2) -> jax.Array:
    """relu(max-pooling of x + b), as `max_pool_forward` pools, in one call that writes
    nothing else: x (B, H, W, C), b (C,) of x's dtype -> (B, H // size, W // size, C). Not
    differentiable (`conv.max_pool_bias_relu` gives it a gradient)."""
    _bias_checked(x, b)
    return _call("jaxmnist_onednn_pool_bias_relu", _pooled(x, size), x, b, size=size)


def max_pool_bias_relu_forward(
    x: jax.Array, b: jax.Array, size: int = 2
) -> tuple[jax.Array, jax.Array]:
    """`max_pool_bias_relu` and the pooling's workspace, as `max_pool_forward` writes it
    (for `max_pool_backward`): the forward pass of training."""
    _bias_checked(x, b)
    out = _pooled(x, size)
    workspace = jax.ShapeDtypeStruct(out.shape, jnp.uint8)
    return _call("jaxmnist_onednn_pool_bias_relu_forward", (out, workspace), x, b, size=size)
