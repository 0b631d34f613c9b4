"""The multi-device tests run in their own pytest process with 8 fake CPU devices.

`make test` runs them as `XLA_FLAGS=--xla_force_host_platform_device_count=8
pytest tests/multidevice` (the flag must be set before JAX starts, so they cannot
share a process with the rest of the suite, which runs on one device).
"""

import jax
import pytest

NEEDED = 8


def pytest_collection_modifyitems(config, items):
    if jax.device_count() < NEEDED:
        raise pytest.UsageError(
            f"tests/multidevice needs {NEEDED} devices, found {jax.device_count()}: run it with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={NEEDED} (make test does)"
        )
