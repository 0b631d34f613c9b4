"""Seeing a run: plots, a self-contained HTML report, run comparison, TensorBoard logs.

Modules: `html` (page template, CSS, embedded images, tables: shared by every
page jaxmnist writes), `plots` (matplotlib figures as PNG bytes), `predictions`
(the run's test_predictions.npz), `rundata` (reading a finished run directory
back, with clear errors), `run_report` (report.html), `background` (the child process
that draws it for `jaxmnist train`), `compare` (several runs on one page) and
`tensorboard` (event files). Nothing is imported here, so that
training can save predictions without loading matplotlib.
"""
