"""`jaxmnist serve`: a local web page to draw or upload an image, and the JSON API behind it.

`app` builds the Starlette application (the model compiled once, at start-up;
requests served one model call at a time); `server` binds the socket and runs
it on uvicorn; `static/` holds the page (HTML, CSS, JavaScript, no external
resources). Starlette and uvicorn come with the `serve` extra, so they are
imported only when a server is made.
"""

from jaxmnist.use.serve.server import serve

__all__ = ["serve"]
