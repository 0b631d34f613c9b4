"""Hyperparameter search: a grid (`jaxmnist sweep`), and Optuna (`jaxmnist search`), its
trials trained in vmapped batches as the grid's points are.

`sweep` is the grid: the `--grid` syntax, its points grouped by compiled program and
trained as one population per group, ranked, written (sweep.json, sweep.csv; the page is
`report.sweep_report`). The rest builds on it with Optuna, which owns sampling, pruning
and storage; one module per concern: `space` (the `--param` syntax and its
distributions), `study` (sampler, pruner, storage, heartbeats and retries, the budget),
`batch` (ask K trials, train them as sweep points grouped by program, report each epoch
for pruning, tell), `worker` (a worker's loop over batches, and what the command asks of
it), `outputs` (search.json, search.csv, the table, the best trial's `jaxmnist train`
command) and `page` (search.html). Those need the `search` extra
(`pip install 'jaxmnist[search]'`); `sweep` does not, and nothing is imported here.
"""
