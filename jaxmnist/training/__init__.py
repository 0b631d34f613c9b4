"""Training: the loop's vocabulary, the run recipe, and the core it drives.

From the top down: `run` (`train_and_evaluate`: set up, restore, compile, loop,
summarise), `loop` (the epochs of a population, calling back), `hooks` (the
vocabulary every layer above shares: callbacks and what they are handed),
`population` (many models as one program), `step` (the pure step and epoch),
`evaluate` (exact evaluation), `parallel` (meshes and shardings), `memory`
(chunks that fit), `pacing` and `preemption` (when a call ends, and a clean stop).
"""
