"""Hyperparameter search with Optuna (`jaxmnist search`), trials trained in vmapped batches.

Optuna owns sampling, pruning and storage; this package wires them to the sweep's
training path. One module per concern: `space` (the `--param` syntax and its
distributions), `study` (sampler, pruner, storage, heartbeats and retries, the budget),
`batch` (ask K trials, train them as sweep points grouped by program, report each
epoch for pruning, tell), `run` (a worker's loop over batches), `outputs` (search.json,
search.csv, the table, the best trial's `jaxmnist train` command) and `page`
(search.html). Needs the `search` extra (`pip install 'jaxmnist[search]'`).
"""
