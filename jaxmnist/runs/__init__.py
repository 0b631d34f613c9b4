"""The run directory: writing it as a run goes, checkpoints, resuming, and reading it back.

`rundir` (atomic writes, the lock, parameters), `predictions` (test_predictions.npz:
the test-set probabilities and sample images every finished run keeps for its
reports), `writer` (the run loop's callback that writes the directory), `checkpoint`
(Orbax saves and verified restores), `resume` (which configs may continue a run, and
rewinding its files) and `reader` (`open_run`: the one reader every command uses).
"""
