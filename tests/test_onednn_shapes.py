"""The oneDNN convolution against `lax.conv_general_dilated` over many shapes: kernel sizes
1-31 ("same" for odd k, "valid" for every k that fits), kernels larger than the map,
channel counts 1, 3 and 8, batch sizes 1-17, float32 and bfloat16, forward and both
gradients, under vmap, and plans built on one thread and run on another.

The checks that execute oneDNN run in a child process (this file, run as a script): a
regression there is a crash rather than an exception (the handlers once corrupted the
heap, through oneDNN's thread-local scratchpad, for kernels from about 15 up), and a
crash would kill the test process and hide which check did it. The parent reports the
child's signal, or the cases whose numbers disagree, as one failure per section.

The grid's reference is the convolution's definition summed in float64 NumPy (`numpy_conv`),
which compiles nothing: XLA's convolutions of the grid's ~95 shapes, forward and both
gradients, took most of the check's time to compile. A test below holds that reference
to `lax.conv_general_dilated` on shapes of each kind.
"""

import json
import signal
import subprocess
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jaxmnist.models import onednn

# Relative to the largest magnitude: sums of up to 31²·32 products, in float32 too; a
# wrong padding or layout is off by order 1.
TOLERANCE = {"float32": 5e-5, "bfloat16": 3e-2}

# (B, H, W, C_in, C_out, k, padding, dtype)
KERNELS_SAME = [(2, 7, 9, 3, 8, k, "same", "float32") for k in range(1, 32, 2)]
KERNELS_VALID = [(2, 31, 33, 3, 8, k, "valid", "float32") for k in range(1, 32)]
# The CNN preset's second block (and a third one's 7x7 maps) with the kernel sizes that
# crashed, at the reported batch size; its first layer (one input channel).
CNN_LAYERS = [(16, 14, 14, 16, 32, k, "same", "float32") for k in (15, 17, 19, 21, 27, 31)] + [
    (16, 7, 7, 32, 32, 21, "same", "float32"),
    (16, 28, 28, 1, 16, 21, "same", "float32"),
]
BATCHES = [(b, 7, 7, (1, 3, 8)[b % 3], 8, 21, "same", "float32") for b in range(1, 18)] + [
    (b, 8, 6, 3, 4, 3, "same", "float32") for b in (1, 2, 5, 16, 17)
]
CHANNELS = [(3, 6, 6, c, o, 19, "same", "float32") for c in (1, 3, 8) for o in (1, 3, 8)] + [
    (3, 8, 8, c, 3, 4, "valid", "float32") for c in (1, 3, 8)
]
EDGES = [
    (2, 7, 9, 3, 8, 7, "valid", "float32"),  # the kernel just fits: 1x3 outputs
    (1, 5, 5, 1, 1, 5, "valid", "float32"),  # 1x1 output, one channel, one example
    (1, 1, 1, 1, 1, 31, "same", "float32"),  # a 1x1 map
    (0, 7, 7, 3, 8, 5, "same", "float32"),  # an empty batch: zero weight gradient
    (2, 7, 9, 3, 8, 21, "same", "bfloat16"),
    (4, 14, 14, 16, 32, 21, "same", "bfloat16"),
]
GRID = KERNELS_SAME + KERNELS_VALID + CNN_LAYERS + BATCHES + CHANNELS + EDGES


def reference(x, w, padding="same"):
    return lax.conv_general_dilated(
        x, w, (1, 1), padding.upper(), dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def numpy_conv(x, w, g, padding):
    """(y, dx, dw) of `reference` in float64 NumPy: y = x ⋆ w (a cross-correlation, "same"
    padding (k - 1) / 2 on each side), and the gradients of <y, g> in x and w, summed over
    the kernel's k² offsets."""
    x, w, g = (np.asarray(a, np.float64) for a in (x, w, g))
    k, pad = w.shape[0], (w.shape[0] - 1) // 2 if padding == "same" else 0
    xp = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    (b, ho, wo, o), c = g.shape, x.shape[3]
    g2 = g.reshape(b * ho * wo, o)  # a row per output pixel: an offset is a matrix product
    y, dxp, dw = np.zeros(g2.shape), np.zeros(xp.shape), np.zeros(w.shape)
    for u in range(k):
        for v in range(k):
            window = xp[:, u : u + ho, v : v + wo, :].reshape(b * ho * wo, c)
            y += window @ w[u, v]
            dw[u, v] = window.T @ g2
            dxp[:, u : u + ho, v : v + wo, :] += (g2 @ w[u, v].T).reshape(b, ho, wo, c)
    dx = dxp[:, pad : pad + x.shape[1], pad : pad + x.shape[2], :]
    return y.reshape(g.shape), dx, dw


def _error(got, want) -> float:
    """The largest difference relative to the largest magnitude (0 for empty arrays)."""
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    scale = max(float(np.abs(want).max()), 1e-30)
    return float(np.abs(got - want).max()) / scale


def _mismatches(name, got, want, dtype) -> list[str]:
    """One line per output (y, dx, dw, ...) that differs by more than the tolerance."""
    lines = []
    for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)):
        err = _error(a, b)
        if not err <= TOLERANCE[dtype]:
            lines.append(f"{name} output {i}: relative error {err:.2e}")
    return lines


