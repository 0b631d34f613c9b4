"""oneDNN's CPU convolution and max-pooling as XLA FFI handlers, compiled when this package
is installed (`src/` beside it, built by setuptools against Intel's oneDNN wheel).

`handlers()` maps each FFI target name to a PyCapsule of its handler, for
`jax.ffi.register_ffi_target(name, capsule, platform="cpu")`; `onednn_version()` is the
(major, minor, patch) of the oneDNN library loaded. jaxmnist (`jaxmnist.models.onednn`)
registers the handlers and calls them; importing this package loads oneDNN, nothing more.
"""

from jaxmnist_onednn._handlers import handlers, onednn_version

__all__ = ["handlers", "onednn_version"]
