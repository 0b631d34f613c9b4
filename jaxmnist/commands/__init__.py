"""The command line's commands: one module per command, each with its parser and its run.

Every command module has `add_parser(subparsers) -> ArgumentParser` and
`run(args) -> int` (the exit status); `jaxmnist.cli` assembles the parsers and
dispatches. What several commands share (the config flags, the process flags, default
output folders) is in `options`; the terminal reporter of a training run in `terminal`.
Building every parser must stay fast (`jaxmnist --help`), so a command imports jax, the
training code or matplotlib inside `run`.
"""