def _operands(rng, case):
    b, h, w, c, o, k, padding, dtype = case
    shrink = 0 if padding == "same" else k - 1
    arrays = (
        rng.normal(size=(b, h, w, c)),
        rng.normal(size=(k, k, c, o)),
        rng.normal(size=(b, h - shrink, w - shrink, o)),
    )
    # Rounded by NumPy (to float32, then to `dtype`) and copied to the device as they are:
    # the values `jnp.asarray(a, jnp.float32).astype(dtype)` gives, without the conversion
    # programs it compiles for every shape.
    return tuple(jax.device_put(a.astype(np.float32).astype(dtype)) for a in arrays)


def _value_and_grads(fn, padding):
    def run(x, w, g):
        y, vjp = jax.vjp(lambda x, w: fn(x, w, padding), x, w)
        return (y, *vjp(g))

    return jax.jit(run)


def _all_value_and_grads(fn, cases):
    """One program computing each case's forward pass and both gradients: compiled once,
    rather than once a case (the compiles were most of this check's time)."""

    def run(operands):
        return [
            _value_and_grads(fn, case[6])(x, w, g)
            for case, (x, w, g) in zip(cases, operands, strict=True)
        ]

    return jax.jit(run)


def check_grid() -> list[str]:
    """Forward and both gradients of every case in GRID, against `numpy_conv`."""
    rng = np.random.default_rng(0)
    operands = [_operands(rng, case) for case in GRID]
    # No bfloat16 kernels for this CPU: those cases are left out (test_conv checks).
    kept = [(c, o) for c, o in zip(GRID, operands, strict=True) if onednn.supports(c[7])]
    cases, operands = [c for c, _ in kept], [o for _, o in kept]
    got = _all_value_and_grads(onednn.conv_onednn, cases)(operands)
    want = [numpy_conv(*o, case[6]) for case, o in zip(cases, operands, strict=True)]
    failures = []
    for case, a, b in zip(cases, got, want, strict=True):
        failures += _mismatches(str(case), a, b, case[7])
    return failures


def _member_grads(fn, padding):
    """One member's loss over its maps, and its gradients in the images and weights."""

    def loss(images, weights):
        return jnp.sum(jnp.tanh(fn(images, weights, padding)))

    return jax.value_and_grad(loss, argnums=(0, 1))


def check_vmap() -> list[str]:
    """Populations of 3 members with their own weights (shared or own images), and a
    nested vmap: the value and both gradients of a loss over each member's maps."""
    rng = np.random.default_rng(1)
    failures = []
    for b, h, wd, c, o, k, padding in [
        (5, 7, 7, 3, 8, 21, "same"),
        (4, 14, 14, 8, 8, 15, "same"),
        (3, 9, 8, 3, 4, 6, "valid"),
    ]:
        x = jnp.asarray(rng.normal(size=(3, b, h, wd, c)), jnp.float32)
        w = jnp.asarray(rng.normal(size=(3, k, k, c, o)), jnp.float32)
        name = f"vmap {(b, h, wd, c, o, k, padding)}"
        for label, axes, xs in (("own images", (0, 0), x), ("shared images", (None, 0), x[0])):
            got, want = (
                jax.jit(jax.vmap(_member_grads(fn, padding), in_axes=axes))(xs, w)
                for fn in (onednn.conv_onednn, reference)
            )
            failures += _mismatches(f"{name}, {label}", got, want, "float32")
        xx, ww = jnp.stack([x, x[::-1]]), jnp.stack([w, w[::-1]])
        got, want = (
            jax.jit(jax.vmap(jax.vmap(_member_grads(fn, padding))))(xx, ww)
            for fn in (onednn.conv_onednn, reference)
        )
        failures += _mismatches(f"{name}, nested", got, want, "float32")
    return failures


def check_threads() -> list[str]:
    """Plans built on one thread and executed on others (XLA runs custom calls on its
    own threads). This is what crashed: the gemm-based weight gradient that oneDNN picks
    for large kernels kept its scratchpad in the creating thread's thread-local buffer.
    Runs first in its process, so these shapes' plans are new."""
    rng = np.random.default_rng(2)
    failures = []
    for case in [
        (16, 14, 14, 16, 32, 21, "same", "float32"),
        (8, 7, 7, 8, 8, 31, "same", "float32"),
    ]:
        x, w, g = _operands(rng, case)
        fn = _value_and_grads(onednn.conv_onednn, "same")
        want = _value_and_grads(reference, "same")(x, w, g)
        results = {}

        def run_on(where, fn=fn, args=(x, w, g), results=results):
            results[where] = fn(*args)

        for where in ("first", "main", "other"):
            if where == "main":
                run_on(where)
            else:
                thread = threading.Thread(target=run_on, args=(where,))
                thread.start()
                thread.join()
        for where, got in results.items():
            failures += _mismatches(f"{case} on the {where} thread", got, want, "float32")
    return failures


