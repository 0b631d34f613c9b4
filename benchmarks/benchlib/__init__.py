"""What the benchmark scripts share, kept out of the `jaxmnist` package.

`results` writes a script's figures with what every result keeps beside them (the
machine's load and `runtime.environment()`); `steps` times one network's training step
in several formulations side by side.

The scripts run as `python benchmarks/NAME.py`, so Python puts `benchmarks/` first on
`sys.path` and `import benchlib` finds this package: no script touches `sys.path`.
tests/test_benchmarks.py puts `benchmarks/` on `sys.path` the same way before it imports
them.
"""
