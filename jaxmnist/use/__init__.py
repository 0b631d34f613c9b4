"""Using a trained run: re-evaluating it, predicting on people's images, exporting, serving."""
