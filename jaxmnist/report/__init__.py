"""Seeing a run: plots, a self-contained HTML report, run comparison, TensorBoard logs.

Modules (every page is built with `jaxmnist.pages`): `plots` (matplotlib figures as PNG
bytes), `rundata` (reading a finished run directory back, with clear errors),
`run_report` (report.html), `background` (the child process that draws it for
`jaxmnist train`), `compare` (several runs on one page) and `tensorboard` (event files).
Nothing is imported here, so that a module of it (the TensorBoard callback, say) loads
no more than it needs.
"""
