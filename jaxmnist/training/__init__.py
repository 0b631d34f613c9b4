"""Training: the loop, its vocabulary, and the core it drives.

From the top down: `loop` (the epochs of a population, calling back), `hooks` (the
vocabulary every layer above shares: callbacks and what they are handed), `population`
(many models as one program), `step` (the pure step and epoch), `evaluate` (exact
evaluation), `parallel` (meshes and shardings), `memory` (chunks that fit), `pacing` and
`preemption` (when a call ends, and a clean stop). The recipe of a whole run, which
hands the loop the callbacks of the run directory, checkpoints and TensorBoard, stands
above this package and `runs`: `jaxmnist.train`.
"""