def check_refusals() -> list[str]:
    """The handlers refuse operands whose shapes disagree instead of reading past them."""
    failures = []
    x, w = jnp.ones((2, 7, 7, 3)), jnp.ones((5, 5, 4, 8))  # 4 input channels, x has 3
    w3 = w[..., :3, :]

    def f32(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.float32)

    def u8(*shape):
        return jax.ShapeDtypeStruct(shape, jnp.uint8)

    ws = jnp.zeros((2, 3, 3, 3), jnp.uint8)
    calls = [
        ("jaxmnist_onednn_conv_forward", f32(2, 7, 7, 8), (x, w)),
        ("jaxmnist_onednn_conv_forward", f32(2, 9, 9, 8), (x, w3)),
        ("jaxmnist_onednn_conv_backward_data", jax.typeof(x), (jnp.ones((2, 7, 7, 9)), w3)),
        # Pooling: a pooled map, a workspace or a gradient of another size than x's.
        ("jaxmnist_onednn_pool_forward", (f32(2, 3, 3, 3), u8(2, 3, 4, 3)), (x,)),
        ("jaxmnist_onednn_pool_forward", (f32(2, 4, 3, 3), u8(2, 3, 3, 3)), (x,)),
        ("jaxmnist_onednn_pool_backward", jax.typeof(x), (jnp.ones((2, 3, 3, 3)), ws[:, :2])),
        ("jaxmnist_onednn_pool_backward", jax.typeof(x), (jnp.ones((2, 3, 3, 4)), ws)),
        # Inference's pooling, bias and ReLU: a bias or a pooled map of another size.
        ("jaxmnist_onednn_pool_bias_relu", f32(2, 3, 3, 3), (x, jnp.ones((4,)))),
        ("jaxmnist_onednn_pool_bias_relu", f32(2, 3, 2, 3), (x, jnp.ones((3,)))),
        # ... and in training, a workspace of another size.
        (
            "jaxmnist_onednn_pool_bias_relu_forward",
            (f32(2, 3, 3, 3), u8(2, 3, 2, 3)),
            (x, x[0, 0, 0]),
        ),
    ]
    for target, result, operands in calls:
        attributes = {"size": 2} if "_pool_" in target else {"pad": 2}
        try:
            jax.block_until_ready(onednn._call(target, result, *operands, **attributes))
            failures.append(f"{target} ran on mismatched shapes {[a.shape for a in operands]}")
        except jax.errors.JaxRuntimeError as e:
            if "operand shapes do not agree" not in str(e):
                failures.append(f"{target}: unexpected error {str(e)[:200]}")
    return failures


SECTIONS = {
    "threads": check_threads,
    "grid": check_grid,
    "vmap": check_vmap,
    "refusals": check_refusals,
}


@pytest.mark.parametrize("section", sorted(SECTIONS))
@pytest.mark.slow
def test_onednn_matches_lax_in_a_child_process(section):
    if not onednn.available():
        pytest.skip(onednn.unavailable_reason())
    done = subprocess.run(
        [sys.executable, __file__, section],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode < 0:
        name = signal.Signals(-done.returncode).name
        tail = "\n".join(done.stderr.splitlines()[-5:])
        pytest.fail(f"the {section} check was killed by {name}:\n{tail}")
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    failures = json.loads(lines[-1])
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize(
    "case",
    [
        (2, 7, 9, 3, 8, 5, "same", "float32"),
        (2, 9, 8, 3, 4, 4, "valid", "float32"),  # an even kernel
        (1, 5, 5, 1, 1, 5, "valid", "float32"),  # 1x1 output
        (0, 7, 7, 3, 8, 5, "same", "float32"),  # an empty batch
        (2, 6, 6, 3, 4, 3, "same", "bfloat16"),
    ],
    ids=str,
)
def test_the_grids_numpy_reference_is_lax_convolution(case):
    operands = _operands(np.random.default_rng(3), case)
    want = _value_and_grads(reference, case[6])(*operands)
    assert _mismatches(str(case), numpy_conv(*operands, case[6]), want, case[7]) == []


@pytest.mark.parametrize(
    ("x", "w", "padding", "message"),
    [
        ((2, 7, 7, 3), (4, 4, 3, 8), "same", "'same' padding takes an odd kernel, got k=4"),
        ((2, 7, 9, 3), (8, 8, 3, 8), "valid", "a 8x8 kernel does not fit 7x9 maps"),
        ((2, 7, 7, 3), (3, 3, 2, 8), "same", r"w \(k, k, 3, O\)"),
        ((2, 7, 7, 3), (3, 5, 3, 8), "same", r"w \(k, k, 3, O\)"),
        ((2, 7, 7, 3), (3, 3, 3, 8), "full", "padding 'same' or 'valid'"),
    ],
)
def test_shapes_the_handlers_cannot_compute_are_refused_before_the_call(x, w, padding, message):
    with pytest.raises(ValueError, match=message):
        onednn.conv_onednn(jnp.zeros(x), jnp.zeros(w), padding)


if __name__ == "__main__":
    print(json.dumps(SECTIONS[sys.argv[1]]()), flush=True)
