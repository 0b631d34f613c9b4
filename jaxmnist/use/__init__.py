"""Using a trained run: re-evaluating it, predicting on people's images, exporting, serving.

`members` (the ensemble of a run's members, or one of them), `reevaluate`
(`jaxmnist eval`), `preprocess` (a person's image made the way the dataset's images
were), `predict` (top-k on files and arrays), `export` (`jax.export`), `serve/` (the web
page and its API).
"""
