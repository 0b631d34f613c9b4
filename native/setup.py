"""The extension `jaxmnist_onednn._handlers`: the FFI handlers (src/onednn_conv.cc) and the
module that hands them to Python (src/module.cc), compiled against JAX's XLA FFI headers
and the oneDNN wheel of the build environment. The wheel then requires that same oneDNN
release, and finds its library where Intel's wheel puts it, `<prefix>/lib`: the run path
is the wheel's own record of that place relative to site-packages, so it holds in any
environment pip installs both into."""

from importlib import metadata
from pathlib import Path, PurePosixPath

import jax
from setuptools import Extension, setup

RUNTIME, DEVEL = "onednn-cpu-gomp", "onednn-devel-cpu-gomp"


def _file(dist: str, suffix: str) -> metadata.PackagePath:
    """The file of `dist` whose recorded path ends with `suffix`."""
    for path in metadata.files(dist) or ():
        if str(path).endswith(suffix):
            return path
    raise SystemExit(f"{dist} {metadata.version(dist)} has no {suffix}")


header = Path(_file(DEVEL, "oneapi/dnnl/dnnl.hpp").locate()).resolve()
library = _file(RUNTIME, "libdnnl.so")
# Recorded relative to site-packages (`../../libdnnl.so`); the extension is one folder below.
run_path = PurePosixPath("$ORIGIN", "..", PurePosixPath(library).parent)

setup(
    ext_modules=[
        Extension(
            "jaxmnist_onednn._handlers",
            sources=["src/onednn_conv.cc", "src/module.cc"],
            include_dirs=[jax.ffi.include_dir(), str(header.parents[2])],
            library_dirs=[str(Path(library.locate()).resolve().parent)],
            libraries=["dnnl"],
            extra_compile_args=["-std=c++17"],
            extra_link_args=[f"-Wl,-rpath,{run_path}"],
            language="c++",
        )
    ],
    install_requires=[f"{RUNTIME}=={metadata.version(RUNTIME)}"],
)
