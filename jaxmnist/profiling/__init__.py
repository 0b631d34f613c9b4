"""`jaxmnist profile`: a `jax.profiler` trace of N steady training steps, and where
a step's time goes.

Modules: `trace` (capturing the trace of N steps, reading its operations back with JAX's
reader), `classify` (what each HLO instruction of the step is: matmul, convolution by
formulation, elementwise, optimizer update, copies), `flops` (the FLOPs of each matmul
and convolution, from its shapes), `breakdown` (the measured time split by kind, FLOP/s
and fraction of the measured peak; the terminal table), `peak` (the device's limit: a
large matmul's measured FLOP/s, which `jaxmnist bench` divides by too), `recipe`
(`profile_population`, `profile_config`: the recipe, and profile.json), `callback`
(`train --profile-steps`), `section` (the table as an HTML section, for report.html and
bench.html).
"""
